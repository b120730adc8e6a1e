"""The properties no anchor checks together, each ``prop(suite, node, spec)``.

Invariances are claims (``Capabilities.invariances``): held by default, declined with a
reason (then reported unsupported, and run anyway under ``--probe-unclaimed``):
determinism (the same input twice gives the same bits), batch invariance (a sequence's
output does not depend on its neighbours) and placement invariance (permuting the
physical blocks changes no bit). Correctness, never optional: input immutability,
poisoned padding (NaN in every slot a kernel must not read), and a fully written
``out=``. Every property judges the validity of the outputs first: a backend whose
outputs are invalid never passes by being invalid the same way twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pagedattn.adapters.loading import accepts_out
from pagedattn.cases.spec import case_seed
from pagedattn.indexing import index_rows
from pagedattn.oracle import PagedCase, bits_equal, check_attention
from pagedattn.oracle.bitexact import bits_dtype, bits_view
from pagedattn.runner.case_record import note
from pagedattn.runner.faults import BackendFault
from pagedattn.runner.suite import PLACEMENT_STREAM, Suite, guarded

#: a NaN whose payload no arithmetic produces, per element size: ``out=`` is filled with it
#: so that "never written" (still this payload) differs from "written with a NaN"
OUT_SENTINEL = {torch.float32: 0x7FC0BEEF, torch.float16: 0x7E5A, torch.bfloat16: 0x7FDA}

#: ``check(suite, node, case) -> problem or ""``; ``node`` is None while probing
Check = Callable[[Suite, "pytest.Item | None", PagedCase], str]


def _call(suite: Suite, case: PagedCase) -> Any:
    return suite.call("paged_attention", case)


def _valid(suite: Suite, node: pytest.Item | None, case: PagedCase, out: Any, what: str) -> str:
    """Why ``out`` is not a valid answer to ``case`` (shape, dtype, device, non-finite
    where the oracle is finite), or ``""``."""
    check = check_attention(out, case, **suite.policy(case))
    if check.problem or check.num_nonfinite:
        if node is not None:
            note(node, metrics=check.metrics())
        return f"{what}: {check}"
    return ""


def _start(suite: Suite, node: pytest.Item, spec: Any, prop: str) -> PagedCase:
    note(node, property=prop)
    return suite.start(node, spec, "attention", family="properties")


def _verdict(suite: Suite, node: pytest.Item, spec: Any, case: PagedCase, problem: str) -> None:
    if problem:
        suite.fail(node, spec, case.to("cpu"), problem, "attention")


def _invariance(suite: Suite, node: pytest.Item, spec: Any, prop: str, check: Check) -> None:
    """An invariance property: unsupported with the backend's reason where it declines
    the claim (``Capabilities.invariance_reason``), run anyway under
    ``--probe-unclaimed``; else ``check(suite, node, case)`` (a problem, or ``""``) decides."""
    case = _start(suite, node, spec, prop)
    reason = suite.caps.invariance_reason(prop)
    if reason:
        note(node, reason=reason)
        if suite.take_probe(reason):
            try:
                problem = check(suite, None, case)
                verdict = "would hold" if not problem else f"would not hold: {problem.splitlines()[0]}"
            except BackendFault as exc:
                verdict = f"could not be probed: {str(exc).splitlines()[0]}"
            note(node, probe=verdict)
        pytest.skip(f"unsupported: {reason}")
    _verdict(suite, node, spec, case, check(suite, node, case))


# ------------------------------------------------------------ the checks
def check_determinism(suite: Suite, node: pytest.Item | None, case: PagedCase) -> str:
    a = _call(suite, case.clone())
    b = _call(suite, case.clone())
    invalid = _valid(suite, node, case, a, "determinism") or _valid(suite, node, case, b, "determinism")
    if invalid:
        return invalid
    return "" if bits_equal(a, b) else "determinism: the same input twice gave different bits"


def check_batch_invariance(suite: Suite, node: pytest.Item | None, case: PagedCase) -> str:
    whole = _call(suite, case.clone())
    invalid = _valid(suite, node, case, whole, "batch invariance (whole batch)")
    if invalid:
        return invalid
    loc = case.query_start_loc_list
    for b in range(case.num_seqs):
        one = single_sequence(case, b)
        alone = _call(suite, one.clone())
        invalid = _valid(suite, node, one, alone, f"batch invariance (sequence {b} alone)")
        if invalid:
            return invalid
        if not bits_equal(alone, whole[loc[b] : loc[b + 1]]):
            return f"batch invariance: sequence {b} alone differs in its bits from the same sequence in the batch"
    return ""


def placement_check(seed: int) -> Check:
    """The placement-invariance check, with the blocks permuted by ``seed``."""

    def check(suite: Suite, node: pytest.Item | None, case: PagedCase) -> str:
        moved = permute_blocks(case, seed=seed)
        a, b = _call(suite, case.clone()), _call(suite, moved.clone())
        invalid = _valid(suite, node, case, a, "placement invariance") or _valid(
            suite, node, moved, b, "placement invariance"
        )
        if invalid:
            return invalid
        return "" if bits_equal(a, b) else "placement invariance: permuting the physical blocks changed the output bits"

    return check


# ------------------------------------------------------------ the properties
@guarded
def determinism(suite: Suite, node: pytest.Item, spec: Any) -> None:
    _invariance(suite, node, spec, "determinism", check_determinism)


@guarded
def batch_invariance(suite: Suite, node: pytest.Item, spec: Any) -> None:
    _invariance(suite, node, spec, "batch_invariance", check_batch_invariance)


@guarded
def placement_invariance(suite: Suite, node: pytest.Item, spec: Any) -> None:
    check = placement_check(case_seed(spec.id, PLACEMENT_STREAM))
    _invariance(suite, node, spec, "placement_invariance", check)


@guarded
def immutability(suite: Suite, node: pytest.Item, spec: Any) -> None:
    case = _start(suite, node, spec, "immutability")
    before = case.clone()
    out = _call(suite, case)
    changed = [f for f, t in case.tensors().items() if not bits_equal(t, getattr(before, f))]
    problem = f"input immutability: the backend modified {', '.join(changed)}" if changed else ""
    _verdict(suite, node, spec, before, problem or _valid(suite, node, before, out, "input immutability"))


@guarded
def poisoned_padding(suite: Suite, node: pytest.Item, spec: Any) -> None:
    case = _start(suite, node, spec, "poisoned_padding")
    if not bool(torch.isnan(case.key_cache.float()).any()):
        raise AssertionError(f"{spec.id}: a poisoned-padding case must carry NaN poison")
    suite.judge(node, spec, case.clone(), _call(suite, case))


@guarded
def out_argument(suite: Suite, node: pytest.Item, spec: Any) -> None:
    """``paged_attention(case, out=buf)`` writes every element of ``buf``. ``buf`` starts
    as a NaN of a payload no arithmetic produces: an element still holding it was never
    written; a NaN written there is a non-finite output, judged as such."""
    case = _start(suite, node, spec, "out_argument")
    if not accepts_out(suite.backend):
        note(node, reason="paged_attention takes no out= argument")
        pytest.skip("unsupported: paged_attention takes no out= argument")
    out = sentinel_filled((case.num_tokens, case.num_heads, case.head_dim_v), case.dtype, case.device)
    got = suite.call("paged_attention", case.clone(), out=out)
    if got is not None and (not isinstance(got, torch.Tensor) or got.data_ptr() != out.data_ptr()):
        return _verdict(suite, node, spec, case, "out=: the result was not written into `out`")
    unwritten = int(is_sentinel(out).sum())
    if unwritten:
        return _verdict(
            suite,
            node,
            spec,
            case,
            f"out=: {unwritten} of {out.numel()} elements of `out` were never "
            "written (they still hold the sentinel NaN the suite filled it with)",
        )
    suite.judge(node, spec, case.clone(), out)


#: every property by name, in the order the suite runs them
PROPERTIES: dict[str, Callable[[Suite, pytest.Item, Any], None]] = {
    "determinism": determinism,
    "batch_invariance": batch_invariance,
    "placement_invariance": placement_invariance,
    "immutability": immutability,
    "poisoned_padding": poisoned_padding,
    "out_argument": out_argument,
}


# ------------------------------------------------------------ helpers
def sentinel_filled(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """A tensor of ``shape`` whose every element is ``OUT_SENTINEL``'s NaN."""
    return torch.full(shape, OUT_SENTINEL[dtype], dtype=bits_dtype(dtype), device=device).view(dtype)


def is_sentinel(t: torch.Tensor) -> torch.Tensor:
    """Which elements of ``t`` still hold ``OUT_SENTINEL``'s NaN (bool, ``t``'s shape)."""
    return bits_view(t) == OUT_SENTINEL[t.dtype]


def single_sequence(case: PagedCase, b: int) -> PagedCase:
    """Sequence ``b`` of ``case`` as a batch of one, over the same cache."""
    loc = case.query_start_loc_list
    mask = case.tree_mask_of(b)
    caches = {"key_cache": case.key_cache.clone()}
    if not case.shared_kv:  # a shared latent cache's values follow its keys (``replace``)
        caches["value_cache"] = case.value_cache.clone()
    return case.replace(
        query=case.query[loc[b] : loc[b + 1]].clone(),
        **caches,
        block_tables=case.block_tables[b : b + 1].clone(),
        seq_lens=case.seq_lens[b : b + 1].clone(),
        query_start_loc=torch.tensor([0, loc[b + 1] - loc[b]], dtype=torch.int32, device=case.device),
        tree_mask=None if mask is None else mask.reshape(-1).clone(),
    )


def permute_blocks(case: PagedCase, seed: int = 0) -> PagedCase:
    """The same problem with the physical blocks shuffled and the tables remapped."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(case.num_blocks, generator=gen).to(case.device)  # new[i] = old[perm[i]]
    inv = torch.argsort(perm)
    caches = {"key_cache": index_rows(case.key_cache, perm).clone()}
    if not case.shared_kv:  # a shared latent cache's values follow its keys (``replace``)
        caches["value_cache"] = index_rows(case.value_cache, perm).clone()
    return case.replace(**caches, block_tables=inv[case.block_tables.long()].to(torch.int32))
