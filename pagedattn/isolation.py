"""Fault isolation: run a backend in a child process that is replaced when it dies.

A backend that segfaults, hits a CUDA illegal memory access, or hangs must cost
one failed case, not the run. ``IsolatedBackend`` loads the backend a second time
in a spawned child process and forwards every call there, with a per-call
timeout. A child that dies or times out is killed and replaced before the next
case; the call raises ``BackendFault`` with what happened.

Tensors travel through a pipe on the CPU and are moved to the case's device on
the other side. What the backend does to its inputs comes back too (copied onto
the caller's tensors), so the immutability property still sees a backend that
writes into the cache.
"""

from __future__ import annotations

import inspect
import multiprocessing
import signal
import sys
import traceback
from typing import Any

import torch

from pagedattn.cases.io import case_from_state, case_state
from pagedattn.oracle import PagedCase, bits_equal

#: Time allowed for a fresh child to import torch and load the backend.
STARTUP_TIMEOUT_S = 180.0


class BackendFault(Exception):
    """The backend process crashed, hung, or could not be started."""


def _to(x: Any, device: str | torch.device) -> Any:
    """Tensors to ``device``; anything else (a backend's wrong answer) as it is."""
    return x.to(device) if isinstance(x, torch.Tensor) else x


def _child_main(conn, spec: str, path: list[str]) -> None:
    """The child: load the backend, then serve calls until the pipe closes."""
    sys.path[:] = path
    from pagedattn.adapters.loading import load_backend

    try:
        backend = load_backend(spec)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", None))
    while True:
        try:
            method, device, payload = conn.recv()
        except EOFError:
            return
        try:
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
                conn.send(("ok", (_to(result, "cpu"), after, out)))
            elif method == "gather":
                pool, slots = (t.to(device) for t in payload)
                conn.send(("ok", (_to(backend.gather(pool, slots), "cpu"), pool.cpu())))
            elif method == "write_cache":
                pool, slots, new = (t.to(device) for t in payload)
                backend.write_cache(pool, slots, new)
                conn.send(("ok", (pool.cpu(), new.cpu())))
            else:
                conn.send(("error", f"unknown method {method!r}"))
        except Exception:
            conn.send(("raised", traceback.format_exc()))


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class IsolatedBackend:
    """The backend ``spec`` behind a child process; same attributes as ``local`` (the
    backend loaded in this process, for its name, capabilities and target)."""

    def __init__(self, spec: str, local: Any, device: str, timeout: float | None):
        self.spec = spec
        self.local = local
        self.device = device
        self.timeout = timeout
        self.name = local.name
        self.capabilities = local.capabilities
        self.version = getattr(local, "version", None)
        try:
            self.accepts_out = "out" in inspect.signature(local.paged_attention).parameters
        except (TypeError, ValueError):
            self.accepts_out = False
        self._proc: Any = None
        self._conn: Any = None
        self.restarts = 0
        if not hasattr(local, "gather"):
            self.gather = None  # type: ignore[assignment]
        if not hasattr(local, "write_cache"):
            self.write_cache = None  # type: ignore[assignment]
        if not hasattr(local, "paged_attention_lse"):
            self.paged_attention_lse = None  # type: ignore[assignment]

    @property
    def target(self) -> str:
        inner = getattr(self.local, "target", None) or f"{self.name} ({self.device})"
        limit = f", {self.timeout:g} s per case" if self.timeout else ""
        return f"{inner} [isolated in a child process{limit}]"

    # ------------------------------------------------------------ process
    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_child_main, args=(child_conn, self.spec, list(sys.path)), daemon=True)
        self._proc.start()
        child_conn.close()
        if not self._conn.poll(STARTUP_TIMEOUT_S):
            self.close()
            raise BackendFault(f"the backend process did not start within {STARTUP_TIMEOUT_S:g} s")
        try:
            status, detail = self._conn.recv()
        except EOFError:
            self._proc.join(5)
            code = self._proc.exitcode
            self.close()
            raise BackendFault(f"the backend process {_describe_exit(code)} while loading the backend") from None
        if status != "ready":
            self.close()
            raise BackendFault(f"the backend failed to load in the child process:\n{detail}")

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def _request(self, method: str, payload: Any) -> Any:
        if self._proc is None or not self._proc.is_alive():
            if self._proc is not None:
                self.restarts += 1
            self.close()
            self._start()
        assert self._conn is not None and self._proc is not None
        self._conn.send((method, self.device, payload))
        if not self._conn.poll(self.timeout):
            self.close()
            raise BackendFault(
                f"the backend did not answer within {self.timeout:g} s (--case-timeout); its process was killed "
                "and a fresh one serves the next case"
            )
        try:
            status, detail = self._conn.recv()
        except (EOFError, ConnectionResetError):
            self._proc.join(5)
            what = _describe_exit(self._proc.exitcode)
            self.close()
            raise BackendFault(
                f"the backend process {what} during {method}; a fresh process serves the next case"
            ) from None
        if status == "raised":
            if "CUDA error" in detail or "illegal memory access" in detail:
                self.close()  # a CUDA context that faulted is poisoned for every later call
            raise BackendFault(f"the backend raised during {method}:\n{detail}")
        if status != "ok":
            raise BackendFault(f"the backend process answered {status}: {detail}")
        return detail

    # ------------------------------------------------------------ the contract
    def paged_attention(self, case: PagedCase, out: torch.Tensor | None = None) -> torch.Tensor:
        payload = {"case": case_state(case), "out": out.cpu() if out is not None else None}
        result, after, out_after = self._request("paged_attention", payload)
        self._mirror(case, after)
        if out is not None and out_after is not None:
            out.copy_(out_after)
            if isinstance(result, torch.Tensor) and result.shape == out.shape:
                return out
        return _to(result, self.device)

    def paged_attention_lse(self, case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
        result, after, _ = self._request("paged_attention_lse", {"case": case_state(case), "out": None})
        self._mirror(case, after)
        if isinstance(result, tuple):
            return tuple(_to(r, self.device) for r in result)  # type: ignore[return-value]
        return result

    @staticmethod
    def _mirror(case: PagedCase, after: dict) -> None:
        for f, mine in case.tensors().items():  # mirror what the backend did to its inputs
            theirs = after[f].to(mine.device)
            if not bits_equal(mine, theirs):
                mine.copy_(theirs)

    def gather(self, pool: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:  # noqa: F811
        result, _ = self._request("gather", (pool.cpu(), slot_mapping.cpu()))
        return _to(result, self.device)

    def write_cache(self, pool: torch.Tensor, slot_mapping: torch.Tensor, new: torch.Tensor) -> None:  # noqa: F811
        pool_after, new_after = self._request("write_cache", (pool.cpu(), slot_mapping.cpu(), new.cpu()))
        pool.copy_(pool_after.to(pool.device))
        new.copy_(new_after.to(new.device))
