"""Fault isolation: run a backend in a child process that is replaced when it dies.

A backend that segfaults, hits a CUDA illegal memory access, or hangs must cost
one case, not the run. ``isolated_backend`` constructs the backend *only* in a
spawned child process (a constructor that crashes cannot take the test process
with it), asks the child for its capabilities, and forwards every call there with
a per-call timeout (``pagedattn.runner.options.DEFAULT_TIMEOUT_S`` unless ``--case-timeout`` says
otherwise). A child that dies or times out is killed and replaced before the next
case; the call raises ``BackendFault`` saying what happened.

Tensors travel through a pipe on the CPU, serialized by value (never in shared memory:
a tensor that arrives is the receiver's own, which the backend can no longer write, and
no shared-memory segment outlives a killed run), and are moved to the case's device on
the other side. What the backend does to its inputs comes back too (copied onto the
caller's tensors), so the immutability property still sees a backend that writes into
the cache.

The child dies with the process that started it (a parent-death signal on Linux, a
watch of its parent elsewhere), so killing pytest while a case hangs leaves no child
behind, nor multiprocessing's resource tracker (the spawn starts it; it ends when the
last process holding its pipe, pytest or a child, is gone). The child's stdout and
stderr go to a file that the parent copies into its own stdout after each call, so the
backend's prints land in the captured output of the case.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import tempfile
from functools import cache
from typing import Any

import torch

from pagedattn.adapters.loading import OPTIONAL_METHODS, BackendLoadError
from pagedattn.cases.io import case_state
from pagedattn.oracle import PagedCase, bits_equal
from pagedattn.runner.faults import BackendFault
from pagedattn.runner.isolation_child import _child_main, _recv, _send, _to

#: Time allowed for a fresh child to import torch and construct the backend.
STARTUP_TIMEOUT_S = 180.0
#: Time allowed for ``backend.warmup(case)`` (a JIT compile), outside the case's limit.
WARMUP_TIMEOUT_S = 1800.0


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class RemoteCapabilities:
    """The capabilities of a backend that lives in the child (a ``Claims``): the plain
    fields from its description, ``case_reason`` and ``unsupported_reason`` asked of the
    child (a predicate or a case filter cannot cross a process boundary)."""

    def __init__(self, child: _Child, info: dict[str, Any]):
        self._child = child
        self._info = info
        self.dtypes = frozenset(getattr(torch, d) for d in info["dtypes"])
        self.operations = frozenset(info["operations"])
        self.variants = frozenset(info["variants"])
        self.devices = frozenset(info["devices"])
        self.fp32_precision: str = info["fp32_precision"]
        self.qk_precision: str = info["qk_precision"]
        self.tanh_precision: str = info["tanh_precision"]
        self.partials_precision: str = info.get("partials_precision", "fp32")
        self.declared_on: str = info.get("declared_on", "all")
        self.tolerance_factor: float = info["tolerance_factor"]
        self.notes: dict[str, str] = dict(info["notes"])
        self.max_seq_len: int | None = info["max_seq_len"]
        self.decode_only: bool = info["decode_only"]
        self.default_scale_only: bool = info["default_scale_only"]

    def case_reason(self, case: PagedCase, operation: str = "attention") -> str | None:
        return self._child.request("case_reason", (case_state(case), operation))

    def unsupported_reason(self, **kwargs: Any) -> str | None:
        if "device" in kwargs and kwargs["device"] is not None:
            kwargs["device"] = str(kwargs["device"])
        return self._child.request("unsupported_reason", kwargs)

    def invariance_reason(self, name: str) -> str | None:
        return self._info["invariances"].get(name)

    def describe(self) -> dict[str, Any]:
        return dict(self._info["capabilities"])

    def limit_lines(self) -> list[str]:
        return list(self._info["limit_lines"])


def _own_path_first() -> list[str]:
    """``sys.path`` for the child, with the directory holding this process's ``pagedattn``
    first where the path as it is would find another copy first (pytest puts a test module's
    root first: a checkout beside an installed or editable copy). The child runs the harness
    of the process that talks to it through the pipe; otherwise the path is left as it is."""
    import importlib.machinery

    import pagedattn

    ours = os.path.abspath(pagedattn.__file__)
    found = importlib.machinery.PathFinder.find_spec("pagedattn", sys.path)
    if found is None or found.origin is None or os.path.abspath(found.origin) == ours:
        return list(sys.path)
    root = os.path.dirname(os.path.dirname(ours))
    return [root, *(p for p in sys.path if p != root)]


class _Child:
    """The child process that holds the backend, and the pipe to it. Constructing one
    starts the child; a child that crashes while constructing raises ``BackendFault``,
    one that raises ``BackendLoadError`` (as an in-process load would). A child that dies
    or times out is replaced before the next request."""

    def __init__(self, spec: str, device: str, timeout: float | None):
        self.spec = spec
        self.device = device
        self.timeout = timeout
        self._proc: Any = None
        self._conn: Any = None
        self._log: Any = None  # the child's stdout and stderr (read side)
        self.generation = 0  # how many children were started: a warm-up is lost with its child
        self.info: dict[str, Any] = self._start()

    def _start(self) -> dict[str, Any]:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        handle, log = tempfile.mkstemp(prefix="pagedattn-isolated-", suffix=".log")
        os.close(handle)
        self._log = open(log, "rb")  # noqa: SIM115 - read after every call, closed with the child
        path = _own_path_first()
        args = (child_conn, self.spec, path, os.getpid(), log)
        self._proc = ctx.Process(target=_child_main, args=args, daemon=True)
        saved = sys.path[:]
        try:
            sys.path[:] = path  # spawn imports this module in the child by the path it sees now
            self._proc.start()
            sys.path[:] = saved
            self.generation += 1
            child_conn.close()
            ready = self._conn.poll(STARTUP_TIMEOUT_S)
        finally:
            sys.path[:] = saved
            os.unlink(log)  # opened by both sides by now (or never): no file left behind, even on SIGKILL
        if not ready:
            self.close()
            raise BackendFault(f"the backend was not constructed within {STARTUP_TIMEOUT_S:g} s (it hangs?)")
        try:
            status, detail, tb = _recv(self._conn)
        except (EOFError, ConnectionResetError):
            self._proc.join(5)
            code = self._proc.exitcode
            self.close()
            raise BackendFault(f"the backend crashed while being constructed: {_describe_exit(code)}") from None
        finally:
            self.forward_output()
        if status != "ready":
            self.close()
            raise BackendLoadError(detail + (f"\n{tb}" if tb else ""))
        return detail

    def forward_output(self) -> None:
        """Copy what the child printed since the last call into this process's stdout (the
        captured output of the case that is running)."""
        if self._log is None:
            return
        text = self._log.read()
        if text:
            sys.stdout.write(text.decode(errors="replace"))
            sys.stdout.flush()

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        if self._log is not None:
            self.forward_output()  # what a child that crashed or hung printed last
            self._log.close()
        self._proc = self._conn = self._log = None

    def request(self, method: str, payload: Any, timeout: float | None = None) -> Any:
        """Ask the child to run ``method`` on ``payload`` (``_serve``); its answer, or
        ``BackendFault`` (crashed, timed out, raised), or ``pytest.skip`` (declined)."""
        if self._proc is None or not self._proc.is_alive():
            self.close()
            self._start()
        assert self._conn is not None and self._proc is not None
        limit = timeout if timeout is not None else self.timeout
        _send(self._conn, (method, self.device, payload))
        if not self._conn.poll(limit):
            self.close()
            raise BackendFault(
                f"the backend did not answer {method} within {limit:g} s (--case-timeout); its process was killed "
                "and a fresh one serves the next case",
                kind="timed_out",
            )
        try:
            status, detail, tb = _recv(self._conn)
        except (EOFError, ConnectionResetError):
            self._proc.join(5)
            what = _describe_exit(self._proc.exitcode)
            self.close()
            raise BackendFault(
                f"the backend process {what} during {method}; a fresh process serves the next case"
            ) from None
        self.forward_output()
        if status == "skipped":
            import pytest

            pytest.skip(detail)
        if status == "raised":
            if "CUDA error" in tb or "illegal memory access" in tb:
                self.close()  # a CUDA context that faulted is poisoned for every later call
            raise BackendFault(detail, kind="raised", traceback=tb)
        if status != "ok":
            raise BackendFault(f"the backend process answered {status}: {detail}")
        return detail


class IsolatedBackend:
    """A ``Backend`` (with ``SupportsOut`` and ``SupportsClose``) whose backend lives in a
    child process. Its optional methods are exactly the child backend's: the classes
    ``isolated_backend`` returns add them (``_IsolatedLse``, ``_IsolatedGather``,
    ``_IsolatedWriteCache``, ``_IsolatedWarmup``), so ``isinstance(proxy, SupportsGather)``
    answers as for the backend itself. Beyond the contract, ``generation`` counts the child
    processes started (a restart after a crash or a hang starts the next): the suite warms
    each configuration up once per generation, since a warm-up is lost with its child."""

    def __init__(self, child: _Child):
        self._child = child
        self.info = child.info
        self.name: str = self.info["name"]
        self.version: str = self.info["version"]
        self.accepts_out: bool = self.info["accepts_out"]
        self.capabilities = RemoteCapabilities(child, self.info)

    @property
    def device(self) -> str:
        return self._child.device

    @property
    def timeout(self) -> float | None:
        return self._child.timeout

    @property
    def generation(self) -> int:
        """How many child processes were started (a warm-up is lost with its child)."""
        return self._child.generation

    @property
    def target(self) -> str:
        inner = self.info.get("target") or f"{self.name} ({self.device})"
        limit = f", {self.timeout:g} s per case" if self.timeout else ", no time limit"
        return f"{inner} [isolated in a child process{limit}]"

    def close(self) -> None:
        self._child.close()

    def paged_attention(self, case: PagedCase, out: torch.Tensor | None = None) -> torch.Tensor:
        payload = {"case": case_state(case), "out": out.cpu() if out is not None else None}
        result, after, out_after = self._child.request("paged_attention", payload)
        self._mirror(case, after)
        if out is not None and out_after is not None:
            out.copy_(out_after)
            if isinstance(result, torch.Tensor) and result.shape == out.shape:
                return out
        return _to(result, self.device)

    @staticmethod
    def _mirror(case: PagedCase, after: dict[str, torch.Tensor]) -> None:
        for f, mine in case.tensors().items():  # mirror what the backend did to its inputs
            theirs = after[f].to(mine.device)
            if not bits_equal(mine, theirs):
                mine.copy_(theirs)


class _IsolatedLse(IsolatedBackend):
    def paged_attention_lse(self, case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
        result, after, _ = self._child.request("paged_attention_lse", {"case": case_state(case), "out": None})
        self._mirror(case, after)
        if isinstance(result, tuple):
            return tuple(_to(r, self.device) for r in result)
        return result  # not a pair: the suite rejects it


class _IsolatedGather(IsolatedBackend):
    def gather(self, pool: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        result, _ = self._child.request("gather", (pool.cpu(), slot_mapping.cpu()))
        return _to(result, self.device)


class _IsolatedWriteCache(IsolatedBackend):
    def write_cache(self, pool: torch.Tensor, slot_mapping: torch.Tensor, new: torch.Tensor) -> None:
        pool_after, new_after = self._child.request("write_cache", (pool.cpu(), slot_mapping.cpu(), new.cpu()))
        pool.copy_(pool_after.to(pool.device))
        new.copy_(new_after.to(new.device))


class _IsolatedWarmup(IsolatedBackend):
    def warmup(self, case: PagedCase) -> None:
        self._child.request("warmup", case_state(case), timeout=WARMUP_TIMEOUT_S)


_OPTIONAL_PROXIES: dict[str, type[IsolatedBackend]] = {
    "paged_attention_lse": _IsolatedLse,
    "gather": _IsolatedGather,
    "write_cache": _IsolatedWriteCache,
    "warmup": _IsolatedWarmup,
}


@cache
def _proxy_class(methods: frozenset[str]) -> type[IsolatedBackend]:
    """The proxy class with exactly the optional ``methods`` (one class per combination)."""
    bases = tuple(cls for name, cls in _OPTIONAL_PROXIES.items() if name in methods)
    if not bases:
        return IsolatedBackend
    names = "+".join(name for name in _OPTIONAL_PROXIES if name in methods)
    return type(f"IsolatedBackend[{names}]", bases, {"__doc__": IsolatedBackend.__doc__})


def isolated_backend(spec: str, device: str, timeout: float | None) -> IsolatedBackend:
    """The backend ``spec``, constructed and run in a child process (see the module
    docstring), behind a proxy with the same optional methods. A child that crashes while
    constructing raises ``BackendFault``; one that cannot load ``spec`` raises
    ``BackendLoadError``, as an in-process load would."""
    child = _Child(spec, device, timeout)
    return _proxy_class(frozenset(child.info["methods"]) & frozenset(OPTIONAL_METHODS))(child)
