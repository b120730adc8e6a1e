"""The isolated child's side of ``pagedattn.runner.isolation``: its main loop, which constructs
the backend and serves each call, the messages' serialization (by value, never shared memory),
and the child's tie to its parent (it dies with the process that started it)."""

from __future__ import annotations

import ctypes
import io
import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import torch

from pagedattn.adapters.loading import BackendLoadError, backend_info, load_backend
from pagedattn.cases.io import case_from_state
from pagedattn.runner.faults import backend_files, describe_exception

#: ``prctl``'s option that sets the signal a process receives when its parent dies (linux/prctl.h)
PR_SET_PDEATHSIG = 1


def _send(conn: Connection, message: Any) -> None:
    """``message`` through the pipe, its tensors by value (``torch.save``, which takes every
    dtype, fp8 included): torch's multiprocessing reducers (which ``Connection.send`` uses)
    would move each tensor's storage into shared memory, where the sender's later writes show
    in the receiver's tensor."""
    buffer = io.BytesIO()
    torch.save(message, buffer)
    conn.send_bytes(buffer.getbuffer())


def _recv(conn: Connection) -> Any:
    # the peer is this package's own process, which sends pickled objects (strings, dicts)
    return torch.load(io.BytesIO(conn.recv_bytes()), weights_only=False)


def die_with_parent(parent: int) -> None:
    """Make this process end when ``parent`` (the process that started it: pytest for the
    isolated child, the pytest-xdist controller for a worker) ends, also when that is killed
    by SIGKILL and runs no cleanup. The kernel's signal follows the thread that started this
    process: both start it from their main thread, which lives as long as they do. On Linux the kernel sends SIGKILL on
    the parent's death (``PR_SET_PDEATHSIG``); elsewhere a daemon thread watches the parent
    pid. The parent may already have died before the signal was set: then exit now."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            _watch_parent(parent)
    else:
        _watch_parent(parent)
    if os.getppid() != parent:
        os._exit(1)


def _watch_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="pagedattn-parent-watch", daemon=True).start()


def _to(x: Any, device: str | torch.device) -> Any:
    """Tensors to ``device``; anything else (a backend's wrong answer) as it is."""
    return x.to(device) if isinstance(x, torch.Tensor) else x


def _serve(backend: Any, method: str, device: str, payload: Any) -> Any:
    if method in ("paged_attention", "paged_attention_lse"):
        case = case_from_state(payload["case"], device)
        kwargs = {}
        if payload.get("out") is not None:
            kwargs["out"] = payload["out"].to(device)
        result = getattr(backend, method)(case, **kwargs)
        if isinstance(result, tuple):
            result = tuple(_to(r, "cpu") for r in result)
        after = {f: t.cpu() for f, t in case.tensors().items()}
        out = kwargs["out"].cpu() if "out" in kwargs else None
        return _to(result, "cpu"), after, out
    if method == "gather":
        pool, slots = (t.to(device) for t in payload)
        return _to(backend.gather(pool, slots), "cpu"), pool.cpu()
    if method == "write_cache":
        pool, slots, new = (t.to(device) for t in payload)
        backend.write_cache(pool, slots, new)
        return pool.cpu(), new.cpu()
    if method == "warmup":
        backend.warmup(case_from_state(payload, device))
        return None
    if method == "case_reason":
        state, operation = payload
        return backend.capabilities.case_reason(case_from_state(state, device), operation)
    if method == "unsupported_reason":
        return backend.capabilities.unsupported_reason(**payload)
    raise ValueError(f"unknown method {method!r}")


def _child_main(conn: Connection, spec: str, path: list[str], parent: int, log: str) -> None:
    """The child: construct the backend, then serve calls until the pipe closes."""
    die_with_parent(parent)
    # Ctrl-C reaches the whole process group: the parent stops the run and kills this child;
    # a KeyboardInterrupt here could then only come from the backend itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.path[:] = path
    import pytest

    def answer(*message: Any) -> None:
        sys.stdout.flush()  # the parent copies the file after each answer
        sys.stderr.flush()
        _send(conn, message)

    try:
        backend = load_backend(spec)
        info = backend_info(backend)
    except BackendLoadError as exc:
        answer("load_error", str(exc), "")
        return
    except BaseException:
        answer("load_error", f"--backend={spec}: describing the backend failed", traceback.format_exc())
        return
    answer("ready", info, "")
    files = backend_files(backend)
    while True:
        try:
            method, device, payload = _recv(conn)
        except EOFError:
            return
        try:
            result = _serve(backend, method, device, payload)
        except pytest.skip.Exception as exc:  # the adapter declines this case
            answer("skipped", str(exc.msg), "")
        except BaseException as exc:  # SystemExit and the like from a kernel fail the case too
            short, full = describe_exception(exc, files)
            answer("raised", short, full)
        else:
            answer("ok", result, "")
