"""The Triton kernel's host side around the launch: input checks before any launch, ``prepare``'s
plan and scratch, ``run``'s launches without a device sync, the fp8 widening's choice, the adapter."""

import pytest
import torch

from pagedattn.cases import CaseSpec
from pagedattn.kernels import checks, launch_plan
from tests.triton_support import (
    BASE,
    DEVICE,
    bad_args,
    case_args,
)

triton = pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")
from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402  (after the interpreter is decided)


def test_bad_variant_fails_before_any_launch(monkeypatch):
    monkeypatch.setattr(tpa, "plan_launch", lambda *a, **kw: pytest.fail("planned a launch for invalid input"))
    args = bad_args("query", lambda a: None)
    with pytest.raises(ValueError, match="sinks"):
        tpa.paged_attention(**args, sinks=torch.zeros(7))


@pytest.mark.parametrize("field", ["alibi_slopes", "sinks"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_slopes_and_sinks_fail_before_any_launch(monkeypatch, field, bad):
    # prepare() hands them to the core checks' one device-to-host transfer
    monkeypatch.setattr(tpa, "plan_launch", lambda *a, **kw: pytest.fail("planned a launch for invalid input"))
    args = bad_args("query", lambda a: None)
    values = torch.ones(args["query"].shape[1], dtype=torch.float32)
    values[-1] = bad
    with pytest.raises(ValueError, match=f"{field}: must be finite"):
        tpa.paged_attention(**args, **{field: values})


def test_scale_times_k_scale_must_stay_in_fp32_before_any_launch(monkeypatch):
    monkeypatch.setattr(tpa, "plan_launch", lambda *a, **kw: pytest.fail("planned a launch for invalid input"))
    args = bad_args("query", lambda a: None)
    with pytest.raises(ValueError, match="scale"):
        tpa.paged_attention(**args, scale=1e39)


def test_bad_input_fails_before_any_launch(monkeypatch):
    monkeypatch.setattr(tpa, "plan_launch", lambda *a, **kw: pytest.fail("planned a launch for invalid input"))
    args = bad_args("block_tables", lambda a: a["block_tables"].__setitem__((0, 0), 10**6))
    with pytest.raises(ValueError, match="block_tables"):
        tpa.paged_attention(**args)


def test_bad_scale_and_out():
    args = bad_args("query", lambda a: None)
    with pytest.raises(ValueError, match="scale"):
        checks.check_paged_inputs(**args, scale=-1.0)
    with pytest.raises(ValueError, match="out"):
        checks.check_paged_inputs(**args, out=torch.empty(3))


def test_prepare_plans_with_the_window(monkeypatch):
    """``prepare`` hands the sliding window to the plan: the decode launch's shape counts only
    the splits the new token sees (``decode_splits.decode_work``)."""
    seen = []
    real = tpa.plan_launch
    monkeypatch.setattr(tpa, "plan_launch", lambda *a, **kw: seen.append(a[9]) or real(*a, **kw))
    case = CaseSpec("t", ((140, 1), (33, 4)), num_heads=4, num_kv_heads=2, head_dim=32, block_size=8).build()
    case = case.to(DEVICE)
    tpa.prepare(*case_args(case), scale=case.scale, sliding_window=45)
    tpa.prepare(*case_args(case), scale=case.scale)
    assert seen == [45, None]


def test_cache_offsets_take_int32_only_when_every_offset_fits():
    """A cache is addressed in int32 only when its last element's offset is below 2**31
    (shapes on the meta device: no memory)."""
    fits = torch.empty(2**31 // (16 * 8 * 128), 16, 8, 128, device="meta")  # last offset 2**31 - 1
    assert checks.fits_int32(fits) and not checks.fits_int32(torch.empty(fits.shape[0] + 1, 16, 8, 128, device="meta"))
    # a head-major cache viewed as [N, bs, Hkv, D]: its last head starts at 7 * 2**29, past
    # 2**31, so it takes the int64 path, where the head term is widened too (it was not)
    heads_major = torch.empty(8, 2**21, 16, 16, device="meta").permute(1, 2, 0, 3)
    assert heads_major.stride(2) * 7 > 2**31 and not checks.fits_int32(heads_major)
    # through strides: one K of an [N, 2, bs, Hkv, D] pool reaches twice as far as its size says
    pool = torch.empty(2**30 // (16 * 8 * 128) + 1, 2, 16, 8, 128, device="meta")
    assert pool[:, 0].numel() < 2**31 and not checks.fits_int32(pool[:, 0])


class _Launch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args)`` records the call."""

    def __init__(self, calls, name):
        self.calls, self.name = calls, name

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.name, grid))


def _forbid(what):
    def fail(*a, **k):
        pytest.fail(f"run called {what}: a CUDA graph could not capture it")

    return fail


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_run_is_graph_capturable(dtype, monkeypatch):
    """Given out and lse, ``run`` allocates nothing and reads nothing back from the device:
    everything a replay needs was made by ``prepare``. One decode launch (the merge is
    folded in) and one prefill launch."""
    case = CaseSpec("t", ((70, 1), (33, 9)), dtype=dtype).build().to(DEVICE)  # prepare refuses CPU tensors on a GPU
    prep = tpa.prepare(*case_args(case), scale=case.scale, return_lse=True)
    out, lse = torch.empty_like(case.query), torch.empty(case.num_tokens, case.num_heads, device=DEVICE)
    calls: list = []
    monkeypatch.setattr(tpa, "_decode_kernel", _Launch(calls, "decode"))
    monkeypatch.setattr(tpa, "_prefill_kernel", _Launch(calls, "prefill"))
    for name in ("empty", "empty_like", "zeros", "zeros_like", "full", "full_like", "tensor", "cat"):
        monkeypatch.setattr(torch, name, _forbid(f"torch.{name}"))
    for name in ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, _forbid(f"Tensor.{name}"))
    got = tpa.run(prep, case.query, case.key_cache, case.value_cache, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    assert [c[0] for c in calls] == ["decode", "prefill"], calls


@pytest.mark.parametrize("kind", ["mla", "tree", "mla-perhead", "perhead"])
def test_run_is_graph_capturable_with_mla_and_trees(kind, monkeypatch):
    """The same of MLA's two launches (decode, multi-token tree-masked) and of the tree-masked
    prefill: the tree's words and the MLA scratch were made by ``prepare``; so were the per-kv-head
    fp8 scales (``-perhead``: one a tensor, the other a float)."""
    from pagedattn.cases.variant_families import MLA_SHAPE

    fp8 = dict(kv_dtype=torch.float8_e4m3fn, v_scale=1.9) if kind.endswith("perhead") else {}
    if kind.startswith("mla"):
        spec = CaseSpec("t", ((70, 1), (33, 3)), num_heads=16, tree_mask=True, **MLA_SHAPE, **fp8)
    else:
        spec = CaseSpec("t", ((70, 1), (33, 9)), tree_mask=True, **fp8)
    case = spec.build().to(DEVICE)
    if fp8:
        case = case.replace(k_scale=torch.linspace(0.5, 2.0, case.num_kv_heads, device=DEVICE))
    prep = tpa.prepare(
        *case_args(case),
        scale=case.scale,
        tree_mask=case.tree_mask,
        return_lse=True,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
    )
    assert (prep.qk_scales is not None) == bool(fp8), prep
    out = torch.empty(case.num_tokens, case.num_heads, case.head_dim_v, dtype=case.dtype, device=DEVICE)
    lse = torch.empty(case.num_tokens, case.num_heads, device=DEVICE)
    calls: list = []
    for name in ("_decode_kernel", "_prefill_kernel", "_mla_decode_kernel"):
        monkeypatch.setattr(tpa, name, _Launch(calls, name))
    for name in ("empty", "empty_like", "zeros", "zeros_like", "full", "full_like", "tensor", "cat"):
        monkeypatch.setattr(torch, name, _forbid(f"torch.{name}"))
    for name in ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, _forbid(f"Tensor.{name}"))
    got = tpa.run(prep, case.query, case.key_cache, case.value_cache, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    want = ["_mla_decode_kernel"] * 2 if kind.startswith("mla") else ["_decode_kernel", "_prefill_kernel"]
    assert [c[0] for c in calls] == want, calls


def test_fp8_pairs_are_taken_only_where_they_apply():
    """``KV_FP8``: the cvt pairs (2 for e4m3, 3 for e5m2) need an fp8 cache, fp16 dots, a GPU that
    converts pairs and even offsets; anything else widens through the compiler (1), and a cache in
    the query dtype is 0."""
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    widening = launch_plan.fp8_widening
    assert widening(torch.bfloat16, True, True, True) == 0
    assert (widening(e4, True, True, True), widening(e5, True, True, True)) == (2, 3)
    for missing in range(3):  # without any one condition: the compiler's widening
        assert widening(e4, *[i != missing for i in range(3)]) == 1
        assert widening(e5, *[i != missing for i in range(3)]) == 1
    # the interpreter runs no inline assembly: never native there, whatever the device
    assert not tpa._fp8_native(torch.device("cuda"), True) and not tpa._fp8_native(torch.device("cpu"), False)


@pytest.mark.parametrize("operation", ["attention", "lse"])
def test_the_adapter_warms_up_ahead_by_compiling_only(operation, monkeypatch):
    """Compiled, ``warmup_ahead`` asks the kernel to compile the case's kernels (the lse
    ones for "lse") and launch nothing; on the interpreter it calls nothing at all."""
    from pagedattn.adapters.triton import TritonBackend

    backend = TritonBackend()
    calls = []
    monkeypatch.setattr(backend._kernel, "paged_attention", lambda *a, **kw: calls.append(kw))
    case = BASE.build().to(DEVICE)
    monkeypatch.setattr(backend, "interpreter", True)
    backend.warmup_ahead(case, operation)
    assert calls == []
    monkeypatch.setattr(backend, "interpreter", False)
    backend.warmup_ahead(case, operation)
    assert len(calls) == 1 and calls[0]["compile_only"] is True and calls[0]["return_lse"] == (operation == "lse")
