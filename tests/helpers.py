"""Shared helpers for the project's own tests: small case builders and naive references."""

from __future__ import annotations

import importlib
import math
import os

import pytest
import torch

from pagedattn.cases import grid
from pagedattn.oracle import PagedCase
from pagedattn.verdict_kernel import triton_problem

#: What a conformance session imports (the plugin's hooks import most of it lazily).
SESSION_MODULES = (
    "pagedattn.adapters.loading",
    "pagedattn.runner.record_book",
    "pagedattn.runner.collection",
    "pagedattn.runner.faults",
    "pagedattn.runner.isolation",
    "pagedattn.runner.properties",
    "pagedattn.runner.recording",
    "pagedattn.runner.replay",
    "pagedattn.runner.report",
    "pagedattn.runner.suite",
)


def import_session_modules() -> None:
    """Imports what a conformance session imports, for a test module that runs the suite in
    process (``pytester.runpytest_inprocess``). pytester drops the modules a test imported
    when it ends, so without this the next run imports some of them again: a second
    ``Capabilities`` class, which the modules that stayed reject ("capabilities must be a
    pagedattn.Capabilities, got Capabilities")."""
    for name in SESSION_MODULES:
        importlib.import_module(name)


#: what xdist tells its workers: a run made in process by a test on a worker must not see
#: them (the suite would take itself for worker gw0 and record that in its report)
XDIST_VARIABLES = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


def run_inprocess(pytester, *args):
    """``pytester.runpytest_inprocess(*args)`` with xdist's worker variables hidden."""
    saved = {k: os.environ.pop(k) for k in XDIST_VARIABLES if k in os.environ}
    try:
        return pytester.runpytest_inprocess(*args)
    finally:
        os.environ.update(saved)


# what the quick decode family holds, so expectations about suite runs follow the grid
QUICK_DECODE = grid("quick", "decode")
N_DECODE = len(QUICK_DECODE)
N_DECODE_FP32 = sum(s.dtype == torch.float32 for s in QUICK_DECODE)
N_SINGLE = sum(len(s.seqs) == 1 for s in QUICK_DECODE)  # single-sequence cases


def _head_scale(scale, kv_head: int) -> float:
    """An fp8 scale for one kv head: a float as it is, a per-head tensor's entry."""
    return float(scale[kv_head]) if isinstance(scale, torch.Tensor) else scale


def naive_attention(case: PagedCase, return_lse: bool = False):
    """An independent float64 reference: one loop per query token and head, reading the
    cache block by block through the table, written without the oracle's helpers.

    Variants, written from their definitions: keys dequantized (``* k_scale``, the kv
    head's own where the scales are per head), the
    score capped (``c * tanh(s / c)``), ALiBi added (``slope * (j - p)``), only keys in
    ``(p - W, p]`` visited, the sink's ``exp`` added to the denominator; under a tree mask a new
    key visited only where the sequence's block of the flat mask (after the earlier sequences'
    ``q * q`` entries) says so; values as wide as ``value_cache``. With ``return_lse``, also
    ``[T, Hq]`` float64: ``log`` of the denominator.
    """
    q_all = case.query.double()
    out = torch.zeros(case.num_tokens, case.num_heads, case.value_cache.shape[3], dtype=torch.float64)
    lse = torch.zeros(case.num_tokens, case.num_heads, dtype=torch.float64)
    loc = case.query_start_loc.tolist()
    lens = case.seq_lens.tolist()
    bs = case.key_cache.shape[1]
    group = case.num_heads // case.key_cache.shape[2]
    window = case.sliding_window
    mask_start = 0
    for b in range(len(lens)):
        n_new = loc[b + 1] - loc[b]
        context = lens[b] - n_new
        for i in range(n_new):
            pos = lens[b] - n_new + i
            first = 0 if window is None else max(0, pos - window + 1)
            for h in range(case.num_heads):
                kvh = h // group
                scores, values = [], []
                for j in range(first, pos + 1):
                    if case.tree_mask is not None and j >= context:
                        if not bool(case.tree_mask[mask_start + i * n_new + (j - context)]):
                            continue
                    blk = int(case.block_tables[b, j // bs])
                    kj = case.key_cache[blk, j % bs, kvh].double() * _head_scale(case.k_scale, kvh)
                    values.append(case.value_cache[blk, j % bs, kvh].double() * _head_scale(case.v_scale, kvh))
                    sc = float(torch.dot(q_all[loc[b] + i, h], kj)) * case.scale
                    if case.logits_soft_cap is not None:
                        sc = case.logits_soft_cap * math.tanh(sc / case.logits_soft_cap)
                    if case.alibi_slopes is not None:
                        sc += float(case.alibi_slopes[h]) * (j - pos)
                    scores.append(sc)
                sink = float(case.sinks[h]) if case.sinks is not None else None
                m = max(scores + ([sink] if sink is not None else []))
                w = [math.exp(s - m) for s in scores]
                tot = math.fsum(w) + (math.exp(sink - m) if sink is not None else 0.0)
                acc = torch.zeros(out.shape[2], dtype=torch.float64)
                for wj, vj in zip(w, values):
                    acc += (wj / tot) * vj
                out[loc[b] + i, h] = acc
                lse[loc[b] + i, h] = m + math.log(tot)
        mask_start += n_new * n_new
    return (out, lse) if return_lse else out


def make_case(
    seqs,
    *,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    block_size=2,
    dtype=torch.float64,
    scale=None,
    seed=0,
    extra_blocks=1,
) -> PagedCase:
    """A small case with blocks in order and one spare block; ``seqs`` as ``[(seq_len, q_len)]``."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-s // block_size) for s, _ in seqs]
    N = sum(need) + extra_blocks
    width = max(need) + 1
    tables = torch.full((len(seqs), width), N - 1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(need):
        tables[b, :n] = torch.arange(start, start + n, dtype=torch.int32)
        start += n
    qlens = [q for _, q in seqs]
    return PagedCase(
        query=torch.randn(sum(qlens), num_heads, head_dim, generator=g).to(dtype),
        key_cache=torch.randn(N, block_size, num_kv_heads, head_dim, generator=g).to(dtype),
        value_cache=torch.randn(N, block_size, num_kv_heads, head_dim, generator=g).to(dtype),
        block_tables=tables,
        seq_lens=torch.tensor([s for s, _ in seqs], dtype=torch.int32),
        query_start_loc=torch.tensor([0] + qlens).cumsum(0).to(torch.int32),
        scale=scale,
    )


def searched(run) -> None:
    """``run.run()`` of a ``pagedattn.runner.search.SearchRun``, where a skip (the item unsupported or not
    run) fails the test: a test that expects a verdict must not pass by skipping (and
    ``pytest.raises`` of a failure lets a skip through)."""
    try:
        run.run()
    except pytest.skip.Exception as exc:
        raise AssertionError(f"the search item was skipped: {exc}") from None


#: tests that run the GPU verdict kernels (under the Triton interpreter here) need a Triton that
#: runs them; elsewhere the check takes its torch path, which the other tests cover
needs_verdict_kernel = pytest.mark.skipif(
    bool(triton_problem()), reason=f"the GPU verdict kernel cannot run here: {triton_problem()}"
)


def require_verdict_kernel() -> None:
    """Skip the calling test (or parameter) that runs the GPU verdict kernel where it cannot run."""
    if triton_problem():
        pytest.skip(f"the GPU verdict kernel cannot run here: {triton_problem()}")
