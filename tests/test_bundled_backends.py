"""Every bundled backend passes the whole quick profile, as a user would run it."""

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

import pagedattn.adapters
from pagedattn import INVARIANCES
from pagedattn.adapters.sdpa import SDPABackend
from pagedattn.adapters.tlsim import TLSimBackend
from pagedattn.cases.spec import CaseSpec
from pagedattn.oracle import check_attention, gather_history
from pagedattn.oracle.reference import causal_mask

# What each bundled backend legitimately leaves out on this machine, and why.
_NO_HOOK = "(SDPA has no hook for a logits soft-cap or attention sinks)"
TLSIM_NOTE = TLSimBackend.capabilities.notes["variants"]
EXPECTED_UNSUPPORTED = {
    "reference": {"paged_attention takes no out= argument"},
    "sdpa": {
        "paged_attention takes no out= argument",
        "operation 'lse' not claimed",
        f"variant logits_soft_cap not claimed {_NO_HOOK}",
        f"variant sinks not claimed {_NO_HOOK}",
        f"variants logits_soft_cap, sinks not claimed {_NO_HOOK}",  # the combined family's pair
    },
    "tlsim": {"paged_attention takes no out= argument"}
    | {f"variant {v} not claimed ({TLSIM_NOTE})" for v in ("fp8_per_head_scales", "mla", "head_dim_v", "tree_mask")},
    "triton": {
        "operation 'gather' not claimed",
        "operation 'write_cache' not claimed",
    },
    "flex": {
        "operation 'gather' not claimed",
        "operation 'write_cache' not claimed",
        "paged_attention takes no out= argument",
    },
}


#: the narrowings a bundled backend declares for the installed torch or triton, each with its reason
_VERSION_NARROWINGS = (
    "eager FlexAttention keeps",
    "FlexAttention takes power-of-two head dims",
    "interpreter cannot run",
)


def _narrowed_for_this_torch(reason: str) -> bool:
    return any(n in reason for n in _VERSION_NARROWINGS)


# The Triton kernel's whole quick profile on the interpreter takes about 47 s of a core, a
# quarter of the default run's: it is `slow` (CI's second step runs it, and the README's first
# command is the same run); tests/test_triton_*.py run the kernel in the default run. FlexAttention's,
# eager on the CPU, takes ~30 s of a core, and tlsim's (the Triton model, interpreted tile by tile)
# ~35 s: `slow` too (CI's second step); the default run runs their decode families
# (``test_backend_passes_the_decode_family``).
_SLOW_PROFILES = ("triton", "flex", "tlsim")


@pytest.mark.parametrize(
    "backend",
    [pytest.param(b, marks=pytest.mark.slow) if b in _SLOW_PROFILES else b for b in sorted(EXPECTED_UNSUPPORTED)],
)
def test_bundled_backend_passes_the_quick_profile(pytester, backend):
    if backend == "triton":
        pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--pyargs", "pagedattn.conformance", f"--backend={backend}", "--report-json=r.json"
    )
    report = json.loads((pytester.path / "r.json").read_text())
    failed = [c["id"] for c in report["cases"] if c["status"] == "failed"]
    assert result.ret == 0 and not failed, f"{backend} failed {failed}:\n{result.stdout.str()[-4000:]}"
    reasons = {c["reason"] for c in report["cases"] if c["status"] == "unsupported"}
    # a narrowing a backend declares for this torch (with its reason) is expected too
    reasons = {r for r in reasons if not _narrowed_for_this_torch(r)}
    # an invariance a backend declines (with its reason) is reported as not claimed, not run
    caps = pagedattn.adapters.load_backend(backend).capabilities
    declined = {r for name in sorted(INVARIANCES) if (r := caps.invariance_reason(name))}
    assert declined <= reasons, f"{backend}: declined invariances not reported unsupported: {declined - reasons}"
    assert reasons <= EXPECTED_UNSUPPORTED[backend] | declined, f"{backend}: unexpected unsupported reasons {reasons}"
    # honest claims need no expectations file: nothing is an expected failure
    assert not {c["status"] for c in report["cases"]} & {"xfailed", "xpassed"}, f"{backend}: expectations in use"
    runs = any(c["status"] != "unsupported" for c in report["cases"] if c["family"] == "decode")
    if runs:  # a backend that cannot run here at all said why above, in its reasons
        families = {r["family"] for r in report["summary"] if r["passed"]}
        assert {"decode", "prefill", "continuation", "gqa", "layout", "mixed", "properties"} <= families
        # every variant family a backend claims runs and passes (the rest said why above)
        claimed = set(report["target"]["capabilities"]["variants"])
        if {"sliding_window", "logits_soft_cap", "alibi_slopes", "sinks", "fp8_e4m3", "fp8_e5m2"} <= claimed:
            assert {"sliding_window", "logits_soft_cap", "alibi_slopes", "sinks", "fp8", "combined"} <= families, (
                families
            )
        if "lse" in report["target"]["capabilities"]["operations"]:
            assert "lse" in families
        assert "passed" in {c["status"] for c in report["cases"]}
    if backend == "triton" and not torch.cuda.is_available() and runs:
        assert "interpreter" in report["target"]["runs_on"], "the report must say the kernel ran on the interpreter"
        bf16 = [r for r in report["summary"] if r["dtype"] == "bf16" and r["family"] == "decode"]
        assert bf16 and bf16[0]["passed"] > 0, "bf16 must run (with the documented upcast), not be skipped"


# The hypothesis search of the standard profile draws this fp16 ALiBi case (scale 1,
# 527 tokens, 16 heads: slopes up to 2 ** -0.5), on which an sdpa computing ALiBi in half
# precision uses 15.9x the bound. It is not a grid case, so it is spelled out here.
_SDPA_ALIBI = CaseSpec(
    "search",
    ((527, 100), (300, 1)),
    num_heads=16,
    num_kv_heads=2,
    head_dim=64,
    dtype=torch.float16,
    scale=1.0,
    alibi_slopes=True,
    query_gain=4.0,
)


def _sdpa_with_a_half_precision_bias(case):
    """What sdpa did before: the ALiBi bias handed to SDPA as a mask in the query dtype."""
    out = torch.empty_like(case.query)
    loc = case.query_start_loc_list
    for b, L in enumerate(case.seq_lens_list):
        k, v = (t.repeat_interleave(case.gqa_ratio, 1).transpose(0, 1) for t in gather_history(case, b))
        q = case.query[loc[b] : loc[b + 1]].transpose(0, 1)
        n = q.shape[1]
        rel = torch.arange(L)[None, :] - torch.arange(L - n, L)[:, None]
        bias = case.alibi_slopes[:, None, None] * rel[None].float()
        mask = bias.masked_fill(~causal_mask(n, L, q.device, None)[None], float("-inf")).to(case.dtype)
        out[loc[b] : loc[b + 1]] = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=case.scale).transpose(
            0, 1
        )
    return out


@pytest.mark.parametrize("backend", [b for b in _SLOW_PROFILES if b != "triton"])  # (the kernel: test_triton_*.py)
def test_backend_passes_the_decode_family(pytester, backend):
    """The default run's FlexAttention and tlsim backends (their whole quick profiles are `slow`):
    the decode family, every claimed case passed, none expected to fail, and a case left out
    only for a narrowing the backend declares for this torch, with its reason."""
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--pyargs",
        "pagedattn.conformance",
        f"--backend={backend}",
        "-k",
        "decode",
        "--report-json=r.json",
    )
    report = json.loads((pytester.path / "r.json").read_text())
    decode = [c for c in report["cases"] if c["family"] == "decode"]
    passed = [c for c in decode if c["status"] == "passed"]
    unclaimed = [c for c in decode if c["status"] == "unsupported" and _narrowed_for_this_torch(c["reason"])]
    others = [(c["id"], c["status"], c.get("reason")) for c in decode if c not in passed and c not in unclaimed]
    assert result.ret == 0 and passed and not others, f"{others}\n{result.stdout.str()[-4000:]}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sdpa_meets_the_bound_on_half_precision_alibi(dtype):
    """sdpa claims ALiBi in fp16/bf16 and meets it: the bias reaches SDPA in float32. The
    same case with the bias in the query dtype fails, so the case does catch it."""
    case = dataclasses.replace(_SDPA_ALIBI, dtype=dtype).build()
    sdpa = SDPABackend()
    assert sdpa.capabilities.case_reason(case) is None, "sdpa must claim this case"
    check = check_attention(sdpa.paged_attention(case.clone()), case)
    assert check.passed and not check.warning, f"sdpa on {case!r}:\n{check}"
    planted = check_attention(_sdpa_with_a_half_precision_bias(case), case)
    assert not planted.passed, f"a half-precision ALiBi bias must fail this case:\n{planted}"


@pytest.mark.parametrize("backend", sorted(EXPECTED_UNSUPPORTED))
def test_bundled_backends_declare_their_invariances(backend):
    """flex declines batch and placement invariance, with its reasons; the others hold all three."""
    if backend == "triton":
        pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")
    caps = pagedattn.adapters.load_backend(backend).capabilities
    want = {"determinism"} if backend == "flex" else set(INVARIANCES)
    assert caps.invariances == want, f"{backend} claims {sorted(caps.invariances)}, expected {sorted(want)}"
    for name in INVARIANCES - want:
        reason = caps.invariance_reason(name)
        assert reason and reason.startswith(f"invariance '{name}' not claimed (") and "physical" in reason, reason
