"""A case's status: the one vocabulary of verdicts (the record, the table, the JSON report,
the JUnit properties and ``python -m pagedattn report`` all speak it)."""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    """A case's verdict."""

    PASSED = "passed"
    FAILED = "failed"
    WARNED = "warned"
    UNSUPPORTED = "unsupported"
    XFAILED = "xfailed"
    XPASSED = "xpassed"
    CRASHED = "crashed"
    TIMED_OUT = "timed_out"
    NOT_RUN = "not_run"


#: statuses that make a run fail
FAILING = frozenset({Status.FAILED, Status.CRASHED, Status.TIMED_OUT, Status.NOT_RUN, Status.XPASSED})
