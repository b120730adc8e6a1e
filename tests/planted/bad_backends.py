"""Deliberately wrong backends, one broken property each, for testing the suite itself."""

import torch

from pagedattn import INVARIANCES, Capabilities, paged_attention_reference


def _nudge(out: torch.Tensor, ulps: int) -> torch.Tensor:
    """``out`` with its first element moved by ``ulps`` units in the last place."""
    out = out.clone()
    bits = out.view({2: torch.int16, 4: torch.int32}[out.element_size()])
    bits.view(-1)[0] += ulps
    return out


class Correct:
    name = "correct"
    capabilities = Capabilities()

    def paged_attention(self, case):
        return paged_attention_reference(case).to(case.dtype)


class WrongScale(Correct):
    name = "wrong-scale"

    def paged_attention(self, case):
        return paged_attention_reference(case.replace(scale=case.scale * 1.01)).to(case.dtype)


class Nondeterministic(Correct):
    calls = 0

    def paged_attention(self, case):
        Nondeterministic.calls += 1
        return _nudge(super().paged_attention(case), Nondeterministic.calls % 2)


class BatchDependent(Correct):
    def paged_attention(self, case):
        return _nudge(super().paged_attention(case), int(case.num_seqs > 1))


class PlacementDependent(Correct):
    def paged_attention(self, case):
        return _nudge(super().paged_attention(case), int(case.block_tables[0, 0]) % 3 + 1)


class Mutating(Correct):
    def paged_attention(self, case):
        out = super().paged_attention(case)
        case.key_cache[int(case.block_tables[0, 0]), 0] = 0  # "writes the new token's K"
        return out


class ReadsPadding(Correct):
    def paged_attention(self, case):
        pad = case.key_cache[int(case.block_tables[0, -1])].float().sum()  # past the last block: poison
        return (super().paged_attention(case).double() + 0.0 * pad).to(case.dtype)


class PartlyWritesOut(Correct):
    def paged_attention(self, case, out=None):
        result = super().paged_attention(case)
        if out is None:
            return result
        out[:-1] = result[:-1]  # forgets the last token
        return out


class Raises(Correct):
    def paged_attention(self, case):
        raise RuntimeError("kernel launch failed: too many resources requested")


class RaisesOnSingleSequence(Correct):
    """Raises where ``SegfaultsOnLongDecode`` dies: on single-sequence cases only."""

    def paged_attention(self, case):
        if case.num_seqs == 1:
            raise RuntimeError("kernel launch failed: an illegal memory access was encountered")
        return super().paged_attention(case)


def factory():
    return Correct()


instance = Correct()
not_a_backend = object()


class SegfaultsOnLongDecode(Correct):
    """Dies like a kernel that reads far out of bounds, on single-sequence cases only."""

    def paged_attention(self, case):
        if case.num_seqs == 1:
            import ctypes

            ctypes.string_at(0)  # SIGSEGV
        return super().paged_attention(case)


def _hang() -> None:
    """Sleep "forever"; but leave when orphaned (a test killed the run above this process)."""
    import os
    import time

    parent = os.getppid()
    for _ in range(1200):
        time.sleep(0.1)
        if os.getppid() != parent:
            os._exit(1)


class HangsOnLongDecode(Correct):
    def paged_attention(self, case):
        if case.num_seqs == 1:
            _hang()
        return super().paged_attention(case)


class CrashesWhenConstructed(Correct):
    """A constructor that dies (a CUDA context that faults while a kernel library loads)."""

    def __init__(self):
        import ctypes

        ctypes.string_at(0)  # SIGSEGV


class SkipsMultiSequence(Correct):
    """Declines what it cannot run by raising ``pytest.skip`` inside the call."""

    def paged_attention(self, case):
        if case.num_seqs > 1:
            import pytest

            pytest.skip("this adapter runs one sequence per call")
        return super().paged_attention(case)


class WritesNaNIntoOut(Correct):
    """Writes every element of ``out``, one of them with a NaN."""

    def paged_attention(self, case, out=None):
        result = super().paged_attention(case)
        if out is None:
            return result
        out.copy_(result)
        out[0, 0, 0] = float("nan")
        return out


class DeclinesBatchInvariance(BatchDependent):
    """Batch-dependent, and says so."""

    capabilities = Capabilities(
        invariances=INVARIANCES - {"batch_invariance"},
        notes={"batch_invariance": "decode and mixed batches take different kernels"},
    )


class WrongShape(Correct):
    def paged_attention(self, case):
        return super().paged_attention(case)[:, :1]


class WrongDtype(Correct):
    def paged_attention(self, case):
        return super().paged_attention(case).double()


class WrongDevice(Correct):
    def paged_attention(self, case):
        return super().paged_attention(case).to("meta")


class ReturnsNaN(Correct):
    def paged_attention(self, case):
        return torch.full_like(case.query, float("nan"))


class ClaimsFp32Only(Correct):
    capabilities = Capabilities(dtypes=frozenset({torch.float32}), notes={"dtypes": "fp32 build only"})


class OffForWideGroups(Correct):
    """Wrong only when the GQA group is 4 or more and a history spans more than 30 tokens: the
    kind of bug only a search finds."""

    def paged_attention(self, case):
        scale = case.scale * (1.02 if case.gqa_ratio >= 4 and case.max_seq_len > 30 else 1.0)
        return paged_attention_reference(case.replace(scale=scale)).to(case.dtype)


class LseBase(Correct):
    """Claims the log-sum-exp operation; subclasses return it wrongly."""

    capabilities = Capabilities(operations=frozenset({"attention", "lse"}))

    def paged_attention_lse(self, case):
        from pagedattn.oracle import paged_attention_reference_lse

        out, lse = paged_attention_reference_lse(case)
        return out.to(case.dtype), lse.float()


class LseNotATuple(LseBase):
    def paged_attention_lse(self, case):
        return super().paged_attention_lse(case)[0]


class LseHeadsFirst(LseBase):
    """FlashAttention's [num_heads, num_tokens] layout, not converted."""

    def paged_attention_lse(self, case):
        out, lse = super().paged_attention_lse(case)
        return out, lse.transpose(0, 1).contiguous()


class LseIgnoresSinks(Correct):
    """Claims sinks and lse; leaves the sink out of the log-sum-exp only."""

    capabilities = Capabilities(operations=frozenset({"attention", "lse"}), variants=frozenset({"sinks"}))

    def paged_attention_lse(self, case):
        from pagedattn.oracle import paged_attention_reference_lse

        out = paged_attention_reference_lse(case)[0]
        lse = paged_attention_reference_lse(case.replace(sinks=None))[1]
        return out.to(case.dtype), lse.float()


class WindowOffByOne(Correct):
    """Claims the sliding window and sees one key too many."""

    capabilities = Capabilities(variants=frozenset({"sliding_window"}))

    def paged_attention(self, case):
        w = case.sliding_window
        return paged_attention_reference(case.replace(sliding_window=None if w is None else w + 1)).to(case.dtype)


class WarmsUp(Correct):
    """A JIT-style backend: ``warmup(case)`` compiles; it logs each warm-up (process and
    configuration) to the file named by ``PAGEDATTN_TEST_WARMLOG``."""

    def warmup(self, case):
        import os

        from pagedattn.runner.suite import case_configuration

        with open(os.environ["PAGEDATTN_TEST_WARMLOG"], "a") as f:
            f.write(f"{os.getpid()} {case_configuration(case, 'attention')}\n")


class WarmsUpAhead(Correct):
    """A JIT-style backend that compiles ahead: ``warmup_ahead(case, operation)`` logs the
    process, the calling thread, the configuration and the case's regimes to the file named
    by ``PAGEDATTN_TEST_WARMLOG``. Its cases take 20 ms longer, as a compiling backend's
    first ones do, so the thread gets ahead of them."""

    def paged_attention(self, case):
        import time

        time.sleep(0.02)
        return super().paged_attention(case)

    def warmup_ahead(self, case, operation):
        import os
        import threading

        from pagedattn.runner.suite import case_configuration

        regimes = "+".join(sorted({"decode" if q == 1 else "prefill" for q in case.query_lens}))
        with open(os.environ["PAGEDATTN_TEST_WARMLOG"], "a") as f:
            f.write(
                f"{os.getpid()} {threading.current_thread().name} {case_configuration(case, operation)} "
                f"{case.num_heads}/{case.num_kv_heads} {regimes}\n"
            )


class DiesWarmingUpAhead(Correct):
    """Its warm-up ahead kills the process (a compiler abort) once two cases have run there
    (their reports, which say the warm-up is on, have left the process by then)."""

    done = 0

    def paged_attention(self, case):
        import time

        time.sleep(0.05)
        out = super().paged_attention(case)
        DiesWarmingUpAhead.done += 1
        return out

    def warmup_ahead(self, case, operation):
        import os
        import time

        while DiesWarmingUpAhead.done < 2:
            time.sleep(0.01)
        time.sleep(0.3)
        os.abort()


class ReusesOutputBuffer(Correct):
    """Returns a view of one buffer it rewrites on every call (a CUDA graph's static output),
    and is nondeterministic: every other call moves the first element by one ulp."""

    calls = 0

    def __init__(self):
        self._buffer = torch.empty(0)

    def paged_attention(self, case):
        ReusesOutputBuffer.calls += 1
        out = _nudge(super().paged_attention(case), ReusesOutputBuffer.calls % 2)
        buffer = self._buffer
        if buffer.numel() < out.numel() or buffer.dtype != out.dtype or buffer.device != out.device:
            buffer = self._buffer = torch.empty(4 * out.numel(), dtype=out.dtype, device=out.device)
        buffer[: out.numel()].copy_(out.reshape(-1))
        return buffer[: out.numel()].view(out.shape)


class PlantedInterrupt(BaseException):
    """A ``BaseException`` subclass that is not ``KeyboardInterrupt`` (as some runtimes raise
    to unwind a worker)."""


class ExitsOnSingleSequence(Correct):
    """Calls ``sys.exit(3)`` inside the kernel on single-sequence cases."""

    def paged_attention(self, case):
        if case.num_seqs == 1:
            import sys

            sys.exit(3)
        return super().paged_attention(case)


class RaisesBaseExceptionOnSingleSequence(Correct):
    def paged_attention(self, case):
        if case.num_seqs == 1:
            raise PlantedInterrupt("the runtime unwinds the call")
        return super().paged_attention(case)


class ExitsWhenConstructed(Correct):
    """``sys.exit(7)`` in the constructor (a library that finds no device and exits)."""

    def __init__(self):
        import sys

        sys.exit(7)


def _sleep_forever() -> None:
    """Sleep for ten minutes ("forever" for a test run), in a thread nobody joins."""
    import time

    time.sleep(600)


class LeavesThread(Correct):
    """Starts a non-daemon thread that sleeps "forever" when constructed (a runtime's
    background thread that is never stopped)."""

    def __init__(self):
        import threading

        threading.Thread(target=_sleep_forever, name="planted-forever", daemon=False).start()


class HangsForever(Correct):
    """Hangs on single-sequence cases for two minutes, whether or not its parent lives (a
    kernel spinning on the device); writes its pid to ``hanging.pid`` in the working
    directory when it starts hanging."""

    def paged_attention(self, case):
        if case.num_seqs == 1:
            import os
            import time

            with open("hanging.pid", "w") as f:
                f.write(str(os.getpid()))
            time.sleep(120)
        return super().paged_attention(case)


class PrintsWrongOnSingleSequence(Correct):
    """Prints a line on every call (a chatty kernel library), and is wrong (``WrongScale``) on
    single-sequence cases."""

    def paged_attention(self, case):
        print(f"planted-print {case.num_seqs} sequence(s)")
        scale = case.scale * (1.01 if case.num_seqs == 1 else 1.0)
        return paged_attention_reference(case.replace(scale=scale)).to(case.dtype)


class InterruptedOnFourthCall(Correct):
    """Raises ``KeyboardInterrupt`` on its fourth call, as the user's Ctrl-C does there."""

    calls = 0

    def paged_attention(self, case):
        InterruptedOnFourthCall.calls += 1
        if InterruptedOnFourthCall.calls == 4:
            raise KeyboardInterrupt
        return super().paged_attention(case)


class LeavesThreadWrongScale(LeavesThread):
    """Leaves a thread running, and fails every case (``WrongScale``)."""

    def paged_attention(self, case):
        return paged_attention_reference(case.replace(scale=case.scale * 1.01)).to(case.dtype)


class LeavesThreadAndExits(LeavesThread):
    """Starts its thread, then ``sys.exit(9)`` in the constructor: a usage error, thread left."""

    def __init__(self):
        import sys

        super().__init__()
        sys.exit(9)
