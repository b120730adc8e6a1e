"""What one conformance case does: build, ask the backend, judge, record.

The test modules in ``conformance/`` are thin: each hands its case spec to a
``Suite`` method. Results are attached to the test item (``user_properties``)
so they travel with pytest's reports, also from pytest-xdist workers.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from pagedattn.cases import save_case
from pagedattn.cases.spec import DTYPE_NAMES, KV_DTYPE_NAMES
from pagedattn.isolation import BackendFault, accepts_out, backend_files, describe_exception
from pagedattn.oracle import (
    PagedCase,
    bits_equal,
    check_attention,
    check_attention_lse,
    check_bitexact,
    paged_gather,
)
from pagedattn.oracle.bitexact import BitCheck, bits_dtype, bits_view
from pagedattn.oracle.case import FP8_DTYPES
from pagedattn.oracle.reference import index_rows
from pagedattn.oracle.verdict import AttentionCheck
from pagedattn.record import FACTS_KEY, note, noted

RECORD_KEY = FACTS_KEY
# the suite attaches facts; the RecordBook (pagedattn.record) decides each case's status
record = note
recorded = noted

#: a NaN whose payload no arithmetic produces, per element size: ``out=`` is filled with it
#: so that "never written" (still this payload) differs from "written with a NaN"
OUT_SENTINEL = {torch.float32: 0x7FC0BEEF, torch.float16: 0x7E5A, torch.bfloat16: 0x7FDA}


def guarded(method):
    """A backend fault (a crash, a hang, an exception) fails the case with a short message
    (what happened; for an exception its type, message and the last frame in the
    backend's file), a replay file and command, and the full traceback in the record."""

    @functools.wraps(method)
    def wrapper(self, node, spec, *args, **kwargs):
        try:
            return method(self, node, spec, *args, **kwargs)
        except BackendFault as exc:
            fault = exc
        if fault.kind in ("crashed", "timed_out"):
            note(node, fault=fault.kind)
        operation = noted(node).get("operation", "attention")
        self._fail(node, spec, spec.build(), str(fault), operation, traceback=fault.traceback)

    return wrapper


class PagedAttnWarning(UserWarning):
    """A case landed in the policy's warning band."""


def dtype_name(dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> str:
    """``bf16``; with an fp8 cache, the query and cache dtypes: ``bf16/e4m3``."""
    name = DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))
    if kv_dtype is not None and kv_dtype != dtype:
        name += "/" + KV_DTYPE_NAMES.get(kv_dtype, str(kv_dtype).replace("torch.", ""))
    return name


def configuration(dtype: torch.dtype, kv_dtype: torch.dtype | None, head_dim: int, block_size: int,
                  variants: frozenset[str] | set[str], operation: str) -> str:  # fmt: skip
    """The compile key of a case: what a JIT backend specializes on, e.g.
    ``bf16|kv=bf16|d128|bs16|sinks+sliding_window|attention``. Cases are ordered by it and,
    under pytest-xdist (``--dist loadgroup``), each key runs on one worker."""
    q = DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))
    kv = q if kv_dtype is None or kv_dtype == dtype else KV_DTYPE_NAMES.get(kv_dtype, str(kv_dtype))
    var = "+".join(sorted(variants)) or "plain"
    return f"{q}|kv={kv}|d{head_dim}|bs{block_size}|{var}|{operation}"


def case_configuration(case: PagedCase, operation: str) -> str:
    return configuration(case.dtype, case.kv_dtype, case.head_dim, case.block_size, case.variants, operation)


def spec_configuration(spec, operation: str) -> str:
    """``configuration`` of a grid spec without building it (a saved case is built)."""
    if not hasattr(spec, "head_dim"):
        return case_configuration(spec.build(), operation)
    variants = {v for v, on in (("sliding_window", spec.sliding_window is not None),
                                ("logits_soft_cap", spec.soft_cap is not None),
                                ("alibi", spec.alibi), ("sinks", spec.sinks)) if on}  # fmt: skip
    if spec.kv_dtype is not None:
        variants.add(FP8_DTYPES[spec.kv_dtype])
    return configuration(spec.dtype, spec.kv_dtype, spec.head_dim, spec.block_size, variants, operation)


@dataclass
class Suite:
    """The run's state: the backend under test and where and how to run it."""

    backend: Any
    backend_spec: str
    device: str
    profile: str
    replay_dir: str
    suite_path: str = "conformance"
    extra_args: list[str] = field(default_factory=list)
    probe_unclaimed: int = 0  # how many unclaimed cases per reason to run anyway
    tb_long: bool = False  # --tb=long: failure messages carry the backend's full traceback
    _probed: dict = field(default_factory=dict)
    _warmed: set = field(default_factory=set)

    @property
    def caps(self):
        return self.backend.capabilities

    @property
    def policy(self) -> dict[str, Any]:
        """The backend's declared policy terms, as keyword arguments of the checks."""
        caps = self.caps
        return {"precision": caps.fp32_precision, "qk_precision": caps.qk_precision,
                "tolerance_factor": caps.tolerance_factor}  # fmt: skip

    # ------------------------------------------------------------- plumbing
    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``backend.<method>(*args, **kwargs)``; an exception it raises becomes a
        ``BackendFault`` of kind ``"raised"`` (short message, full traceback). A
        ``pytest.skip`` it raises passes through: the case is unsupported, with its reason."""
        try:
            return getattr(self.backend, method)(*args, **kwargs)
        except BackendFault:
            raise
        except Exception as exc:
            short, full = describe_exception(exc, backend_files(self.backend))
            raise BackendFault(short, kind="raised", traceback=full) from None

    def _start(self, node: pytest.Item, spec, operation: str, family: str | None = None) -> PagedCase:
        case = spec.build().to(self.device)
        note(node, id=spec.id, family=family or spec.family, dtype=dtype_name(case.dtype, case.kv_dtype),
             operation=operation, configuration=case_configuration(case, operation))  # fmt: skip
        if case.variants:
            note(node, variants=sorted(case.variants))
        reason = self.caps.case_reason(case, operation)
        if reason:
            note(node, reason=reason)
            if operation == "attention" and family is None and self._probed.get(reason, 0) < self.probe_unclaimed:
                self._probed[reason] = self._probed.get(reason, 0) + 1
                note(node, probe=self._probe(case))
            pytest.skip(f"unsupported: {reason}")
        self._warmup(case, operation)
        return case

    def _warmup(self, case: PagedCase, operation: str) -> None:
        """``backend.warmup(case)`` once per configuration (per child process under
        --isolate), before the case's own timed call: a JIT compile is not a hang."""
        if operation not in ("attention", "lse") or not callable(getattr(self.backend, "warmup", None)):
            return
        key = (getattr(self.backend, "generation", 0), case_configuration(case, operation))
        if key not in self._warmed:
            self.call("warmup", case.clone())
            self._warmed.add(key)

    def _probe(self, case: PagedCase) -> str:
        """Run an unclaimed case anyway and say whether it would have passed."""
        try:
            check = check_attention(self.backend.paged_attention(case.clone()), case)
        except Exception as exc:  # a probe never fails the run
            return f"raises {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return "would pass" if check.passed else f"would fail (budget used {check.budget_used:.3g})"

    def replay_command(self, path: str) -> str:
        args = [
            "pytest",
            self.suite_path,
            f"--backend={self.backend_spec}",
            f"--device={self.device}",
            "--replay",
            path,
        ] + self.extra_args
        return " ".join(shlex.quote(a) for a in args)

    def save_replay(self, case: PagedCase, name: str, **meta: Any) -> str:
        """Save ``case`` under the replay directory as ``name``; the command that replays it."""
        name = re.sub(r"[^A-Za-z0-9_.+-]", "_", name)
        path = os.path.join(self.replay_dir, f"{name}.pt")
        save_case(case.to("cpu"), path, **meta)
        rel = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
        return self.replay_command(rel)

    def failure_message(self, case_id: str, operation: str, message: str, replay: str | None) -> str:
        """The one shape of every family's failure message: ``<id> [<operation>]: <what>``,
        then the replay command."""
        return f"{case_id} [{operation}]: {message}" + (f"\n  replay: {replay}" if replay else "")

    def _fail(self, node: pytest.Item, spec, case: PagedCase, message: str, operation: str,
              traceback: str = "") -> None:  # fmt: skip
        family = noted(node).get("family", spec.family)
        name = spec.id if spec.id.startswith(family) else f"{family}-{spec.id}"
        prop = noted(node).get("property")
        name += ("" if operation == "attention" else f"-{operation}") + (f"-{prop}" if prop else "")
        replay = self.save_replay(case, name, id=spec.id, family=family, operation=operation)
        text = self.failure_message(spec.id, operation, message, replay)
        note(node, replay=replay, message=text, traceback=traceback)
        pytest.fail(text + (f"\n{traceback}" if traceback and self.tb_long else ""), pytrace=False)

    def _judge(self, node, spec, pristine: PagedCase, out, operation: str = "attention") -> AttentionCheck:
        check = check_attention(out, pristine, **self.policy)
        self._verdict(node, spec, pristine, [check], operation)
        return check

    def _verdict(self, node, spec, pristine: PagedCase, verdicts: list[AttentionCheck], operation: str,
                 **fields: Any) -> None:  # fmt: skip
        """Record the worst of ``verdicts`` (and ``fields``); fail with every failed one, or
        warn with the worst one in the warning band."""
        worst = max(verdicts, key=lambda c: (not c.passed, c.budget_used))
        status = "failed" if not all(c.passed for c in verdicts) else worst.status
        note(node, metrics=worst.metrics(), warned=status == "warned", **fields)
        if status == "failed":
            failed = "\n".join(str(c) for c in verdicts if not c.passed)
            self._fail(node, spec, pristine.to("cpu"), failed, operation)
        if status == "warned":
            warnings.warn(PagedAttnWarning(f"{spec.id}: {worst}"), stacklevel=3)

    # ------------------------------------------------------------ families
    @guarded
    def attention(self, node: pytest.Item, spec) -> AttentionCheck:
        """The family check: the output is within the policy's bound of the oracle."""
        case = self._start(node, spec, "attention")
        pristine = case.clone()  # judged on an untouched copy, whatever the backend does
        out = self.call("paged_attention", case)
        return self._judge(node, spec, pristine, out)

    @guarded
    def attention_lse(self, node: pytest.Item, spec) -> tuple[AttentionCheck, AttentionCheck]:
        """The ``lse`` operation: the output and its log-sum-exp, each within its bound."""
        case = self._start(node, spec, "lse")
        pristine = case.clone()
        result = self.call("paged_attention_lse", case)
        if not (isinstance(result, tuple) and len(result) == 2):
            self._fail(node, spec, pristine.to("cpu"), f"paged_attention_lse must return (out, lse), got "
                       f"{type(result).__name__}", "lse")  # fmt: skip
        out_check, lse_check = check_attention_lse(result[0], result[1], pristine, **self.policy)
        self._verdict(node, spec, pristine, [out_check, lse_check], "lse",
                      checks={"output": out_check.metrics(), "lse": lse_check.metrics()})  # fmt: skip
        return out_check, lse_check

    def _bit_verdict(self, node, spec, case, check: BitCheck, operation: str) -> None:
        note(node, metrics=check.metrics())
        if not check.passed:
            self._fail(node, spec, case.to("cpu"), str(check), operation)

    @guarded
    def gather(self, node: pytest.Item, spec) -> None:
        """``gather(pool, slots)`` is bit-identical to ``pool[slots]`` for the K and V
        pools, over every history slot (shared blocks read twice), NaN payloads included."""
        case = self._start(node, spec, "gather")
        slots = torch.cat([case.slot_mapping(b) for b in range(case.num_seqs)])
        for name in ("key_cache", "value_cache"):
            pool = _with_nan_payloads(getattr(case, name), slots)
            want = paged_gather(pool, slots)
            got = self.call("gather", pool.clone(), slots.clone())
            check = check_bitexact(got, want, f"gather of {name}")
            if not check.passed:
                return self._bit_verdict(node, spec, case, check, "gather")
        self._bit_verdict(node, spec, case, check, "gather")

    @guarded
    def cache_write(self, node: pytest.Item, spec) -> None:
        """``write_cache(pool, slots, new)`` writes exactly ``new[i]`` at every slot >= 0,
        skips slots < 0, and leaves every other slot's bits untouched."""
        case = self._start(node, spec, "write_cache", family="cache_write")
        gen = torch.Generator().manual_seed(len(spec.id))
        pool = case.key_cache
        n_slots = pool.shape[0] * pool.shape[1]
        n = min(n_slots, 3 + n_slots // 3)
        slots = torch.randperm(n_slots, generator=gen)[:n]
        slots[::4] = -1  # skipped rows
        new = torch.randn(n, *pool.shape[2:], generator=gen).to(pool.dtype)
        new = _with_nan_payloads(new.unsqueeze(1), torch.arange(n)).squeeze(1)
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

    # ---------------------------------------------------------- properties
    def _call(self, case: PagedCase) -> torch.Tensor:
        return self.call("paged_attention", case)

    def _valid(self, node: pytest.Item | None, case: PagedCase, out: Any, what: str) -> str:
        """Why ``out`` is not a valid answer to ``case`` (shape, dtype, device, non-finite
        where the oracle is finite), or ``""``. Properties judge validity first: a backend
        whose outputs are invalid never passes by being invalid the same way twice."""
        check = check_attention(out, case, **self.policy)
        if check.problem or check.num_nonfinite:
            if node is not None:
                note(node, metrics=check.metrics())
            return f"{what}: {check}"
        return ""

    def _property(self, node, spec, prop: str) -> PagedCase:
        note(node, property=prop)
        case = self._start(node, spec, "attention", family="properties")
        return case

    def _property_verdict(self, node, spec, case, problem: str) -> None:
        if problem:
            self._fail(node, spec, case.to("cpu"), problem, "attention")

    def _invariance(self, node, spec, prop: str, check) -> None:
        """An invariance property: unsupported with the backend's reason where it declines
        the claim (``Capabilities.invariance_reason``), run anyway under
        ``--probe-unclaimed``; else ``check(node, case)`` (a problem, or ``""``) decides."""
        case = self._property(node, spec, prop)
        why = getattr(self.caps, "invariance_reason", None)
        reason = why(prop) if callable(why) else None
        if reason:
            note(node, reason=reason)
            if self._probed.get(reason, 0) < self.probe_unclaimed:
                self._probed[reason] = self._probed.get(reason, 0) + 1
                try:
                    problem = check(None, case)
                    verdict = "would hold" if not problem else f"would not hold: {problem.splitlines()[0]}"
                except BackendFault as exc:
                    verdict = f"could not be probed: {str(exc).splitlines()[0]}"
                note(node, probe=verdict)
            pytest.skip(f"unsupported: {reason}")
        self._property_verdict(node, spec, case, check(node, case))

    def _check_determinism(self, node: pytest.Item | None, case: PagedCase) -> str:
        a = self._call(case.clone())
        b = self._call(case.clone())
        invalid = self._valid(node, case, a, "determinism") or self._valid(node, case, b, "determinism")
        if invalid:
            return invalid
        return "" if bits_equal(a, b) else "determinism: the same input twice gave different bits"

    def _check_batch_invariance(self, node: pytest.Item | None, case: PagedCase) -> str:
        whole = self._call(case.clone())
        invalid = self._valid(node, case, whole, "batch invariance (whole batch)")
        if invalid:
            return invalid
        loc = case.query_start_loc_list
        for b in range(case.num_seqs):
            one = single_sequence(case, b)
            alone = self._call(one.clone())
            invalid = self._valid(node, one, alone, f"batch invariance (sequence {b} alone)")
            if invalid:
                return invalid
            if not bits_equal(alone, whole[loc[b] : loc[b + 1]]):
                return f"batch invariance: sequence {b} alone differs in its bits from the same sequence in the batch"
        return ""

    def _check_placement_invariance(self, node: pytest.Item | None, case: PagedCase, seed: int = 0) -> str:
        moved = permute_blocks(case, seed=seed)
        a, b = self._call(case.clone()), self._call(moved.clone())
        invalid = self._valid(node, case, a, "placement invariance") or self._valid(
            node, moved, b, "placement invariance"
        )
        if invalid:
            return invalid
        return "" if bits_equal(a, b) else "placement invariance: permuting the physical blocks changed the output bits"

    @guarded
    def determinism(self, node, spec) -> None:
        self._invariance(node, spec, "determinism", self._check_determinism)

    @guarded
    def batch_invariance(self, node, spec) -> None:
        self._invariance(node, spec, "batch_invariance", self._check_batch_invariance)

    @guarded
    def placement_invariance(self, node, spec) -> None:
        seed = len(spec.id)
        self._invariance(node, spec, "placement_invariance",
                         lambda n, case: self._check_placement_invariance(n, case, seed))  # fmt: skip

    @guarded
    def immutability(self, node, spec) -> None:
        case = self._property(node, spec, "immutability")
        before = case.clone()
        out = self._call(case)
        changed = [f for f, t in case.tensors().items() if not bits_equal(t, getattr(before, f))]
        problem = f"input immutability: the backend modified {', '.join(changed)}" if changed else ""
        self._property_verdict(node, spec, before, problem or self._valid(node, before, out, "input immutability"))

    @guarded
    def poisoned_padding(self, node, spec) -> None:
        case = self._property(node, spec, "poisoned_padding")
        if not bool(torch.isnan(case.key_cache.float()).any()):
            raise AssertionError(f"{spec.id}: a poisoned-padding case must carry NaN poison")
        self._judge(node, spec, case.clone(), self._call(case))

    @guarded
    def out_argument(self, node, spec) -> None:
        """``paged_attention(case, out=buf)`` writes every element of ``buf``. ``buf`` starts
        as a NaN of a payload no arithmetic produces: an element still holding it was never
        written; a NaN written there is a non-finite output, judged as such."""
        case = self._property(node, spec, "out_argument")
        if not accepts_out(self.backend):
            note(node, reason="paged_attention takes no out= argument")
            pytest.skip("unsupported: paged_attention takes no out= argument")
        out = _sentinel_filled((case.num_tokens, case.num_heads, case.head_dim), case.dtype, case.device)
        got = self.call("paged_attention", case.clone(), out=out)
        if got is not None and (not isinstance(got, torch.Tensor) or got.data_ptr() != out.data_ptr()):
            return self._property_verdict(node, spec, case, "out=: the result was not written into `out`")
        unwritten = int(_is_sentinel(out).sum())
        if unwritten:
            return self._property_verdict(
                node, spec, case, f"out=: {unwritten} of {out.numel()} elements of `out` were never written "
                "(they still hold the sentinel NaN the suite filled it with)"
            )  # fmt: skip
        self._judge(node, spec, case.clone(), out)


def _sentinel_filled(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """A tensor of ``shape`` whose every element is ``OUT_SENTINEL``'s NaN."""
    return torch.full(shape, OUT_SENTINEL[dtype], dtype=bits_dtype(dtype), device=device).view(dtype)


def _is_sentinel(t: torch.Tensor) -> torch.Tensor:
    return bits_view(t) == OUT_SENTINEL[t.dtype]


def _with_nan_payloads(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """A copy of ``pool`` with a few used slots holding NaNs of unusual payloads, so that
    a gather that goes through float arithmetic (and canonicalizes NaNs) shows."""
    pool = pool.clone()
    flat = pool.view(pool.shape[0] * pool.shape[1], -1)
    bits = bits_view(flat)
    nan = {2: 0x7E01, 4: 0x7FC00101}[pool.element_size()] if pool.dtype != torch.bfloat16 else 0x7FC1
    for i, s in enumerate(slots[:: max(1, len(slots) // 3)][:3].tolist()):
        bits[s, i % bits.shape[1]] = nan + i
    return pool


def single_sequence(case: PagedCase, b: int) -> PagedCase:
    """Sequence ``b`` of ``case`` as a batch of one, over the same cache."""
    loc = case.query_start_loc_list
    return case.replace(
        query=case.query[loc[b] : loc[b + 1]].clone(),
        key_cache=case.key_cache.clone(),
        value_cache=case.value_cache.clone(),
        block_tables=case.block_tables[b : b + 1].clone(),
        seq_lens=case.seq_lens[b : b + 1].clone(),
        query_start_loc=torch.tensor([0, loc[b + 1] - loc[b]], dtype=torch.int32, device=case.device),
    )


def permute_blocks(case: PagedCase, seed: int = 0) -> PagedCase:
    """The same problem with the physical blocks shuffled and the tables remapped."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(case.num_blocks, generator=gen).to(case.device)  # new[i] = old[perm[i]]
    inv = torch.argsort(perm)
    return case.replace(
        key_cache=index_rows(case.key_cache, perm).clone(),
        value_cache=index_rows(case.value_cache, perm).clone(),
        block_tables=inv[case.block_tables.long()].to(torch.int32),
    )
