"""What one pytest process knows of the conformance run, kept on ``config.stash``.

Torch-free: the plugin module that every pytest session imports reads these keys.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import subprocess
    from types import FrameType

    from pagedattn.runner.record_book import RecordBook
    from pagedattn.runner.suite import Suite


@dataclass
class Run:
    """What this process knows of the run. On the pytest-xdist controller the backend is
    not loaded (``suite`` is None): its description arrives from the workers."""

    spec: str | None = None
    #: the device, or "" until ``device`` is first read (the xdist controller's default)
    chosen_device: str = "cpu"
    profile: str = "quick"
    isolate: bool = False
    timeout: float | None = None
    controller: bool = False  # the xdist controller (no backend here)
    suite: Suite | None = None
    info: dict[str, Any] = field(default_factory=dict)  # backend_info()
    broken: str = ""  # the backend crashed while being constructed
    book: RecordBook | None = None
    watch: subprocess.Popen[str] | None = None  # the crash watch (pagedattn.runner.recording)
    crashed_workers: int = 0
    #: why ``--dist loadgroup`` did not keep configurations together, or "" (it did, or is off)
    grouping_lost: str = ""
    #: the first pytest-xdist worker that failed to start (``recorder._startup_failure``), or "";
    #: the run's error only where no worker started (``recorder.finish``), else a warning
    start_failure: str = ""
    expectations: list[dict[str, Any]] = field(default_factory=list)  # --expectations entries
    testrunuid: str = ""  # pytest-xdist's run id, seen by the controller (the warm-up's claims)
    preload: threading.Thread | None = None  # the controller's imports in the background (plugin)
    report_lock: str | None = None  # the lock file beside --report-json (``record_book.claim_report``)
    #: the handlers ``stop_on_signals`` replaced, to put back at the end
    replaced_handlers: dict[int, Any] = field(default_factory=dict)

    @property
    def device(self) -> str:
        """``--device``, or its default: ``cuda`` where torch sees a CUDA device, else ``cpu``.
        Where the plugin left it open (the xdist controller, no ``--device``) the first read
        picks the default: the controller's configure and header do not read it, so it imports
        torch only after xdist has started the workers (before, every worker's start waited
        for the controller's torch import, 1-3 s)."""
        if not self.chosen_device:
            import torch

            self.chosen_device = "cuda" if torch.cuda.is_available() else "cpu"
        return self.chosen_device

    @device.setter
    def device(self, value: str) -> None:
        self.chosen_device = value


#: signals that end a run as Ctrl-C does: a CI runner's cancel (SIGTERM) or a closed terminal (SIGHUP)
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def stop_on_signals(run: Run) -> None:
    """Make SIGTERM and SIGHUP end the run as Ctrl-C does (``KeyboardInterrupt``): pytest then
    finishes the session, so the report is settled and written (a case running then is
    ``crashed``, the rest ``not_run``, every verdict that arrived kept) and the exit status is 2.
    Only where the signal's handler is the default one (a handler someone installed stays), and
    from the main thread (the only one Python lets set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            run.replaced_handlers[signum] = signal.signal(signum, _interrupt(run))


def restore_signals(run: Run) -> None:
    """Put back the handlers ``stop_on_signals`` replaced."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, handler in run.replaced_handlers.items():
        signal.signal(signum, handler)
    run.replaced_handlers.clear()


def _interrupt(run: Run) -> Any:
    def handler(signum: int, frame: FrameType | None) -> None:
        if run.book is not None and run.book.complete:
            # the report is written: end as the signal's default would (no traceback of the
            # interpreter's shutdown), whatever the process is doing now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")

    return handler


SUITE_KEY = pytest.StashKey["Suite | None"]()
RUN_KEY = pytest.StashKey[Run]()


def _suite_dir() -> str:
    """Where the suite's test modules are: ``pagedattn/conformance`` in an installed wheel,
    ``conformance/`` in a checkout (editable or on ``PYTHONPATH``)."""
    try:
        spec = importlib.util.find_spec("pagedattn.conformance")
    except ImportError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return str(list(spec.submodule_search_locations)[0])
    return str(Path(__file__).resolve().parent.parent / "conformance")


SUITE_DIR = _suite_dir()
