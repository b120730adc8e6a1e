"""Per-head fp8 scales: ``k_scale``/``v_scale`` as ``[num_kv_heads]`` float32 tensors.

The case's rules, copies and files; the oracle against the naive reference and against the
per-tensor case; the policy's largest-scale bound and the fused check; who claims the variant."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from pagedattn import PagedCase
from pagedattn.adapters.sdpa import SDPABackend
from pagedattn.adapters.tlsim import TLSimBackend
from pagedattn.cases import CaseSpec, load_case, save_case
from pagedattn.cases.strategies import case_specs
from pagedattn.oracle import PER_HEAD_SCALES, VARIANTS, check_attention, paged_attention_reference_lse, policy
from pagedattn.oracle.subnormal import _weights_stay_normal
from pagedattn.validation import ProblemError
from pagedattn.verdict_kernel import host as gpu_check
from tests.asserts import assert_close, assert_differs, assert_equal
from tests.helpers import naive_attention, needs_verdict_kernel
from tests.planted.streamed import streamed_attention

E4M3 = torch.float8_e4m3fn
K_SCALES, V_SCALES = (0.5, 1.0, 2.0, 0.25), (2.0, 0.25, 0.5, 1.0)


def _spec(**changes) -> CaseSpec:
    fields = dict(
        num_heads=8, num_kv_heads=4, head_dim=32, kv_dtype=E4M3, dtype=torch.float16, k_scale=K_SCALES, v_scale=V_SCALES
    )
    return CaseSpec("t", ((40, 1), (23, 23), (30, 6)), **{**fields, **changes})


@pytest.fixture
def case() -> PagedCase:
    return _spec().build()


# ------------------------------------------------------------------ the case
@pytest.mark.parametrize(
    "field, value, says",
    [
        ("k_scale", torch.tensor([0.5, 1.0, 2.0], dtype=torch.float32), "shape [num_kv_heads] = (4,)"),
        ("v_scale", torch.ones(4, 1), "shape [num_kv_heads] = (4,)"),
        ("k_scale", torch.ones(4, dtype=torch.float64), "must be float32"),
        ("v_scale", torch.tensor([1.0, 0.0, 1.0, 1.0]), "finite and > 0 for every kv head"),
        ("k_scale", torch.tensor([1.0, -2.0, 1.0, 1.0]), "finite and > 0 for every kv head"),
        ("k_scale", torch.tensor([1.0, float("inf"), 1.0, 1.0]), "finite and > 0 for every kv head"),
        ("v_scale", torch.tensor([float("nan"), 1.0, 1.0, 1.0]), "finite and > 0 for every kv head"),
        ("k_scale", torch.ones(4, device="meta"), "must be on the query's device"),
    ],
)
def test_a_per_head_scale_breaking_a_rule_is_named_with_its_bound(case, field, value, says):
    with pytest.raises(ProblemError, match="PagedCase." + field) as err:
        case.replace(**{field: value})
    assert says in str(err.value), f"{field}={value}: the message {str(err.value)!r} lacks {says!r}"


def test_a_per_head_scale_needs_an_fp8_cache(case):
    plain = _spec(kv_dtype=None, k_scale=1.0, v_scale=1.0).build()
    with pytest.raises(ProblemError, match="PagedCase.k_scale: .*unless the cache is fp8"):
        plain.replace(k_scale=torch.ones(4))


def test_the_case_names_copies_and_saves_its_per_head_scales(case, tmp_path):
    assert case.variants == {"fp8_e4m3", PER_HEAD_SCALES}, case.variants
    assert PER_HEAD_SCALES in VARIANTS
    assert "k_scale=[0.5, 1, 2, 0.25], v_scale=[2, 0.25, 0.5, 1]" in repr(case), repr(case)
    copy = case.clone()
    assert copy.k_scale is not case.k_scale and copy.k_scale.data_ptr() != case.k_scale.data_ptr()
    assert_equal(copy.k_scale, case.k_scale, "a clone's k_scale")
    assert_equal(case.to("cpu").v_scale, case.v_scale, "a moved case's v_scale")
    assert "k_scale" in case.tensors() and "k_scale" not in case.options(), (case.tensors().keys(), case.options())
    save_case(case, tmp_path / "c.pt", family="fp8")
    back, _ = load_case(tmp_path / "c.pt")
    for f in ("k_scale", "v_scale", "key_cache"):
        assert_equal(getattr(back, f), getattr(case, f), f"the saved case's {f}", nan_equal=True)
    assert back.variants == case.variants


def test_one_scale_tensor_and_one_float_mix(case):
    mixed = case.replace(v_scale=1.9)
    assert PER_HEAD_SCALES in mixed.variants and isinstance(mixed.v_scale, float)
    assert "v_scale=1.9" in repr(mixed), repr(mixed)


# ---------------------------------------------------------------- the oracle
def test_the_oracle_is_the_naive_reference_with_each_heads_scales(case):
    out, lse = paged_attention_reference_lse(case)
    want, want_lse = naive_attention(case, return_lse=True)
    assert_close(out, want, 1e-12, "the oracle against the naive reference, per-head scales", atol=1e-14)
    assert_close(lse, want_lse, 1e-12, "the oracle's lse against the naive one, per-head scales")


@pytest.mark.parametrize("scale", [0.37, 1.0, 2.5])
def test_one_shared_per_head_scale_is_the_per_tensor_case_bit_for_bit(case, scale):
    """Bit for bit against the float the float32 scale holds (0.37 rounds to float32 first)."""
    shared = case.replace(k_scale=torch.full((4,), scale), v_scale=torch.full((4,), 2 * scale))
    per_tensor = case.replace(k_scale=float(shared.k_scale[0]), v_scale=float(shared.v_scale[0]))
    got, got_lse = paged_attention_reference_lse(shared)
    want, want_lse = paged_attention_reference_lse(per_tensor)
    assert_equal(got, want, f"output, every head's scale {scale} against the float {scale}")
    assert_equal(got_lse, want_lse, f"lse, every head's scale {scale} against the float {scale}")
    _, bound = policy.attention_error_bound(shared)
    _, want_bound = policy.attention_error_bound(per_tensor)
    assert_equal(bound, want_bound, "the bound of shared per-head scales against the per-tensor one")


def test_a_heads_scale_moves_only_its_own_query_heads(case):
    out, _ = paged_attention_reference_lse(case)
    k = case.k_scale.clone()
    k[1] *= 3.0
    moved, _ = paged_attention_reference_lse(case.replace(k_scale=k))
    group = case.gqa_ratio
    assert_equal(moved[:, :group], out[:, :group], "kv head 0's query heads under kv head 1's new scale")
    assert_equal(moved[:, 2 * group :], out[:, 2 * group :], "kv heads 2-3's query heads")
    assert_differs(moved[:, group : 2 * group], out[:, group : 2 * group], "kv head 1's query heads")


# ---------------------------------------------------------------- the policy
def test_the_subnormal_guard_takes_the_largest_key_scale():
    """Where the largest head's scale makes the weights leave the normal range, the guard says so
    (judged as the per-tensor case at that scale would be), whichever head carries it."""
    spec = _spec(query_gain=6.0, dtype=torch.float16)
    for big in range(4):
        k = [0.01] * 4
        k[big] = 40.0
        per_head = spec.build().replace(k_scale=torch.tensor(k))
        for min_normal in (2.0**-14, 2.0**-126):
            want = _weights_stay_normal(per_head.replace(k_scale=40.0), min_normal)
            assert _weights_stay_normal(per_head, min_normal) == want, f"head {big} at 40, min normal {min_normal}"
    assert not _weights_stay_normal(per_head, 2.0**-14), "a scale of 40 at query gain 6 spans fp16's range"


@needs_verdict_kernel
def test_the_fused_check_judges_per_head_scales_as_the_torch_path(monkeypatch):
    """The fused check reads the oracle's dequantized blocks, so per-head scales reach it as they
    reach the torch path: the same bound at each row's worst element, the same expected error."""
    monkeypatch.setattr(gpu_check, "ON_CPU", True)
    monkeypatch.setattr(policy, "DEVICE_PATH_ON_CPU", True)
    case = _spec().build()
    assert gpu_check.usable(case), "the fused check should run for a per-head case"
    out = streamed_attention(case, 16)
    terms = policy._terms(case, "ieee", "fp32", "ieee")
    stats = gpu_check._stats(out, None, case, terms, 1.0).stats.cpu()
    _, bound = policy.attention_error_bound(case)
    rows = case.num_tokens * case.num_heads
    at = bound.reshape(rows, case.head_dim)[torch.arange(rows), stats[:, 3].long()]
    assert_close(stats[:, 6], at, policy.FUSED_RTOL, "a row's bound at its worst element, fused against torch")
    var = torch.cat([blk.var for blk in policy.chunk_bounds(case, "ieee", "fp32", "ieee", with_lse=False)], dim=0)
    assert var.shape[0] == case.num_tokens
    assert_close(stats[:, 8], var.sum(-1).reshape(-1), policy.FUSED_RTOL, "a row's expected squared error")


# -------------------------------------------------------- backends and cases
def test_who_claims_per_head_scales():
    assert PER_HEAD_SCALES in SDPABackend.capabilities.variants
    caps = TLSimBackend.capabilities
    assert PER_HEAD_SCALES not in caps.variants and "per-head" in caps.notes["variants"], caps.notes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sdpa_and_the_streamed_baseline_pass_per_head_scales_and_head_0s_scales_fail(dtype):
    case = _spec(dtype=dtype).build()
    for name, out in (("sdpa", SDPABackend().paged_attention(case)), ("streamed", streamed_attention(case, 16))):
        verdict = check_attention(out, case)
        assert verdict.passed and not verdict.warning, f"{name} at {dtype}: {verdict}"
    wrong = check_attention(streamed_attention(case, 16, bug="per_head_scale_per_tensor"), case)
    assert not wrong.passed, f"kv head 0's scales for every head passed at {dtype}: {wrong}"


@settings(max_examples=30, deadline=None, derandomize=True)
@given(case_specs(variants=frozenset(VARIANTS)))
def test_the_search_draws_per_head_scales_only_with_fp8_and_as_many_as_kv_heads(spec):
    if spec.per_head_scales:
        assert spec.kv_dtype is not None
        assert len(spec.k_scale) == len(spec.v_scale) == spec.num_kv_heads  # type: ignore[arg-type]
        assert PER_HEAD_SCALES in spec.build().variants
