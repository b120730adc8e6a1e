"""Every way out of a kernel is a verdict: ``SystemExit`` or another ``BaseException``
subclass from a kernel fails its case with a replay and the run goes on; ``KeyboardInterrupt``
(the user's Ctrl-C) stops the run with every finished verdict in the report; ``sys.exit`` at a
backend's import or in its constructor is one usage error naming the backend and the code."""

import json

import pytest

from pagedattn.cases import grid
from tests.helpers import N_DECODE

DECODE = "pagedattn.conformance.test_decode"
SINGLE = {s.id for s in grid("quick", "decode") if len(s.seqs) == 1}  # where the planted faults strike
MODES = {"plain": [], "isolate": ["--isolate"]}


def _run(pytester, *args):
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--report-json=r.json", "--pyargs", *args)
    return result, json.loads((pytester.path / "r.json").read_text())


KERNEL_EXITS = {
    "sys.exit": ("ExitsOnSingleSequence", "the backend called sys.exit(3) (SystemExit)"),
    "BaseException": (
        "RaisesBaseExceptionOnSingleSequence",
        "the backend raised PlantedInterrupt: the runtime unwinds",
    ),
}


def _matrix(names, quick):
    """Every name under every mode; those not in ``quick`` marked slow."""
    for name in names:
        for mode in MODES:
            marks = () if (name, mode) in quick else (pytest.mark.slow,)
            yield pytest.param(name, mode, id=f"{name}-{mode}", marks=marks)


@pytest.mark.parametrize(
    "exit, mode", list(_matrix(KERNEL_EXITS, {("sys.exit", "isolate"), ("BaseException", "plain")}))
)
def test_an_exit_from_a_kernel_fails_its_case_with_a_replay(pytester, bad, exit, mode):
    fault, says = KERNEL_EXITS[exit]
    result, report = _run(pytester, DECODE, f"--backend={bad}:{fault}", *MODES[mode])
    assert result.ret == pytest.ExitCode.TESTS_FAILED, f"exit status {result.ret}, want 1"
    cases = {c["id"]: c for c in report["cases"]}
    assert len(report["cases"]) == len(cases) == N_DECODE, f"{len(report['cases'])} records, want {N_DECODE}"
    assert report["complete"] is True, "the run stopped at the exit"
    failed = {i for i, c in cases.items() if c["status"] == "failed"}
    assert failed == SINGLE, f"failed {sorted(failed)}, want the single-sequence cases {sorted(SINGLE)}"
    assert {c["status"] for i, c in cases.items() if i not in SINGLE} == {"passed"}
    for i in SINGLE:
        assert says in cases[i]["message"], f"{i}: {cases[i]['message']!r} does not say {says!r}"
        assert cases[i]["replay"].startswith("pytest ") and "--replay" in cases[i]["replay"], cases[i]
        assert cases[i]["traceback"], f"{i}: no traceback in the record"


def test_a_keyboard_interrupt_stops_the_run_and_keeps_the_finished_verdicts(pytester, bad):
    result, report = _run(pytester, DECODE, f"--backend={bad}:InterruptedOnFourthCall")
    assert result.ret == pytest.ExitCode.INTERRUPTED, f"exit status {result.ret}, want 2 (interrupted)"
    cases = report["cases"]
    assert len(cases) == len({c["nodeid"] for c in cases}) == N_DECODE, f"{len(cases)} records, want {N_DECODE}"
    statuses = [c["status"] for c in cases]
    assert statuses.count("passed") == 3, f"want the 3 verdicts before the interrupt kept: {statuses}"
    # the case the interrupt struck ended with the run, as a kill would end it: not a verdict
    assert statuses.count("crashed") == 1 and "failed" not in statuses, f"an interrupt is not a verdict: {statuses}"
    assert statuses.count("not_run") == N_DECODE - 4, f"want every case after the interrupt not_run: {statuses}"


@pytest.mark.parametrize(
    "where, mode", list(_matrix(["import", "constructor"], {("import", "isolate"), ("constructor", "plain")}))
)
def test_sys_exit_while_loading_is_one_usage_error_with_a_report(pytester, bad, where, mode):
    if where == "import":
        pytester.makepyfile(exits_at_import="import sys\n\nsys.exit(5)\n")
        spec, says = "exits_at_import.py:Backend", "importing 'exits_at_import.py' exited with code 5 (sys.exit)"
    else:
        spec, says = f"{bad}:ExitsWhenConstructed", "constructing the backend exited with code 7 (sys.exit)"
    result, report = _run(pytester, DECODE, f"--backend={spec}", *MODES[mode])
    assert result.ret == pytest.ExitCode.USAGE_ERROR, f"exit status {result.ret}, want 4 (usage error)"
    stderr = result.stderr.str()
    assert f"--backend={spec}: {says}" in stderr, stderr[-2000:]
    assert "INTERNALERROR" not in stderr + result.stdout.str(), "an internal error, not a usage error"
    assert says in report["error"] and report["exit_status"] == 4, report
