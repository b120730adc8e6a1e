"""A declared approximate soft-cap tanh (``Capabilities.tanh_precision="approx"``).

A kernel whose tanh errs by the PTX figure fails the IEEE policy and passes its declared one;
soft-cap bugs still fail under it; only soft-capped cases change; the claim reaches the
checks, the header and the JSON."""

import json

import pytest
import torch

from pagedattn.adapters.loading import backend_info
from pagedattn.cases import CaseSpec
from pagedattn.oracle import check_attention, check_attention_lse
from pagedattn.oracle.error_model import U_RCP_APPROX, U_TANH_APPROX
from pagedattn.oracle.policy import attention_lse_error_bounds
from pagedattn.runner.report import _claims_lines
from pagedattn.runner.suite import Suite
from tests.planted.approx_tanh import BUGS, PTX_TANH_REL, ApproxTanhBackend, approx_softcap_attention

#: small caps the scores saturate, fp32 output and lse; and the quick profile's lse case that
#: FlashInfer's tanh.approx.f32 put at 1.14x the IEEE lse bound on the H200
SOFTCAP_SPECS = [
    CaseSpec("logits_soft_cap", ((33, 33), (40, 7)), logits_soft_cap=5.0, query_gain=4.0, dtype=torch.float32),
    CaseSpec("logits_soft_cap", ((24, 24), (45, 1)), block_size=8, logits_soft_cap=2.5, query_gain=4.0),
    CaseSpec("lse", ((40, 40), (1100, 1)), sliding_window=20, logits_soft_cap=5.0, dtype=torch.bfloat16),
]


def test_the_ptx_figure_is_within_the_declared_constant():
    """The emulation's error is the PTX ISA's (2**-11); the policy's constant is no smaller."""
    assert PTX_TANH_REL <= U_TANH_APPROX, f"U_TANH_APPROX {U_TANH_APPROX:.4g} under the PTX figure {PTX_TANH_REL:.4g}"


@pytest.mark.parametrize("spec", SOFTCAP_SPECS, ids=lambda s: s.id)
def test_an_approximate_tanh_fails_the_ieee_policy_and_passes_its_declared_one(spec):
    case = spec.build()
    out, lse = approx_softcap_attention(case)
    strict_out, strict_lse = check_attention_lse(out, lse, case)
    assert not strict_lse.passed, (
        f"a tanh off by 2**-11 on every capped score should fail the IEEE lse bound:\n{strict_lse}"
    )
    out_check, lse_check = check_attention_lse(out, lse, case, tanh_precision="approx")
    for check, strict in ((out_check, strict_out), (lse_check, strict_lse)):
        assert check.passed and not check.warning, f"declared approx tanh, judged by its own bound:\n{check}"
        assert check.budget_used < strict.budget_used, (
            f"{check.what}: the declared bound should be the wider: {check.budget_used:.3g} "
            f"declared vs {strict.budget_used:.3g} IEEE"
        )
        assert "approximate soft-cap tanh (declared)" in str(check), str(check)


def test_an_exact_tanh_passes_both_policies():
    case = SOFTCAP_SPECS[0].build()
    out, lse = approx_softcap_attention(case, rel=0.0)
    for tanh_precision in ("ieee", "approx"):
        for check in check_attention_lse(out, lse, case, tanh_precision=tanh_precision):
            assert check.passed and not check.warning, f"tanh_precision={tanh_precision}:\n{check}"


def test_a_tanh_four_times_worse_than_the_ptx_figure_fails_the_declared_policy():
    """The declared term is the PTX figure, not a blanket loosening."""
    case = SOFTCAP_SPECS[0].build()
    out, lse = approx_softcap_attention(case, rel=4 * PTX_TANH_REL)
    _, lse_check = check_attention_lse(out, lse, case, tanh_precision="approx")
    assert not lse_check.passed, f"a tanh off by 2**-9 should fail even the declared approx bound:\n{lse_check}"


@pytest.mark.parametrize("bug", BUGS)
def test_soft_cap_bugs_still_fail_under_a_declared_approximate_tanh(bug):
    case = SOFTCAP_SPECS[0].build()
    out, lse = approx_softcap_attention(case, bug=bug)
    out_check, lse_check = check_attention_lse(out, lse, case, tanh_precision="approx")
    assert not out_check.passed, f"{bug} passed under tanh_precision='approx':\n{out_check}"
    assert not lse_check.passed, f"{bug} (log-sum-exp) passed under tanh_precision='approx':\n{lse_check}"


def test_only_soft_capped_cases_change_and_by_the_declared_term():
    """Without a soft-cap the bounds are identical; with one, every row's lse bound grows by
    exactly ``(U_TANH_APPROX + U_RCP_APPROX) * cap`` and no output bound shrinks."""
    plain = CaseSpec("lse", ((33, 33), (40, 7)), dtype=torch.float32).build()
    ieee, approx = attention_lse_error_bounds(plain), attention_lse_error_bounds(plain, tanh_precision="approx")
    for name, a, b in zip(("ref", "bound", "ref_lse", "bound_lse"), ieee, approx):
        assert torch.equal(a, b), f"{name} changed on a case without a soft-cap"
    capped = SOFTCAP_SPECS[0].build()
    _, b_ieee, _, lse_ieee = attention_lse_error_bounds(capped)
    _, b_approx, _, lse_approx = attention_lse_error_bounds(capped, tanh_precision="approx")
    expected = (U_TANH_APPROX + U_RCP_APPROX) * capped.logits_soft_cap
    grew = lse_approx - lse_ieee
    off = float((grew - expected).abs().max())
    assert off <= 1e-12 * expected, f"lse bound grew by {grew.min():.6g}..{grew.max():.6g}, expected {expected:.6g}"
    assert bool((b_approx >= b_ieee).all()) and bool((b_approx > b_ieee).any()), "the output bound did not grow"


def test_precision_keywords_name_the_bad_tanh_precision():
    case = SOFTCAP_SPECS[0].build()
    out, lse = approx_softcap_attention(case)
    with pytest.raises(ValueError, match=r"check_attention\.tanh_precision: must be one of \('ieee', 'approx'\)"):
        check_attention(out, case, tanh_precision="fast")
    with pytest.raises(ValueError, match=r"check_attention_lse\.tanh_precision: must be one of"):
        check_attention_lse(out, lse, case, tanh_precision="approximate")


def test_the_suite_judges_a_backend_by_its_declared_tanh_precision():
    """``Capabilities.tanh_precision`` reaches the checks through ``Suite.policy``."""
    case = SOFTCAP_SPECS[0].build()
    for declare, passes in ((True, True), (False, False)):
        backend = ApproxTanhBackend(declare=declare)
        suite = Suite(backend=backend, backend_spec="x", device="cpu", profile="quick", replay_dir=".")
        policy = suite.policy(case)
        assert policy["tanh_precision"] == ("approx" if declare else "ieee"), policy
        _, lse_check = check_attention_lse(*backend.paged_attention_lse(case), case, **policy)
        assert lse_check.passed == passes, f"declared={declare}, judged by Suite.policy:\n{lse_check}"


def test_the_claims_lines_show_a_declared_approximate_tanh():
    info = backend_info(ApproxTanhBackend(declare=True))
    lines = _claims_lines(info)
    assert lines[0] == "  policy: fp32 dot precision ieee, soft-cap tanh approx", lines
    limit = (
        "  limit: soft-cap tanh: approximate, tanh.approx.f32 and an approximate 1/cap (tanh_precision 'approx') "
        "(every capped score off by 2**-11 relative)"
    )
    assert limit in lines, lines
    assert info["capabilities"]["tanh_precision"] == "approx" and info["tanh_precision"] == "approx", info
    plain = _claims_lines(backend_info(ApproxTanhBackend(declare=False)))
    assert plain[0] == "  policy: fp32 dot precision ieee" and not any("tanh" in line for line in plain), plain


def test_a_declared_approximate_tanh_passes_the_soft_cap_family_with_its_header(pytester):
    """End to end: the header's policy and limit lines, the JSON's capabilities, and every
    soft-cap case passed on the declared bound (the same kernel fails them undeclared:
    ``test_an_approximate_tanh_fails_the_ieee_policy_and_passes_its_declared_one``)."""
    from pathlib import Path

    helper = Path(__file__).parent / "planted" / "approx_tanh.py"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--pyargs",
        "pagedattn.conformance.test_logits_soft_cap",
        f"--backend={helper}:declared",
        "--report-json=r.json",
    )
    result.stdout.fnmatch_lines(
        ["*policy: fp32 dot precision ieee, soft-cap tanh approx*", "*limit: soft-cap tanh: approximate*"]
    )
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["target"]["capabilities"]["tanh_precision"] == "approx", report["target"]
    assert report["target"]["tanh_precision"] == "approx", report["target"]
    statuses = {c["id"]: c["status"] for c in report["cases"]}
    assert statuses and set(statuses.values()) == {"passed"}, statuses
    assert result.ret == 0, result.stdout.str()[-2000:]
