"""A wrong command line is a usage error (exit 4) with one clear line, found before any case
runs, and kept in the JSON report wherever the report's path is usable: ``--report-json``
naming a directory, an uncreatable path or another live run's report; a bad ``--replay`` or
``--expectations`` file; under ``-n 2``, a backend file that cannot load, found once (on the
controller where its source tells, else at the first worker that fails), not by every worker
in turn.
"""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

DECODE = "pagedattn.conformance.test_decode"

SYNTAX_ERROR = "class Backend:\n    def paged_attention(self, case)\n        return case\n"
NEEDS_ARGUMENTS = """
from pagedattn import Capabilities


class Backend:
    name = "needs-arguments"
    capabilities = Capabilities()

    def __init__(self, device, *, stream=None):
        pass

    def paged_attention(self, case):
        raise NotImplementedError
"""
IMPORT_FAILS = "import pagedattn_no_such_module\n\n\nclass Backend:\n    pass\n"


def _run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pyargs", DECODE, *args)


def _one_error_line(result, want):
    """Exit 4, one ``ERROR:`` line that says ``want``, no INTERNALERROR and no traceback."""
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, f"exit {result.ret}, want 4:\n{out[-3000:]}"
    errors = [line for line in out.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and want in errors[0], f"want one ERROR line saying {want!r}:\n{out[-3000:]}"
    assert "INTERNALERROR" not in out and "Traceback" not in out, out[-3000:]
    return out


def _report_error(pytester, want):
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["exit_status"] == 4 and want in report["error"], report.get("error")
    assert report["complete"] is True and report["cases"] == []


@pytest.mark.parametrize("where", ["a directory", "under a file"])
def test_an_unusable_report_path_is_a_usage_error(pytester, where):
    if where == "a directory":
        (pytester.path / "out").mkdir()
        path, want = "out", "--report-json=out: is a directory; give a file path"
    else:
        (pytester.path / "afile").write_text("")
        path, want = "afile/r.json", "--report-json=afile/r.json: cannot create its directory"
    _one_error_line(_run(pytester, "--backend=reference", f"--report-json={path}"), want)


@pytest.mark.parametrize(
    "option, want",
    [
        ("--replay=missing.pt", "--replay=missing.pt"),
        ("--expectations=missing.json", "--expectations=missing.json: cannot read it as JSON"),
        pytest.param(
            "--device=cuda",
            "--device=cuda: torch sees no CUDA device here",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here"),
        ),
    ],
)
def test_bad_files_or_device_are_usage_errors_kept_in_the_report(pytester, option, want):
    _one_error_line(_run(pytester, "--backend=reference", "--report-json=r.json", option), want)
    _report_error(pytester, want)
    assert not (pytester.path / "r.json.lock").exists(), "the report's lock outlived the run"


def test_a_report_another_live_run_writes_is_a_usage_error(pytester):
    """The lock file beside the report names a live process (this test's): the second run stops,
    naming the path and that process; the first run's report is left as it was."""
    (pytester.path / "r.json").write_text('{"theirs": true}')
    (pytester.path / "r.json.lock").write_text(f"{os.getpid()}\n")
    result = _run(pytester, "--backend=reference", "--report-json=r.json")
    _one_error_line(result, f"--report-json=r.json: another run (pid {os.getpid()}) is writing this report")
    assert json.loads((pytester.path / "r.json").read_text()) == {"theirs": True}


def test_a_dead_runs_lock_is_taken_over_and_a_finished_run_removes_its_own(pytester):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (pytester.path / "r.json.lock").write_text(f"{dead.pid}\n")
    result = _run(pytester, "--backend=reference", "--report-json=r.json", "-k", "d64-fp32")
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert json.loads((pytester.path / "r.json").read_text())["complete"] is True
    assert not (pytester.path / "r.json.lock").exists(), "the run left its lock file behind"


@pytest.mark.parametrize(
    "source, want",
    [
        (SYNTAX_ERROR, "--backend=planted.py:Backend: importing 'planted.py' failed: SyntaxError: expected ':'"),
        (
            NEEDS_ARGUMENTS,
            "--backend=planted.py:Backend: constructing the backend failed: Backend.__init__() needs the "
            "arguments device",
        ),
    ],
    ids=["syntax-error", "constructor-arguments"],
)
def test_xdist_controller_finds_a_broken_backend_file_before_the_workers_start(pytester, source, want):
    (pytester.path / "planted.py").write_text(source)
    start = time.monotonic()
    result = _run(pytester, "-n", "2", "--backend=planted.py:Backend", "--report-json=r.json")
    elapsed = time.monotonic() - start
    out = _one_error_line(result, want)
    assert "node down" not in out and "bringing up nodes" not in out, "workers were started:\n" + out[-3000:]
    assert elapsed < 30, f"{elapsed:.0f} s for a usage error"
    _report_error(pytester, want)


@pytest.mark.slow
def test_xdist_stops_at_the_first_worker_that_cannot_load_the_backend(pytester):
    """A failure only an import shows: the first worker's ends the run (each of the two workers
    may report it; pytest-xdist would otherwise replace them eight times)."""
    (pytester.path / "planted.py").write_text(IMPORT_FAILS)
    result = _run(pytester, "-n", "2", "--backend=planted.py:Backend", "--report-json=r.json")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, f"exit {result.ret}:\n{out[-3000:]}"
    downs = out.count("node down")
    assert 1 <= downs <= 2, f"{downs} workers failed to start, want at most one per worker:\n{out[-3000:]}"
    assert "replacing crashed worker" not in out, out[-3000:]
    _report_error(pytester, "No module named 'pagedattn_no_such_module'")
