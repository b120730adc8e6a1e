"""The warm-up ahead (``pagedattn.runner.warmup``): which kernel classes it compiles, in what order,
once per run across processes, never for a class a case reached first, and never in the
way of a case (a case whose class is compiling here waits for it; a failure is forgotten)."""

import os
import threading
import time

import pytest
import torch

from pagedattn.cases.spec import CaseSpec
from pagedattn.runner import warmup as ahead


def _spec(seqs, family="decode", **kw):
    return CaseSpec(family, seqs, **kw)


SMALL_DECODE = _spec(((20, 1),))
BIG_DECODE = _spec(((300, 1), (40, 1)))
MIXED = _spec(((50, 1), (30, 30)), family="mixed")
FP16_PREFILL = _spec(((64, 64),), family="prefill", dtype=torch.float16)


def test_kernel_classes_split_a_case_by_regime():
    decode, prefill = ahead.kernel_classes(MIXED, "attention")
    assert decode[-1] == "decode" and prefill[-1] == "prefill" and decode[:-1] == prefill[:-1]
    assert ahead.kernel_classes(MIXED, "lse")[0][0] != decode[0]  # the operation is part of the configuration
    assert ahead.kernel_classes(_spec(((20, 1),), num_heads=8), "attention") != ahead.kernel_classes(
        SMALL_DECODE, "attention"
    )
    # the GQA group, not the head counts: 8 query heads over 4 kv heads is SMALL_DECODE's class
    assert ahead.kernel_classes(_spec(((20, 1),), num_heads=8, num_kv_heads=4), "attention") == (
        ahead.kernel_classes(SMALL_DECODE, "attention")
    )


def test_plan_takes_the_smallest_case_of_each_class_needed_last_first():
    plans = ahead.plan(
        [(BIG_DECODE, "attention"), (FP16_PREFILL, "attention"), (SMALL_DECODE, "attention"), (MIXED, "attention")]
    )
    keys = [p.key for p in plans]
    assert len(keys) == len(set(keys)) == 3  # fp32 decode, fp32 prefill, fp16 prefill
    # the class needed last comes first: MIXED (last case) needs the fp32 decode and prefill classes
    assert {keys[0][-1], keys[1][-1]} == {"decode", "prefill"} and keys[2][0] != keys[0][0]
    decode = next(p for p in plans if p.key[-1] == "decode" and p.key[0] == keys[0][0])
    assert decode.spec is SMALL_DECODE  # the smallest case of the class, not the first


def test_plan_takes_a_case_of_one_regime_before_a_smaller_mixed_one():
    """A warm-up compiles every kernel of its case: a mixed case would compile the other
    regime's kernel too, which another thread may be compiling for its own class."""
    plans = ahead.plan([(BIG_DECODE, "attention"), (MIXED, "attention")])
    (decode,) = [p for p in plans if p.key[-1] == "decode"]
    assert decode.spec is BIG_DECODE and decode.cases[1][0] is MIXED  # MIXED is the smaller


def test_a_mixed_warmup_takes_its_other_class_too(tmp_path):
    """Warming the prefill class with its only (mixed) case compiles the decode kernel too: the
    decode class is then warmed, not compiled again, and its cases wait for it like the
    thread's own class."""
    for claim_dir in (None, tmp_path):  # one process; workers sharing claims
        backend = _Log()
        w = ahead.WarmupAhead(backend, "cpu", ahead.plan([(MIXED, "attention")]), claim_dir=claim_dir)
        w.start()
        _finish(w)
        assert len(backend.calls) == 1 and w.compiled == len(w._warmed) == 2 and not w._busy
        w.reached_case(MIXED, "attention")  # both classes warmed: nothing reached first
        assert w.reached == 0
    # both classes finished for the other workers (their cases would wait WAIT_S for a .done)
    assert all(ahead._claim_file(tmp_path, k).with_suffix(".done").exists() for k in w._warmed)


def test_a_mixed_warmup_waits_for_its_other_class_compiling_in_another_worker(tmp_path):
    """Across workers: the other class of a mixed case is claimed by another worker's thread,
    still compiling: this warm-up waits for that compile's ``.done`` (its kernel is then in
    Triton's cache) rather than compile the same kernel at the same time."""
    order = []
    gate = threading.Event()

    class Ordered(_Log):
        def warmup_ahead(self, case, operation):
            super().warmup_ahead(case, operation)
            order.append(case.query_lens)

    first = Ordered(gate=gate)  # compiles the fp32 decode class, held by the gate
    a = ahead.WarmupAhead(first, "cpu", ahead.plan([(BIG_DECODE, "attention")]), claim_dir=tmp_path)
    a.start()
    deadline = time.time() + 10
    while not a._busy and time.time() < deadline:
        time.sleep(0.01)
    prefill_only = [p for p in ahead.plan([(MIXED, "attention")]) if p.key[-1] == "prefill"]
    second = Ordered()
    b = ahead.WarmupAhead(second, "cpu", prefill_only, claim_dir=tmp_path)
    threading.Timer(0.3, gate.set).start()
    b.start()
    _finish(b)
    _finish(a)
    assert order == [[1, 1], [1, 30]], "the mixed warm-up ran before the other worker's decode compile was done"
    assert b.compiled == 1 and b.elsewhere == 0


def test_two_workers_warming_the_two_classes_of_one_mixed_case_never_wait_on_each_other(tmp_path, monkeypatch):
    """Worker A walks MIXED's decode class first, worker B its prefill class, both with MIXED:
    each warm-up would compile the other's class too. Neither may hold a claim while waiting for
    the other's (a wait in both directions would hold both threads, and the cases waiting on
    their classes, for WAIT_S)."""
    monkeypatch.setattr(ahead, "WAIT_S", 5.0)
    plans = ahead.plan([(MIXED, "attention")])
    together = threading.Barrier(2, timeout=5)

    class Together:  # both threads have chosen their case before either claims its class
        def case_reason(self, case, operation):
            if threading.current_thread().name == "pagedattn-warmup-ahead":
                try:
                    together.wait()
                except threading.BrokenBarrierError:
                    pass
            return None

    a_log, b_log = _Log(), _Log()
    a = ahead.WarmupAhead(a_log, "cpu", plans, claim_dir=tmp_path, claims=Together())
    b = ahead.WarmupAhead(b_log, "cpu", plans[::-1], claim_dir=tmp_path, claims=Together())
    t0 = time.time()
    a.start()
    b.start()
    _finish(a)
    _finish(b)
    assert time.time() - t0 < 3.0, "the two threads waited on each other"
    # and the one mixed case is compiled once: the claims are taken in one order everywhere
    assert len(a_log.calls) + len(b_log.calls) == 1 and a.failed == b.failed == 0
    assert a.compiled + b.compiled == 2


def test_a_case_of_the_class_a_mixed_warmup_took_waits_for_it_and_no_longer(monkeypatch):
    """This process's case of the other class (decode rows only) waits for the mixed warm-up in
    flight, and is released when it ends, not after WAIT_S."""
    monkeypatch.setattr(ahead, "WAIT_S", 5.0)
    gate = threading.Event()
    prefill_only = [p for p in ahead.plan([(MIXED, "attention")]) if p.key[-1] == "prefill"]
    w = ahead.WarmupAhead(_Log(gate=gate), "cpu", prefill_only, claim_dir=None)
    w.start()
    deadline = time.time() + 10
    while len(w._busy) < 2 and time.time() < deadline:  # both classes taken, the compile held
        time.sleep(0.01)
    assert len(w._busy) == 2
    threading.Timer(0.3, gate.set).start()
    t0 = time.time()
    w.reached_case(_spec(((50, 1),), family="mixed"), "attention")  # the decode class only
    assert 0.2 < time.time() - t0 < 3.0 and w.reached == 0
    _finish(w)


def test_stop_ends_a_wait_for_another_workers_compile(tmp_path, monkeypatch):
    """A warm-up waiting for another worker's compile of its case's other class (which may take
    a compile's time, or WAIT_S if that worker hangs) stops when asked, and compiles nothing."""
    monkeypatch.setattr(ahead, "WAIT_S", 30.0)
    decode, prefill = sorted(ahead.kernel_classes(MIXED, "attention"), key=lambda k: k[-1])
    first = min((decode, prefill), key=lambda k: ahead._claim_file(tmp_path, k).name)
    assert ahead._claim(tmp_path, first)  # another worker holds the class claimed first, unfinished
    plans = [p for p in ahead.plan([(MIXED, "attention")]) if p.key != first]
    backend = _Log()
    w = ahead.WarmupAhead(backend, "cpu", plans, claim_dir=tmp_path)
    w.start()
    time.sleep(0.3)  # waiting for the other worker
    t0 = time.time()
    w.stop(timeout=5.0)
    assert time.time() - t0 < 2.0 and not w._thread.is_alive(), "stop did not end the wait"
    assert backend.calls == [] and w.compiled == 0


class _Log:
    """A backend whose warm-ups log (key, thread), optionally blocking or raising."""

    def __init__(self, gate=None, fail=False):
        self.calls, self.gate, self.fail = [], gate, fail

    def warmup_ahead(self, case, operation):
        if self.gate is not None:
            self.gate.wait(10)
        self.calls.append((case.query_lens, operation, threading.current_thread().name))
        if self.fail:
            raise RuntimeError("compile failed")


def _finish(w):
    w._thread.join(10)
    assert not w._thread.is_alive()


def test_each_class_is_compiled_once_across_processes_sharing_claims(tmp_path):
    cases = [(BIG_DECODE, "attention"), (FP16_PREFILL, "attention"), (MIXED, "attention")]
    first, second = _Log(), _Log()
    a = ahead.WarmupAhead(first, "cpu", ahead.plan(cases), claim_dir=tmp_path)
    b = ahead.WarmupAhead(second, "cpu", ahead.plan(cases), claim_dir=tmp_path)
    a.start()
    _finish(a)
    b.start()
    _finish(b)
    assert a.compiled == len(first.calls) == 3 and {t for *_, t in first.calls} == {"pagedattn-warmup-ahead"}
    assert b.compiled == 0 and b.elsewhere == 3 and second.calls == []


def test_a_class_reached_by_its_case_first_is_not_compiled_ahead():
    backend = _Log()
    w = ahead.WarmupAhead(
        backend, "cpu", ahead.plan([(SMALL_DECODE, "attention"), (FP16_PREFILL, "attention")]), claim_dir=None
    )
    w.reached_case(SMALL_DECODE, "attention")  # before the thread starts: the case compiles it itself
    w.start()
    _finish(w)
    assert w.reached == 1 and w.compiled == 1 and [c[0] for c in backend.calls] == [[64]]


def test_a_case_waits_for_its_class_compiling_here_and_a_failure_is_forgotten():
    gate = threading.Event()
    backend = _Log(gate=gate, fail=True)
    w = ahead.WarmupAhead(backend, "cpu", ahead.plan([(SMALL_DECODE, "attention")]), claim_dir=None)
    w.start()
    deadline = time.time() + 10
    while not w._busy and time.time() < deadline:  # the thread has taken the class
        time.sleep(0.01)
    assert w._busy
    threading.Timer(0.3, gate.set).start()
    w.reached_case(SMALL_DECODE, "attention")  # waits for the compile in flight, raises nothing
    assert gate.is_set() and not w._busy, "the case went on while its class was compiling here"
    _finish(w)
    assert w.failed == 1 and w.compiled == 0 and w.reached == 0 and w.stats()["failed"] == 1


def test_stop_ends_the_walk_before_the_next_class():
    gate = threading.Event()
    backend = _Log(gate=gate)
    cases = [(SMALL_DECODE, "attention"), (FP16_PREFILL, "attention"), (MIXED, "attention")]
    w = ahead.WarmupAhead(backend, "cpu", ahead.plan(cases), claim_dir=None)
    w.start()
    w._stop.set()
    gate.set()
    _finish(w)
    assert len(backend.calls) <= 1


def test_claims_are_per_xdist_run_and_removed_with_it():
    directory = ahead.claim_dir("abc123")
    assert directory.name == "pagedattn-ahead-abc123"
    assert ahead._claim(directory, ("k",)) and not ahead._claim(directory, ("k",))
    ahead.remove_claims("abc123")
    assert not directory.exists()


@pytest.mark.parametrize("device, index", [("cuda", None), ("cuda:1", 1)])
def test_the_thread_takes_the_run_device_and_never_raises(monkeypatch, device, index):
    """ "cuda" (no index) is the default device, as in the main thread; "cuda:N" is set in the
    thread. A warm-up that fails there (here: building its case) is counted, not raised."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)

    def no_build(self, seed=0):
        raise RuntimeError("no case here")

    monkeypatch.setattr(CaseSpec, "build", no_build)
    w = ahead.WarmupAhead(_Log(), device, ahead.plan([(SMALL_DECODE, "attention")]), claim_dir=None)
    w.start()
    _finish(w)
    assert chosen == ([] if index is None else [index])
    assert w.failed == 1 and w.compiled == 0 and w.error == ""


def test_an_error_outside_a_warmup_ends_the_walk_quietly():
    w = ahead.WarmupAhead(_Log(), "nonsense-device", ahead.plan([(SMALL_DECODE, "attention")]), claim_dir=None)
    w.start()
    _finish(w)
    assert w.error and w.stats()["errors"] == 1


def test_a_case_claims_its_class_for_the_run_and_waits_for_another_workers_compile(tmp_path, monkeypatch):
    """Across workers (a shared claim directory): a case that reaches an unclaimed class
    claims it, so no thread compiles it again; a case whose class another worker is
    compiling waits for that compile's ``.done``, not longer."""
    cases = [(SMALL_DECODE, "attention"), (FP16_PREFILL, "attention")]
    main = ahead.WarmupAhead(_Log(), "cpu", ahead.plan(cases), claim_dir=tmp_path)
    main.reached_case(SMALL_DECODE, "attention")  # claims and finishes the fp32 decode class
    other = _Log()
    thread = ahead.WarmupAhead(other, "cpu", ahead.plan(cases), claim_dir=tmp_path)
    thread.start()
    _finish(thread)
    assert [c[0] for c in other.calls] == [[64]] and thread.elsewhere == 1  # only the prefill class
    # a third worker claims a class and is compiling it: the case waits for its .done
    fp16_decode = _spec(((9, 1),), family="mixed", dtype=torch.float16)
    (key,) = ahead.kernel_classes(fp16_decode, "attention")
    assert ahead._claim(tmp_path, key)
    late = ahead.WarmupAhead(_Log(), "cpu", [], claim_dir=tmp_path)
    done = ahead._claim_file(tmp_path, key).with_suffix(".done")
    threading.Timer(0.3, ahead._finish, (tmp_path, key)).start()
    late.reached_case(fp16_decode, "attention")
    assert done.exists(), "the case went on while another worker was compiling its class"
    # a claim never finished (its worker died): the case gives up after WAIT_S and compiles itself
    monkeypatch.setattr(ahead, "WAIT_S", 0.1)
    (stuck,) = ahead.kernel_classes(_spec(((5, 1),), head_dim=32), "attention")
    assert ahead._claim(tmp_path, stuck)
    late.reached_case(_spec(((5, 1),), head_dim=32), "attention")
    assert not ahead._claim_file(tmp_path, stuck).with_suffix(".done").exists()


def test_a_class_the_thread_found_claimed_elsewhere_is_waited_for_by_its_case(tmp_path):
    """The thread skips a class another worker claimed; a case of that class then waits for
    that worker's compile (it does not count the class as handled here)."""
    (key,) = ahead.kernel_classes(SMALL_DECODE, "attention")
    assert ahead._claim(tmp_path, key)  # another worker's thread
    w = ahead.WarmupAhead(_Log(), "cpu", ahead.plan([(SMALL_DECODE, "attention")]), claim_dir=tmp_path)
    w.start()
    _finish(w)
    assert w.elsewhere == 1 and w.compiled == 0
    threading.Timer(0.2, ahead._finish, (tmp_path, key)).start()
    w.reached_case(SMALL_DECODE, "attention")
    assert ahead._claim_file(tmp_path, key).with_suffix(".done").exists()


def test_unclaimed_cases_and_other_operations_are_not_warmed_and_skips_do_not_escape():
    class Claims:
        def case_reason(self, case, operation):
            return "fp16 not claimed" if case.dtype == torch.float16 else None

    class Skips(_Log):
        def warmup_ahead(self, case, operation):
            super().warmup_ahead(case, operation)
            pytest.skip("not here")

    backend = Skips()
    cases = [(SMALL_DECODE, "attention"), (FP16_PREFILL, "attention")]
    w = ahead.WarmupAhead(backend, "cpu", ahead.plan(cases), claims=Claims())
    w.start()
    _finish(w)
    assert [c[0] for c in backend.calls] == [[1]]  # the fp32 decode only; its skip is counted
    assert w.failed == 1 and w.error == ""
    w.reached_case(SMALL_DECODE, "gather")  # not a kernel class of attention: not counted
    assert w.reached == 0


def test_a_class_whose_smallest_case_is_unclaimed_is_warmed_with_the_next():
    class Claims:
        def case_reason(self, case, operation):
            return "mixed batches not claimed" if len(set(case.query_lens)) > 1 else None

    mixed_small = _spec(((9, 1), (5, 5)), family="mixed")  # smaller, needs the decode class too
    backend = _Log()
    w = ahead.WarmupAhead(
        backend, "cpu", ahead.plan([(BIG_DECODE, "attention"), (mixed_small, "attention")]), claims=Claims()
    )
    w.start()
    _finish(w)
    assert [c[0] for c in backend.calls] == [[1, 1]] and w.compiled == 1  # BIG_DECODE, for the decode class


def test_a_case_does_not_wait_for_a_claim_whose_process_died(tmp_path, monkeypatch):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (key,) = ahead.kernel_classes(SMALL_DECODE, "attention")
    ahead._claim_file(tmp_path, key).write_text(dead.stdout.strip())  # claimed by a finished process
    monkeypatch.setattr(ahead, "WAIT_S", 600.0)
    w = ahead.WarmupAhead(_Log(), "cpu", [], claim_dir=tmp_path)
    w.reached_case(SMALL_DECODE, "attention")  # returns: the claimer is gone (else: 600 s)
    assert not ahead._claim_file(tmp_path, key).with_suffix(".done").exists()


def test_a_zombie_claimer_counts_as_dead(tmp_path):
    """A crashed pytest-xdist worker stays a zombie until its controller reaps it: its claims
    must not hold the other workers' cases for WAIT_S."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    while time.time() < deadline:  # exited, not yet reaped: a zombie
        try:
            state = open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            pytest.fail("no /proc here: this test needs Linux")
        if state == "Z":
            break
        time.sleep(0.02)
    claim = tmp_path / "claim"
    claim.write_text(str(child.pid))
    assert not ahead._alive(claim)
    child.wait()
    assert not ahead._alive(claim)
    claim.write_text(str(os.getpid()))
    assert ahead._alive(claim)
