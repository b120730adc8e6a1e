"""One record per conformance case: what it is (``CaseRecord``) and the facts it is made of.

The suite attaches *facts* to a test item while a case runs (``note``: id, family,
metrics, replay, a fault's kind, ...). They travel with pytest's reports, also from
pytest-xdist workers, to the one owner of the records, the ``RecordBook``
(``pagedattn.runner.record_book``), which turns them into one ``CaseRecord`` per collected case and
decides its ``Status``; no other code sets a status. The summary table, the JSON report
and the JUnit properties are built from the records only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pytest

from pagedattn.runner.status import Status

#: ``item.user_properties`` key of the facts the suite attaches to a case
FACTS_KEY = "pagedattn"
#: ``item.user_properties`` key that says the warm-up ahead runs in the case's process
#: (``pagedattn.runner.warmup``): the report's owner then adds ``book.CRASH_HINT`` to crashes
AHEAD_KEY = "pagedattn_warmup_ahead"


def clean(x: Any) -> Any:
    """JSON- and execnet-safe: non-finite floats become strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
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
    props.update(clean(facts))
    node.user_properties[:] = [(k, v) for k, v in node.user_properties if k != FACTS_KEY]
    node.user_properties.append((FACTS_KEY, props))


# facts that are record fields; every other fact goes to ``extra``
_FIELDS = ("id", "family", "dtype", "operation", "configuration", "message", "reason", "replay", "metrics", "traceback")
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
        return clean(d)

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
#: the operation each conformance module runs (the rest run ``attention``)
OPERATIONS = {"gather": "gather", "cache_write": "write_cache", "lse": "lse"}


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
    kv = next((t for t in tokens if t in ("fp8_e4m3", "fp8_e5m2")), None)
    if kv:
        dtype += "/" + kv
    # under --dist loadgroup the group is the configuration key, which ends in the operation
    operation = group.rpartition("|")[2] if group else OPERATIONS.get(family, "attention")
    return CaseRecord(nodeid=plain, id=case_id, family=family, dtype=dtype, operation=operation, configuration=group)
