"""Where a pytest-xdist run's wall time goes (issue 16, thirteenth stop): every process
(controller and workers) appends one JSON line per event to ``$PAGEDATTN_TIMELINE``: its start
(``configure``), its session's start and the end of its collection (``sessionstart``,
``collected``), each test's start and finish (``start``, ``finish``, with the node id), and
each Triton compile (``compile``: its thread, its stages' microseconds, a cache hit or not, the
kernel's name). Read with ``timeline_report.py``.

    PAGEDATTN_TIMELINE=/tmp/t.jsonl python -m pytest -p pagedattn.plugin \
        -p benchmarks.results.timeline_plugin conformance ... -n 8
"""

from __future__ import annotations

import json
import os
import threading
import time

_FD: int | None = None


def _emit(**event: object) -> None:
    if _FD is None:
        return
    event.setdefault("t", time.time())
    event["pid"] = os.getpid()
    os.write(_FD, (json.dumps(event) + "\n").encode())  # one write a line, O_APPEND: whole lines


def _listener(*, src, metadata, metadata_group, times, cache_hit, **_: object) -> None:
    stages = {name: us for name, us in times.lowering_stages}
    _emit(
        ev="compile",
        thread=threading.current_thread().name,
        hit=bool(cache_hit),
        name=str(metadata.get("name", getattr(src, "name", "?"))),
        hash=str(metadata.get("hash", ""))[:16],
        us=times.ir_initialization + sum(stages.values()) + times.store_results,
        stages=stages,
    )


def _process_start() -> float | None:
    """This process's start, seconds since the epoch (Linux: ``/proc``), or None."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def pytest_configure(config) -> None:
    global _FD
    path = os.environ.get("PAGEDATTN_TIMELINE")
    if not path:
        return
    _FD = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    started = _process_start()
    worker = getattr(config, "workerinput", {}).get("workerid", "controller")
    _emit(ev="configure", worker=worker, process_start=started)
    try:
        import triton

        triton.knobs.compilation.listener = _listener
    except (ImportError, AttributeError):
        _emit(ev="no_listener")


def pytest_sessionstart(session) -> None:
    _emit(ev="sessionstart")


def pytest_collection_finish(session) -> None:
    _emit(ev="collected", items=len(session.items))


def pytest_runtest_logstart(nodeid, location) -> None:
    _emit(ev="start", node=nodeid)


def pytest_runtest_logfinish(nodeid, location) -> None:
    _emit(ev="finish", node=nodeid)


def pytest_sessionfinish(session, exitstatus) -> None:
    _emit(ev="sessionfinish", exit=int(exitstatus))
