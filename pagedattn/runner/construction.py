"""The backend's construction at configure time, and the usage error that stops a run before it.

The backend is constructed in this process or, under ``--isolate``, in a child that is replaced
when it crashes; a crash while constructing leaves every case ``not_run`` with the report
written, and a usage error is kept in the JSON report too, so that a CI job sees why no case ran.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, NoReturn

import pytest

from pagedattn.runner import recording as recorder
from pagedattn.runner.options import NO_LIMIT
from pagedattn.runner.session import Run

if TYPE_CHECKING:
    from pagedattn.adapters.protocol import Backend

#: the threads alive before the backend was loaded (the process's own: pytest's, xdist's)
THREADS_BEFORE_KEY = pytest.StashKey["frozenset[threading.Thread]"]()
#: what the backend left running at the end of the run, one line per process (this one, or the workers)
LEFTOVER_KEY = pytest.StashKey["list[str]"]()
#: how long the threads the backend left get to end by themselves at the end of the run
LEFTOVER_GRACE_S = 2.0


def usage_error(config: pytest.Config, run: Run, message: str) -> NoReturn:
    """Stop the run with a usage error (exit 4) whose message the JSON report keeps too (its
    ``error``, ``exit_status`` 4), so that a CI job reading the report sees why no case ran."""
    if run.book is not None:
        run.broken = f"usage error: {message}"
        config._pagedattn_exit = int(pytest.ExitCode.USAGE_ERROR)  # type: ignore[attr-defined]
        run.book.stop("not run: usage error")  # finished, not crashed: nothing was collected
        run.book.flush()
    raise pytest.UsageError(message)


def construct_backend(run: Run, spec: str, device: str) -> tuple[Backend | None, list[str]]:
    """The backend (in this process, or isolated in a child) and the arguments a replay
    command repeats; ``None`` when it crashed while being constructed (``run.broken``)."""
    from pagedattn.adapters.loading import BackendLoadError, load_backend
    from pagedattn.runner.faults import BackendFault
    from pagedattn.runner.isolation import isolated_backend

    extra = [f"--profile={run.profile}"]
    if run.book is not None:
        # written before the backend is constructed, and watched: a constructor that kills
        # this process still leaves a report and a hint
        run.book.notes.append("constructing the backend")
        run.book.flush()
        run.watch = recorder.start_watch(run.book.path)
        recorder.tell(run, "start the backend's construction")
    try:
        backend: Backend
        if run.isolate:
            backend = isolated_backend(spec, device, run.timeout)
            extra += ["--isolate", f"--case-timeout={run.timeout:g}" if run.timeout else f"--case-timeout={NO_LIMIT}"]
        else:
            backend = load_backend(spec)
    except BackendLoadError as exc:
        raise pytest.UsageError(str(exc)) from None
    except BackendFault as exc:
        # a crash while constructing: every case is reported not_run, the report is written
        run.broken = str(exc)
        run.info = {"name": spec, "target": f"{spec} (not constructed: {exc})"}
        return None, extra
    finally:
        recorder.tell(run, "end")
        if run.book is not None:
            run.book.notes.remove("constructing the backend")
    return backend, extra


# ------------------------------------------------------------ threads the backend leaves
def leftover_threads(config: pytest.Config, grace: float = LEFTOVER_GRACE_S) -> list[threading.Thread]:
    """The non-daemon threads alive now that were not before the backend was loaded (its
    runtime's, left running), after each gets a short grace to end by itself."""
    before = config.stash.get(THREADS_BEFORE_KEY, None)
    if before is None:
        return []
    main = threading.main_thread()
    left = [t for t in threading.enumerate() if t.is_alive() and not t.daemon and t is not main and t not in before]
    for t in left:
        t.join(grace / len(left))
    return [t for t in left if t.is_alive()]


def describe_threads(threads: list[threading.Thread]) -> str:
    """``'name' (target module.function), ...`` of ``threads``."""
    described = []
    for t in threads:
        target = getattr(t, "_target", None)  # Thread keeps it until the thread ends
        where = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
        described.append(f"{t.name!r} (target {where if target is not None else type(t).__qualname__ + '.run'})")
    return ", ".join(described)


def note_leftover_threads(config: pytest.Config, where: str = "") -> str:
    """The warning for the threads the backend left running (``""`` if none), kept for the
    summary and the report."""
    left = leftover_threads(config)
    if not left:
        return ""
    line = (
        f"the backend left {len(left)} non-daemon thread(s) running after the last case{where}: "
        f"{describe_threads(left)}; pytest ends without waiting for them"
    )
    config.stash.setdefault(LEFTOVER_KEY, []).append(line)
    return line


def end_despite_leftover_threads(config: pytest.Config, exitstatus: int, error: str = "") -> None:
    """End this process now with ``exitstatus`` when threads the backend left still run
    (first writing ``error``, which pytest would print after this, and the warning, to stderr
    when no summary was printed: ``error`` given).

    Python joins every non-daemon thread before the interpreter exits (before ``atexit``
    handlers too), and nothing can stop or demote a running thread from outside: a backend
    thread that never ends keeps pytest alive after its summary, forever, and a CI job waits
    on it. Called last (``pytest_unconfigure``, trylast), when the terminal summary, the JUnit
    XML and the JSON report are written and an xdist worker has sent its results, so
    ``os._exit`` loses nothing but the wait. A run started with ``pytest.main()`` inside a
    longer-lived process ends that process too, which would otherwise hang at its own exit."""
    left = leftover_threads(config, grace=0.0 if not error else LEFTOVER_GRACE_S)
    if not left:
        return
    if error:
        sys.stderr.write(f"ERROR: {error}\n")
        sys.stderr.write(f"warning: the backend left non-daemon thread(s) running: {describe_threads(left)}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(exitstatus))
