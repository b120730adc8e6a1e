"""Per-kv-head fp8 scales in the Triton kernel (``PER_HEAD_SCALES``): the decode (one split and
several, every launch shape), prefill, continuation and MLA programs each load their kv head's
scales, judged by the oracle; heads that share one scale compute the per-tensor bits; kv head
0's scales for every head fail; the host checks name the field."""

import dataclasses

import pytest
import torch

from pagedattn.cases import CaseSpec, grid
from pagedattn.cases.variant_families import MLA_SHAPE  # DeepSeek's: one latent kv head of 576, values its first 512
from pagedattn.kernels.tuning import TUNING
from pagedattn.oracle import PER_HEAD_SCALES, check_attention, check_attention_lse
from pagedattn.validation import ProblemError
from tests.asserts import assert_equal
from tests.triton_support import DEVICE, attention, case_args, force_decode_shape, runs_kernel

triton = pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")
from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402  (after the interpreter is decided)

E4M3 = torch.float8_e4m3fn
#: distinct per kv head, the values' in another order (the conformance family's)
K_SCALES, V_SCALES = (0.5, 1.0, 2.0, 0.25), (2.0, 0.25, 0.5, 1.0)
#: the quick grid's per-head cases: each a prefill, a decode and a continuation
QUICK = [s for s in grid("quick", "fp8") if s.per_head_scales]
#: 32-key splits: the decode histories below take two to four, merged across programs
SPLITS = dataclasses.replace(TUNING, short_under=0, split_size=32, split_long=32, long_from=10**9, decode_block_n=16)
#: decode histories of one, two and four splits under ``SPLITS``, and a continuation
SPLIT_SPEC = CaseSpec(
    "t",
    ((20, 1), (40, 1), (120, 1), (30, 6)),
    num_heads=8,
    num_kv_heads=4,
    head_dim=32,
    kv_dtype=E4M3,
    dtype=torch.float16,
    k_scale=K_SCALES,
    v_scale=V_SCALES,
)
#: MLA's one latent kv head: a decode over two splits (the default 512-key split) and multi-token
MLA_SPEC = CaseSpec(
    "t",
    ((700, 1), (40, 4)),
    num_heads=16,
    block_size=64,
    kv_dtype=E4M3,
    k_scale=(0.37,),
    v_scale=(0.61,),
    dtype=torch.bfloat16,
    **MLA_SHAPE,
)


def _scales(case):
    return dict(scale=case.scale, k_scale=case.k_scale, v_scale=case.v_scale)


def _run(case, tuning=TUNING, **kw):
    """The kernel's output on ``case``, its scales as the case holds them."""
    return attention(case, tuning, **_scales(case), **kw)


def _shared(case, k: float, v: float):
    """``case`` with every kv head's scales ``k`` and ``v`` (float32 tensors), and the per-tensor
    case of the floats they hold."""
    h = case.num_kv_heads
    per_head = case.replace(
        k_scale=torch.full((h,), k, device=case.device), v_scale=torch.full((h,), v, device=case.device)
    )
    return per_head, case.replace(k_scale=float(per_head.k_scale[0]), v_scale=float(per_head.v_scale[0]))


def test_the_quick_grid_has_per_head_prefills_decodes_and_continuations():
    assert len(QUICK) == 3, [s.id for s in QUICK]
    for spec in QUICK:
        assert spec.id.endswith("-perhead"), spec.id
        lens = spec.build().query_lens
        seqs = spec.build().seq_lens_list
        kinds = {"decode" if q == 1 else "prefill" if q == s else "continuation" for q, s in zip(lens, seqs)}
        assert kinds == {"decode", "prefill", "continuation"}, f"{spec.id}: {kinds}"


@runs_kernel
@pytest.mark.parametrize("spec", QUICK, ids=lambda s: s.id)
def test_quick_per_head_cases_within_policy(spec):
    case = spec.build().to(DEVICE)
    assert PER_HEAD_SCALES in case.variants
    out, lse = tpa.paged_attention(*case_args(case), **_scales(case), return_lse=True)
    out_check, lse_check = check_attention_lse(out, lse, case)
    assert out_check.passed and not out_check.warning, str(out_check)
    assert lse_check.passed, str(lse_check)


@runs_kernel
@pytest.mark.parametrize("spec", QUICK, ids=lambda s: s.id)
def test_kv_head_0s_scales_for_every_head_fail(spec, monkeypatch):
    """The planted bug of the conformance family (``per_head_scale_per_tensor``) in the kernel's
    own path: ``prepare`` hands every program kv head 0's scales, as a kernel indexing the scales
    with 0 would read them. The policy fails it on every quick per-head case."""
    real = tpa.head_scales

    def head_0(*args):
        qk, v = real(*args)
        return qk[:1].expand_as(qk).contiguous(), v[:1].expand_as(v).contiguous()

    monkeypatch.setattr(tpa, "head_scales", head_0)
    case = spec.build().to(DEVICE)
    check = check_attention(_run(case), case)
    assert not check.passed, f"{spec.id}: kv head 0's scales for every head passed: {check}"


@runs_kernel
@pytest.mark.parametrize(
    "shape",
    [(False, 1, False), (True, 2, False), (True, 4, False)],
    ids=["one-split-a-program", "loop-2", "every-split-a-program"],
)
def test_split_decodes_within_policy_at_every_launch_shape(shape, monkeypatch):
    """Decode histories of one to four splits: the kv head's ``v_scale`` where the merging program
    finishes a row (across programs, or in the split loop of a program of every split)."""
    force_decode_shape(monkeypatch, shape)
    case = SPLIT_SPEC.build().to(DEVICE)
    prep = tpa.prepare(*case_args(case), tuning=SPLITS, **_scales(case))
    assert prep.plan.max_splits == 4, prep.plan
    check = check_attention(tpa.run(prep, case.query, case.key_cache, case.value_cache), case)
    assert check.passed and not check.warning, str(check)


@runs_kernel
@pytest.mark.parametrize("which", ["quick", "split-decode", "mla"])
def test_one_shared_per_head_scale_gives_the_per_tensor_bits(which):
    """``scale * k_scale`` of a kv head is formed on the host in float64 and rounded to fp32 once,
    as the per-tensor argument is, and ``v_scale`` is the fp32 the argument becomes: heads that
    share one scale compute the per-tensor case's bits (0.37 and 1.9 are not fp32: the floats
    are those the fp32 tensors hold). Except MLA on the interpreter, which multiplies a scalar
    argument by log2(e) in float64 (a compiled kernel's argument is fp32, as the loaded scale
    is): there both are judged."""
    spec, tuning = {"quick": (QUICK[1], TUNING), "split-decode": (SPLIT_SPEC, SPLITS), "mla": (MLA_SPEC, TUNING)}[which]
    per_head, per_tensor = _shared(spec.build().to(DEVICE), 0.37, 1.9)
    assert PER_HEAD_SCALES in per_head.variants and PER_HEAD_SCALES not in per_tensor.variants
    got, want = _run(per_head, tuning), _run(per_tensor, tuning)
    if which != "mla" or not tpa.interpreter_active():
        assert_equal(got, want, f"{which}: every kv head's scales 0.37, 1.9 against the floats")
    for name, out, case in (("per head", got, per_head), ("per tensor", want, per_tensor)):
        check = check_attention(out, case)
        assert check.passed and not check.warning, f"{which}, {name}: {check}"


@runs_kernel
@pytest.mark.parametrize("tensor", ["k_scale", "v_scale"])
def test_one_field_a_tensor_the_other_a_float(tensor):
    """The float is repeated over the kv heads: the same bits as the tensor of it, within policy."""
    both = QUICK[0].build().to(DEVICE)
    float_field = "v_scale" if tensor == "k_scale" else "k_scale"
    x = float(getattr(both, float_field)[2])  # kv head 2's, a float
    mixed = both.replace(**{float_field: x})
    repeated = both.replace(**{float_field: torch.full((both.num_kv_heads,), x, device=both.device)})
    got = _run(mixed)
    assert_equal(got, _run(repeated), f"{float_field} {x} as a float and as a tensor of it")
    check = check_attention(got, mixed)
    assert check.passed and not check.warning, str(check)


@runs_kernel
def test_mla_with_a_one_entry_scale_tensor_within_policy():
    """MLA's one latent kv head takes ``[1]`` scales (keys' and values' different, though they read
    the same rows): its decode over two splits, merged, and its multi-token launch."""
    case = MLA_SPEC.build().to(DEVICE)
    assert tuple(case.k_scale.shape) == (1,) and case.shared_kv
    out, lse = tpa.paged_attention(*case_args(case), **_scales(case), return_lse=True)
    out_check, lse_check = check_attention_lse(out, lse, case)
    assert out_check.passed and not out_check.warning, str(out_check)
    assert lse_check.passed, str(lse_check)
    swapped = case.replace(k_scale=case.v_scale, v_scale=case.k_scale)
    assert not check_attention(_run(swapped), case).passed, "MLA's k_scale and v_scale swapped passed"


# ------------------------------------------------------------------ host checks
def _fp8_args():
    case = CaseSpec(
        "t", ((9, 3), (5, 1)), num_heads=4, num_kv_heads=2, head_dim=16, block_size=4, kv_dtype=E4M3
    ).build()
    return case_args(case)


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("k_scale", torch.ones(3), "shape [num_kv_heads] = (2,)"),
        ("v_scale", torch.ones(2, 1), "shape [num_kv_heads] = (2,)"),
        ("k_scale", torch.ones(2, dtype=torch.float64), "must be float32"),
        ("v_scale", torch.ones(2, device="meta"), "must be on the query's device"),
        ("k_scale", torch.tensor([1.0, float("nan")]), "finite and > 0 for every kv head"),
        ("v_scale", torch.tensor([0.0, 1.0]), "finite and > 0 for every kv head"),
        ("k_scale", torch.tensor([1.0, 3e38]), "scale * k_scale of every kv head must be inside fp32's normal range"),
        ("v_scale", torch.tensor([1.0, 1e-45]), "v_scale of every kv head must be inside fp32's normal range"),
    ],
    ids=["k-shape", "v-rank", "k-dtype", "v-device", "k-nan", "v-zero", "k-product-overflows", "v-subnormal"],
)
def test_a_bad_scale_tensor_is_named_before_any_launch(field, value, says, monkeypatch):
    monkeypatch.setattr(tpa, "plan_launch", lambda *a, **kw: pytest.fail("planned a launch for invalid input"))
    args = _fp8_args()
    with pytest.raises(ProblemError, match=f"paged_attention.{field}") as err:
        tpa.prepare(*args, scale=2.0, **{field: value.to(DEVICE) if value.device.type != "meta" else value})
    assert says in str(err.value), f"{field}={value}: the message {str(err.value)!r} lacks {says!r}"


def test_a_scale_tensor_needs_an_fp8_cache():
    case = CaseSpec("t", ((9, 3),), num_heads=4, num_kv_heads=2, head_dim=16, block_size=4).build()
    with pytest.raises(ProblemError, match="paged_attention.v_scale: .*unless the cache is fp8"):
        tpa.prepare(*case_args(case), v_scale=torch.ones(2))


def test_prepare_copies_the_scales_it_was_given():
    """``prepare`` keeps fp32 copies of the kv heads' scales (a float repeated): a prepared batch
    computes with the scales it was prepared with, and ``run`` reads nothing back to form them."""
    args = _fp8_args()
    k = torch.tensor([0.5, 3.0], device=args[0].device)
    prep = tpa.prepare(*args, scale=0.25, k_scale=k, v_scale=1.5)
    assert prep.qk_scales is not None and prep.v_scales is not None
    assert prep.qk_scales.data_ptr() != k.data_ptr() and prep.qk_scales.is_contiguous()
    assert prep.qk_scales.tolist() == [0.125, 0.75] and prep.v_scales.tolist() == [1.5, 1.5], (
        prep.qk_scales,
        prep.v_scales,
    )
    assert prep.scale == 0.25, "the per-tensor argument is the softmax scale alone (unread per kv head)"
    plain = tpa.prepare(*args, scale=0.25, k_scale=2.0)
    assert plain.qk_scales is None and plain.v_scales is None and plain.scale == 0.5


def test_the_triton_backend_claims_per_head_scales():
    from pagedattn.adapters.triton import TritonBackend

    caps = TritonBackend().capabilities
    assert PER_HEAD_SCALES in caps.variants, sorted(caps.variants)
    assert "variants" not in caps.notes, f"a note on a claim narrowed no longer: {caps.notes}"
