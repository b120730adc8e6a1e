"""Fault isolation: run a backend in a child process that is replaced when it dies.

A backend that segfaults, hits a CUDA illegal memory access, or hangs must cost
one case, not the run. ``IsolatedBackend`` constructs the backend *only* in a
spawned child process (a constructor that crashes cannot take the test process
with it), asks the child for its capabilities, and forwards every call there with
a per-call timeout (``pagedattn.options.DEFAULT_TIMEOUT_S`` unless ``--case-timeout`` says
otherwise). A child that dies or times out is killed and replaced before the next
case; the call raises ``BackendFault`` saying what happened.

Tensors travel through a pipe on the CPU and are moved to the case's device on
the other side. What the backend does to its inputs comes back too (copied onto
the caller's tensors), so the immutability property still sees a backend that
writes into the cache.
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import signal
import sys
import traceback
from typing import Any

import torch

from pagedattn.cases.io import case_from_state, case_state
from pagedattn.oracle import PagedCase, bits_equal

#: Time allowed for a fresh child to import torch and construct the backend.
STARTUP_TIMEOUT_S = 180.0
#: Time allowed for ``backend.warmup(case)`` (a JIT compile), outside the case's limit.
WARMUP_TIMEOUT_S = 1800.0
#: The invariances a backend may decline (``Capabilities.invariance_reason``).
INVARIANCE_NAMES = ("determinism", "batch_invariance", "placement_invariance")
OPTIONAL_METHODS = ("gather", "write_cache", "paged_attention_lse", "warmup")


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


def describe_exception(exc: BaseException, backend_files: set[str]) -> tuple[str, str]:
    """``(short, full)`` for an exception a backend raised: one line with its type, message
    and the last frame in the backend's own file(s) (else the last frame outside
    pagedattn), and the full traceback."""
    full = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    frames = traceback.extract_tb(exc.__traceback__)
    ours = os.path.dirname(os.path.abspath(__file__))
    mine = [f for f in frames if os.path.abspath(f.filename) in backend_files]
    outside = [f for f in frames if not os.path.abspath(f.filename).startswith(ours + os.sep)]
    chosen = mine or outside or list(frames)
    text = str(exc).strip().splitlines()
    short = f"the backend raised {type(exc).__name__}" + (f": {text[0]}" if text else "")
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


def accepts_out(backend: Any) -> bool:
    """Whether ``backend.paged_attention`` takes ``out=``: its ``accepts_out`` attribute, else
    its signature."""
    explicit = getattr(backend, "accepts_out", None)
    if explicit is not None:
        return bool(explicit)
    try:
        return "out" in inspect.signature(backend.paged_attention).parameters
    except (TypeError, ValueError):
        return False


def backend_info(backend: Any) -> dict[str, Any]:
    """What the suite and the report need to know of a backend, as plain data (it crosses
    process boundaries: from the isolation child, from xdist workers)."""
    caps = backend.capabilities
    limit_lines = getattr(caps, "limit_lines", None)
    invariance_reason = getattr(caps, "invariance_reason", None)
    return {
        "name": str(backend.name),
        "version": str(getattr(backend, "version", "") or ""),
        "target": getattr(backend, "target", None),
        "capabilities": caps.describe(),
        "limit_lines": list(limit_lines()) if callable(limit_lines) else [],
        "invariances": {n: invariance_reason(n) if callable(invariance_reason) else None for n in INVARIANCE_NAMES},
        "notes": dict(caps.notes),
        "dtypes": [str(d).replace("torch.", "") for d in caps.dtypes],
        "operations": sorted(caps.operations),
        "variants": sorted(caps.variants),
        "devices": sorted(caps.devices),
        "fp32_precision": caps.fp32_precision,
        "qk_precision": getattr(caps, "qk_precision", "fp32"),
        "tolerance_factor": caps.tolerance_factor,
        "methods": [m for m in OPTIONAL_METHODS if callable(getattr(backend, m, None))],
        "accepts_out": accepts_out(backend),
    }


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


def _child_main(conn, spec: str, path: list[str]) -> None:
    """The child: construct the backend, then serve calls until the pipe closes."""
    sys.path[:] = path
    import pytest

    from pagedattn.adapters.loading import BackendLoadError, load_backend

    try:
        backend = load_backend(spec)
        info = backend_info(backend)
    except BackendLoadError as exc:
        conn.send(("load_error", str(exc), ""))
        return
    except Exception:
        conn.send(("load_error", f"--backend={spec}: describing the backend failed", traceback.format_exc()))
        return
    conn.send(("ready", info, ""))
    files = backend_files(backend)
    while True:
        try:
            method, device, payload = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", _serve(backend, method, device, payload), ""))
        except pytest.skip.Exception as exc:  # the adapter declines this case
            conn.send(("skipped", str(exc.msg), ""))
        except Exception as exc:
            short, full = describe_exception(exc, files)
            conn.send(("raised", short, full))


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
    """The capabilities of a backend that lives in the child: the plain fields from its
    description, ``case_reason`` and ``unsupported_reason`` asked of the child (a
    predicate or a case filter cannot cross a process boundary)."""

    def __init__(self, owner: IsolatedBackend, info: dict[str, Any]):
        self._owner = owner
        self._info = info
        self.dtypes = frozenset(getattr(torch, d) for d in info["dtypes"])
        self.operations = frozenset(info["operations"])
        self.variants = frozenset(info["variants"])
        self.devices = frozenset(info["devices"])
        self.fp32_precision = info["fp32_precision"]
        self.qk_precision = info["qk_precision"]
        self.tolerance_factor = info["tolerance_factor"]
        self.notes = dict(info["notes"])

    def case_reason(self, case: PagedCase, operation: str = "attention") -> str | None:
        return self._owner._request("case_reason", (case_state(case), operation))

    def unsupported_reason(self, **kwargs: Any) -> str | None:
        if "device" in kwargs and kwargs["device"] is not None:
            kwargs["device"] = str(kwargs["device"])
        return self._owner._request("unsupported_reason", kwargs)

    def invariance_reason(self, name: str) -> str | None:
        return self._info["invariances"].get(name)

    def describe(self) -> dict[str, Any]:
        return dict(self._info["capabilities"])

    def limit_lines(self) -> list[str]:
        return list(self._info["limit_lines"])


class IsolatedBackend:
    """The backend ``spec``, constructed and run in a child process. Construction starts
    the child; a child that crashes while constructing raises ``BackendFault``, one that
    raises ``BackendLoadError`` (as an in-process load would)."""

    def __init__(self, spec: str, device: str, timeout: float | None):
        self.spec = spec
        self.device = device
        self.timeout = timeout
        self._proc: Any = None
        self._conn: Any = None
        self.generation = 0  # how many children were started: a warm-up is lost with its child
        self.info: dict[str, Any] = self._start()
        self.name = self.info["name"]
        self.version = self.info["version"]
        self.accepts_out = self.info["accepts_out"]
        self.capabilities = RemoteCapabilities(self, self.info)
        for m in OPTIONAL_METHODS:
            if m not in self.info["methods"]:
                setattr(self, m, None)

    @property
    def target(self) -> str:
        inner = self.info.get("target") or f"{self.name} ({self.device})"
        limit = f", {self.timeout:g} s per case" if self.timeout else ", no time limit"
        return f"{inner} [isolated in a child process{limit}]"

    # ------------------------------------------------------------ process
    def _start(self) -> dict[str, Any]:
        from pagedattn.adapters.loading import BackendLoadError

        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_child_main, args=(child_conn, self.spec, list(sys.path)), daemon=True)
        self._proc.start()
        self.generation += 1
        child_conn.close()
        if not self._conn.poll(STARTUP_TIMEOUT_S):
            self.close()
            raise BackendFault(f"the backend was not constructed within {STARTUP_TIMEOUT_S:g} s (it hangs?)")
        try:
            status, detail, tb = self._conn.recv()
        except (EOFError, ConnectionResetError):
            self._proc.join(5)
            code = self._proc.exitcode
            self.close()
            raise BackendFault(f"the backend crashed while being constructed: {_describe_exit(code)}") from None
        if status != "ready":
            self.close()
            raise BackendLoadError(detail + (f"\n{tb}" if tb else ""))
        return detail

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def _request(self, method: str, payload: Any, timeout: float | None = None) -> Any:
        if self._proc is None or not self._proc.is_alive():
            self.close()
            self._start()
        assert self._conn is not None and self._proc is not None
        limit = timeout if timeout is not None else self.timeout
        self._conn.send((method, self.device, payload))
        if not self._conn.poll(limit):
            self.close()
            raise BackendFault(
                f"the backend did not answer {method} within {limit:g} s (--case-timeout); its process was killed "
                "and a fresh one serves the next case",
                kind="timed_out",
            )
        try:
            status, detail, tb = self._conn.recv()
        except (EOFError, ConnectionResetError):
            self._proc.join(5)
            what = _describe_exit(self._proc.exitcode)
            self.close()
            raise BackendFault(
                f"the backend process {what} during {method}; a fresh process serves the next case"
            ) from None
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

    # ------------------------------------------------------------ the contract
    def warmup(self, case: PagedCase) -> None:  # noqa: F811
        self._request("warmup", case_state(case), timeout=WARMUP_TIMEOUT_S)

    def paged_attention(self, case: PagedCase, out: torch.Tensor | None = None) -> torch.Tensor:
        payload = {"case": case_state(case), "out": out.cpu() if out is not None else None}
        result, after, out_after = self._request("paged_attention", payload)
        self._mirror(case, after)
        if out is not None and out_after is not None:
            out.copy_(out_after)
            if isinstance(result, torch.Tensor) and result.shape == out.shape:
                return out
        return _to(result, self.device)

    def paged_attention_lse(self, case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: F811
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
