"""The exit status is the verdict: a run (or a saved report) passes only when cases were
judged, enough of them, and every expectation held; JUnit XML tells the statuses apart.

Scripted runs with planted backends (claims that leave every case unsupported, an
expectations file listing passing cases and an entry that matches nothing), and the
``report`` command on incomplete, empty, zero-judged and failing reports.
"""

import argparse
import json
import xml.etree.ElementTree as ET

import pytest

from pagedattn.__main__ import main as pagedattn_main
from pagedattn.runner.gate import NOTHING_JUDGED, floor_of, min_judged
from tests.helpers import N_DECODE, N_DECODE_FP32, N_SINGLE, QUICK_DECODE, import_session_modules, run_inprocess

import_session_modules()  # before the in-process runs below (see its docstring)

DECODE = "pagedattn.conformance.test_decode"

#: planted backends of this module, written next to each run
BACKENDS = """
import torch
from pagedattn import Capabilities, paged_attention_reference


class Typo:
    '''An adapter whose claims have a typo: no case of the grid has head dim 999.'''
    name = "typo"
    capabilities = Capabilities(head_dims={999})

    def paged_attention(self, case):
        return paged_attention_reference(case).to(case.dtype)


class Fp32FailsSingle:
    '''fp32 only (the rest unsupported); raises on single-sequence batches.'''
    name = "fp32-fails-single"
    capabilities = Capabilities(dtypes=frozenset({torch.float32}))

    def paged_attention(self, case):
        if case.num_seqs == 1:
            raise RuntimeError("kernel launch failed")
        return paged_attention_reference(case).to(case.dtype)
"""

#: two fp32 multi-sequence cases (they pass) and a single-sequence one (it fails)
PASSING = [s.id for s in QUICK_DECODE if s.dtype.itemsize == 4 and len(s.seqs) > 1][:2]
FAILING = next(s.id for s in QUICK_DECODE if s.dtype.itemsize == 4 and len(s.seqs) == 1)


def _run(pytester, *args):
    """A decode run in this process with this module's backends; the result and its JSON report."""
    (pytester.path / "gate_backends.py").write_text(BACKENDS)
    result = run_inprocess(pytester, "-p", "no:cacheprovider", "--pyargs", DECODE, "--report-json=r.json", *args)
    path = pytester.path / "r.json"
    return result, json.loads(path.read_text()) if path.exists() else None


def _statuses(report):
    return {c["id"]: c["status"] for c in report["cases"]}


def test_a_run_that_judged_nothing_fails_with_its_own_status(pytester):
    result, report = _run(pytester, f"--backend={pytester.path / 'gate_backends.py'}:Typo")
    assert result.ret == NOTHING_JUDGED, result.stdout.str()[-2000:]
    assert set(_statuses(report).values()) == {"unsupported"} and len(report["cases"]) == N_DECODE
    assert report["exit_status"] == NOTHING_JUDGED and report["gate"]["judged"] == 0
    assert report["gate"]["reasons"] == [f"nothing judged: no case reached a verdict ({N_DECODE} unsupported)"]
    result.stdout.fnmatch_lines(["*FAILED (pagedattn gate): nothing judged: no case reached a verdict*"])
    assert pagedattn_main(["report", str(pytester.path / "r.json")]) == NOTHING_JUDGED


def test_a_run_deselected_into_nothing_fails_unless_min_judged_is_zero(pytester):
    backend = f"--backend={pytester.path / 'gate_backends.py'}:Typo"
    result, report = _run(pytester, backend, "-k", "no_such_case")
    assert result.ret == NOTHING_JUDGED and report["cases"] == [], result.stdout.str()[-2000:]
    result.stdout.fnmatch_lines(["*FAILED (pagedattn gate): nothing judged: no case reached a verdict (no case)*"])
    allowed, report = _run(pytester, backend, "--min-judged=0")
    assert allowed.ret == 0 and report["gate"]["reasons"] == [] and report["gate"]["judged"] == 0


def test_min_judged_sets_a_floor_on_judged_cases(pytester):
    backend = f"--backend={pytester.path / 'gate_backends.py'}:Fp32FailsSingle"
    expect = f"--expectations={pytester.path / 'exp.json'}"
    (pytester.path / "exp.json").write_text(json.dumps({"expected_failures": [{"case": "*-L300", "reason": "r"}]}))
    # the fp32 cases are judged (passed or xfailed), the rest unsupported
    enough, report = _run(pytester, backend, expect, f"--min-judged={N_DECODE_FP32}")
    assert enough.ret == 0, enough.stdout.str()[-2000:]
    assert report["gate"]["judged"] == N_DECODE_FP32 and report["gate"]["min_judged"] == N_DECODE_FP32
    assert report["exit_status"] == 0 and report["gate"]["reasons"] == []
    short, report = _run(pytester, backend, expect, "--min-judged=0.9")
    assert short.ret == NOTHING_JUDGED
    need = floor_of(0.9, N_DECODE)
    assert report["gate"]["reasons"][0].startswith(f"too few judged: {N_DECODE_FP32} of {N_DECODE} cases"), report
    short.stdout.fnmatch_lines([f"*FAILED (pagedattn gate): too few judged*asks {need}*"])
    bad, _ = _run(pytester, backend, "--min-judged=1.5")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--min-judged*fraction in (0, 1]*"])


def test_min_judged_reads_a_count_or_a_fraction():
    assert min_judged("10") == 10 and isinstance(min_judged("10"), int)
    assert min_judged("0.5") == 0.5 and min_judged("1.0") == 1.0
    for text in ("-1", "0", "0.0", "1.5", "x", "nan"):
        if text == "0":
            assert min_judged(text) == 0
            continue
        with pytest.raises(argparse.ArgumentTypeError):
            min_judged(text)
    assert floor_of(None, 100) == 1 and floor_of(0.5, 7) == 4 and floor_of(0.1, 30) == 3 and floor_of(5, 3) == 5


def _expectations(pytester):
    (pytester.path / "exp.json").write_text(
        json.dumps(
            {
                "expected_failures": [
                    {"case": FAILING, "reason": "raises on one sequence"},
                    *({"case": case_id, "reason": "believed broken"} for case_id in PASSING),
                    {"case": "prefill-*", "reason": "matches no case of the suite"},
                ]
            }
        )
    )
    return f"--expectations={pytester.path / 'exp.json'}"


def test_expectations_are_strict_and_junit_tells_the_statuses_apart(pytester):
    """Listed cases that pass and an entry that matches nothing fail the run; JUnit XML
    carries every case's status as a property, skip messages that start with the status,
    and an unexpected pass as a failure."""
    backend = f"--backend={pytester.path / 'gate_backends.py'}:Fp32FailsSingle"
    result, report = _run(pytester, backend, _expectations(pytester), "--junitxml=j.xml", "-k", "fp32 or bf16")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-3000:]
    statuses = _statuses(report)
    assert {statuses[c] for c in PASSING} == {"xpassed"} and statuses[FAILING] == "xfailed"
    assert "unsupported" in statuses.values()
    assert report["gate"]["stale_expectations"] == ["prefill-*"]
    assert any(r.startswith("unexpected pass of 2 listed case(s)") for r in report["gate"]["reasons"])
    result.stdout.fnmatch_lines(
        [
            f"*FAILED (pagedattn gate): unexpected pass of 2 listed case(s): {', '.join(PASSING)}*",
            "*FAILED (pagedattn gate): expectation(s) matching no collected case: 'prefill-*'*",
        ]
    )
    tree = ET.parse(pytester.path / "j.xml")
    cases = tree.getroot().findall(".//testcase")
    assert len(cases) == len(report["cases"])
    by_status: dict[str, list] = {}
    for case in cases:
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        by_status.setdefault(props["pagedattn_status"], []).append(case)
    assert set(by_status) == set(statuses.values()), sorted(by_status)
    for case in by_status["unsupported"]:
        assert case.find("skipped").get("message").startswith("unsupported: "), ET.tostring(case)[:300]
    for case in by_status["xfailed"]:
        assert case.find("skipped").get("message") == "xfailed: raises on one sequence", ET.tostring(case)[:300]
    for case in by_status["xpassed"]:
        assert case.find("failure") is not None and case.find("skipped") is None, ET.tostring(case)[:300]
    for case in by_status["passed"]:
        assert case.find("failure") is None and case.find("skipped") is None
    # a deselected case (-k) is not stale: the entry names a case the suite collected
    assert FAILING in statuses and all("fp8" not in c for c in statuses)

    lenient, report = _run(pytester, backend, _expectations(pytester), "--lenient-expectations")
    assert lenient.ret == 0, lenient.stdout.str()[-2000:]
    assert {_statuses(report)[c] for c in PASSING} == {"xpassed"} and report["gate"]["reasons"] == []
    lenient.stdout.fnmatch_lines(["*stale expectation: 'prefill-*' matched no case*"])
    assert pagedattn_main(["report", str(pytester.path / "r.json")]) == 0  # the run's own leniency


# ------------------------------------------------------------- python -m pagedattn report
def _case(nodeid, status):
    return {"nodeid": nodeid, "id": nodeid.split("[")[-1].rstrip("]"), "family": "decode", "dtype": "fp32",
            "status": status, "configuration": "k"}  # fmt: skip


def _report(cases, **head):
    return {"complete": True, "exit_status": 0, "error": None, "target": {"backend": "x"}, "cases": cases, **head}


@pytest.mark.parametrize(
    "report, status, says",
    [
        (_report([_case("t[a]", "passed")]), 0, None),
        (_report([_case("t[a]", "passed")], complete=False, running=["t[a]"]), 1, "incomplete: the run did not finish"),
        (_report([]), 1, "no cases: the report accounts for no collected case"),
        (_report([_case("t[a]", "unsupported"), _case("t[b]", "not_run")]), 1, "nothing judged"),
        (_report([_case("t[a]", "unsupported")]), NOTHING_JUDGED, "nothing judged: no case reached a verdict"),
        (_report([_case("t[a]", "passed")], error="usage error: --backend=x"), 1, "error: usage error: --backend=x"),
        (_report([_case("t[a]", "failed")], exit_status=1), 1, "failing cases: 1 failed"),
    ],
    ids=["passed", "incomplete", "empty", "not-run", "zero-judged", "error", "failed"],
)
def test_report_command_fails_a_report_that_is_no_verdict(tmp_path, capsys, report, status, says):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    assert pagedattn_main(["report", str(path)]) == status
    out = capsys.readouterr().out
    if says is None:
        assert "FAILED" not in out, out
    else:
        assert any(line.startswith("FAILED: ") and says in line for line in out.splitlines()), out


def test_report_command_rejects_what_is_not_a_report(tmp_path, capsys):
    (tmp_path / "x.json").write_text("[]")
    assert pagedattn_main(["report", str(tmp_path / "x.json")]) == 2
    assert pagedattn_main(["report"]) == 2


def test_expected_failures_count_as_judged_single_sequence_counts():
    # the planted runs above rely on the quick grid having both kinds of fp32 case
    assert N_SINGLE > 0 and len(PASSING) == 2 and FAILING.endswith("L300")


#: backends that end the process with status 0 behind the suite's back
SILENT_EXITS = """
import os
from pagedattn import Capabilities, paged_attention_reference


class ExitsZeroMidRun:
    '''Ends the process with status 0 on its third call, as a library calling exit(0) would.'''
    name = "exits-zero"
    capabilities = Capabilities()
    calls = 0

    def paged_attention(self, case):
        ExitsZeroMidRun.calls += 1
        if ExitsZeroMidRun.calls == 3:
            os._exit(0)
        return paged_attention_reference(case).to(case.dtype)


class ExitsZeroWhenConstructed:
    name = "exits-zero-constructed"
    capabilities = Capabilities()

    def __init__(self):
        os._exit(0)
"""


@pytest.mark.parametrize("backend", ["ExitsZeroMidRun", "ExitsZeroWhenConstructed"])
def test_a_process_that_exits_zero_behind_the_suite_leaves_a_report_that_fails(pytester, backend):
    """pytest's own status is 0 when a backend ends the process with ``os._exit(0)``: nothing
    can change that from inside. The report, written ahead, is incomplete (mid-run: the case
    that ran is ``crashed``, the rest ``not_run``; in the constructor: no case reached it), and
    ``pagedattn report`` on it fails, which is why the CI recipe runs it after pytest."""
    (pytester.path / "silent.py").write_text(SILENT_EXITS)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--pyargs",
        DECODE,
        f"--backend={pytester.path / 'silent.py'}:{backend}",
        "--report-json=r.json",
    )
    assert result.ret == 0, "os._exit(0) ends pytest with status 0; the report must carry the verdict"
    path = pytester.path / "r.json"
    assert path.exists(), "the write-ahead report must exist"
    report = json.loads(path.read_text())
    assert not report.get("complete", True), f"an interrupted run's report must say it is unfinished: {report}"
    if backend == "ExitsZeroMidRun":
        statuses = _statuses(report)
        assert len(statuses) == N_DECODE and list(statuses.values()).count("passed") == 2, statuses
        assert list(statuses.values()).count("crashed") == 1, statuses
    assert pagedattn_main(["report", str(path)]) != 0, "pagedattn report must fail an unfinished run"
