"""What one conformance case does: build, ask the backend, judge, record.

The test modules in ``conformance/`` are thin: each hands its case spec to a
``Suite`` method. Results are attached to the test item (``user_properties``)
so they travel with pytest's reports, also from pytest-xdist workers.
"""

from __future__ import annotations

import functools
import inspect
import math
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
from pagedattn.isolation import BackendFault
from pagedattn.oracle import (
    PagedCase,
    bits_equal,
    check_attention,
    check_attention_lse,
    check_bitexact,
    paged_gather,
)
from pagedattn.oracle.policy import AttentionCheck, BitCheck
from pagedattn.oracle.reference import index_rows

RECORD_KEY = "pagedattn"


def guarded(method):
    """A backend fault (crash, hang, exception in an isolated child) fails the case with
    what happened and a replay line, instead of a traceback into our own code."""

    @functools.wraps(method)
    def wrapper(self, node, spec, *args, **kwargs):
        try:
            return method(self, node, spec, *args, **kwargs)
        except BackendFault as exc:
            fault = exc
        self._fail(node, spec, spec.build(), f"backend fault: {fault}", "attention")

    return wrapper


class PagedAttnWarning(UserWarning):
    """A case landed in the policy's warning band."""


def _clean(x: Any) -> Any:
    """JSON- and execnet-safe: non-finite floats become strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def recorded(node: pytest.Item) -> dict[str, Any]:
    """This case's result as attached so far (empty if none)."""
    for key, value in node.user_properties:
        if key == RECORD_KEY and isinstance(value, dict):
            return value
    return {}


def record(node: pytest.Item, **fields: Any) -> None:
    """Attach (or update) this case's result on the test item."""
    props = dict(recorded(node))
    props.update(_clean(fields))
    node.user_properties[:] = [(k, v) for k, v in node.user_properties if k != RECORD_KEY]
    node.user_properties.append((RECORD_KEY, props))


def dtype_name(dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> str:
    """``bf16``; with an fp8 cache, the query and cache dtypes: ``bf16/e4m3``."""
    name = DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))
    if kv_dtype is not None and kv_dtype != dtype:
        name += "/" + KV_DTYPE_NAMES.get(kv_dtype, str(kv_dtype).replace("torch.", ""))
    return name


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
    _probed: dict = field(default_factory=dict)

    @property
    def caps(self):
        return self.backend.capabilities

    @property
    def policy(self) -> dict[str, Any]:
        """The backend's declared policy terms, as keyword arguments of the checks."""
        return dict(precision=self.caps.fp32_precision, tolerance_factor=self.caps.tolerance_factor)

    # ------------------------------------------------------------- plumbing
    def _start(self, node: pytest.Item, spec, operation: str, family: str | None = None) -> PagedCase:
        case = spec.build().to(self.device)
        record(
            node,
            id=spec.id,
            family=family or spec.family,
            dtype=dtype_name(case.dtype, case.kv_dtype),
            operation=operation,
            status="error",  # replaced once the backend has answered
        )
        if case.variants:
            record(node, variants=sorted(case.variants))
        reason = self.caps.case_reason(case, operation)
        if reason:
            record(node, status="unsupported", reason=reason)
            if operation == "attention" and family is None and self._probed.get(reason, 0) < self.probe_unclaimed:
                self._probed[reason] = self._probed.get(reason, 0) + 1
                record(node, probe=self._probe(case))
            pytest.skip(f"unsupported: {reason}")
        return case

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

    def _fail(self, node: pytest.Item, spec, case: PagedCase, message: str, operation: str) -> None:
        family = recorded(node).get("family", spec.family)
        name = spec.id if spec.id.startswith(family) else f"{family}-{spec.id}"
        name = re.sub(r"[^A-Za-z0-9_.+-]", "_", name + ("" if operation == "attention" else f"-{operation}"))
        path = os.path.join(self.replay_dir, f"{name}.pt")
        save_case(case, path, id=spec.id, family=family, operation=operation)
        rel = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
        replay = self.replay_command(rel)
        record(node, replay=replay)
        pytest.fail(f"{spec.id} [{operation}]: {message}\n  replay: {replay}", pytrace=False)

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
        record(node, status=status, metrics=worst.metrics(), **fields)
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
        out = self.backend.paged_attention(case)
        return self._judge(node, spec, pristine, out)

    @guarded
    def attention_lse(self, node: pytest.Item, spec) -> tuple[AttentionCheck, AttentionCheck]:
        """The ``lse`` operation: the output and its log-sum-exp, each within its bound."""
        case = self._start(node, spec, "lse")
        pristine = case.clone()
        result = self.backend.paged_attention_lse(case)
        if not (isinstance(result, tuple) and len(result) == 2):
            record(node, status="failed")
            self._fail(node, spec, pristine.to("cpu"), f"paged_attention_lse must return (out, lse), got "
                       f"{type(result).__name__}", "lse")  # fmt: skip
        out_check, lse_check = check_attention_lse(result[0], result[1], pristine, **self.policy)
        self._verdict(node, spec, pristine, [out_check, lse_check], "lse",
                      checks={"output": out_check.metrics(), "lse": lse_check.metrics()})  # fmt: skip
        return out_check, lse_check

    def _bit_verdict(self, node, spec, case, check: BitCheck, operation: str) -> None:
        record(node, status=check.status, metrics=check.metrics())
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
            got = self.backend.gather(pool.clone(), slots.clone())
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
        self.backend.write_cache(got, slots.clone(), new_copy)
        check = check_bitexact(got, want, "cache write")
        if check.passed and not bits_equal(new_copy, new):
            check = BitCheck(False, "cache write", problem="the backend modified its `new` argument")
        self._bit_verdict(node, spec, case, check, "write_cache")

    # ---------------------------------------------------------- properties
    def _call(self, case: PagedCase) -> torch.Tensor:
        return self.backend.paged_attention(case)

    def _property(self, node, spec, prop: str) -> PagedCase:
        case = self._start(node, spec, "attention", family="properties")
        record(node, property=prop)
        return case

    def _property_verdict(self, node, spec, case, ok: bool, message: str) -> None:
        record(node, status="passed" if ok else "failed")
        if not ok:
            self._fail(node, spec, case.to("cpu"), message, "attention")

    @guarded
    def determinism(self, node, spec) -> None:
        case = self._property(node, spec, "determinism")
        a, b = self._call(case.clone()), self._call(case.clone())
        self._property_verdict(
            node, spec, case, bits_equal(a, b), "determinism: the same input twice gave different bits"
        )

    @guarded
    def batch_invariance(self, node, spec) -> None:
        case = self._property(node, spec, "batch_invariance")
        whole = self._call(case.clone())
        loc = case.query_start_loc_list
        for b in range(case.num_seqs):
            alone = self._call(single_sequence(case, b))
            if not bits_equal(alone, whole[loc[b] : loc[b + 1]]):
                return self._property_verdict(
                    node,
                    spec,
                    case,
                    False,
                    f"batch invariance: sequence {b} alone differs in its bits from the same sequence in the batch",
                )
        self._property_verdict(node, spec, case, True, "")

    @guarded
    def placement_invariance(self, node, spec) -> None:
        case = self._property(node, spec, "placement_invariance")
        moved = permute_blocks(case, seed=len(spec.id))
        ok = bits_equal(self._call(case.clone()), self._call(moved))
        self._property_verdict(
            node, spec, case, ok, "placement invariance: permuting the physical blocks changed the output bits"
        )

    @guarded
    def immutability(self, node, spec) -> None:
        case = self._property(node, spec, "immutability")
        before = case.clone()
        self._call(case)
        changed = [f for f, t in case.tensors().items() if not bits_equal(t, getattr(before, f))]
        self._property_verdict(
            node, spec, before, not changed, f"input immutability: the backend modified {', '.join(changed)}"
        )

    @guarded
    def poisoned_padding(self, node, spec) -> None:
        case = self._property(node, spec, "poisoned_padding")
        if not bool(torch.isnan(case.key_cache.float()).any()):
            raise AssertionError(f"{spec.id}: a poisoned-padding case must carry NaN poison")
        self._judge(node, spec, case.clone(), self._call(case))

    @guarded
    def out_argument(self, node, spec) -> None:
        case = self._property(node, spec, "out_argument")
        accepts_out = getattr(self.backend, "accepts_out", None)
        if accepts_out is None:
            try:
                accepts_out = "out" in inspect.signature(self.backend.paged_attention).parameters
            except (TypeError, ValueError):
                accepts_out = False
        if not accepts_out:
            record(node, status="unsupported", reason="paged_attention takes no out= argument")
            pytest.skip("unsupported: paged_attention takes no out= argument")
        out = torch.full(
            (case.num_tokens, case.num_heads, case.head_dim), float("nan"), dtype=case.dtype, device=case.device
        )
        got = self.backend.paged_attention(case.clone(), out=out)
        unwritten = int(torch.isnan(out.float()).sum())
        if got is not None and got.data_ptr() != out.data_ptr():
            return self._property_verdict(node, spec, case, False, "out=: the result was not written into `out`")
        if unwritten:
            return self._property_verdict(
                node, spec, case, False, f"out=: {unwritten} elements of the NaN-filled `out` were never written"
            )
        self._judge(node, spec, case.clone(), out)


def _with_nan_payloads(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """A copy of ``pool`` with a few used slots holding NaNs of unusual payloads, so that
    a gather that goes through float arithmetic (and canonicalizes NaNs) shows."""
    pool = pool.clone()
    flat = pool.view(pool.shape[0] * pool.shape[1], -1)
    bits = flat.view({2: torch.int16, 4: torch.int32}[pool.element_size()])
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
