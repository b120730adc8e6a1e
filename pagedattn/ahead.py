"""Warm-up ahead: compile what later cases need while earlier cases run.

A JIT backend (Triton, FlashInfer's JIT) compiles once per kernel specialization, and
after every edit of the kernel, every specialization again: in the thorough profile on an
H200 that was most of each worker's time, one compile after another on one core while
the machine's other cores idled. A backend that offers ``warmup_ahead(case, operation)``
(``pagedattn.adapters.protocol.SupportsWarmupAhead``: compile only, no launch, safe from
a second thread) gets a background thread per pytest process that walks this process's
cases from the **last** one back, one case per kernel class, while the cases run from
the first one on: the two meet in the middle, and most cases find their kernels
compiled. Under pytest-xdist the workers share the walk through claim files (one per
kernel class, created exclusively), so each class is compiled ahead at most once.

What it never does: run a kernel (a compile-only call cannot fault the device under a
case that did not cause it), judge anything, or hold a case up: a case whose kernel
class this process's thread is compiling waits for that compile (it would compile the
same kernel again otherwise); any other case runs at once. A warm-up that raises is
counted and forgotten: the case itself meets the same error and reports it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pagedattn.cases.configuration import Configuration
from pagedattn.cases.spec import CaseSpec

#: How long a case waits for its kernel class's compile in this process's thread, seconds
#: (a compile takes 1-3 s on the H200's host; past this, the case compiles on its own).
WAIT_S = 120.0

Key = tuple[Any, ...]


def kernel_classes(spec: CaseSpec, operation: str) -> list[Key]:
    """The kernel classes a case of ``spec`` run as ``operation`` needs: its configuration
    (dtype, kv dtype, head dim, block size, variants, operation), its head counts (the GQA
    group), and each regime it has: decode rows (one new token) and prefill rows (more).
    Backends that specialize on more (strides, sizes) compile the rest in the case."""
    config = Configuration.of_spec(spec).key(operation)
    regimes = sorted({"decode" if q == 1 else "prefill" for _, q in spec.seqs if q >= 1})
    return [(config, spec.num_heads, spec.num_kv_heads, regime) for regime in regimes]


def _size(spec: CaseSpec) -> int:
    return sum(s for s, _ in spec.seqs) * spec.num_kv_heads * spec.head_dim


@dataclass
class _Plan:
    """One warm-up: the smallest case needing a kernel class, as ``(spec, operation)``."""

    key: Key
    spec: CaseSpec
    operation: str


def plan(cases: Sequence[tuple[CaseSpec, str]]) -> list[_Plan]:
    """The warm-ups for ``cases`` (in the order they run): per kernel class the smallest case
    that needs it, the class needed last first."""
    last: dict[Key, int] = {}
    smallest: dict[Key, tuple[CaseSpec, str]] = {}
    for n, (spec, operation) in enumerate(cases):
        for key in kernel_classes(spec, operation):
            last[key] = n
            if key not in smallest or _size(spec) < _size(smallest[key][0]):
                smallest[key] = (spec, operation)
    order = sorted(last, key=lambda k: -last[k])
    return [_Plan(k, *smallest[k]) for k in order]


def _claim_dir() -> Path | None:
    """Where the workers of one pytest-xdist run claim kernel classes (``None``: one process)."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not uid:
        return None
    return Path(tempfile.gettempdir()) / f"pagedattn-ahead-{uid}"


def _claim(directory: Path | None, key: Key) -> bool:
    """This process takes ``key`` (no other worker of the run has): True once per run."""
    if directory is None:
        return True
    directory.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha1(repr(key).encode()).hexdigest()
    try:
        os.close(os.open(directory / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


@dataclass
class WarmupAhead:
    """The background warm-up of one pytest process (see the module docstring)."""

    backend: Any  # a SupportsWarmupAhead backend
    device: str
    plans: list[_Plan]
    claim_dir: Path | None = field(default_factory=_claim_dir)
    compiled: int = 0  # kernel classes this thread compiled ahead
    elsewhere: int = 0  # ... that another worker claimed first
    reached: int = 0  # ... that a case needed before this thread came to them
    failed: int = 0  # warm-ups that raised (the case reports its own error)
    seconds: float = 0.0  # time in warm-up calls
    error: str = ""  # what ended the walk early, if anything did
    _done: set[Key] = field(default_factory=set)
    _busy: dict[Key, threading.Event] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._walk, name="pagedattn-warmup-ahead", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """No further warm-ups; waits up to ``timeout`` s for the one in flight."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def stats(self) -> dict[str, Any]:
        return {
            "compiled": self.compiled,
            "claimed_elsewhere": self.elsewhere,
            "reached_first": self.reached,
            "failed": self.failed,
            "seconds": round(self.seconds, 2),
            "errors": int(bool(self.error)),
        }

    def reached_case(self, spec: Any, operation: str) -> None:
        """A case is about to run: wait for its kernel classes' compiles in flight here,
        and keep the thread off the classes it will now compile itself."""
        if not isinstance(spec, CaseSpec):
            return
        for key in kernel_classes(spec, operation):
            with self._lock:
                busy = self._busy.get(key)
                if busy is None and key not in self._done:
                    self._done.add(key)
                    self.reached += 1
            if busy is not None:
                busy.wait(WAIT_S)

    def _walk(self) -> None:
        try:
            index = torch.device(self.device).index
            if self.device.startswith("cuda") and index is not None:
                torch.cuda.set_device(index)  # this thread's current device ("cuda": the default, as in the main thread)
            self._each()
        except Exception as exc:  # never an unhandled exception in a thread: the walk just ends
            self.error = f"{type(exc).__name__}: {exc}"

    def _each(self) -> None:
        for p in self.plans:
            if self._stop.is_set():
                return
            with self._lock:
                if p.key in self._done:
                    continue
                self._done.add(p.key)
                if not _claim(self.claim_dir, p.key):
                    self.elsewhere += 1
                    continue
                event = self._busy[p.key] = threading.Event()
            t0 = time.perf_counter()
            try:
                case = p.spec.build().to(self.device)
                self.backend.warmup_ahead(case, p.operation)
                self.compiled += 1
            except Exception:  # the case meets the same error and reports it
                self.failed += 1
            finally:
                self.seconds += time.perf_counter() - t0
                with self._lock:
                    del self._busy[p.key]
                event.set()
