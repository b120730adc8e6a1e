"""The one owner of the case records, and the write-ahead JSON report.

The ``RecordBook`` of the process that writes the report (the serial run, or the
pytest-xdist controller) turns pytest's reports and the suite's facts
(``pagedattn.runner.case_record.note``) into one ``CaseRecord`` per collected case and decides its
``Status``.

The JSON report is written ahead: every collected case is ``not_run`` at collection,
a case that starts is written as ``crashed`` ("the process died while running this
case") until its verdict arrives, and the file is replaced atomically as cases finish.
Whatever kills the process, the file on disk is valid and accounts for every case.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pytest

from pagedattn.runner.case_record import FACTS_KEY, CaseRecord, base_record, clean, split_group
from pagedattn.runner.status import Status
from pagedattn.runner.table import summary_rows

#: message of a case whose process died under it (serial run, no --isolate)
DIED = "the process died while running this case (crash or kill); rerun with --isolate to contain it"

#: added to the message of a case whose process died while the warm-up ahead (``pagedattn.runner.warmup``)
#: was on in the run: its compiles run beside the cases, in the same process
CRASH_HINT = (
    " (the warm-up ahead was compiling beside it: a compiler that died there is reported here; "
    "--isolate or --warmup-ahead=off puts it on its own case)"
)


#: the longest a report in progress keeps its header (duration, expectations) before redoing it
HEADER_S = 1.0


class RecordBook:
    """Every collected case's record, written by one owner and flushed to ``path``
    (write-ahead, atomic) when given. ``header`` is the report's non-case part (a dict
    or a zero-argument callable returning one), refreshed on each flush."""

    def __init__(
        self, path: str | None = None, header: dict[str, Any] | Callable[[], dict[str, Any]] | None = None
    ) -> None:
        self.path = path
        self.header = header
        #: the file is written on each start (a started case is on disk as ``crashed`` before it
        #: runs, with the verdict before it) and, where the cases run in other processes (the
        #: pytest-xdist controller's book), on each verdict as it arrives: a worker's next start
        #: may come seconds later, or never. In this process (or its --isolate child) a case's
        #: verdict, its teardown and the next start are milliseconds apart
        self.remote = False
        self._header: tuple[float, dict[str, Any]] | None = None  # (when, the header) of a report in progress
        self.records: dict[str, CaseRecord] = {}
        self.running: set[str] = set()
        self.notes: list[str] = []  # run-level events (a worker crash, a construction failure)
        self.complete = False
        #: record -> a command that reruns that case (for a crash that left no replay file)
        self.rerun: Callable[[CaseRecord], str] | None = None
        #: appended to a crash's message where something else ran beside the case (the warm-up ahead)
        self.crash_hint = ""
        #: each record's clean dict and its JSON text, redone only for records changed since
        #: the last flush (a flush before every case was 40 ms of re-encoding 223 unchanged
        #: records on the CPU: a third of the quick profile's time)
        self._dirty: set[str] = set()
        self._dicts: dict[str, dict[str, Any]] = {}
        self._texts: dict[str, str] = {}

    @property
    def died(self) -> str:
        """The message of a case written ahead as crashed (``DIED``, and the crash hint)."""
        return DIED + self.crash_hint

    # the key is pytest's node id as reported (an xdist group suffix included)
    def collected(self, nodeid: str, facts: dict[str, Any] | None = None) -> None:
        if nodeid in self.records:
            return
        rec = base_record(nodeid)
        if facts:
            rec.absorb(facts)
        self.records[nodeid] = rec
        self._dirty.add(nodeid)

    def get(self, nodeid: str) -> CaseRecord:
        """The record of ``nodeid`` (collected now if new), to be changed: it is written anew."""
        if nodeid not in self.records:
            self.collected(nodeid)
        self._dirty.add(nodeid)
        return self.records[nodeid]

    def start(self, nodeid: str) -> None:
        rec = self.get(nodeid)
        rec.status, rec.message, rec.reason = Status.CRASHED, self.died, ""
        if self.rerun and not rec.replay:
            rec.replay = self.rerun(rec)
        self.running.add(nodeid)
        self.flush()

    def update(self, report: pytest.TestReport, crash_hint: str | None = None) -> CaseRecord | None:
        """Fold one pytest report into its case's record; the record, or ``None`` for a
        report about nothing this book tracks (a test outside the suite). ``crash_hint``:
        what a crash of the report's own process adds to its message (``CRASH_HINT`` or
        ``""``), where that differs from the book's (an xdist worker's warm-up ahead)."""
        facts = next((v for k, v in report.user_properties if k == FACTS_KEY), None)
        if not isinstance(facts, dict) and report.nodeid not in self.records:
            return None
        rec = self.get(report.nodeid)
        facts = facts if isinstance(facts, dict) else {}
        rec.absorb(facts)
        if report.when in ("setup", "call"):
            rec.duration_s += report.duration
        done = self._decide(rec, report, facts, self.crash_hint if crash_hint is None else crash_hint)
        if done and rec.status in (Status.CRASHED, Status.TIMED_OUT) and not rec.replay and self.rerun:
            rec.replay = self.rerun(rec)
        elif done and rec.status not in (Status.CRASHED, Status.TIMED_OUT) and self.rerun:
            if rec.replay == self.rerun(rec):  # set in case it died; it did not
                rec.replay = None
        if done:
            self.running.discard(report.nodeid)
            if self.remote:
                # on disk as it arrives: a SIGKILL of this process loses no verdict (the next
                # report from a worker may come seconds later, or never)
                self.flush()
        return rec

    def _decide(self, rec: CaseRecord, report: pytest.TestReport, facts: dict[str, Any], crash_hint: str) -> bool:
        """Set the status from the report; whether the case is finished."""
        when = report.when
        if when == "???":  # pytest-xdist: the worker died while running this case
            rec.status = Status.CRASHED
            rec.message = (
                f"{report.longrepr}; the process died while running this case: rerun with --isolate{crash_hint}"
            )
            return True
        if hasattr(report, "wasxfail") and when in ("setup", "call"):
            rec.status = Status.XFAILED if report.skipped else Status.XPASSED
            rec.extra["expectation"] = report.wasxfail
            if report.failed:  # a strict xfail that passed
                rec.status = Status.XPASSED
            return True
        if report.skipped and when in ("setup", "call"):
            reason = _skip_reason(report)
            if facts.get("not_run"):
                rec.status, rec.reason = Status.NOT_RUN, str(facts["not_run"])
            else:
                rec.status = Status.UNSUPPORTED
                rec.reason = rec.reason or reason.removeprefix("unsupported: ")
            rec.message = ""
            return True
        if report.failed:
            if when == "teardown" and rec.status not in (Status.CRASHED, Status.NOT_RUN):
                rec.message = (rec.message + "\n" if rec.message else "") + f"teardown failed: {_short(report)}"
                if rec.status in (Status.PASSED, Status.WARNED):
                    rec.status = Status.FAILED
                return True
            fault = facts.get("fault")
            rec.status = Status(fault) if fault in ("crashed", "timed_out") else Status.FAILED
            rec.message = facts.get("message") or _short(report)
            rec.traceback = facts.get("traceback") or (str(report.longrepr) if report.longrepr else "")
            return True
        if when == "call":  # passed
            metrics = rec.metrics or {}
            rec.status = Status.WARNED if facts.get("warned") or metrics.get("status") == "warned" else Status.PASSED
            if rec.status is Status.PASSED or rec.message.startswith(DIED):  # the start's placeholder goes
                rec.message = facts.get("message", "") if rec.status is Status.WARNED else ""
            return True
        return False

    def stop(self, reason: str) -> None:
        """The run is over: a case still running died with its process; the rest never ran."""
        for nodeid in list(self.running):
            rec = self.records[nodeid]
            if rec.status is Status.CRASHED and rec.message.startswith(DIED):  # the start's placeholder
                rec.message = "the run ended while this case was running (crash, kill or interrupt)" + self.crash_hint
        self.running.clear()
        for rec in self.records.values():
            if rec.status is Status.NOT_RUN and not rec.reason:
                rec.reason = reason
        self._dirty.update(self.records)
        self.complete = True

    # ------------------------------------------------------------ output
    def as_list(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.records.values()]

    def case_dicts(self) -> list[dict[str, Any]]:
        """Every record as its report entry (``clean(to_dict())``), in collection order; the
        same objects until a record changes: read them, do not change them. A record is
        known to change through the book's methods (``get`` included); one put into
        ``records`` directly is encoded when first seen."""
        for nodeid in self._dirty | (self.records.keys() - self._dicts.keys()):
            d = self._dicts[nodeid] = clean(self.records[nodeid].to_dict())
            self._texts[nodeid] = json.dumps(d)
        self._dirty.clear()
        return [self._dicts[n] for n in self.records]

    def _head(self, cases: list[dict[str, Any]]) -> dict[str, Any]:
        """The report without its cases (``header``, then the counts of ``cases``)."""
        header = self._header_now()
        counts = {s.value: 0 for s in Status}
        for c in cases:
            counts[c["status"]] += 1
        return {
            **header,
            "complete": self.complete,
            "running": sorted(split_group(n)[0] for n in self.running),
            "counts": counts,
            "configurations": len({c["configuration"] for c in cases if c["configuration"]}),
            "notes": list(self.notes),
            "summary": summary_rows(cases),
        }

    def _header_now(self) -> dict[str, Any]:
        """``header``'s dict: fresh for the finished report; for one in progress, at most
        ``HEADER_S`` old (its versions, device name and expectations cost milliseconds a call,
        more than the rest of a write)."""
        if not callable(self.header):
            return dict(self.header or {})
        now = time.monotonic()
        if self.complete or self._header is None or now - self._header[0] > HEADER_S:
            self._header = (now, self.header())
        return self._header[1]

    def report(self) -> dict[str, Any]:
        cases = self.case_dicts()
        return {**self._head(cases), "cases": [dict(c) for c in cases]}

    def flush(self) -> None:
        """Write the report: the final one indented; one in progress compact, its unchanged
        cases from their cached JSON text."""
        if not self.path:
            return
        if self.complete:
            write_atomic(self.path, self.report(), indent=1)
        else:
            head = json.dumps(clean(self._head(self.case_dicts())))
            cases = ", ".join(self._texts[n] for n in self.records)
            write_atomic(self.path, head[:-1] + f', "cases": [{cases}]}}', indent=None, text=True)


def _skip_reason(report: pytest.TestReport) -> str:
    lr = report.longrepr
    text = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr or "")
    return str(text).removeprefix("Skipped: ")


def _short(report: pytest.TestReport) -> str:
    """The one-line gist of a failed report (pytest's crash line), never the fixture repr."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return str(crash.message)
    text = str(report.longrepr or "").strip().splitlines()
    return text[-1] if text else "failed"


def write_atomic(path: str, data: Any, indent: int | None = 1, text: bool = False) -> None:
    """``data`` as JSON (or, with ``text``, JSON text as it is) at ``path`` through a
    temporary file and a rename: a reader (or a crash) never sees half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".pagedattn-report-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(data if text else json.dumps(clean(data), indent=indent))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def claim_report(path: str) -> str:
    """Check that ``--report-json=path`` can be written and that no other live run is writing it;
    take it (a lock file ``path.lock`` holding this process's id) and return the lock's path,
    or raise ``pytest.UsageError`` with one line saying why not. A lock whose process is gone
    (a run killed with SIGKILL) is taken over."""
    where = f"--report-json={path}"
    if os.path.isdir(path):
        raise pytest.UsageError(f"{where}: is a directory; give a file path, e.g. {os.path.join(path, 'report.json')}")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise pytest.UsageError(f"{where}: cannot create its directory {folder}: {exc.strerror or exc}") from None
    lock = os.path.abspath(path) + ".lock"
    try:
        # the lock appears with its process id in it (a hard link of a written file): a run that
        # finds it never reads it half written
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".pagedattn-lock-")
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
    except OSError as exc:
        raise pytest.UsageError(f"{where}: cannot write in {folder}: {exc.strerror or exc}") from None
    try:
        for _ in range(2):  # the second try follows the removal of a dead run's lock
            try:
                os.link(tmp, lock)
                return lock
            except FileExistsError:
                other = _lock_owner(lock)
                if other is not None:
                    raise pytest.UsageError(
                        f"{where}: another run (pid {other}) is writing this report (lock file {lock}); "
                        "give each run its own --report-json"
                    ) from None
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock)
            except OSError as exc:
                raise pytest.UsageError(f"{where}: cannot write in {folder}: {exc.strerror or exc}") from None
    finally:
        os.unlink(tmp)
    raise pytest.UsageError(f"{where}: its lock file {lock} keeps reappearing: another run is starting beside this one")


def release_report(lock: str) -> None:
    """Remove the lock file ``claim_report`` made, if it is still this process's."""
    if _lock_owner(lock) == os.getpid():
        with contextlib.suppress(OSError):
            os.unlink(lock)


def _lock_owner(lock: str) -> int | None:
    """The id of the live process named in ``lock``, or ``None`` (no file, no number, or a dead
    process: one that signal 0 cannot reach for lack of it)."""
    try:
        with open(lock) as f:
            pid = int(f.read().strip() or "0")
    except (OSError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, another user's
        return pid
    return pid
