"""How a backend's failure is told: ``BackendFault`` (crashed, timed out, raised) and the
one-line description of an exception a backend raised, pointing into its own file."""

from __future__ import annotations

import inspect
import os
import traceback
from typing import Any

import pytest


class BackendFault(Exception):
    """The backend crashed, hung, raised, or could not be started.

    Attributes:
        kind: ``"crashed"`` (its process died or could not start), ``"timed_out"``,
            or ``"raised"`` (an exception: the case fails).
        traceback: the full traceback of a raised exception (``""`` otherwise).
    """

    def __init__(self, message: str, kind: str = "crashed", traceback: str = ""):
        super().__init__(message)
        self.kind = kind
        self.traceback = traceback


def passes_through(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a backend call, is not the backend's fault: the user's
    Ctrl-C (``KeyboardInterrupt``) stops the run, and pytest's outcomes (``pytest.skip``: the
    adapter declines the case) reach pytest. Anything else a kernel raises, ``SystemExit`` and
    other ``BaseException`` subclasses included, fails its case."""
    return isinstance(exc, (KeyboardInterrupt, pytest.skip.Exception, pytest.fail.Exception))


def describe_exception(exc: BaseException, backend_files: set[str]) -> tuple[str, str]:
    """``(short, full)`` for an exception a backend raised: one line with its type, message
    and the last frame in the backend's own file(s) (else the last frame outside
    pagedattn), and the full traceback."""
    full = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    frames = traceback.extract_tb(exc.__traceback__)
    ours = os.path.dirname(os.path.abspath(__file__))  # the pagedattn package
    mine = [f for f in frames if os.path.abspath(f.filename) in backend_files]
    outside = [f for f in frames if not os.path.abspath(f.filename).startswith(ours + os.sep)]
    chosen = mine or outside or list(frames)
    text = str(exc).strip().splitlines()
    short = f"the backend raised {type(exc).__name__}" + (f": {text[0]}" if text else "")
    if isinstance(exc, SystemExit):
        short = f"the backend called sys.exit({exc.code!r}) (SystemExit)"
    if chosen:
        frame = chosen[-1]
        short += f" (at {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name})"
    return short, full


def backend_files(backend: Any) -> set[str]:
    """The source file of the backend's class (where its own frames are)."""
    try:
        path = inspect.getsourcefile(type(backend))
    except (TypeError, OSError):
        path = None
    return {os.path.abspath(path)} if path else set()
