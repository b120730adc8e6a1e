"""The backend's construction at configure time, and the usage error that stops a run before it.

The backend is constructed in this process or, under ``--isolate``, in a child that is replaced
when it crashes; a crash while constructing leaves every case ``not_run`` with the report
written, and a usage error is kept in the JSON report too, so that a CI job sees why no case ran.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import pytest

from pagedattn.runner import recording as recorder
from pagedattn.runner.options import NO_LIMIT
from pagedattn.runner.session import Run

if TYPE_CHECKING:
    from pagedattn.adapters.protocol import Backend


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
