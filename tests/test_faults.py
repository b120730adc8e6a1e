"""Fault isolation, expectations and probing of unclaimed cases, with faulty backends."""

import json

import pytest

from tests.helpers import N_DECODE, N_DECODE_FP32, N_SINGLE

DECODE = "pagedattn.conformance.test_decode"


def _run(pytester, *args):
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--report-json=r.json", "--pyargs", *args)
    report = json.loads((pytester.path / "r.json").read_text())
    return result, report


def test_a_segfault_costs_one_case_and_the_run_goes_on(pytester, bad):
    result, report = _run(pytester, DECODE, f"--backend={bad}:SegfaultsOnLongDecode", "--isolate")
    result.assert_outcomes(failed=N_SINGLE, passed=N_DECODE - N_SINGLE)
    result.stdout.fnmatch_lines(
        [
            "*killed by signal SIGSEGV*fresh process serves the next case*",
            "*pagedattn conformance*isolated in a child process*",
            f"*decode*fp32*{N_DECODE_FP32 - 1}*1*",
        ]
    )
    assert sum(c["status"] == "failed" for c in report["cases"]) == N_SINGLE


def test_a_hang_costs_one_case_per_timeout(pytester, bad):
    result, report = _run(pytester, DECODE, f"--backend={bad}:HangsOnLongDecode", "--case-timeout=3")
    result.assert_outcomes(failed=N_SINGLE, passed=N_DECODE - N_SINGLE)
    result.stdout.fnmatch_lines(["*did not answer within 3 s (--case-timeout)*"])
    assert report["exit_status"] == 1 and len(report["cases"]) == N_DECODE


BAD_ANSWERS = {
    "Raises": "too many resources requested",
    "WrongShape": "shape (*, 1, *), expected",
    "WrongDtype": "dtype torch.float64, expected the query dtype",
    "WrongDevice": "device meta, expected the case's device",
    "ReturnsNaN": "non-finite where the reference is finite",
}
# a meta tensor cannot cross a process boundary, so WrongDevice runs in-process only
COMBOS = [(c, False) for c in BAD_ANSWERS] + [(c, True) for c in BAD_ANSWERS if c != "WrongDevice"]


@pytest.mark.parametrize("cls, isolate", COMBOS, ids=[f"{c}-{'isolated' if i else 'in-process'}" for c, i in COMBOS])
def test_bad_answers_fail_every_case_clearly(pytester, bad, cls, isolate):
    text = BAD_ANSWERS[cls]
    args = [DECODE, f"--backend={bad}:{cls}"] + (["--isolate"] if isolate else [])
    result, report = _run(pytester, *args)
    result.assert_outcomes(failed=N_DECODE)
    result.stdout.fnmatch_lines([f"*{text}*"])
    assert {c["status"] for c in report["cases"]} == {"failed"}


def test_expectations_xfail_xpass_and_stale(pytester, bad):
    (pytester.path / "exp.json").write_text(json.dumps({"expected_failures": [
        {"case": "decode-*-L300", "reason": "crashes on single-sequence batches"},
        {"case": "decode-gqa2-bs16-d64-fp32-L70-B3", "reason": "believed broken"},
        {"case": "prefill-*", "reason": "no such case in this run"},
    ]}))  # fmt: skip
    result, report = _run(
        pytester, DECODE, f"--backend={bad}:SegfaultsOnLongDecode", "--isolate", "--expectations=exp.json"
    )
    result.assert_outcomes(passed=N_DECODE - N_SINGLE - 1, xfailed=N_SINGLE, xpassed=1)
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "*unexpected pass (listed in --expectations): decode-gqa2-bs16-d64-fp32-L70-B3*",
        "*stale expectation: 'prefill-*' matched no case*",
    ])  # fmt: skip
    assert report["expectations"]["unexpected_passes"] == ["decode-gqa2-bs16-d64-fp32-L70-B3"]
    assert [e["case"] for e in report["expectations"]["stale"]] == ["prefill-*"]


def test_bad_expectations_file_is_a_usage_error(pytester):
    (pytester.path / "exp.json").write_text(json.dumps({"expected_failures": [{"case": "x"}]}))
    result = pytester.runpytest_subprocess("--pyargs", DECODE, "--backend=reference", "--expectations=exp.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*entry 0 needs a 'case' pattern and a 'reason'*"])


def test_claimed_but_failing_fails(pytester, bad):
    result, _ = _run(pytester, DECODE, f"--backend={bad}:WrongScale")
    result.assert_outcomes(failed=N_DECODE)


def test_probe_unclaimed_reports_what_would_pass(pytester, bad):
    result, report = _run(pytester, DECODE, f"--backend={bad}:ClaimsFp32Only", "--probe-unclaimed=2")
    result.assert_outcomes(passed=N_DECODE_FP32, skipped=N_DECODE - N_DECODE_FP32)
    result.stdout.fnmatch_lines(["*probe of unclaimed cases (dtype float16 not claimed (fp32 build only)): 2 of 2*"])
    probes = report["probes"]
    assert sum(p["probed"] for p in probes.values()) == 4
    assert all(p["would_pass"] == p["probed"] for p in probes.values())


def test_isolation_carries_the_variants_and_the_lse(pytester):
    """A case's variant tensors and options cross into the child process, and the lse
    operation comes back from it: the same verdicts isolated as in process."""
    args = ("pagedattn.conformance.test_lse", "pagedattn.conformance.test_combined", "--backend=tlsim")
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pyargs", *args, "--report-json=a.json")
    isolated = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--pyargs", *args, "--isolate", "--report-json=b.json"
    )  # fmt: skip
    assert plain.ret == isolated.ret == 0

    def verdicts(name):
        report = json.loads((pytester.path / name).read_text())
        return sorted((c["id"], c["status"], c["metrics"]["budget_used"]) for c in report["cases"])

    assert verdicts("a.json") == verdicts("b.json")
    assert any("sinks" in i for i, _, _ in verdicts("b.json"))
