"""A run under ``-n 2`` stopped from outside (Ctrl-C, SIGTERM, SIGHUP, SIGKILL of the
controller) keeps every verdict that had arrived: the JSON report lists each finished case
with its verdict, the cases running then as ``crashed`` and the rest as ``not_run``.

Scripted runs in a new session: a planted backend that sleeps from its third call on each
worker (writing a file that says so), a signal to the controller once both workers sleep,
and the report read back. The controller's ``-v`` lines tell which verdicts had arrived.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from pagedattn.cases import grid

DECODE_IDS = {s.id for s in grid("quick", "decode")}

SLEEPER = '''
import os
import time

from pagedattn import Capabilities, paged_attention_reference


class SleepsFromThirdCall:
    """Correct for two calls per process, then asleep for 8 s (less if its parent goes)."""

    name = "sleeps-from-third-call"
    capabilities = Capabilities()

    def __init__(self):
        self.calls = 0

    def paged_attention(self, case):
        self.calls += 1
        if self.calls >= 3:
            open(f"asleep-{os.getpid()}", "w").close()
            parent = os.getppid()
            for _ in range(80):  # 8 s: past the signal, and short enough not to hold the run's end
                time.sleep(0.1)
                if os.getppid() != parent:
                    os._exit(1)
        return paged_attention_reference(case).to(case.dtype)
'''


def _default_signals():
    """The run starts with the signals' default dispositions, as from a terminal: a test process
    started in the background (``nohup``, ``&`` in a script) ignores SIGHUP and SIGINT, and its
    children would inherit that."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def _interrupted_run(path, signum, group=False):
    """Run the decode family under ``-n 2`` in ``path``, send ``signum`` to the controller (to
    its whole process group, as a terminal's Ctrl-C does, with ``group``) once both workers
    sleep; its exit status, output and report."""
    (path / "sleeper.py").write_text(SLEEPER)
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "-v", "--pyargs"]
    args += ["pagedattn.conformance.test_decode", "--backend=sleeper.py:SleepsFromThirdCall", "--report-json=r.json"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        args,
        cwd=path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_default_signals,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(path.glob("asleep-*"))) < 2:
            assert proc.poll() is None, f"the run ended before both workers slept:\n{proc.stdout.read()[-3000:]}"
            assert time.monotonic() < deadline, "the workers never reached the sleeping call"
            time.sleep(0.1)
        time.sleep(0.5)  # the verdicts before the sleeping calls reach the controller
        if group:
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _wait_gone(proc.pid)
    return proc.returncode, out, json.loads((path / "r.json").read_text())


def _wait_gone(group, wait_s=15.0):
    """No process of the run's session is left (the sleeping workers leave when orphaned)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            os.killpg(group, signal.SIGKILL)
            pytest.fail(f"processes of the interrupted run were still alive {wait_s:g} s after it ended")
        time.sleep(0.2)


def _check(out, report, settled):
    """Every verdict the controller printed is in the report; every case accounted for once."""
    cases = {c["nodeid"].split("@")[0]: c for c in report["cases"]}
    assert len(cases) == len(report["cases"]) == len(DECODE_IDS), f"{len(report['cases'])} records"
    assert {c["id"] for c in cases.values()} == DECODE_IDS
    printed = set(re.findall(r"\] PASSED (\S+)", out))
    assert printed, f"no verdict arrived before the signal:\n{out[-3000:]}"
    lost = sorted(n for n in printed if cases[n.split("@")[0]]["status"] != "passed")
    assert not lost, f"verdicts that had arrived were lost: {lost}"
    statuses = [c["status"] for c in cases.values()]
    assert statuses.count("crashed") == 2, f"the two sleeping cases are crashed: {statuses}"
    assert set(statuses) <= {"passed", "crashed", "not_run"}, statuses
    assert report["complete"] is settled


@pytest.mark.parametrize(
    "signum, group",
    [
        # SIGTERM (a CI runner's cancel) in the default run; the others take the same path
        pytest.param(signal.SIGINT, True, id="ctrl-c", marks=pytest.mark.slow),
        pytest.param(signal.SIGINT, False, id="sigint", marks=pytest.mark.slow),
        pytest.param(signal.SIGTERM, False, id="sigterm"),
        pytest.param(signal.SIGHUP, False, id="sighup", marks=pytest.mark.slow),
    ],
)
def test_a_stopped_run_keeps_every_verdict_and_settles_the_rest(pytester, signum, group):
    rc, out, report = _interrupted_run(pytester.path, signum, group)
    assert rc == pytest.ExitCode.INTERRUPTED, f"exit status {rc}, want 2:\n{out[-3000:]}"
    assert "Traceback (most recent call last)" not in out, out[-3000:]
    _check(out, report, settled=True)
    assert report["running"] == [], "a settled report has no case running"
    crashed = [c for c in report["cases"] if c["status"] == "crashed"]
    assert all("the run ended while this case was running" in c["message"] for c in crashed), crashed


def test_a_killed_controller_leaves_every_verdict_that_arrived(pytester):
    rc, out, report = _interrupted_run(pytester.path, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    _check(out, report, settled=False)  # nobody settled it: the write-ahead file as it was
