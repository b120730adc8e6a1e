"""What one conformance case does: build, ask the backend, judge, record.

The test modules in ``conformance/`` are thin: each hands its case spec to a ``Suite``
method (the families here, the properties in ``pagedattn.runner.properties``). Results are
attached to the test item (``pagedattn.runner.case_record.note``) so they travel with pytest's
reports, also from pytest-xdist workers; the ``RecordBook`` decides each status.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
import torch

from pagedattn.adapters.capabilities import policy_for
from pagedattn.adapters.protocol import Backend, Claims, SupportsWarmup
from pagedattn.cases.configuration import Configuration, dtype_name
from pagedattn.cases.spec import case_seed
from pagedattn.oracle import PagedCase, bits_equal, check_attention, check_attention_lse, check_bitexact, paged_gather
from pagedattn.oracle.bitexact import BitCheck, bits_view
from pagedattn.oracle.verdict import AttentionCheck
from pagedattn.runner.case_record import AHEAD_KEY, note, noted
from pagedattn.runner.faults import BackendFault, backend_files, describe_exception, passes_through
from pagedattn.runner.isolation import IsolatedBackend
from pagedattn.runner.replay import ReplayFiles

__all__ = ["PagedAttnWarning", "Suite", "case_configuration", "guarded"]

# the suite attaches facts (``case_record.note``); the RecordBook (``record_book``) decides each case's status

#: the suite's own random stream of a case (``case_seed(case_id, stream)``): the slots and
#: rows of a cache write; the permutation of the placement-invariance property
CACHE_WRITE_STREAM = 1
PLACEMENT_STREAM = 2

F = TypeVar("F", bound=Callable[..., Any])


def guarded(method: F) -> F:
    """A backend fault (a crash, a hang, an exception) fails the case with a short message
    (what happened; for an exception its type, message and the last frame in the
    backend's file), a replay file and command, and the full traceback in the record.
    Wraps ``method(suite, node, spec, ...)``."""

    @functools.wraps(method)
    def wrapper(suite: Suite, node: pytest.Item, spec: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(suite, node, spec, *args, **kwargs)
        except BackendFault as exc:
            fault = exc
        if fault.kind in ("crashed", "timed_out"):
            note(node, fault=fault.kind)
        operation = noted(node).get("operation", "attention")
        suite.fail(node, spec, spec.build(), str(fault), operation, traceback=fault.traceback)

    return wrapper  # type: ignore[return-value]


class PagedAttnWarning(UserWarning):
    """A case landed in the policy's warning band."""


def case_configuration(case: PagedCase, operation: str) -> str:
    """The compile key of a built case run as ``operation`` (``Configuration.key``)."""
    return Configuration.of_case(case).key(operation)


@dataclass
class Suite:
    """The run's state: the backend under test and where and how to run it."""

    backend: Backend
    backend_spec: str
    device: str
    profile: str
    replay_dir: str
    suite_path: str = "conformance"
    extra_args: list[str] = field(default_factory=list)
    probe_unclaimed: int = 0  # how many unclaimed cases per reason to run anyway
    tb_long: bool = False  # --tb=long: failure messages carry the backend's full traceback
    _probed: dict[str, int] = field(default_factory=dict)
    _warmed: set[tuple[int, str]] = field(default_factory=set)
    ahead: Any = None  # pagedattn.runner.warmup.WarmupAhead, when this process warms up ahead

    @property
    def caps(self) -> Claims:
        return self.backend.capabilities

    def policy(self, case: PagedCase) -> dict[str, Any]:
        """The backend's declared policy terms for ``case``, as keyword arguments of the checks
        (a declared precision applies where its scope covers the case)."""
        return policy_for(self.caps, case)

    @property
    def replays(self) -> ReplayFiles:
        """Where this run saves failing cases, and the command that replays one."""
        return ReplayFiles(self.replay_dir, self.suite_path, self.backend_spec, self.device, tuple(self.extra_args))

    # ------------------------------------------------------------- plumbing
    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``backend.<method>(*args, **kwargs)``, its tensors owned by the caller
        (``owned``); anything it raises (``SystemExit`` and other ``BaseException``
        subclasses too) becomes a ``BackendFault`` of kind ``"raised"`` (short message, full
        traceback). A ``pytest.skip`` it raises passes through (the case is unsupported, with
        its reason), and so does ``KeyboardInterrupt`` (the user stops the run)."""
        try:
            result = getattr(self.backend, method)(*args, **kwargs)
        except BackendFault:
            raise
        except BaseException as exc:
            if passes_through(exc):
                raise
            short, full = describe_exception(exc, backend_files(self.backend))
            raise BackendFault(short, kind="raised", traceback=full) from None
        out = kwargs.get("out")
        if isinstance(out, torch.Tensor) and isinstance(result, torch.Tensor) and result.data_ptr() == out.data_ptr():
            return result  # written into the caller's own `out=`: the property checks it is that buffer
        return owned(result)

    def take_probe(self, reason: str) -> bool:
        """Whether one more case unclaimed for ``reason`` is probed (``--probe-unclaimed N``:
        up to N per reason); counts it if so."""
        if self._probed.get(reason, 0) >= self.probe_unclaimed:
            return False
        self._probed[reason] = self._probed.get(reason, 0) + 1
        return True

    def start(self, node: pytest.Item, spec: Any, operation: str, family: str | None = None) -> PagedCase:
        """Build the case on the device and record what it is; skip it as unsupported, with
        the backend's reason, when the backend does not claim it (probing it first under
        ``--probe-unclaimed``); warm the backend up for its configuration."""
        case = spec.build().to(self.device)
        note(
            node,
            id=spec.id,
            family=family or spec.family,
            dtype=dtype_name(case.dtype, case.kv_dtype),
            operation=operation,
            configuration=case_configuration(case, operation),
        )
        if case.variants:
            note(node, variants=sorted(case.variants))
        reason = self.caps.case_reason(case, operation)
        if reason:
            note(node, reason=reason)
            if operation == "attention" and family is None and self.take_probe(reason):
                note(node, probe=self._probe(case))
            pytest.skip(f"unsupported: {reason}")
        if self.ahead is not None:
            # whether this process compiles beside the case: the report's owner words crashes by it
            node.user_properties.append((AHEAD_KEY, self.ahead.walking()))
            self.ahead.reached_case(spec, operation)
        self._warmup(case, operation)
        return case

    def _warmup(self, case: PagedCase, operation: str) -> None:
        """``backend.warmup(case)`` once per configuration (per child process under
        --isolate), before the case's own timed call: a JIT compile is not a hang."""
        if operation not in ("attention", "lse") or not isinstance(self.backend, SupportsWarmup):
            return
        # a warm-up is lost with the isolated child it ran in: key it by the child's generation
        generation = self.backend.generation if isinstance(self.backend, IsolatedBackend) else 0
        key = (generation, case_configuration(case, operation))
        if key not in self._warmed:
            self.call("warmup", case.clone())
            self._warmed.add(key)

    def _probe(self, case: PagedCase) -> str:
        """Run an unclaimed case anyway and say whether it would have passed."""
        try:
            check = check_attention(self.backend.paged_attention(case.clone()), case)
        except BaseException as exc:  # a probe never fails the run
            if passes_through(exc):
                raise
            return f"raises {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return "would pass" if check.passed else f"would fail (budget used {check.budget_used:.3g})"

    def fail(
        self, node: pytest.Item, spec: Any, case: PagedCase, message: str, operation: str, traceback: str = ""
    ) -> None:
        """Fail the case: save it for replay, record the message (``<id> [<operation>]:
        <what>``, then the replay command) and the traceback, and ``pytest.fail``."""
        family = noted(node).get("family", spec.family)
        name = spec.id if spec.id.startswith(family) else f"{family}-{spec.id}"
        prop = noted(node).get("property")
        name += ("" if operation == "attention" else f"-{operation}") + (f"-{prop}" if prop else "")
        replay = self.replays.save(case, name, id=spec.id, family=family, operation=operation)
        text = f"{spec.id} [{operation}]: {message}\n  replay: {replay}"
        note(node, replay=replay, message=text, traceback=traceback)
        pytest.fail(text + (f"\n{traceback}" if traceback and self.tb_long else ""), pytrace=False)

    def judge(
        self, node: pytest.Item, spec: Any, pristine: PagedCase, out: Any, operation: str = "attention"
    ) -> AttentionCheck:
        """Judge ``out`` against the oracle on ``pristine`` (an untouched copy of the case)."""
        check = check_attention(out, pristine, **self.policy(pristine))
        self.verdict(node, spec, pristine, [check], operation)
        return check

    def verdict(
        self,
        node: pytest.Item,
        spec: Any,
        pristine: PagedCase,
        verdicts: list[AttentionCheck],
        operation: str,
        **fields: Any,
    ) -> None:
        """Record the worst of ``verdicts`` (and ``fields``); fail with every failed one, or
        warn with the worst one in the warning band."""
        worst = max(verdicts, key=lambda c: (not c.passed, c.budget_used))
        status = "failed" if not all(c.passed for c in verdicts) else worst.status
        if status == "warned":  # the record says why; a passed case has no message
            fields.setdefault("message", str(worst))
        note(node, metrics=worst.metrics(), warned=status == "warned", **fields)
        if status == "failed":
            failed = "\n".join(str(c) for c in verdicts if not c.passed)
            self.fail(node, spec, pristine.to("cpu"), failed, operation)
        if status == "warned":
            warnings.warn(PagedAttnWarning(f"{spec.id}: {worst}"), stacklevel=3)

    # ------------------------------------------------------------ families
    @guarded
    def attention(self, node: pytest.Item, spec: Any) -> AttentionCheck:
        """The family check: the output is within the policy's bound of the oracle."""
        case = self.start(node, spec, "attention")
        pristine = case.clone()  # judged on an untouched copy, whatever the backend does
        out = self.call("paged_attention", case)
        return self.judge(node, spec, pristine, out)

    @guarded
    def attention_lse(self, node: pytest.Item, spec: Any) -> tuple[AttentionCheck, AttentionCheck]:
        """The ``lse`` operation: the output and its log-sum-exp, each within its bound."""
        case = self.start(node, spec, "lse")
        pristine = case.clone()
        result = self.call("paged_attention_lse", case)
        if not (isinstance(result, tuple) and len(result) == 2):
            self.fail(
                node,
                spec,
                pristine.to("cpu"),
                f"paged_attention_lse must return (out, lse), got {type(result).__name__}",
                "lse",
            )
        out_check, lse_check = check_attention_lse(result[0], result[1], pristine, **self.policy(pristine))
        self.verdict(
            node,
            spec,
            pristine,
            [out_check, lse_check],
            "lse",
            checks={"output": out_check.metrics(), "lse": lse_check.metrics()},
        )
        return out_check, lse_check

    def _bit_verdict(self, node: pytest.Item, spec: Any, case: PagedCase, check: BitCheck, operation: str) -> None:
        note(node, metrics=check.metrics())
        if not check.passed:
            self.fail(node, spec, case.to("cpu"), str(check), operation)

    @guarded
    def gather(self, node: pytest.Item, spec: Any) -> None:
        """``gather(pool, slots)`` is bit-identical to ``pool[slots]`` for the K and V
        pools, over every history slot (shared blocks read twice), NaN payloads included."""
        case = self.start(node, spec, "gather")
        slots = torch.cat([case.slot_mapping(b) for b in range(case.num_seqs)])
        for name in ("key_cache", "value_cache"):
            pool = with_nan_payloads(getattr(case, name), slots)
            want = paged_gather(pool, slots)
            got = self.call("gather", pool.clone(), slots.clone())
            check = check_bitexact(got, want, f"gather of {name}")
            if not check.passed:
                return self._bit_verdict(node, spec, case, check, "gather")
        self._bit_verdict(node, spec, case, check, "gather")

    @guarded
    def cache_write(self, node: pytest.Item, spec: Any) -> None:
        """``write_cache(pool, slots, new)`` writes exactly ``new[i]`` at every slot >= 0,
        skips slots < 0, and leaves every other slot's bits untouched."""
        case = self.start(node, spec, "write_cache", family="cache_write")
        gen = torch.Generator().manual_seed(case_seed(spec.id, CACHE_WRITE_STREAM))
        pool = case.key_cache
        n_slots = pool.shape[0] * pool.shape[1]
        n = min(n_slots, 3 + n_slots // 3)
        slots = torch.randperm(n_slots, generator=gen)[:n]
        slots[::4] = -1  # skipped rows
        new = torch.randn(n, *pool.shape[2:], generator=gen).to(pool.dtype)
        new = with_nan_payloads(new.unsqueeze(1), torch.arange(n)).squeeze(1)
        slots, new = slots.to(self.device), new.to(self.device)
        want = pool.clone()
        keep = slots >= 0
        want.view(n_slots, *pool.shape[2:])[slots[keep]] = new[keep]
        got = pool.clone()
        new_copy = new.clone()
        self.call("write_cache", got, slots.clone(), new_copy)
        check = check_bitexact(got, want, "cache write")
        if check.passed and not bits_equal(new_copy, new):
            check = BitCheck(False, "cache write", problem="the backend modified its `new` argument")
        self._bit_verdict(node, spec, case, check, "write_cache")


def owned(result: Any) -> Any:
    """``result`` with every tensor (alone, or in a tuple or list) replaced by a copy: what a
    backend returns may be a view of a buffer it reuses and rewrites on its next call (a
    CUDA graph's static output), and a result kept across calls must not change under the
    suite. Anything else (a backend's wrong answer) as it is."""
    if isinstance(result, torch.Tensor):
        return result.clone()
    if type(result) in (tuple, list):
        return type(result)(owned(r) for r in result)
    return result


def with_nan_payloads(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """A copy of ``pool`` ``[num_blocks, block_size, ...]`` with a few used slots holding NaNs
    of unusual payloads, so that a gather that goes through float arithmetic (and
    canonicalizes NaNs) shows."""
    pool = pool.clone()
    flat = pool.view(pool.shape[0] * pool.shape[1], -1)
    bits = bits_view(flat)
    nan = {2: 0x7E01, 4: 0x7FC00101}[pool.element_size()] if pool.dtype != torch.bfloat16 else 0x7FC1
    for i, s in enumerate(slots[:: max(1, len(slots) // 3)][:3].tolist()):
        bits[s, i % bits.shape[1]] = nan + i
    return pool
