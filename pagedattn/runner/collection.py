"""Which cases the run has, and in what order: the grid (or the one saved case of
``--replay``) as the ``conformance_spec`` parameter of each suite module, one record per
case from collection on, expected failures marked, and the cases ordered by the
configuration a backend compiles for (kept on one worker under ``--dist loadgroup``).

Torch-free at import: the grid and the configurations come with the hooks that use them.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from pagedattn.runner.case_record import OPERATIONS, note, noted, split_group
from pagedattn.runner.expectations import expected_failure, matches
from pagedattn.runner.gate import gate_of
from pagedattn.runner.replay import ReplaySpec
from pagedattn.runner.session import Run


def need_backend() -> str:
    """The usage error of a suite module collected without ``--backend``."""
    from pagedattn.adapters.loading import available_backends

    names = ", ".join(sorted(available_backends())) or "(none installed)"
    return f"the conformance suite needs --backend=NAME (available: {names}), package.module:attr or file.py:attr"


def parametrize(metafunc: pytest.Metafunc, run: Run) -> None:
    """The ``conformance_spec`` parameter of one suite module: the profile's grid of its
    family (``FAMILY``), its own ``SPECS(profile)``, or the case of ``--replay``. A decode-only
    backend is offered, right after each case of several query tokens in a sequence, that
    case's decode form (``pagedattn.cases.decode_forms``): the case itself stays, reported
    unsupported, so that every backend's report holds the grid's ids."""
    if not run.spec:
        # reported once, for the whole run, in pytest_collection_modifyitems
        metafunc.parametrize("conformance_spec", [None], ids=["no-backend"])
        return
    from pagedattn.cases import FAMILIES, grid

    family = metafunc.module.FAMILY
    replay = metafunc.config.getoption("--replay")
    specs: list[Any]
    if replay:
        spec = ReplaySpec(replay)
        specs = [spec] if spec.family == family else []
    else:
        source = getattr(metafunc.module, "SPECS", None)
        if callable(source):
            specs = source(run.profile)
        else:
            specs = grid(run.profile, family) if family in FAMILIES else []  # replay-only modules
        if offers_decode_forms(run, family):
            from pagedattn.cases.decode_forms import with_decode_forms

            specs = with_decode_forms(specs)
    metafunc.parametrize("conformance_spec", specs, ids=[s.id for s in specs])


def offers_decode_forms(run: Run, family: str) -> bool:
    """Whether the suite module of ``family`` offers decode forms: to a decode-only backend,
    in the modules whose operation reads the query (attention, lse; the properties too).
    Known wherever cases are collected: the backend is constructed at configure time."""
    from pagedattn.adapters.capabilities import QUERY_OPERATIONS

    suite = run.suite
    return suite is not None and suite.caps.decode_only and OPERATIONS.get(family, "attention") in QUERY_OPERATIONS


def spec_of(item: pytest.Item) -> Any:
    """The ``conformance_spec`` of a suite item (a grid spec or a ``ReplaySpec``), or ``None``."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("conformance_spec") if callspec else None


def _has_spec_param(item: pytest.Item) -> bool:
    return "conformance_spec" in getattr(getattr(item, "callspec", None), "params", {})


def base_facts(item: pytest.Item) -> dict[str, Any] | None:
    """What the record of a suite item says before it runs: id, family, dtype, operation
    and configuration (from the spec, without building the case)."""
    from pagedattn.cases.configuration import Configuration, dtype_name

    module = getattr(item, "module", None)
    family = getattr(module, "FAMILY", None)
    if family is None:
        return None
    spec = spec_of(item)
    if spec is None:
        if _has_spec_param(item):
            return None
        return {
            "file": str(item.path),
            "id": family,
            "family": family,
            "dtype": "mixed",
            "operation": "attention",
            "configuration": family,
        }
    operation = spec.operation if isinstance(spec, ReplaySpec) else None
    operation = operation or OPERATIONS.get(family, "attention")
    # a saved case is built (it is already in memory); a grid spec says it all without building
    config = Configuration.of_case(spec.build()) if isinstance(spec, ReplaySpec) else Configuration.of_spec(spec)
    facts = {
        "worker": os.environ.get("PYTEST_XDIST_WORKER"),
        "file": str(item.path),
        "id": spec.id,
        "family": family if family in ("properties", "cache_write") else spec.family,
        "dtype": dtype_name(config.dtype, config.kv_dtype),
        "operation": operation,
        "configuration": config.key(operation),
    }
    source = getattr(spec, "source", None)
    if source is not None:  # a decode form (``DecodeFormSpec``): the case it stands for, and its rows
        facts.update(decode_form_of=source.id, description=spec.description)
    params = item.callspec.params  # type: ignore[attr-defined]
    if "prop" in params:
        facts["property"] = params["prop"]
    return facts


def arrange(config: pytest.Config, run: Run, items: list[pytest.Item]) -> None:
    """Settle the run's items: drop modules with nothing to run in this mode, mark expected
    failures, keep only the replayed case under ``--replay``, give every suite item its
    record, and order the items by configuration (compile key), each configuration one
    ``xdist_group``."""
    # modules with nothing to run in this mode (replay-only ones) got an empty parameter set
    empty = [i for i in items if _has_spec_param(i) and not hasattr(spec_of(i), "build")]
    if empty:
        config.hook.pytest_deselected(items=empty)
        items[:] = [i for i in items if i not in empty]
    gate = gate_of(config)
    named = [(spec.id, item.name) for item in items if (spec := spec_of(item)) is not None]
    # before -k, -m and --shard deselect: an entry is stale when it names no case of the suite
    # (a --replay run holds one saved case: no entry is judged stale by it)
    if not config.getoption("--replay"):
        gate.stale = [e for e in run.expectations if not any(matches(e, case_id, name) for case_id, name in named)]
    for item in items:
        spec = spec_of(item)
        reason = expected_failure(run.expectations, spec.id, item.name) if spec is not None else None
        if reason is not None:
            # strict: an unexpected pass fails the case (pytest's XPASS(strict)), as xfail_strict does
            item.add_marker(pytest.mark.xfail(reason=f"expected failure: {reason}", strict=gate.strict))
    if config.getoption("--replay"):
        keep = [i for i in items if isinstance(spec_of(i), ReplaySpec)]
        dropped = [i for i in items if i not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    keys: dict[int, str] = {}
    for item in items:
        facts = base_facts(item)
        if facts is not None:
            note(item, **facts)
            keys[id(item)] = facts["configuration"]
            if item.get_closest_marker("xdist_group") is None:  # the search's items carry their own
                item.add_marker(pytest.mark.xdist_group(name=facts["configuration"]))
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda i: (id(i) not in keys, keys.get(id(i), ""), order[id(i)]))
    # the search's items are spread once deselection is done (the plugin, ``spread_search``)


#: Cases between two of the search's items in the run's order (see ``spread_search``).
SEARCH_STRIDE = 3


def spread_search(items: list[pytest.Item], search: list[pytest.Item]) -> None:
    """Place the search's items among the run's last cases, ``SEARCH_STRIDE`` cases apart
    (the last one ``SEARCH_STRIDE`` cases before the end), instead of all at the end.

    Why: each item spends its share of the search's time budget, seconds that no other
    case comes near, and pytest-xdist's ``load`` scheduler keeps every worker two items
    ahead: items at the very end went out in pairs, so half the workers ran two shares one
    after the other while the rest idled (the search's wall time doubles). With
    cases between them, a worker running a search item takes the next case into its
    queue, not the next search item, and the cases after them fill the workers that finish
    first. Late in the run still: the cases before have compiled the grid's kernels that the
    search draws from. ``items`` is reordered in place; ``search`` is in its run order. Under
    ``--isolate`` (``--dist loadgroup``) xdist hands out groups largest first, so the
    search's one-item groups go out among the last anyway."""
    if not search:
        return
    ids = {id(i) for i in search}
    rest = [i for i in items if id(i) not in ids]
    arranged, taken = [], 0
    for k, item in enumerate(search):
        at = max(0, len(rest) - (len(search) - k) * SEARCH_STRIDE)  # cases before this item
        arranged += rest[taken:at] + [item]
        taken = max(taken, at)
    items[:] = arranged + rest[taken:]


def keep_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--shard I/N``, after deselection (``-k``, ``-m``): record every collected node id
    and deselect the cases of the other shards (``pagedattn.runner.shard``)."""
    from pagedattn.runner.shard import split

    gate = gate_of(config)
    spec = gate.shard
    if spec is None:
        return
    gate.collected = [split_group(i.nodeid)[0] for i in items]
    dropped = split(items, spec[0], spec[1], lambda i: noted(i).get("configuration") or split_group(i.nodeid)[0])
    if dropped:
        config.hook.pytest_deselected(items=dropped)


def collection_line(items: list[pytest.Item]) -> str:
    keys = {noted(i).get("configuration") for i in items} - {None}
    return (
        f"pagedattn: {len(items)} cases in {len(keys)} configurations (dtype, kv dtype, head dim, block size, "
        "variants, operation), run in that order"
    )
