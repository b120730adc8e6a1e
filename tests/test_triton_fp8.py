"""An fp8 cache: fp16 dots for bf16 queries, every tile width, the sink's range, the cvt of
fp8 pairs and where the compiler widens instead."""

import dataclasses

import pytest
import torch

from pagedattn.cases import CaseSpec
from pagedattn.kernels.tuning import TUNING
from pagedattn.oracle import check_attention, check_attention_lse
from tests.triton_support import (
    DEVICE,
    attention,
    case_args,
    runs_kernel,
)

triton = pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")
from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402  (after the interpreter is decided)
from pagedattn.kernels import triton_tiles  # noqa: E402


@runs_kernel
@pytest.mark.parametrize("gain", [1e6, 1e-33], ids=["huge-queries", "tiny-queries"])
def test_fp8_cache_fp16_dots_keep_any_bf16_query_in_range(gain):
    """bf16 queries over an fp8 cache run fp16 dots: each row is scaled by a power of two
    first, so queries far outside fp16's range (either side) still score exactly."""
    spec = CaseSpec(
        "t",
        ((200, 1), (30, 5)),
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        dtype=torch.bfloat16,
        kv_dtype=torch.float8_e4m3fn,
        query_gain=gain,
        scale=1.0,
    )
    case = spec.build().to(DEVICE)
    out, lse = tpa.paged_attention(*case_args(case), scale=case.scale, return_lse=True)
    out_check, lse_check = check_attention_lse(out, lse, case)
    assert out_check.passed and not out_check.warning, str(out_check)
    assert lse_check.passed, str(lse_check)


@runs_kernel
@pytest.mark.parametrize("block_n", [16, 32, 64])
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fp8_prefill_at_every_tile_width(dtype, kv_dtype, block_n):
    """An fp8 cache under every key-tile width, prefill and decode: 16-key tiles went wrong on the
    H200 (triton 3.6) through the row-split widening of V, which tiles under 32 rows now skip; on a
    GPU of sm_89 or later the tiles are read as pairs (``_widen_pairs``) at every width."""
    t = dataclasses.replace(TUNING, prefill_block_n=block_n, decode_block_n=block_n)
    spec = CaseSpec(
        "t", ((70, 30), (20, 1)), num_heads=4, num_kv_heads=2, head_dim=32, dtype=dtype, kv_dtype=kv_dtype, v_scale=2.0
    )
    case = spec.build().to(DEVICE)
    out = attention(case, t, scale=case.scale, k_scale=case.k_scale, v_scale=case.v_scale)
    check = check_attention(out, case)
    assert check.passed and not check.warning, str(check)


@runs_kernel
# bf16: the control (bf16 weights keep the range, so a sink seeded first would pass there too)
@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn], ids=["bf16", "e4m3"])
def test_a_sink_far_above_the_keys_leaves_the_prefill_weights_in_range(kv_dtype):
    """A sink e^25 above every key: relative to it, each key's weight is ~1e-11, below fp16's
    range, and bf16 queries over an fp8 cache run fp16 dots (``F16_DOTS``). Seeded with the sink,
    the prefill's running softmax would flush those weights to 0 and its rows would come out 0;
    the sink joins after the keys, as in the decode merge."""
    spec = CaseSpec(
        "t", ((40, 40), (30, 1)), num_heads=4, num_kv_heads=2, head_dim=32, dtype=torch.bfloat16, kv_dtype=kv_dtype
    )
    case = spec.build()
    case = dataclasses.replace(case, sinks=torch.full((4,), 25.0)).to(DEVICE)
    kw = dict(scale=case.scale, k_scale=case.k_scale, v_scale=case.v_scale, sinks=case.sinks)
    out = tpa.paged_attention(*case_args(case), **kw)
    check = check_attention(out, case)
    assert check.passed and not check.warning, str(check)


def _fp8_pairs_gpu() -> bool:
    return DEVICE == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.skipif(not _fp8_pairs_gpu(), reason="the cvt of fp8 pairs needs a CUDA GPU of sm_89 or later")
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
def test_widen_pairs_converts_every_fp8_pair_exactly(kv_dtype):
    """All 65536 pairs of fp8 bytes through ``_widen_pairs``, against torch's conversion of each byte,
    bit for bit (NaN for NaN): the lower byte is the first value, as memory holds them."""
    import triton.language as tl

    @triton.jit
    def widen(x_ptr, out_ptr, E5M2: tl.constexpr):
        r = tl.arange(0, 512)
        c = tl.arange(0, 128)
        x = tl.load(x_ptr + r[:, None] * 128 + c[None, :])  # [512, 128]: every pair
        y = triton_tiles._widen_pairs(x, E5M2)  # [512, 256]
        c2 = tl.arange(0, 256)
        tl.store(out_ptr + r[:, None] * 256 + c2[None, :], y)

    pairs = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).cuda()  # 0 .. 65535 as 16 bits
    out = torch.empty(1 << 17, dtype=torch.float16, device="cuda")
    widen[(1,)](pairs, out, E5M2=kv_dtype == torch.float8_e5m2)
    want = pairs.view(torch.uint8).view(kv_dtype).to(torch.float16)  # little-endian: the lower byte first
    nan = want.isnan()
    assert torch.equal(nan, out.isnan()), f"{kv_dtype} pairs: NaN where the conversion gives none, or the other way"
    wrong = out[~nan].view(torch.int16) != want[~nan].view(torch.int16)
    assert not wrong.any(), f"{kv_dtype} pairs: {int(wrong.sum())} values widened to other bits than torch's"


@runs_kernel
@pytest.mark.parametrize("odd", ["key_address", "value_address", "value_stride", "head_dim"])
def test_an_odd_offset_into_an_fp8_cache_widens_through_the_compiler(odd, monkeypatch):
    """16-bit pairs need every offset into both caches even: a cache whose first byte is at an
    odd address, a cache row of an odd number of elements (a padded view) or an odd head_dim
    takes the compiler's widening (``KV_FP8`` 1), and the output is right. The device is made to
    claim the pair conversion (``_fp8_native``), so that the offsets alone decide, here too."""
    spec = CaseSpec(
        "t",
        ((90, 1), (40, 9)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=31 if odd == "head_dim" else 32,
        dtype=torch.float16,
        kv_dtype=torch.float8_e5m2,
        k_scale=0.5,
        v_scale=2.0,
    )
    case = spec.build().to(DEVICE)
    args = case_args(case)
    if odd in ("key_address", "value_address"):
        i = 1 if odd == "key_address" else 2
        shifted = torch.empty(args[i].numel() + 1, dtype=torch.uint8, device=DEVICE)[1:].view(args[i].dtype)
        args[i] = shifted.view(args[i].shape).copy_(args[i])  # the same values, one byte further
        assert args[i].data_ptr() % 2 == 1
    elif odd == "head_dim":  # 31 values a head in rows of 32: every stride even, head_dim alone odd
        for i in (1, 2):
            N, bs, H, D = args[i].shape
            args[i] = torch.zeros(N, bs, H, D + 1, dtype=args[i].dtype, device=DEVICE)[..., :D].copy_(args[i])
        assert all(st % 2 == 0 for t in args[1:3] for st in t.stride()[:3])
    elif odd == "value_stride":
        N, bs, H, D = args[2].shape
        padded = torch.zeros(N, bs, H * D + 1, dtype=torch.uint8, device=DEVICE).view(args[2].dtype)
        args[2] = padded[:, :, : H * D].view(N, bs, H, D).copy_(args[2])  # rows of H * D + 1 elements
        assert args[2].stride(1) % 2 == 1
    monkeypatch.setattr(tpa, "_fp8_native", lambda *a: True)
    modes = []
    real = tpa.fp8_widening
    monkeypatch.setattr(tpa, "fp8_widening", lambda *a: modes.append(real(*a)) or modes[-1])
    out = tpa.paged_attention(*args, scale=case.scale, k_scale=case.k_scale, v_scale=case.v_scale)
    assert modes == [1], modes
    check = check_attention(out, case)
    assert check.passed and not check.warning, str(check)
