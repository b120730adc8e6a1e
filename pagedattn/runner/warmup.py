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
kernel class, created exclusively, holding the claimer's process id, and a ``.done``
file beside it when its compile is over): a thread compiles a class only if no worker
has claimed it, and a case whose class another worker's thread is compiling waits for
that compile instead of doing it again. A class that a case reaches first is claimed by
it and compiled in that case (and, on another worker that needs it at the same time, in
that worker's case too: only the threads' compiles are shared).

What it does on the device: it copies each warmed case there, and the backend's host side
runs torch work on it (the Triton kernel's ``prepare`` checks the inputs and allocates); it
launches none of the backend's kernels, so a fault of the kernel under test cannot land under
another case (a fault in that torch work still could). What it never does: judge
anything, warm up a case the backend does not claim, or hold a case up for longer than a
compile in flight (at most ``WAIT_S`` a class; a claim whose process has died is not waited
for). A warm-up that raises (or skips) is counted and forgotten: the case itself meets the
same outcome and reports it. A compiler that *kills* the process (an abort in LLVM) kills
it under whichever case is running: the crash message of a case that started while this
process's walk was on says so, and a rerun with ``--isolate`` (where it is off) or
``--warmup-ahead=off`` puts the crash on its own case.
"""

from __future__ import annotations

import hashlib
import os
import shutil
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

#: How long a case waits for its kernel class's compile in flight, seconds: in this process's
#: thread, or in another worker's (a compile takes 1-3 s on the H200's host; past this the
#: case compiles on its own, as it would have without the warm-up).
WAIT_S = 60.0
#: How often a case looks for another worker's compile to finish, seconds.
POLL_S = 0.02

Key = tuple[Any, ...]


def kernel_classes(spec: CaseSpec, operation: str) -> list[Key]:
    """The kernel classes a case of ``spec`` run as ``operation`` needs: its configuration
    (dtype, kv dtype, head dim, block size, variants, operation), its GQA group (query heads
    per kv head: a kernel specializes on the group, not on the head counts, so MQA with 8
    query heads and GQA with 16 over 2 are one class), and each regime it has: decode rows
    (one new token) and prefill rows (more). Backends that specialize on more (strides,
    sizes) compile the rest in the case."""
    config = Configuration.of_spec(spec).key(operation)
    regimes = sorted({"decode" if q == 1 else "prefill" for _, q in spec.seqs if q >= 1})
    return [(config, spec.gqa_ratio, regime) for regime in regimes]


def _size(spec: CaseSpec) -> int:
    return sum(s for s, _ in spec.seqs) * spec.num_kv_heads * spec.head_dim


#: The cases of a kernel class the thread tries (one regime first, then the smallest), until the
#: backend claims one.
CANDIDATES = 4


@dataclass
class _Plan:
    """One warm-up: the cases needing a kernel class (at most ``CANDIDATES``, in ``plan``'s
    order: the first the backend claims is warmed up), as ``(spec, operation)``."""

    key: Key
    cases: list[tuple[CaseSpec, str]]

    @property
    def spec(self) -> CaseSpec:
        return self.cases[0][0]


def plan(cases: Sequence[tuple[CaseSpec, str]]) -> list[_Plan]:
    """The warm-ups for ``cases`` (in the order they run): per kernel class its candidate cases,
    the class needed last first. A warm-up compiles every kernel its case needs, so a case of
    one regime (decode rows only, or prefill rows only) comes before a mixed one, which would
    compile the other regime's kernel too (on the H200, 110 of the thorough profile's 420
    compiles were a kernel compiled again, 94 of them by two workers' threads warming a class
    each with one mixed case, at once); among those, the smallest first."""
    last: dict[Key, int] = {}
    members: dict[Key, dict[str, tuple[CaseSpec, str]]] = {}
    for n, (spec, operation) in enumerate(cases):
        for key in kernel_classes(spec, operation):
            last[key] = n
            members.setdefault(key, {})[f"{spec.id}/{operation}"] = (spec, operation)
    order = sorted(last, key=lambda k: -last[k])

    def cost(c: tuple[CaseSpec, str]) -> tuple[int, int]:
        return len(kernel_classes(*c)), _size(c[0])

    return [_Plan(k, sorted(members[k].values(), key=cost)[:CANDIDATES]) for k in order]


def claim_dir(testrunuid: str) -> Path:
    """Where the workers of one pytest-xdist run (``testrunuid``, xdist's ``workerinput``)
    claim kernel classes; the controller removes it when the run ends (``remove_claims``)."""
    return Path(tempfile.gettempdir()) / f"pagedattn-ahead-{testrunuid}"


def remove_claims(testrunuid: str) -> None:
    shutil.rmtree(claim_dir(testrunuid), ignore_errors=True)


def _claim_file(directory: Path, key: Key) -> Path:
    return directory / hashlib.sha1(repr(key).encode()).hexdigest()


def _claim(directory: Path | None, key: Key) -> bool:
    """This process takes ``key`` (no other worker of the run has): True once per run. The
    claim file holds this process's id (a waiter gives up on a claimer that has died)."""
    if directory is None:
        return True
    directory.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(_claim_file(directory, key), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return True


def _alive(claim: Path) -> bool:
    """Whether the process that wrote ``claim`` is still running (True when unknown)."""
    try:
        pid = int(claim.read_text() or "0")
    except (OSError, ValueError):
        return True
    if pid <= 0:
        return True  # written, not yet filled
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    try:  # a crashed xdist worker stays a zombie until the controller reaps it
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _finish(directory: Path | None, key: Key) -> None:
    """``key``'s compile is over here (done or failed): whoever waits for it goes on."""
    if directory is not None:
        _claim_file(directory, key).with_suffix(".done").touch()


def _wait_done(directory: Path, key: Key, timeout: float, stop: threading.Event | None = None) -> bool:
    """Wait until whoever claimed ``key`` has finished it; False after ``timeout`` s, at once
    when the claimer has died (its compile will never finish), or when ``stop`` is set."""
    claim = _claim_file(directory, key)
    done = claim.with_suffix(".done")
    deadline = time.monotonic() + timeout
    polls = 0
    while not done.exists():
        if time.monotonic() > deadline or (stop is not None and stop.is_set()):
            return False
        polls += 1
        if polls % 25 == 0 and not _alive(claim):  # every half second
            return False
        time.sleep(POLL_S)
    return True


@dataclass
class WarmupAhead:
    """The background warm-up of one pytest process (see the module docstring).
    ``claims``: the backend's ``capabilities`` (cases they do not claim are not warmed up);
    ``claim_dir``: the run's claim directory under pytest-xdist, ``None`` in one process."""

    backend: Any  # a SupportsWarmupAhead backend
    device: str
    plans: list[_Plan]
    claim_dir: Path | None = None
    claims: Any = None  # pagedattn.adapters.protocol.Claims, or None: every case
    compiled: int = 0  # kernel classes this thread compiled ahead (a mixed case's warm-up: two)
    elsewhere: int = 0  # ... that another worker claimed first
    reached: int = 0  # ... that a case needed before this thread came to them
    waited: float = 0.0  # seconds cases waited for compiles in flight (here or in another worker)
    failed: int = 0  # warm-ups that raised or skipped (the case reports its own outcome)
    seconds: float = 0.0  # time in warm-ups: building the case, waiting for another worker, compiling
    error: str = ""  # what ended the walk early, if anything did
    _reached: set[Key] = field(default_factory=set)  # classes a case needed first (this process)
    _warmed: set[Key] = field(default_factory=set)  # classes this thread compiled
    _busy: dict[Key, threading.Event] = field(default_factory=dict)  # compiling here now
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    on_end: Any = None  # called (no arguments) in the thread when the walk ends

    def start(self) -> None:
        self._thread = threading.Thread(target=self._walk, name="pagedattn-warmup-ahead", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """No further warm-ups; waits up to ``timeout`` s for the one in flight."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def walking(self) -> bool:
        """Whether the walk is still on (its thread alive, not stopped)."""
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def stats(self) -> dict[str, Any]:
        return {
            "compiled": self.compiled,
            "claimed_elsewhere": self.elsewhere,
            "reached_first": self.reached,
            "waited_s": round(self.waited, 2),
            "failed": self.failed,
            "seconds": round(self.seconds, 2),
            "errors": int(bool(self.error)),
        }

    def reached_case(self, spec: Any, operation: str) -> None:
        """A case is about to run: wait for its kernel classes' compiles in flight (in this
        process's thread, or in another worker's), and keep every thread off the classes
        this case will now compile itself (claimed for the run, and finished at once: a
        case's own compile makes nobody wait). Never raises: a claim file that cannot be
        written or read just means the case compiles on its own."""
        if not isinstance(spec, CaseSpec) or operation not in ("attention", "lse"):
            return
        t0 = time.perf_counter()
        for key in kernel_classes(spec, operation):
            with self._lock:
                busy = self._busy.get(key)
                first = busy is None and key not in self._reached and key not in self._warmed
                if first:
                    self._reached.add(key)
                    self.reached += 1
            if busy is not None:
                busy.wait(WAIT_S)
            elif first and self.claim_dir is not None:
                try:
                    if _claim(self.claim_dir, key):
                        _finish(self.claim_dir, key)
                    else:  # another worker took it: its compile is in flight or over
                        _wait_done(self.claim_dir, key, WAIT_S)
                except OSError:
                    pass
        self.waited += time.perf_counter() - t0

    def _walk(self) -> None:
        try:
            self._walk_all()
        finally:
            if self.on_end is not None:
                self.on_end()

    def _walk_all(self) -> None:
        try:
            index = torch.device(self.device).index
            if self.device.startswith("cuda") and index is not None:
                torch.cuda.set_device(
                    index
                )  # this thread's current device ("cuda": the default, as in the main thread)
            self._each()
        except BaseException as exc:  # never an unhandled exception in a thread: the walk just ends
            self.error = f"{type(exc).__name__}: {exc}"

    def _each(self) -> None:
        for p in self.plans:
            if self._stop.is_set():
                return
            with self._lock:
                if p.key in self._reached or p.key in self._warmed:  # (warmed: with another class's case)
                    continue
            if self.claim_dir is not None and _claim_file(self.claim_dir, p.key).exists():
                with self._lock:
                    self.elsewhere += 1  # claimed by another worker: no case built for nothing
                continue
            t0 = time.perf_counter()
            taken: list[tuple[Key, threading.Event]] = []
            try:
                chosen = self._first_claimed(p)
                # a warm-up compiles every kernel its case needs: a mixed case's other regime is
                # another class, taken here too (a candidate's classes include p.key)
                taken = self._acquire(kernel_classes(*chosen[1]) if chosen is not None else [p.key])
                if chosen is not None and taken and not self._stop.is_set():
                    case, (spec, operation) = chosen
                    self.backend.warmup_ahead(case, operation)
                    self.compiled += len(taken)
                elif not taken:
                    with self._lock:
                        self.elsewhere += 1
            except BaseException:  # a raise, a pytest.skip: the case meets it and reports it
                self.failed += 1
            finally:
                self.seconds += time.perf_counter() - t0
                for key, done in taken:
                    with self._lock:
                        self._warmed.add(key)
                        del self._busy[key]
                    done.set()
                    try:
                        _finish(self.claim_dir, key)
                    except OSError:  # the waiting cases give up after WAIT_S and compile themselves
                        pass

    def _first_claimed(self, p: _Plan) -> tuple[Any, tuple[CaseSpec, str]] | None:
        """The first of ``p``'s cases the backend claims, built on the run's device, with its
        ``(spec, operation)``; None when it claims none."""
        for spec, operation in p.cases:
            case = spec.build().to(self.device)
            if self.claims is None or not self.claims.case_reason(case, operation):
                return case, (spec, operation)
            del case
        return None

    def _acquire(self, keys: list[Key]) -> list[tuple[Key, threading.Event]]:
        """Claim each of ``keys`` (a warm-up's classes) that no process has, in one order for
        every process (their claim files' names), and wait for each that another process holds
        unfinished, so that its kernel is then found in Triton's cache rather than compiled twice
        at once. A thread only waits while holding claims that come earlier in that order, so no
        two threads ever wait on each other (18b on the H200: a wait while holding a later claim
        held two threads, and the cases behind them, for WAIT_S). Returns the classes taken, with
        the events this process's cases wait on; a stop ends the waits."""
        taken: list[tuple[Key, threading.Event]] = []
        order = sorted(keys, key=lambda k: _claim_file(self.claim_dir or Path(), k).name)
        for key in order:
            if self._stop.is_set():
                break
            with self._lock:
                if key in self._reached or key in self._warmed or key in self._busy:
                    continue
            try:
                mine = _claim(self.claim_dir, key)
            except OSError:  # no claim files here: leave the class to its cases
                continue
            if not mine:
                assert self.claim_dir is not None  # one process claims everything
                _wait_done(self.claim_dir, key, WAIT_S, self._stop)
                continue
            with self._lock:
                if key not in self._reached:  # (else a case got here while this thread claimed it)
                    self._busy[key] = threading.Event()  # (only this thread adds to _busy)
                    taken.append((key, self._busy[key]))
                    continue
            try:
                _finish(self.claim_dir, key)
            except OSError:
                pass
        return taken
