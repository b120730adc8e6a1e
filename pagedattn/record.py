"""One record per conformance case, and the one owner that writes it.

The suite attaches *facts* to a test item while a case runs (``note``: id, family,
metrics, replay, a fault's kind, ...). The ``RecordBook`` of the process that writes
the report (the serial run, or the pytest-xdist controller) turns pytest's reports and
those facts into one ``CaseRecord`` per collected case and decides its ``Status``; no
other code sets a status. The summary table, the JSON report and the JUnit properties
are built from the records only.

The JSON report is written ahead: every collected case is ``not_run`` at collection,
a case that starts is written as ``crashed`` ("the process died while running this
case") until its verdict arrives, and the file is replaced atomically as cases finish.
Whatever kills the process, the file on disk is valid and accounts for every case.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pytest

from pagedattn.status import Status
from pagedattn.table import summary_rows

#: ``item.user_properties`` key of the facts the suite attaches to a case
FACTS_KEY = "pagedattn"

#: message of a case whose process died under it (serial run, no --isolate)
DIED = "the process died while running this case (crash or kill); rerun with --isolate to contain it"


#: a finished case is written at once unless the file was written less than this ago (the
#: next case's start writes it in any case: a started case must be on disk before it runs)
FLUSH_S = 2.0


def _clean(x: Any) -> Any:
    """JSON- and execnet-safe: non-finite floats become strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, Enum):
        return x.value
    return x


def noted(node: pytest.Item) -> dict[str, Any]:
    """The facts attached to ``node`` so far (empty if none)."""
    for key, value in node.user_properties:
        if key == FACTS_KEY and isinstance(value, dict):
            return value
    return {}


def note(node: pytest.Item, **facts: Any) -> None:
    """Attach (or update) facts about this case on its test item. They travel with
    pytest's reports (also from xdist workers) to the ``RecordBook``. A ``status`` among
    them is ignored: the book decides the status from the outcome and the facts
    ``fault`` (``"crashed"``/``"timed_out"``), ``not_run`` (a reason) and ``metrics``."""
    props = dict(noted(node))
    props.update(_clean(facts))
    node.user_properties[:] = [(k, v) for k, v in node.user_properties if k != FACTS_KEY]
    node.user_properties.append((FACTS_KEY, props))


# facts that are record fields; every other fact goes to ``extra``
_FIELDS = ("id", "family", "dtype", "operation", "configuration", "message", "reason", "replay", "metrics",
           "traceback")  # fmt: skip
_CONTROL = ("status", "fault", "not_run", "warned")


@dataclass
class CaseRecord:
    """The verdict on one collected case.

    Attributes:
        nodeid: pytest's node id (without an xdist group suffix).
        id: the case id (``decode-gqa2-bs16-d64-fp32-L70-B3``).
        family, dtype, operation: the summary table's axes and the operation run.
        configuration: the compile key (``pagedattn.cases.configuration.Configuration.key``).
        status: the verdict.
        message: short: what failed (with the replay command), or why not run.
        reason: why unsupported / not run / expected to fail.
        replay: the command that replays this case from its saved file.
        metrics: the judged check's summary (``AttentionCheck.metrics``).
        traceback: the full traceback of a raising backend or of the suite.
        duration_s: setup + call time.
        extra: every other fact (``property``, ``variants``, ``probe``, ``checks``, ...).
    """

    nodeid: str
    id: str
    family: str
    dtype: str = "-"
    operation: str = "attention"
    configuration: str = ""
    status: Status = Status.NOT_RUN
    message: str = ""
    reason: str = ""
    replay: str | None = None
    metrics: dict | None = None
    traceback: str = ""
    duration_s: float = 0.0
    extra: dict = field(default_factory=dict)

    def absorb(self, facts: dict[str, Any]) -> None:
        """Take the suite's facts (never its idea of the status)."""
        for k, v in facts.items():
            if k in _FIELDS:
                setattr(self, k, v)
            elif k not in _CONTROL:
                self.extra[k] = v

    def to_dict(self) -> dict[str, Any]:
        d = {
            "nodeid": self.nodeid,
            "id": self.id,
            "family": self.family,
            "dtype": self.dtype,
            "operation": self.operation,
            "configuration": self.configuration,
            "status": self.status.value,
            "message": self.message,
            "reason": self.reason,
            "replay": self.replay,
            "metrics": self.metrics,
            "traceback": self.traceback,
            "duration_s": round(self.duration_s, 4),
        }
        d.update({k: v for k, v in self.extra.items() if k not in d})
        return _clean(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaseRecord:
        known = {f: d[f] for f in (*_FIELDS, "nodeid", "duration_s") if f in d}
        rec = cls(**{"id": "", "family": "", **known})
        rec.status = Status(d.get("status", "not_run"))
        rec.extra = {k: v for k, v in d.items() if k not in known and k != "status"}
        return rec

    @property
    def invalid(self) -> bool:
        """The backend's output was rejected (shape, dtype, device, non-finite)."""
        m = self.metrics or {}
        return bool(m.get("problem") or m.get("num_nonfinite"))


# ------------------------------------------------------------- from node ids
_DTYPES = ("fp32", "fp16", "bf16")


def split_group(nodeid: str) -> tuple[str, str]:
    """``(nodeid, group)``: pytest-xdist's ``--dist loadgroup`` appends ``@group``."""
    head, sep, group = nodeid.rpartition("@")
    if sep and "::" in head and "/" not in group and "::" not in group:
        return head, group
    return nodeid, ""


def base_record(nodeid: str) -> CaseRecord:
    """What a node id alone says about a case: its family (from the module), id (from the
    parameters) and dtype (from the id). Facts replace this once the case is set up."""
    plain, group = split_group(nodeid)
    function = plain.split("::")[-1].split("[")[0]  # the module part is empty in a --pyargs run
    family = {"test_search_replay": "search-replay", "test_property": "properties"}.get(
        function, function.removeprefix("test_")
    )
    m = re.search(r"\[(.*)\]$", plain)
    case_id = m.group(1) if m else family
    tokens = case_id.split("-")
    dtype = next((t for t in tokens if t in _DTYPES), "-")
    kv = next((t[2:] for t in tokens if t in ("kve4m3", "kve5m2")), None)
    if kv:
        dtype += "/" + kv
    return CaseRecord(nodeid=plain, id=case_id, family=family, dtype=dtype, configuration=group)


# ------------------------------------------------------------- the book
class RecordBook:
    """Every collected case's record, written by one owner and flushed to ``path``
    (write-ahead, atomic) when given. ``header`` is the report's non-case part (a dict
    or a zero-argument callable returning one), refreshed on each flush."""

    def __init__(self, path: str | None = None, header: Any = None):
        self.path = path
        self.header = header
        self.records: dict[str, CaseRecord] = {}
        self.running: set[str] = set()
        self.notes: list[str] = []  # run-level events (a worker crash, a construction failure)
        self.complete = False
        #: record -> a command that reruns that case (for a crash that left no replay file)
        self.rerun: Any = None
        self._flushed = 0.0

    # the key is pytest's node id as reported (an xdist group suffix included)
    def collected(self, nodeid: str, facts: dict[str, Any] | None = None) -> None:
        if nodeid in self.records:
            return
        rec = base_record(nodeid)
        if facts:
            rec.absorb(facts)
        self.records[nodeid] = rec

    def get(self, nodeid: str) -> CaseRecord:
        if nodeid not in self.records:
            self.collected(nodeid)
        return self.records[nodeid]

    def start(self, nodeid: str) -> None:
        rec = self.get(nodeid)
        rec.status, rec.message, rec.reason = Status.CRASHED, DIED, ""
        if self.rerun and not rec.replay:
            rec.replay = self.rerun(rec)
        self.running.add(nodeid)
        self.flush()

    def update(self, report: pytest.TestReport) -> CaseRecord | None:
        """Fold one pytest report into its case's record; the record, or ``None`` for a
        report about nothing this book tracks (a test outside the suite)."""
        facts = next((v for k, v in report.user_properties if k == FACTS_KEY), None)
        if not isinstance(facts, dict) and report.nodeid not in self.records:
            return None
        rec = self.get(report.nodeid)
        facts = facts if isinstance(facts, dict) else {}
        rec.absorb(facts)
        if report.when in ("setup", "call"):
            rec.duration_s += report.duration
        done = self._decide(rec, report, facts)
        if done and rec.status in (Status.CRASHED, Status.TIMED_OUT) and not rec.replay and self.rerun:
            rec.replay = self.rerun(rec)
        elif done and rec.status not in (Status.CRASHED, Status.TIMED_OUT) and self.rerun:
            if rec.replay == self.rerun(rec):  # set in case it died; it did not
                rec.replay = None
        if done:
            self.running.discard(report.nodeid)
            # the next case's start writes the file anyway; between cases, at most every FLUSH_S
            if time.monotonic() - self._flushed > FLUSH_S:
                self.flush()
        return rec

    def _decide(self, rec: CaseRecord, report: pytest.TestReport, facts: dict[str, Any]) -> bool:
        """Set the status from the report; whether the case is finished."""
        when = report.when
        if when == "???":  # pytest-xdist: the worker died while running this case
            rec.status = Status.CRASHED
            rec.message = f"{report.longrepr}; the process died while running this case: rerun with --isolate"
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
            if rec.status is Status.PASSED:
                rec.message = ""
            return True
        return False

    def stop(self, reason: str) -> None:
        """The run is over: a case still running died with its process; the rest never ran."""
        for nodeid in list(self.running):
            rec = self.records[nodeid]
            if rec.status is Status.CRASHED and rec.message == DIED:
                rec.message = "the run ended while this case was running (crash, kill or interrupt)"
        self.running.clear()
        for rec in self.records.values():
            if rec.status is Status.NOT_RUN and not rec.reason:
                rec.reason = reason
        self.complete = True

    # ------------------------------------------------------------ output
    def as_list(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.records.values()]

    def report(self) -> dict[str, Any]:
        header = self.header() if callable(self.header) else dict(self.header or {})
        cases = [r.to_dict() for r in self.records.values()]
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
            "cases": cases,
        }

    def flush(self) -> None:
        if self.path:
            write_atomic(self.path, self.report(), indent=1 if self.complete else None)
            self._flushed = time.monotonic()


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


def write_atomic(path: str, data: Any, indent: int | None = 1) -> None:
    """``data`` as JSON at ``path`` through a temporary file and a rename: a reader (or a
    crash) never sees half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".pagedattn-report-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_clean(data), f, indent=indent)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
