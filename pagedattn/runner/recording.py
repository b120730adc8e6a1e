"""The process that owns the case records (a serial run, or the pytest-xdist controller):
the hooks that feed pytest's reports into the ``RecordBook``, the JUnit properties, and a
watch process that speaks when this one dies.

Torch-free.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

from pagedattn._version import dist_version
from pagedattn.runner.case_record import AHEAD_KEY, noted, split_group
from pagedattn.runner.gate import gate_of
from pagedattn.runner.gate import verdict as gate_verdict
from pagedattn.runner.record_book import CRASH_HINT, RecordBook
from pagedattn.runner.session import Run
from pagedattn.runner.status import FAILING, Status

_WATCH = r"""
import sys
running, done = None, False
for line in sys.stdin:
    cmd, _, arg = line.rstrip("\n").partition(" ")
    running = arg if cmd == "start" else None if cmd == "end" else running
    done = done or cmd == "done"
if not done:
    where = f" while running {running}" if running else ""
    path = sys.argv[1]
    sys.stderr.write(
        f"\npagedattn: the test process died{where}. "
        + (f"The JSON report {path} accounts for every collected case (a case running then as crashed); "
           f"python -m pagedattn report {path} prints its table. " if path else "")
        + "Rerun with --isolate to contain crashes and hangs.\n"
    )
"""


def start_watch(path: str | None) -> subprocess.Popen[str] | None:
    """A tiny process that outlives a crash of this one and prints what happened and what to
    do (Python cannot run code after a segfault; this is the fatal-error handler)."""
    try:
        return subprocess.Popen(
            [sys.executable, "-c", _WATCH, path or ""], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
    except OSError:
        return None


def tell(run: Run, line: str) -> None:
    """Tell the watch what this process is doing: ``start <case>``, ``end``, ``done``."""
    if run.watch is not None and run.watch.stdin is not None:
        try:
            run.watch.stdin.write(line + "\n")
            run.watch.stdin.flush()
        except (OSError, ValueError):
            run.watch = None


class Recorder:
    """The one owner of the case records (``RecordBook``): in a serial run, or on the
    pytest-xdist controller, where the reports arrive from the workers."""

    def __init__(self, config: pytest.Config, run: Run, book: RecordBook):
        self.config = config
        self.run = run
        self.book = book
        self.ahead_workers: dict[str, bool] = {}  # xdist worker -> its warm-up ahead was on (AHEAD_KEY)
        self.collected_workers: set[str] = set()  # xdist workers that reported their collection

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.run.controller:
            return
        for item in session.items:
            self.book.collected(item.nodeid, noted(item))
        self.book.flush()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        # a worker parses the command line again: tell it the --dist mode chosen here
        node.workerinput["pagedattn_loadgroup"] = self.config.getoption("dist") == "loadgroup"

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.collected_workers.add(_worker_id(node))
        if self.config.getoption("dist") == "loadgroup" and ids and not any(split_group(i)[1] for i in ids):
            # the worker did not append the configuration to the node ids, so the scheduler
            # sees no groups (pytest-xdist#1386: pytest >= 9.2 ignores xdist's node-id rewrite)
            self.run.grouping_lost = (
                f"--dist loadgroup did not group the cases by configuration (pytest {pytest.__version__}, "
                f"pytest-xdist {dist_version('pytest-xdist')}: pytest-xdist#1386); a backend that compiles per "
                "configuration may compile one on several workers"
            )
        fresh = [i for i in ids if i not in self.book.records]
        for nodeid in fresh:
            self.book.collected(nodeid)
        if fresh:
            self.book.flush()

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        if nodeid in self.book.records:
            self.book.start(nodeid)
            tell(self.run, f"start {split_group(nodeid)[0]}")

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        tell(self.run, "end")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # pytest words a strict expectation's pass as a failure without ``wasxfail``: the book
        # is told it is an unexpected pass; JUnit XML and the terminal keep the failure
        strict_xpass = report.failed and str(report.longrepr or "").startswith("[XPASS(strict)] ")
        if strict_xpass:
            report.wasxfail = str(report.longrepr).removeprefix("[XPASS(strict)] ")
        try:
            rec = self.book.update(report, self._crash_hint(report))
        finally:
            if strict_xpass:
                del report.wasxfail
        if rec is None:
            return
        if rec.status is Status.XFAILED and report.skipped and hasattr(report, "wasxfail"):
            # JUnit XML's skip message says which kind of skip it is (unsupported ones say so already)
            reason = str(report.wasxfail).removeprefix("reason: ").removeprefix("expected failure: ")
            report.wasxfail = f"xfailed: {reason}"
        if report.when == "???":
            self.run.crashed_workers += 1
        # JUnit XML (and anything else reading the reports here) gets the record, not the raw facts
        report.user_properties = [
            ("pagedattn_status", rec.status.value),
            ("pagedattn", json.dumps(rec.to_dict() | {"traceback": None})),
        ]

    def _crash_hint(self, report: pytest.TestReport) -> str | None:
        """Under pytest-xdist, what a crash of the worker of ``report`` adds to its message:
        ``CRASH_HINT`` when that worker last said its warm-up ahead was compiling beside its
        cases (``AHEAD_KEY``), else ``""``. ``None`` in a serial run, whose plugin keeps the
        book's own hint while its walk is on."""
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
        if worker is None:
            return None
        said = [value for key, value in report.user_properties if key == AHEAD_KEY]
        if said:
            self.ahead_workers[worker] = bool(said[-1])
        return CRASH_HINT if self.ahead_workers.get(worker) else ""

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        self.run.testrunuid = getattr(node, "workerinput", {}).get("testrunuid", "") or self.run.testrunuid
        if error and _worker_id(node) not in self.collected_workers and str(error) != "keyboard-interrupt":
            # a worker that never collected failed to start (its configure: the backend did not
            # load there, or a replacement after a crash did not): the run's error only if no
            # worker started at all (``finish``)
            self.run.start_failure = self.run.start_failure or _startup_failure(str(error))
        took = getattr(node, "workeroutput", {}).get("pagedattn_gate")
        if took:  # every worker collected the same cases: any one's word will do
            gate = gate_of(self.config)
            gate.stale = gate.stale or list(took["stale"])
            gate.collected = gate.collected or list(took["collected"])
        info = getattr(node, "workeroutput", {}).get("pagedattn_info")
        if info and not self.run.info.get("capabilities"):
            self.run.info = dict(info)  # this worker's warm-up ahead counts included
            self.run.broken = self.run.broken or getattr(node, "workeroutput", {}).get("pagedattn_broken", "")
        elif info and info.get("warmup_ahead_stats"):  # every worker's warm-up ahead, summed
            total = self.run.info.setdefault("warmup_ahead_stats", {})
            for key, value in info["warmup_ahead_stats"].items():
                total[key] = round(total.get(key, 0) + value, 2)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        gate = gate_of(self.config)
        if gate.shard is not None:
            index, count = gate.shard
            terminalreporter.write_line(
                f"shard {index}/{count}: {len(self.book.records)} of {len(gate.collected)} collected cases; merge the "
                "shards' reports with python -m pagedattn report A.json B.json ..."
            )
        for reason in gate.reasons:
            terminalreporter.write_line(f"FAILED (pagedattn gate): {reason}", red=True)


def gate_output(config: pytest.Config) -> dict[str, Any]:
    """What an xdist worker tells the controller of the gate: the stale expectations and the
    collected node ids (only a worker sees the collection before deselection)."""
    gate = gate_of(config)
    return {"stale": gate.stale, "collected": gate.collected}


def _worker_id(node: Any) -> str:
    return str(
        getattr(getattr(node, "gateway", None), "id", "") or getattr(node, "workerinput", {}).get("workerid", "")
    )


def _startup_failure(error: str) -> str:
    """One line for a pytest-xdist worker that failed to start, from its traceback ``error``:
    ``usage error: MESSAGE`` for a ``pytest.UsageError`` (the backend's import, attribute or
    constructor, as ``load_backend`` words it), else ``a worker failed to start: LAST LINE``."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith(("_pytest.config.exceptions.UsageError: ", "pytest.UsageError: ", "UsageError: ")):
            message = line.split("UsageError: ", 1)[1]
            if message.endswith(":"):  # "importing 'x' failed:" and the import's traceback: its exception
                message = f"{message} {_wrapped_cause(lines[i + 1 :])}".strip()
            return f"usage error: {message}"
    return f"a worker failed to start: {lines[-1] if lines else 'no reason given'}"


def _wrapped_cause(lines: list[str]) -> str:
    """The exception line of the traceback a usage error's message carries (``lines``: the
    message's lines after its first): up to the next chained traceback, never a usage error."""
    cause = ""
    for line in lines:
        if line.startswith(("During handling of the above exception", "The above exception was")):
            break
        if "UsageError" not in line and re.match(r"[\w.]+(Error|Exception|Exit|Interrupt)(: |$)", line):
            cause = line
    return cause


def _stop_reason(session: pytest.Session, run: Run) -> str:
    if run.crashed_workers:
        return (
            f"never run: pytest-xdist did not run it after {run.crashed_workers} worker crashes (it stops "
            "replacing crashed workers after --max-worker-restart); rerun with --isolate"
        )
    stop = session.shouldstop or session.shouldfail
    if stop:
        return f"never run: the run stopped early ({stop})"
    return "never run: the run ended before this case (interrupted, or a crash)"


def finish(session: pytest.Session, run: Run, book: RecordBook) -> None:
    """The run is over: settle every record (a case still running died, the rest never ran),
    fail the session when a record fails it, write the report and release the watch."""
    config = session.config
    collect_only = bool(config.getoption("collectonly", False))
    book.stop("not run: --collect-only" if collect_only else _stop_reason(session, run))
    failing = FAILING - {Status.XPASSED} - ({Status.NOT_RUN} if collect_only else set())
    if any(r.status in failing for r in book.records.values()) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if run.start_failure and not run.broken and not book.records:
        run.broken = run.start_failure  # no worker started: why no case ran
    if run.broken and session.exitstatus in (0, pytest.ExitCode.NO_TESTS_COLLECTED):
        usage = run.broken.startswith("usage error: ")
        session.exitstatus = pytest.ExitCode.USAGE_ERROR if usage else pytest.ExitCode.TESTS_FAILED
    gate = gate_of(config)
    verdict = gate_verdict(gate, book.case_dicts(), collect_only=collect_only or bool(run.broken))
    # no case collected (every one deselected, an empty shard) is a run that judged nothing too
    if verdict and session.exitstatus in (0, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = verdict
    config._pagedattn_exit = int(session.exitstatus)  # type: ignore[attr-defined]
    book.flush()
    release(run)


def release(run: Run) -> None:
    """The process ends on its own (a finished run, or any exit that reaches unconfigure: a usage
    error, a SystemExit, Ctrl-C): tell the watch, which then says nothing, and wait for it."""
    tell(run, "done")
    if run.watch is not None:
        try:
            if run.watch.stdin is not None:
                run.watch.stdin.close()
            run.watch.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        run.watch = None
