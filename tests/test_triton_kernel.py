"""The Triton kernel's numerics on the interpreter (or a GPU), judged by the oracle: every dtype,
the variants, the prefill's tiles, the addressing paths, ``out``, strided caches, compile-only."""

import dataclasses

import pytest
import torch

from pagedattn.cases import CaseSpec
from pagedattn.kernels import checks, launch_plan
from pagedattn.kernels.tuning import TUNING
from pagedattn.oracle import check_attention, check_attention_lse, paged_attention_reference_lse
from tests.asserts import assert_equal
from tests.triton_support import (
    DEVICE,
    KERNEL_CASES,
    attention,
    case_args,
    force_flat_grid,
    runs_kernel,
)

triton = pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")
from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402  (after the interpreter is decided)


@runs_kernel
@pytest.mark.parametrize("spec", KERNEL_CASES, ids=lambda s: s.id)
def test_kernel_within_policy(spec):
    case = spec.build().to(DEVICE)
    out = tpa.paged_attention(*case_args(case), scale=case.scale, k_scale=case.k_scale, v_scale=case.v_scale)
    check = check_attention(out, case)
    assert check.passed and not check.warning, str(check)


@runs_kernel
def test_lse_is_float32_natural_log_of_the_denominator():
    case = CaseSpec("t", ((40, 7), (30, 1)), num_heads=4, alibi_slopes=True).build().to(DEVICE)
    out, lse = tpa.paged_attention(*case_args(case), scale=case.scale, alibi_slopes=case.alibi_slopes, return_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == (case.num_tokens, case.num_heads)
    ref = paged_attention_reference_lse(case)[1]
    assert float((lse.double() - ref).abs().max()) < 1e-4  # natural log, not log2 (ln 2 apart)


#: prefills long enough that whole key tiles lie below the diagonal (the unmasked tiles),
#: several query tiles (the longest first), decodes ending in a partial tile; with sinks and
#: lse (both turn from base 2 to natural units), and with soft-cap + ALiBi (the scores are
#: scaled before the exponent there) over an fp8 cache with fp16 dots
PATH_CASES = [
    CaseSpec(
        "t",
        ((150, 40), (83, 1), (40, 9)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        block_size=8,
        sinks=True,
        layout="permuted",
        dtype=torch.float16,
    ),
    CaseSpec(
        "t",
        ((140, 35), (70, 1)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        logits_soft_cap=20.0,
        alibi_slopes=True,
        dtype=torch.bfloat16,
        kv_dtype=torch.float8_e4m3fn,
        k_scale=0.5,
        v_scale=2.0,
    ),
    CaseSpec(
        "t",
        ((150, 40), (83, 1)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        sliding_window=50,
        sinks=True,
        dtype=torch.float32,
    ),
]


def _assert_output_and_lse_within_policy(case, tuning=TUNING):
    """The kernel on ``case`` (under ``tuning``) with every variant the case carries, output and
    lse judged."""
    out, lse = attention(
        case,
        tuning,
        scale=case.scale,
        sliding_window=case.sliding_window,
        logits_soft_cap=case.logits_soft_cap,
        alibi_slopes=case.alibi_slopes,
        sinks=case.sinks,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
        return_lse=True,
    )
    c1, c2 = check_attention_lse(out, lse, case)
    assert c1.passed and c2.passed and not (c1.warning or c2.warning), f"{c1}\n{c2}"


@runs_kernel
@pytest.mark.parametrize("spec", PATH_CASES, ids=lambda s: s.id)
def test_prefill_tiles_within_policy(spec):
    """Small prefill tiles, so that a small case has several whole key tiles below the diagonal
    (taken without a mask) and several query tiles (the longest first)."""
    t = dataclasses.replace(TUNING, prefill_block_n=16, prefill_rows=32)
    case = spec.build().to(DEVICE)
    plan = launch_plan.plan_launch(
        case.seq_lens_list, case.query_lens, 4, 2, 32, spec.block_size, case.dtype, False, tuning=t
    )
    assert plan.other.grid[1] >= 2, "several query tiles"
    _assert_output_and_lse_within_policy(case, t)


def _int64_cache_offsets(monkeypatch):
    """Address the caches in int64, as a cache past 2**31 elements is (the query and output stay int32)."""
    monkeypatch.setattr(tpa, "fits_int32", lambda t: t.dim() != 4 and checks.fits_int32(t))


#: the addressing paths small cases do not take: int64 cache offsets (a cache past 2**31
#: elements), the decode grid on one axis (past 65535 sequences or split groups)
ADDRESSING_PATHS = {"int64-offsets": _int64_cache_offsets, "flat-decode-grid": force_flat_grid}


@runs_kernel
@pytest.mark.parametrize("path", sorted(ADDRESSING_PATHS))
@pytest.mark.parametrize("spec", PATH_CASES[:2], ids=lambda s: s.id)
def test_addressing_paths_within_policy(spec, path, monkeypatch):
    ADDRESSING_PATHS[path](monkeypatch)
    case = spec.build().to(DEVICE)
    _assert_output_and_lse_within_policy(case)


@runs_kernel
def test_fp32_takes_the_compiled_tiles_within_policy():
    """fp32 runs 16 x 16 tiles when compiled (``fp32_prefill_rows``, ``fp32_block_n``) but 32 x 32
    on the interpreter (``fp32_tile_interpreter``, for speed): the compiled shape, run here too."""
    t = dataclasses.replace(TUNING, fp32_tile_interpreter=TUNING.fp32_block_n)
    spec = PATH_CASES[-1]  # fp32, window, sinks; a prefill over several query tiles
    case = spec.build().to(DEVICE)
    plan = launch_plan.plan_launch(
        case.seq_lens_list, case.query_lens, 4, 2, 32, spec.block_size, case.dtype, True, tuning=t
    )
    assert plan.other.BLOCK_N == t.fp32_block_n == plan.decode.BLOCK_N and plan.other.rows == t.fp32_prefill_rows
    _assert_output_and_lse_within_policy(case, t)


@runs_kernel
def test_out_is_fully_written_and_returned():
    case = KERNEL_CASES[3].build().to(DEVICE)
    out = torch.full_like(case.query, float("nan"))
    got = tpa.paged_attention(*case_args(case), scale=case.scale, out=out)
    assert got is out, "paged_attention returned another tensor than the out it was given"
    assert not torch.isnan(out).any(), f"{KERNEL_CASES[3].id}: {int(out.isnan().sum())} elements of out left unwritten"


@runs_kernel
def test_noncontiguous_cache_strides_are_honoured():
    case = KERNEL_CASES[0].build().to(DEVICE)
    # a [N, 2, bs, Hkv, D] combined pool viewed as two strided caches (FlashInfer style)
    both = torch.stack([case.key_cache, case.value_cache], dim=1)
    k, v = both[:, 0], both[:, 1]
    assert not k.is_contiguous()
    out = tpa.paged_attention(case.query, k, v, case.block_tables, case.seq_lens, case.query_start_loc)
    check = check_attention(out, case)
    assert check.passed, f"{KERNEL_CASES[0].id} over strided caches: {check}"


@runs_kernel
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("return_lse", [False, True], ids=["attention", "lse"])
def test_compile_only_launches_nothing_and_compiles_what_the_launch_runs(return_lse, dtype):
    """``compile_only`` (the suite's warm-up ahead) writes nothing (bf16 on the interpreter
    included, where the kernel writes an fp32 copy); compiled, it fills the kernels' caches
    with exactly the specializations the launch then runs (no compile after it; GPU only).
    A head dim and block size no other test here uses: a fresh configuration."""
    spec = CaseSpec("t", ((37, 1), (29, 11)), num_heads=6, num_kv_heads=2, head_dim=40, block_size=7, dtype=dtype)
    case = spec.build().to(DEVICE)
    kernels = (tpa._decode_kernel, tpa._prefill_kernel)

    def compiled():
        return sum(len(caches[0]) for k in kernels for caches in getattr(k, "device_caches", {}).values())

    out = torch.full_like(case.query, float("nan"))
    before = compiled()
    kw = dict(scale=case.scale, return_lse=return_lse)
    result = tpa.paged_attention(*case_args(case), out=out, compile_only=True, **kw)
    assert (result[0] if return_lse else result) is out and torch.isnan(out).all(), "compile_only wrote the output"
    after = compiled()
    if not tpa.interpreter_active():
        assert after == before + 2, f"compile_only compiled {after - before} kernels, expected decode and prefill"
    result = tpa.paged_attention(*case_args(case), out=out, **kw)
    assert compiled() == after, "the launch compiled again: compile_only specialized differently"
    check = check_attention(result[0] if return_lse else result, case)
    assert check.passed and not check.warning, str(check)


@pytest.mark.skipif(
    DEVICE != "cuda",
    reason="CUDA graphs need a GPU; on the CPU, test_run_is_graph_capturable "
    "checks that run allocates nothing and reads nothing back",
)
def test_cuda_graph_replay_computes_what_run_computes():
    """``run`` captured once and replayed gives the eager bits, also after the query tensor
    is refilled (a new step through the same graph)."""
    spec = CaseSpec("t", ((3000, 1), (700, 1), (60, 9)), num_heads=8, dtype=torch.bfloat16, sinks=True)
    case = spec.build().to(DEVICE)
    prep = tpa.prepare(*case_args(case), scale=case.scale, sinks=case.sinks, return_lse=True)
    q, k, v = case.query, case.key_cache, case.value_cache
    out, lse = torch.empty_like(q), torch.empty(case.num_tokens, case.num_heads, device=DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile outside the capture
        tpa.run(prep, q, k, v, out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tpa.run(prep, q, k, v, out=out, lse=lse)
    for step in range(3):
        q.copy_(torch.randn_like(q) * (step + 1))
        want_out, want_lse = tpa.run(prep, q, k, v)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_equal(out, want_out, f"{spec.id}, step {step}: out of the graph's replay against run")
        assert_equal(lse, want_lse, f"{spec.id}, step {step}: lse of the graph's replay against run")
        assert int(prep.done.abs().sum()) == 0, f"step {step}: split counters left at {prep.done.tolist()}"
