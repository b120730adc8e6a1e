"""Verdicts that survive any fault: planted faulty backends (segfault, hang, raise, a
constructor that crashes, all-NaN, wrong shape), each under the plain run, --isolate, -n 2
and both, asserting on the JSON report: every collected case present exactly once, the
statuses as specified, a replay for every failed or crashed case, and no case of an
all-invalid backend passed.

The default run holds a representative subset; the whole matrix is marked slow.
"""

import fnmatch
import json
import re
import sys
import time

import pytest
import torch
from pagedattn.conformance.test_properties import PROPERTIES, SPECS

from pagedattn.cases import grid
from tests.helpers import N_DECODE, N_DECODE_FP32, N_SINGLE, import_session_modules, run_inprocess

import_session_modules()  # before the in-process runs below (see its docstring)

DECODE = "pagedattn.conformance.test_decode"
PROPS = "pagedattn.conformance.test_properties"
# the decode family, and every property on the fp32 mixed batch
SUBSET = [DECODE, PROPS, "-k", "test_decode or (test_property and mixed and fp32)"]
DECODE_IDS = {s.id for s in grid("quick", "decode")}
PROP_SPECS = [s.id for s in SPECS("quick") if s.family == "mixed" and s.dtype == torch.float32]
N_CASES = N_DECODE + len(PROP_SPECS) * len(PROPERTIES)
SINGLE = {s.id for s in grid("quick", "decode") if len(s.seqs) == 1}  # where the planted faults strike

MODES = {"plain": [], "isolate": ["--isolate"], "xdist": ["-n", "2"], "both": ["-n", "2", "--isolate"]}
FAULTS = ["SegfaultsOnLongDecode", "HangsOnLongDecode", "Raises", "CrashesWhenConstructed", "ReturnsNaN", "WrongShape"]
# the default run: a crash, a raise, a constructor crash and invalid outputs; -n 2 is in test_plugin
QUICK = {
    ("SegfaultsOnLongDecode", "plain"),
    ("Raises", "isolate"),
    ("CrashesWhenConstructed", "isolate"),
    ("ReturnsNaN", "plain"),
}
HANG_KILL_S = 40  # a hang without --isolate is not guarded: the test kills the run


def _run(pytester, *args, timeout=None, in_process=False):
    """The run's result (``None`` if the test had to kill it) and its JSON report. In a new
    Python process, which a fault may kill, unless ``in_process`` (a run that cannot crash:
    it saves the 2-3 s of a new interpreter importing torch)."""
    args = ("-p", "no:cacheprovider", "--report-json=r.json", "--pyargs", *args)
    try:
        if in_process:
            result = run_inprocess(pytester, *args)
        else:
            result = pytester.runpytest_subprocess(*args, timeout=timeout)
    except pytester.TimeoutExpired:
        result = None
    report = json.loads((pytester.path / "r.json").read_text())
    return result, report


def _accounted(report, n=N_CASES):
    """Every collected case is in the report exactly once, with a known status; a replay
    for every failed, crashed or timed-out one."""
    cases = report["cases"]
    nodeids = [c["nodeid"] for c in cases]
    assert len(nodeids) == len(set(nodeids)) == n, f"{len(nodeids)} records ({len(set(nodeids))} distinct), want {n}"
    assert {c["id"] for c in cases if c["family"] == "decode"} == DECODE_IDS
    for c in cases:
        assert c["status"] in {"passed", "failed", "warned", "unsupported", "crashed", "timed_out", "not_run"}, c
        if c["status"] in ("failed", "crashed", "timed_out"):
            assert c["replay"] and c["replay"].startswith("pytest "), f"no replay for {c['status']} {c['id']}"
    return {c["nodeid"]: c for c in cases}


def _stderr_says(pytester, pattern, wait_s=15.0):
    """The run's stderr gets ``pattern`` (the watcher process writes it just after the run
    died, possibly after pytester read the stream: read its file again until it shows)."""
    deadline = time.monotonic() + wait_s
    while True:
        text = (pytester.path / "stderr").read_text()
        if any(fnmatch.fnmatch(line, pattern) for line in text.splitlines()):
            return
        assert time.monotonic() < deadline, f"stderr never said {pattern!r}:\n{text[-2000:]}"
        time.sleep(0.2)


def _by_status(cases):
    out = {}
    for c in cases.values():
        out[c["status"]] = out.get(c["status"], 0) + 1
    return out


def _statuses(report, family="decode"):
    return {c["id"]: c["status"] for c in report["cases"] if c["family"] == family}


def _matrix():
    for fault in FAULTS:
        for mode in MODES:
            marks = () if (fault, mode) in QUICK else (pytest.mark.slow,)
            yield pytest.param(fault, mode, id=f"{fault}-{mode}", marks=marks)


@pytest.mark.parametrize("fault, mode", list(_matrix()))
def test_every_fault_under_every_mode_leaves_a_complete_report(pytester, bad, fault, mode):
    args = [*SUBSET, f"--backend={bad}:{fault}", *MODES[mode]]
    isolated = "--isolate" in MODES[mode]
    if fault == "HangsOnLongDecode":
        args += ["--case-timeout=2"] if isolated else []
        result, report = _run(pytester, *args, timeout=None if isolated else HANG_KILL_S)
    else:
        result, report = _run(pytester, *args)
    if result is not None:
        assert result.ret != 0, "a run with a faulty backend must fail"
    check = globals()[f"_check_{fault}"]
    check(report, result, mode, isolated, pytester)


def _check_SegfaultsOnLongDecode(report, result, mode, isolated, pytester):
    cases = _accounted(report)
    decode = _statuses(report)
    if isolated or mode == "xdist":  # the child, or the worker, dies; a fresh one goes on
        assert report["complete"] is True
        assert {i for i, s in decode.items() if s == "crashed"} == SINGLE
        # batch invariance runs each sequence alone: a single-sequence call, which crashes
        crashed = {
            c.get("property") for c in cases.values() if c["family"] == "properties" and c["status"] == "crashed"
        }
        assert crashed == {"batch_invariance"}
        assert _by_status(cases) == {
            "crashed": len(SINGLE) + len(PROP_SPECS),
            "unsupported": len(PROP_SPECS),
            "passed": N_CASES - len(SINGLE) - 2 * len(PROP_SPECS),
        }
        if isolated:
            assert all(
                "killed by SIGSEGV" in decode_case["message"]
                for decode_case in cases.values()
                if decode_case["status"] == "crashed"
            )
        return
    # plain: the process died under the first single-sequence case
    assert report["complete"] is False
    crashed = [c for c in cases.values() if c["status"] == "crashed"]
    assert len(crashed) == 1 and crashed[0]["id"] in SINGLE
    assert "rerun with --isolate" in crashed[0]["message"]
    assert {c["status"] for c in cases.values()} <= {"passed", "crashed", "not_run"}
    assert "not_run" in {c["status"] for c in cases.values()}
    _stderr_says(pytester, "pagedattn: the test process died while running *test_decode*Rerun with --isolate*")
    # and the report of the unfinished run prints as a table
    shown = pytester.run(sys.executable, "-m", "pagedattn", "report", "r.json")
    assert shown.ret == 1
    shown.stdout.fnmatch_lines(
        [
            "*unfinished run*",
            "decode*fp32*",
            f"{N_CASES} cases:*1 crashed*not_run*",
            "the run did not finish; it died while running *test_decode*: rerun with --isolate*",
            "crashed: *: the process died while running this case*",
            "  replay: pytest *--isolate*",
        ]
    )


def _check_HangsOnLongDecode(report, result, mode, isolated, pytester):
    cases = _accounted(report)
    if isolated:
        assert report["complete"] is True
        decode = _statuses(report)
        assert {i for i, s in decode.items() if s == "timed_out"} == SINGLE
        timed_out = {
            c.get("property") for c in cases.values() if c["family"] == "properties" and c["status"] == "timed_out"
        }
        assert timed_out == {"batch_invariance"}  # it runs each sequence alone
        assert _by_status(cases) == {
            "timed_out": len(SINGLE) + len(PROP_SPECS),
            "unsupported": len(PROP_SPECS),
            "passed": N_CASES - len(SINGLE) - 2 * len(PROP_SPECS),
        }
        return
    # not guarded: the test killed the run; the case(s) it hung in are crashed, the rest accounted for
    assert result is None and report["complete"] is False
    crashed = [c for c in cases.values() if c["status"] == "crashed"]
    assert 1 <= len(crashed) <= 2 and all(c["id"] in SINGLE for c in crashed)
    assert {c["status"] for c in cases.values()} <= {"passed", "crashed", "not_run"}


def _check_Raises(report, result, mode, isolated, pytester):
    assert report["complete"] is True
    cases = _accounted(report)
    assert _by_status(cases) == {"failed": N_CASES - len(PROP_SPECS), "unsupported": len(PROP_SPECS)}
    cases = {n: c for n, c in cases.items() if c.get("property") != "out_argument"}  # takes no out=
    shape = re.compile(
        r"^\S+ \[attention\]: the backend raised RuntimeError: kernel launch failed: too many resources requested "
        r"\(at bad_backends\.py:\d+ in paged_attention\)\n  replay: pytest "
    )
    for c in cases.values():
        assert shape.match(c["message"]), c["message"]
        assert "Traceback" in c["traceback"] and "RuntimeError" in c["traceback"]
    # short: a few lines per failing case, not a pytest traceback into the suite
    assert len(result.stdout.lines) < 8 * N_CASES + 80


def _check_CrashesWhenConstructed(report, result, mode, isolated, pytester):
    if isolated:
        assert report["complete"] is True
        cases = _accounted(report)
        assert {c["status"] for c in cases.values()} == {"not_run"}
        reasons = {c["reason"] for c in cases.values()}
        assert reasons == {"the backend crashed while being constructed: was killed by SIGSEGV"}
        assert report["error"] == reasons.pop()
        result.stdout.fnmatch_lines(["*ERROR: the backend crashed while being constructed: was killed by SIGSEGV*"])
        assert result.ret == 1
        return
    # in process the constructor takes the process with it: before any collection (plain) or
    # in every worker (xdist); the report is valid and says the run did not finish
    assert report["complete"] is False or report["counts"]["passed"] == 0
    assert all(c["status"] in ("crashed", "not_run") for c in report["cases"])
    if mode == "plain":
        assert report["cases"] == [] and "constructing the backend" in report["notes"]
        _stderr_says(pytester, "pagedattn: the test process died while running the backend's construction*")


def _invalid_everywhere(report, result, text):
    assert report["complete"] is True
    cases = _accounted(report)
    assert report["counts"]["passed"] == 0
    # every property that can run fails (out= is unsupported: the backend takes no out=)
    assert _by_status(cases) == {"failed": N_CASES - len(PROP_SPECS), "unsupported": len(PROP_SPECS)}
    failed = [c for c in cases.values() if c["status"] == "failed"]
    assert {c["property"] for c in failed if c["family"] == "properties"} == set(PROPERTIES) - {"out_argument"}
    assert all(text in c["message"] for c in failed), [c["message"] for c in failed][:3]
    assert {r["worst_budget"] for r in report["summary"]} == {"invalid"}
    result.stdout.fnmatch_lines(["*decode*fp32*0*5*invalid*"])


def _check_ReturnsNaN(report, result, mode, isolated, pytester):
    _invalid_everywhere(report, result, "non-finite where the reference is finite")


def _check_WrongShape(report, result, mode, isolated, pytester):
    _invalid_everywhere(report, result, "shape (")


# ------------------------------------------------------------------ other faults
@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "soon"])
def test_case_timeout_accepts_positive_finite_seconds_or_none(pytester, value):
    result = pytester.runpytest("--pyargs", DECODE, "--backend=reference", f"--case-timeout={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--case-timeout*positive finite seconds or 'none'*"])


def test_an_adapter_skip_is_unsupported_with_its_reason(pytester, bad):
    result, report = _run(pytester, DECODE, f"--backend={bad}:SkipsMultiSequence", "--isolate")
    result.assert_outcomes(passed=N_SINGLE, skipped=N_DECODE - N_SINGLE)
    statuses = {c["status"] for c in report["cases"]}
    assert statuses == {"passed", "unsupported"}
    assert {c["reason"] for c in report["cases"] if c["status"] == "unsupported"} == {
        "this adapter runs one sequence per call"
    }
    result.stdout.fnmatch_lines(["*unsupported: this adapter runs one sequence per call*"])


@pytest.mark.parametrize(
    "fault, isolate",
    [
        ("RaisesOnSingleSequence", False),  # in this process: the expectations' logic, 0.3 s
        pytest.param("SegfaultsOnLongDecode", True, marks=pytest.mark.slow),  # crashes under --isolate, ~9 s
    ],
    ids=["raises", "crashes-isolate"],
)
def test_expectations_xfail_xpass_and_stale(pytester, bad, fault, isolate):
    (pytester.path / "exp.json").write_text(
        json.dumps(
            {
                "expected_failures": [
                    {"case": "decode-*-L300", "reason": "crashes on single-sequence batches"},
                    {"case": "decode-gqa2-bs16-d64-fp32-L70-B3", "reason": "believed broken"},
                    {"case": "prefill-*", "reason": "no such case in this run"},
                ]
            }
        )
    )
    # reporting only (--lenient-expectations): the strict default is tests/test_gate.py's
    args = (f"--backend={bad}:{fault}", "--expectations=exp.json", "--lenient-expectations")
    args += ("--isolate",) if isolate else ()
    result, report = _run(pytester, DECODE, *args, in_process=not isolate)
    result.assert_outcomes(passed=N_DECODE - N_SINGLE - 1, xfailed=N_SINGLE, xpassed=1)
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "*unexpected pass (listed in --expectations): decode-gqa2-bs16-d64-fp32-L70-B3*",
            "*stale expectation: 'prefill-*' matched no case*",
        ]
    )
    assert report["expectations"]["unexpected_passes"] == ["decode-gqa2-bs16-d64-fp32-L70-B3"]
    assert [e["case"] for e in report["expectations"]["stale"]] == ["prefill-*"]


def test_bad_expectations_file_is_a_usage_error(pytester):
    (pytester.path / "exp.json").write_text(json.dumps({"expected_failures": [{"case": "x"}]}))
    result = run_inprocess(pytester, "--pyargs", DECODE, "--backend=reference", "--expectations=exp.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*entry 0 needs a 'case' pattern and a 'reason'*"])


def test_claimed_but_failing_fails(pytester, bad):
    result, _ = _run(pytester, DECODE, f"--backend={bad}:WrongScale", in_process=True)
    result.assert_outcomes(failed=N_DECODE)


def test_probe_unclaimed_reports_what_would_pass(pytester, bad):
    result, report = _run(pytester, DECODE, f"--backend={bad}:ClaimsFp32Only", "--probe-unclaimed=2", in_process=True)
    result.assert_outcomes(passed=N_DECODE_FP32, skipped=N_DECODE - N_DECODE_FP32)
    result.stdout.fnmatch_lines(["*probe of unclaimed cases (dtype float16 not claimed (fp32 build only)): 2 of 2*"])
    probes = report["probes"]
    assert sum(p["probed"] for p in probes.values()) == 4
    assert all(p["would_pass"] == p["probed"] for p in probes.values())


@pytest.mark.slow  # a child process a case over the variants, ~14 s: CI's second step
def test_isolation_carries_the_variants_and_the_lse(pytester):
    """A case's variant tensors and options cross into the child process, and the lse
    operation comes back from it: the same verdicts isolated as in process."""
    args = ("pagedattn.conformance.test_lse", "pagedattn.conformance.test_combined", "--backend=tlsim")
    plain = run_inprocess(pytester, "-p", "no:cacheprovider", "--pyargs", *args, "--report-json=a.json")
    isolated = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--pyargs", *args, "--isolate", "--report-json=b.json"
    )
    assert plain.ret == isolated.ret == 0

    def verdicts(name):
        report = json.loads((pytester.path / name).read_text())
        return sorted((c["id"], c["status"], c["metrics"]["budget_used"]) for c in report["cases"])

    assert verdicts("a.json") == verdicts("b.json")
    assert any("sinks" in i for i, _, _ in verdicts("b.json"))


@pytest.mark.slow
def test_when_xdist_stops_replacing_workers_the_rest_is_not_run(pytester, bad):
    result, report = _run(
        pytester, *SUBSET, f"--backend={bad}:SegfaultsOnLongDecode", "-n", "2", "--max-worker-restart=0"
    )
    assert result.ret != 0
    cases = _accounted(report)
    statuses = _by_status(cases)
    assert statuses.get("crashed", 0) >= 1 and statuses.get("not_run", 0) >= 1
    never = {c["reason"] for c in cases.values() if c["status"] == "not_run"}
    assert len(never) == 1 and "pytest-xdist did not run it after" in never.pop()
    result.stdout.fnmatch_lines([f"*not run: {statuses['not_run']} cases: never run: pytest-xdist*"])
