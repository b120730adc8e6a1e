"""A backend that leaves a non-daemon thread running does not hang pytest after the summary:
the run ends with its own exit status, warns naming the thread (terminal and JSON report),
and writes the JUnit XML, in process and under pytest-xdist (where each worker warns)."""

import json
import time

import pytest

from tests.helpers import N_DECODE

DECODE = "pagedattn.conformance.test_decode"
THREAD = "'planted-forever' (target pagedattn_adapter_bad_backends._sleep_forever)"
LIMIT_S = 90  # the thread sleeps 600 s: a run that waits for it is killed here


@pytest.mark.parametrize(
    "backend, mode, status",
    [
        ("LeavesThread", [], pytest.ExitCode.OK),
        ("LeavesThreadWrongScale", ["-n", "2"], pytest.ExitCode.TESTS_FAILED),
    ],
    ids=["plain-passing", "xdist-failing"],
)
def test_a_thread_left_running_does_not_hang_the_run(pytester, bad, backend, mode, status):
    args = ["-p", "no:cacheprovider", "--report-json=r.json", "--junitxml=j.xml", "--pyargs", DECODE]
    start = time.monotonic()
    try:
        result = pytester.runpytest_subprocess(*args, f"--backend={bad}:{backend}", *mode, timeout=LIMIT_S)
    except pytester.TimeoutExpired:
        pytest.fail(f"the run did not end within {LIMIT_S} s: it waits for the backend's thread")
    took = time.monotonic() - start
    assert result.ret == status, f"exit status {result.ret}, want {status!r} ({took:.0f} s)"
    out = result.stdout.str()
    warnings = [line for line in out.splitlines() if line.startswith("warning: the backend left")]
    assert warnings and all(THREAD in w for w in warnings), f"no warning naming {THREAD}:\n{out[-3000:]}"
    assert len(warnings) == (2 if mode else 1), warnings  # one per process that loaded the backend
    report = json.loads((pytester.path / "r.json").read_text())
    assert sorted(n for n in report["notes"] if THREAD in n) == sorted(w.removeprefix("warning: ") for w in warnings)
    statuses = {c["status"] for c in report["cases"]}
    assert len(report["cases"]) == N_DECODE and statuses == {"passed" if status == 0 else "failed"}, statuses
    assert "<testsuite" in (pytester.path / "j.xml").read_text(), "no JUnit XML"


@pytest.mark.slow
def test_a_thread_left_by_a_constructor_that_exits_does_not_hide_the_usage_error(pytester, bad):
    args = ["-p", "no:cacheprovider", "--report-json=r.json", "--pyargs", DECODE]
    try:
        result = pytester.runpytest_subprocess(*args, f"--backend={bad}:LeavesThreadAndExits", timeout=LIMIT_S)
    except pytester.TimeoutExpired:
        pytest.fail(f"the run did not end within {LIMIT_S} s: it waits for the backend's thread")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, f"exit status {result.ret}, want 4"
    err = result.stderr.str()
    assert "constructing the backend exited with code 9 (sys.exit)" in err, err[-2000:]
    assert f"warning: the backend left non-daemon thread(s) running: {THREAD}" in err, err[-2000:]
    assert json.loads((pytester.path / "r.json").read_text())["exit_status"] == 4
