"""The fused check's helper kernels (``pagedattn.verdict_kernel.host``) and its launcher (``.launcher``).

The verdicts themselves are compared with the torch path's in ``tests/test_policy.py``; here the
pieces each give their torch counterpart's numbers on their own, where a test can reach every
branch: a sequence's value moments bit for bit, the reduction of a check's statistics (its NaN
and tie rules across the loop's chunks; the check's own runs the same code in its last verdict
program), the rows flagged for the subnormal correction, and the launcher's reuse of a compiled
kernel only for launches that Triton would specialize alike. Under the Triton
interpreter on the CPU; compiled on a GPU.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import subprocess
import sys

import pytest
import torch

from pagedattn.cases import CaseSpec
from pagedattn.oracle import paged_attention_reference, policy, sequence_stats, subnormal
from pagedattn.verdict_kernel import host as gpu_check
from pagedattn.verdict_kernel import launcher
from tests.asserts import F64_REORDERED_SUM, FUSED_RMS_RTOL, assert_close, assert_equal
from tests.helpers import needs_verdict_kernel, require_verdict_kernel
from tests.planted.streamed import streamed_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("first", [0, 11], ids=["whole", "from-key-11"])
@pytest.mark.parametrize("shape", [(2, 37, 80), (1, 300, 64), (3, 40, 256)], ids=str)
def test_sequence_moments_are_the_torch_paths(shape, first):
    """``[|v|, (v - c)^2, v - c]`` in float32 from one kernel: the same bits as ``sequence_stats._value_moments``
    for head dims that are and are not powers of two and lengths that do not fill the kernel's
    row tiles, with values far from 0 (so ``v - c`` cancels) and of every sign; read in place
    from the first key a sequence's rows see (a view whose heads lie a whole history apart).
    The keys' norms from the same launch: torch's within ``FUSED_RTOL``, and NaN and infinite
    where a key holds one."""
    g = torch.Generator().manual_seed(sum(shape))
    v = (torch.randn(shape, generator=g, dtype=torch.float64) * 3.0 + 1e4).to(DEVICE)
    v[..., ::7] *= -1e-3
    k = torch.randn(shape, generator=g, dtype=torch.float64) * torch.logspace(-3, 3, shape[1])[:, None]
    k = k.to(DEVICE)
    k[0, -1, 3] = float("nan")
    k[-1, -2, 0] = float("inf")
    v, k = v[:, first:], k[:, first:]
    centre, vv = sequence_stats._value_moments(v)
    f_centre, f_vv, f_kn = gpu_check.sequence_moments(v, k)
    assert_equal(f_centre, centre, f"the values' centre {shape}")
    assert f_vv.dtype == torch.float32 and f_vv.shape == vv.shape
    assert torch.equal(vv, f_vv), f"{int((vv != f_vv).sum())} of {vv.numel()} elements differ"
    kn = k.norm(dim=-1)
    assert f_kn.dtype == torch.float64 and f_kn.shape == kn.shape
    assert torch.isnan(f_kn[0, -1]) and torch.isinf(f_kn[-1, -2]) and int(torch.isfinite(f_kn).sum()) == kn.numel() - 2
    finite = torch.isfinite(kn)
    assert_close(f_kn[finite], kn[finite], policy.FUSED_RTOL, f"the keys' norms {shape}")


def _torch_reduced(stats: torch.Tensor, per_row: int) -> list[float]:
    """The torch operations the reduction kernel replaced: the first NaN, or else the first
    largest (``torch.argmax``), the sums of the counts and of the moments (and of the flags)."""
    sel = int(torch.argmax(stats[:, 0]))
    row = stats[sel]
    sums = stats[:, 7:].sum(dim=0).tolist()
    return [float(row[0]), *stats[:, 1:3].sum(dim=0).tolist(), sel * per_row + float(row[3]), *row[4:7].tolist(), *sums]


def _stats(n: int, seed: int, ns: int = gpu_check.STATS) -> torch.Tensor:
    """``n`` rows of ``ns`` statistics: the counts, channels, moments and flags integers, whose
    sums are exact in any order (the moments' float64 sums in another order are the verdict
    tests' to judge)."""
    g = torch.Generator().manual_seed(seed)
    stats = torch.rand(n, ns, generator=g, dtype=torch.float64)
    stats[:, 1:3] = torch.randint(0, 5, (n, 2), generator=g).double()
    stats[:, 3] = torch.randint(0, 64, (n,), generator=g).double()
    stats[:, 7:] = torch.randint(0, 1 << 20, (n, ns - 7), generator=g).double()
    stats[::3, 0] = -1.0  # rows with no finite ratio
    return stats


@needs_verdict_kernel
@pytest.mark.parametrize(
    "where",
    [
        "finite",
        "tie-across-chunks",
        "tie-in-a-chunk",
        "nan-after-larger",
        "two-nans-in-a-chunk",
        "two-nans-across-chunks",
        "nan-first-row",
        "all-nan",
        "inf",
    ],
)
@pytest.mark.parametrize("rows", [1, 1023, 1024, 2048, 2500])
@pytest.mark.parametrize("ns", [gpu_check.STATS, gpu_check.ROW_STATS], ids=["stats", "row-stats"])
def test_the_reduction_keeps_the_first_nan_or_first_largest(where, rows, ns):
    """The kernel walks the rows in chunks of 1024: a tie within a chunk or between chunks keeps
    the first row, a NaN ratio is the worst even after a larger finite one, the first of two NaNs
    wins (in one chunk or two), and an infinite ratio is the largest finite one; the counts, the
    moments and (the verdict kernel's rows) the flags are summed; row counts below, at and past a
    chunk's."""
    stats = _stats(rows, seed=len(where) + rows, ns=ns)
    marks = {
        "tie-across-chunks": [(100, 7.0), (1900, 7.0)],
        "tie-in-a-chunk": [(100, 7.0), (200, 7.0)],
        "nan-after-larger": [(10, 9.0), (2200, float("nan"))],
        "two-nans-in-a-chunk": [(1500, float("nan")), (1100, float("nan"))],
        "two-nans-across-chunks": [(1500, float("nan")), (500, float("nan"))],
        "nan-first-row": [(0, float("nan"))],
        "inf": [(1024, float("inf"))],
    }
    for row, value in marks.get(where, []):
        if row < rows:
            stats[row, 0] = value
    if where == "all-nan":
        stats[:, 0] = float("nan")
    stats = stats.to(DEVICE)
    got = gpu_check.reduced(stats, 128).tolist()
    want = _torch_reduced(stats.cpu(), 128)
    assert len(got) == ns
    for i, (a, b) in enumerate(zip(got, want)):
        assert a == b or (a != a and b != b), f"statistic {i}: {a} against {b} ({where})"


class _FakeCompiled:
    """A ``CompiledKernel`` stand-in: records the runner's launches."""

    function = object()

    def __init__(self, log: list) -> None:
        self.log = log

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("runner", grid, args))


class _FakeJit:
    """A ``JITFunction`` stand-in: records the JIT's launches, returns its compiled kernel."""

    def __init__(self) -> None:
        self.log: list = []
        self.compiled = _FakeCompiled(self.log)

    def __getitem__(self, grid):
        def launch(*args, **consts):
            self.log.append(("jit", grid, args + tuple(consts.values())))
            return self.compiled

        return launch


def test_the_launcher_reuses_a_kernel_only_where_triton_would_specialize_alike(monkeypatch):
    """A launch goes through the compiled kernel's runner only with the same constexprs, tensor
    dtypes and 16-byte alignment, and integer widths (1, divisible by 16) as a launch the JIT made;
    the runner takes every argument, constexprs last, and a 1-D grid as three axes."""
    monkeypatch.setattr(launcher, "_RUNNERS", {})
    jit = _FakeJit()
    buf = torch.zeros(64)
    consts = {"BLOCK": 16}
    launcher._launch(jit, (4,), (buf, 3, 2.5), consts)
    launcher._launch(jit, (5,), (buf, 7, 1.5), consts)  # same widths: the runner
    launcher._launch(jit, (5,), (buf[2:], 7, 1.5), consts)  # 8 bytes off: not aligned
    launcher._launch(jit, (5,), (buf[1:], 7, 1.5), consts)  # 4 bytes off: not aligned either
    launcher._launch(jit, (5,), (buf[4:], 7, 1.5), consts)  # 16 bytes off: aligned, the runner
    launcher._launch(jit, (5,), (buf.double(), 7, 1.5), consts)  # another dtype
    launcher._launch(jit, (5,), (buf, 1, 1.5), consts)  # an integer of 1
    launcher._launch(jit, (5,), (buf, 32, 1.5), consts)  # divisible by 16
    launcher._launch(jit, (5,), (buf, 2**40, 1.5), consts)  # int64
    launcher._launch(jit, (5,), (buf, 7, 1.5), {"BLOCK": 32})  # another constexpr
    launcher._launch(jit, (6,), (buf, 9, 0.5), consts)  # the first specialization again
    kinds = [entry[0] for entry in jit.log]
    assert kinds == ["jit", "runner", "jit", "runner", "runner", "jit", "jit", "jit", "jit", "jit", "runner"], kinds
    assert jit.log[1][1] == (5, 1, 1) and jit.log[1][2] == (buf, 7, 1.5, 16)


class _Param:
    def __init__(self, dns: bool, dnsa: bool) -> None:
        self.do_not_specialize, self.do_not_specialize_on_alignment = dns, dnsa


def test_the_launcher_follows_a_kernels_do_not_specialize_flags(monkeypatch):
    """Where the kernel says Triton does not specialize a parameter (``do_not_specialize``: an
    integer's value; ``..._on_alignment``: a pointer's alignment), launches that differ only there
    share the runner; an integer's width and a tensor's dtype still part them."""
    monkeypatch.setattr(launcher, "_RUNNERS", {})
    jit = _FakeJit()
    jit.params = [_Param(False, True), _Param(True, False), _Param(False, False), _Param(False, False)]
    buf = torch.zeros(64)
    consts = {"BLOCK": 16}
    launcher._launch(jit, (4,), (buf, 3, 2.5), consts)
    launcher._launch(jit, (4,), (buf[1:], 1, 2.5), consts)  # unaligned, 1: neither specialized
    launcher._launch(jit, (4,), (buf[1:], 32, 2.5), consts)  # divisible by 16: not specialized
    launcher._launch(jit, (4,), (buf, 2**40, 2.5), consts)  # int64: another kernel
    launcher._launch(jit, (4,), (buf.double(), 3, 2.5), consts)  # another dtype
    kinds = [entry[0] for entry in jit.log]
    assert kinds == ["jit", "runner", "runner", "jit", "jit"], kinds


class _FakeCompiledWithRun(_FakeCompiled):
    """A ``CompiledKernel`` stand-in with the runner's pieces (triton 3.6, 3.9): records ``run``."""

    packed_metadata = object()

    def launch_metadata(self, grid, stream, *args):
        return ("metadata", grid, stream, args)

    def run(self, *args):
        self.log.append(("run", args))


def test_a_kept_kernel_is_launched_as_its_runner_would(monkeypatch):
    """A kept kernel with the runner's pieces is launched through its ``run`` with what the runner
    passes: the three grid axes, the current stream, its function and packed metadata, the launch
    metadata for the same grid, stream and arguments, the launch hooks, then every argument with
    the constexprs last."""
    monkeypatch.setattr(launcher, "_RUNNERS", {})
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    hooks = type("Runtime", (), {"launch_enter_hook": "enter", "launch_exit_hook": "exit"})
    monkeypatch.setattr(launcher, "_knobs", lambda: type("Knobs", (), {"runtime": hooks}))
    jit = _FakeJit()
    jit.compiled = _FakeCompiledWithRun(jit.log)
    buf = torch.zeros(64)
    launcher._launch(jit, (4,), (buf, 3, 2.5), {"BLOCK": 16})
    launcher._launch(jit, (5, 2), (buf, 7, 1.5), {"BLOCK": 16})
    assert [entry[0] for entry in jit.log] == ["jit", "run"], jit.log
    c = jit.compiled
    args = (buf, 7, 1.5, 16)
    metadata = ("metadata", (5, 2, 1), 1234, args)
    assert jit.log[1][1] == (5, 2, 1, 1234, c.function, c.packed_metadata, metadata, "enter", "exit", *args)


#: cases whose verdict launches differ in every way ``_verdict_key`` leaves out: output and lse
#: dtypes, strided outputs, sinks, ALiBi, windows, decodes and prefills, several blocks
VERDICT_KEY_CASES = [
    (CaseSpec("t", ((60, 20), (90, 1)), num_heads=4, num_kv_heads=2), False, False),
    (CaseSpec("t", ((60, 20), (90, 1)), num_heads=4, num_kv_heads=2, dtype=torch.bfloat16), True, True),
    (CaseSpec("t", ((40, 40), (33, 1)), num_heads=4, num_kv_heads=2, sinks=True, dtype=torch.float16), True, False),
    (CaseSpec("t", ((70, 9),), num_heads=4, num_kv_heads=1, alibi_slopes=True, sliding_window=8), True, True),
]


@needs_verdict_kernel
def test_the_verdict_key_decides_as_tritons_specialization_would(monkeypatch):
    """Over every verdict launch of checks whose launches differ in dtypes, strides, variants and
    blocks, the key ``_stats`` passes (``_verdict_key``) determines ``_key``'s (the one tested
    against Triton's binder): two launches with the same verdict key have the same full key, so a
    kept kernel never serves a launch the JIT would have specialized otherwise."""
    from pagedattn.oracle import paged_attention_reference_lse

    monkeypatch.setenv("PAGEDATTN_ORACLE_MAX_BYTES", str(1 << 20))  # several blocks of rows
    seen: dict = {}
    verdict = launcher._compiled().verdict
    if hasattr(verdict, "params"):  # compiled: the kernel's own flags
        plan = launcher._plan(verdict)
    else:  # the interpreter's kernel keeps its decorator's flags: the JIT's parameters from them
        from triton.runtime.jit import JITFunction

        params = JITFunction(verdict.fn, **verdict.kwargs).params
        plan = [(bool(p.do_not_specialize), bool(p.do_not_specialize_on_alignment)) for p in params]
    assert sum(dns for dns, _ in plan) >= 20 and sum(dnsa for _, dnsa in plan) >= 18, plan

    sliced = []

    def capture(kernel, grid_, args, consts, key=None):
        if kernel is verdict:
            full = launcher._key(args, plan)
            assert key is not None and seen.setdefault(key, full) == full, (key, full, seen.get(key))
        else:
            sliced.append(kernel is launcher._compiled().decode_sums)

    monkeypatch.setattr(gpu_check, "_launch", capture)
    # and on the device path, where the decodes' sums are direct: the 33-key decodes' in the
    # verdict kernel, the 90-key ones' over slices (their parts in place of o, S an integer more)
    monkeypatch.setattr(gpu_check, "INLINE_DECODE_ELEMS", 40 * 64)
    for (spec, with_lse, strided), device_path in itertools.product(VERDICT_KEY_CASES, (False, True)):
        monkeypatch.setattr(policy, "DEVICE_PATH_ON_CPU", device_path)
        case = spec.build()
        ref, lse = paged_attention_reference_lse(case)
        out = ref.to(case.dtype)
        if strided:  # a view of a wider buffer: other strides
            wide = torch.zeros(case.num_tokens, case.num_heads, case.head_dim + 8, dtype=case.dtype)
            out = wide[..., : case.head_dim].copy_(out)
        terms = policy._terms(case, "ieee", "fp32", "ieee")
        gpu_check._stats(out, lse.float() if with_lse else None, case, terms, 1.0)
    # the fp32 cases (plain, without the log-sum-exp; strided, ALiBi and a window, with it) share a
    # key and a kernel (the log-sum-exp's place float32 either way); each key its own kernel
    assert len(seen) == 3 and len(set(map(str, seen.values()))) == 3, seen
    assert sliced.count(True) == 2, sliced  # the two 90-key decodes on the device path


@needs_verdict_kernel
def test_the_interpreter_launches_through_the_jit(monkeypatch):
    """Under the interpreter a launch returns no compiled kernel: nothing is kept, every launch
    goes through the JIT (here, the real kernel on the CPU or GPU)."""
    monkeypatch.setattr(launcher, "_RUNNERS", {})
    stats = _stats(10, seed=3).to(DEVICE)
    gpu_check.reduced(stats, 4)
    gpu_check.reduced(stats, 4)
    interpreted = DEVICE == "cpu"
    assert (len(launcher._RUNNERS) == 0) == interpreted


_SPEC_AGAINST_TRITON = r"""
import numpy as np
import torch
from triton.backends.nvidia.compiler import CUDABackend
from triton.runtime.jit import create_function_from_signature

from pagedattn.verdict_kernel import launcher

dtypes = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.int32, torch.uint8]
values = [torch.zeros(64, dtype=dt)[off:] for dt in dtypes for off in (0, 1, 2, 4, 8, 16)]
values += [0, 1, 2, 15, 16, 17, -1, -16, 2**31 - 1, 2**31, -(2**31) - 1, 2**40, 2**63 - 1, 2**63, 2**64 - 1]
values += [True, False, 0.5, float("nan"), None, np.float64(2.0)]
checked = 0
for name, kernel in launcher._compiled()._asdict().items():
    binder = create_function_from_signature(kernel.signature, kernel.params, CUDABackend)
    params = [p for p in kernel.params if not p.is_constexpr]
    consts = {p.name: 16 for p in kernel.params if p.is_constexpr}
    filler = [1.0 if p.annotation else torch.zeros(4) if p.name.endswith("_ptr") else 3 for p in params]
    flags = launcher._plan(kernel)
    for i, p in enumerate(params):
        seen = {}
        for value in values:
            args = list(filler)
            args[i] = value
            try:
                _, spec, _ = binder(*args, **consts)
            except Exception:  # a value Triton refuses for this parameter
                continue
            key = launcher._spec(value, *flags[i])
            checked += 1
            first = seen.setdefault(key, (repr(spec[i]), value))
            assert first[0] == repr(spec[i]), (name, p.name, key, first, repr(spec[i]), value)
print("checked", checked)
"""


@needs_verdict_kernel
def test_the_launch_key_is_tritons_or_finer():
    """Against the installed Triton's own binder (compiled mode, not the interpreter): for every
    parameter of the three kernels and a spread of tensors (dtypes, offsets), integers (1,
    multiples of 16, the int32/int64/uint64 edges), bools, floats and None, two values with the
    same ``_spec`` key get the same specialization from Triton. A Triton that specializes on
    something new fails here, not as a wrong kernel on a GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _SPEC_AGAINST_TRITON], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert int(proc.stdout.split()[-1]) > 1000, proc.stdout


def _watched(real, tensors, refs: list, alive: list):
    """A stand-in for the generator function ``real``: each time ``real`` yields, whether each
    tensor of ``refs`` (weak references) is still alive goes to ``alive``, and the yielded item's
    ``tensors(item)`` join ``refs``. Its own name for the item goes before the next is asked for."""
    import weakref

    def watched(*args, **kwargs):
        it = real(*args, **kwargs)
        while True:
            try:
                item = next(it)  # the next block's tensors exist: the previous block's must not
            except StopIteration:
                return
            alive.append([r() is not None for r in refs])
            refs.extend(weakref.ref(t) for t in tensors(item))
            yield item
            del item

    return watched


@pytest.mark.parametrize("path", ["fused", "torch"])
def test_a_blocks_tensors_are_gone_before_the_next_blocks_come(path, monkeypatch):
    """The check holds one block of rows at a time, as the oracle does: when the oracle's pass
    yields a block, the previous block's tensors are freed: its score-sized weights (the chunk)
    and, on the fused path, what the verdict kernel read (the reference rows, the weighted
    moments and the squared weights' products, the subnormal correction). A name left holding
    them (the launch's argument tuple did) kept two blocks' worth alive, over the oracle's peak."""
    if path == "fused":
        require_verdict_kernel()
    import weakref

    from pagedattn.cases import CaseSpec
    from pagedattn.oracle import check_attention

    refs: list = []
    alive: list = []
    real_launch, real_chunks = gpu_check._launch, gpu_check.iter_chunks

    def launch(kernel, grid, args, consts, key=None):
        if kernel is launcher._compiled().verdict:
            # ``o``, ``s12``, ``ex`` (``o`` without one), ``s34``, ``p2``, ``s56``, ``w_sum``: the check's
            # one-element float32 placeholder stands in where there are none, and lives through it
            refs.extend(weakref.ref(t) for t in args[4:11] if t.numel() > 1)
        return real_launch(kernel, grid, args, consts, key)

    chunks = _watched(real_chunks, lambda c: (c.scores, c.probs), refs, alive)
    monkeypatch.setattr(gpu_check, "_launch", launch)
    monkeypatch.setattr(gpu_check if path == "fused" else policy, "iter_chunks", chunks)
    monkeypatch.setattr(gpu_check, "ON_CPU", path == "fused")
    monkeypatch.setattr(policy, "DEVICE_PATH_ON_CPU", True)
    monkeypatch.setenv("PAGEDATTN_ORACLE_MAX_BYTES", str(1 << 20))
    case = CaseSpec("t", ((300, 120), (50, 1)), num_heads=4, num_kv_heads=2).build().to(DEVICE)
    out = torch.zeros(case.num_tokens, case.num_heads, case.head_dim, device=DEVICE)
    monkeypatch.setattr(gpu_check, "usable", lambda case, tolerance_factor=1.0: path == "fused")
    check_attention(out, case)
    assert len(alive) >= 3, f"several blocks expected, got {len(alive)}"
    assert not any(any(flags) for flags in alive), alive


@pytest.mark.parametrize("lse", [False, True], ids=["attention", "lse"])
def test_the_torch_paths_merged_blocks_go_before_the_next_ones_come(lse, monkeypatch):
    """The torch path's verdict holds one merged block of the bound's rows at a time: when
    ``chunk_bounds`` yields a block, the one before it (its reference rows and bounds) is gone."""
    from pagedattn.cases import CaseSpec
    from pagedattn.oracle import check_attention, check_attention_lse, verdict

    refs: list = []
    alive: list = []
    monkeypatch.setattr(verdict, "chunk_bounds", _watched(verdict.chunk_bounds, lambda b: (b.o, b.e), refs, alive))
    monkeypatch.setattr(gpu_check, "usable", lambda case, tolerance_factor=1.0: False)
    monkeypatch.setenv("PAGEDATTN_ORACLE_MAX_BYTES", str(1 << 20))
    case = CaseSpec("t", ((700, 350), (400, 300)), num_heads=4, num_kv_heads=2).build().to(DEVICE)
    out = torch.zeros(case.num_tokens, case.num_heads, case.head_dim, device=DEVICE)
    if lse:
        check_attention_lse(out, torch.zeros(case.num_tokens, case.num_heads, device=DEVICE), case)
    else:
        check_attention(out, case)
    assert len(alive) >= 3, f"several merged blocks expected, got {len(alive)}"
    assert not any(any(flags) for flags in alive), alive


def test_the_launch_key_is_spec_argument_by_argument():
    """``_key`` (the launch's key, common types inline) is ``_spec`` of each argument under its
    flags, for every kind of argument and both flags."""
    import itertools

    values = [torch.zeros(8)[1:], torch.zeros(8), torch.zeros(4, dtype=torch.float64), 0, 1, 16, 17, -(2**31) - 1]
    values += [2**31, 2**63, True, 2.5, None]
    flags = list(itertools.product([False, True], repeat=2))
    for combo in itertools.product(values, flags):
        value, flag = combo
        assert launcher._key((value,), [flag]) == (launcher._spec(value, *flag),), combo


#: blocks of one row (a decode: the kernel reads its keys, or a launch before it reads slices of
#: them, or taking the moments it walks the key norms, past its KEY_BLOCK of them too) and of many
#: (a walk, or a sliding maximum), with and without a window, keys before and after each row's; a
#: decode with sinks, ALiBi, a soft-cap and a head dim under its power-of-two tile
KEY_NORM_CASES = {
    "decodes-window": CaseSpec("t", ((300, 1), (200, 1)), num_heads=4, num_kv_heads=2, sliding_window=64),
    "decodes-long": CaseSpec("t", ((1300, 1), (1100, 1)), num_heads=4, num_kv_heads=2),
    "decodes-long-window": CaseSpec("t", ((1300, 1), (900, 1)), num_heads=4, num_kv_heads=2, sliding_window=700),
    "prefill": CaseSpec("t", ((200, 40),), num_heads=4, num_kv_heads=2),
    "prefills-window": CaseSpec("t", ((300, 30), (90, 20)), num_heads=4, num_kv_heads=2, sliding_window=40),
    "prefill-long-window": CaseSpec("t", ((1400, 40),), num_heads=4, num_kv_heads=2, sliding_window=600),
    "decodes-d40-variants": CaseSpec(
        "t",
        ((300, 1), (90, 3), (200, 1)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=40,
        sinks=True,
        alibi_slopes=True,
        logits_soft_cap=30.0,
        sliding_window=150,
    ),
}


@needs_verdict_kernel
@pytest.mark.parametrize(
    "name, walk, order",
    [(name, "walk", order) for name in KEY_NORM_CASES for order in ("rising", "falling")]
    # blocks of several rows under a window read the sliding maximum instead
    + [("prefills-window", "reach", "rising"), ("prefills-window", "reach", "falling")]
    + [("prefill-long-window", "reach", "falling")]
    # decodes taking the moments (policy.DIRECT_DECODES off) walk the sequence's norms, as blocks
    # of several rows do
    + [("decodes-long-window", "moments", "rising"), ("decodes-long-window", "moments", "falling")]
    + [("decodes-long", "moments", "falling"), ("decodes-d40-variants", "moments", "rising")]
    # decodes past gpu_check.INLINE_DECODE_ELEMS: their sums over slices of their keys, a tail shorter
    + [("decodes-long", "slices", "rising"), ("decodes-long-window", "slices", "falling")]
    + [("decodes-d40-variants", "slices", "rising"), ("decodes-window", "slices", "falling")],
)
def test_the_fused_bound_is_the_torch_paths_row_by_row(name, walk, order, monkeypatch):
    """Each row and head's bound at its worst element (the statistics' channel and bound) is the
    torch path's there within ``FUSED_RTOL``. The keys' norms rise (or fall) with their position,
    so a row's largest visible norm lies at an end of the keys it sees, where the kernel's walk
    over the sequence's norms starts and stops: a key too many or too few moves its bound. A decode
    reads its own keys (``policy.direct_decode``), or past ``gpu_check.INLINE_DECODE_ELEMS`` a launch
    before it reads them in slices (here slices of 64 or 96 keys), or taking the moments it walks
    the norms; blocks of several rows under a window walk, or (``KEY_WALK`` 0, as under a window
    past it) read the sequence's sliding maximum, as those without a window do."""
    monkeypatch.setenv("PAGEDATTN_ORACLE_MAX_BYTES", str(1 << 20))  # several blocks of rows
    monkeypatch.setattr(gpu_check, "KEY_WALK", 0 if walk == "reach" else gpu_check.KEY_WALK)
    if walk == "moments":
        monkeypatch.setattr(policy, "DIRECT_DECODES", False)
    launched = []
    if walk == "slices":
        monkeypatch.setattr(gpu_check, "INLINE_DECODE_ELEMS", 0)
        monkeypatch.setattr(gpu_check, "SLICE_DECODE_ELEMS", 1 << 12)  # 2 or 3 of BLOCK_J's 32 keys a slice
        real_launch = gpu_check._launch

        def launch(kernel, grid, *args, **kwargs):
            launched.append((kernel, grid))
            return real_launch(kernel, grid, *args, **kwargs)

        monkeypatch.setattr(gpu_check, "_launch", launch)
    monkeypatch.setattr(gpu_check, "ON_CPU", True)
    monkeypatch.setattr(policy, "DEVICE_PATH_ON_CPU", True)
    case = KEY_NORM_CASES[name].build()
    keys = case.key_cache.clone()
    flat = keys.view(-1, case.num_kv_heads, case.head_dim)
    for b, L in enumerate(case.seq_lens_list):
        pos = torch.arange(L, dtype=torch.float64)
        grow = 1.0 + 3.0 * pos / L if order == "rising" else 4.0 - 3.0 * pos / L
        flat[case.slot_mapping(b)] *= grow.to(keys.dtype)[:, None, None]
    case = case.replace(key_cache=keys).to(DEVICE)
    out = paged_attention_reference(case).to(case.dtype)
    terms = policy._terms(case, "ieee", "fp32", "ieee")
    stats = gpu_check._stats(out, None, case, terms, 1.0).stats
    if walk == "slices":  # each decode's sums over slices of its keys (one slice under a 64-key window)
        sums = [grid for kernel, grid in launched if kernel is launcher._compiled().decode_sums]
        assert len(sums) == case.query_lens.count(1), sums
        slices = [g[1] for g in sums]
        assert slices == [1, 1] if name == "decodes-window" else min(slices) > 1, slices
    _, bound = policy.attention_error_bound(case)
    rows = case.num_tokens * case.num_heads
    at = bound.reshape(rows, case.head_dim)[torch.arange(rows), stats[:, 3].long()]
    moved = (stats[:, 6] / at - 1.0).abs().max()
    assert float(moved) <= policy.FUSED_RTOL, f"a row's bound moved by {float(moved):.3g} from the torch path's"


#: half-precision cases whose decodes' and blocks' expected errors take every term: sinks, ALiBi,
#: a soft-cap and a window at a head dim under its tile; an fp8 cache (its keys' and values'
#: rounding); and a float32 case
EXPECTED_ERROR_CASES = {
    "bf16-variants": dataclasses.replace(KEY_NORM_CASES["decodes-d40-variants"], dtype=torch.bfloat16),
    "fp8-fp16": CaseSpec(
        "t", ((70, 7), (33, 1)), num_heads=4, num_kv_heads=2, kv_dtype=torch.float8_e4m3fn, dtype=torch.float16
    ),
    "fp32": CaseSpec("t", ((120, 24), (50, 1)), num_heads=4, num_kv_heads=2),
}
#: the declared precisions that add terms of their own (policy._terms), and a tolerance factor
EXPECTED_ERROR_POLICIES = {
    "fp32": {},
    "input-qk": {"qk_precision": "input"},
    "scaled-query-input-partials": {"qk_precision": "scaled_query", "partials_precision": "input"},
    "tf32": {"precision": "tf32"},
}


@needs_verdict_kernel
@pytest.mark.parametrize(
    "name, sums, declared",
    [
        (name, sums, declared)
        for name in EXPECTED_ERROR_CASES
        for sums in ("inline", "slices", "moments")
        for declared in EXPECTED_ERROR_POLICIES
        # float32 inputs: the declared input-dtype roundings are float32's own, no term of their own
        if name != "fp32" or declared in ("fp32", "tf32")
    ],
)
def test_the_fused_expected_error_is_the_torch_paths_row_by_row(name, sums, declared, monkeypatch):
    """Each row and head's sum of expected squared errors (statistic 8, ``verdict._moments``' over
    its elements) is the torch path's (``policy.chunk_bounds``' ``var``, scaled by the tolerance
    factor squared) within ``FUSED_RTOL``, under each declared precision, for decodes whose sums
    the verdict kernel forms (``inline``), a launch before it over slices of their keys
    (``slices``), or that take the sequence's moments as blocks of several rows do (``moments``);
    and so are its squared errors (statistic 7) and its sum's square (statistic 9)."""
    monkeypatch.setenv("PAGEDATTN_ORACLE_MAX_BYTES", str(1 << 20))  # several blocks of rows
    if sums == "moments":
        monkeypatch.setattr(policy, "DIRECT_DECODES", False)
    if sums == "slices":
        monkeypatch.setattr(gpu_check, "INLINE_DECODE_ELEMS", 0)
        monkeypatch.setattr(gpu_check, "SLICE_DECODE_ELEMS", 1 << 12)  # a few of BLOCK_J's keys a slice
    monkeypatch.setattr(gpu_check, "ON_CPU", True)
    monkeypatch.setattr(policy, "DEVICE_PATH_ON_CPU", True)
    case = EXPECTED_ERROR_CASES[name].build().to(DEVICE)
    spec = dict(EXPECTED_ERROR_POLICIES[declared])
    tol = spec.pop("tolerance_factor", 1.0)
    precisions = (spec.get("precision", "ieee"), spec.get("qk_precision", "fp32"), "ieee")
    partials = spec.get("partials_precision", "fp32")
    out = streamed_attention(case.to("cpu"), 16).to(DEVICE)
    terms = policy._terms(case, *precisions, partials_precision=partials)
    stats = gpu_check._stats(out, None, case, terms, tol).stats.cpu()
    var = torch.empty(case.num_tokens, case.num_heads, case.head_dim, dtype=torch.float64)
    ref = torch.empty_like(var)
    for blk in policy.chunk_bounds(case, *precisions, with_lse=False, partials_precision=partials):
        var[blk.tokens], ref[blk.tokens] = blk.var.cpu() * tol**2, blk.o.cpu()
    rows = var.sum(dim=-1).reshape(-1)  # [T * Hq]: every element finite here
    err2 = (out.cpu().double() - ref).square().sum(dim=-1).reshape(-1)
    what = f"{name}, {sums}, {declared}"
    assert bool((rows > 0).all()), f"{what}: a row with no expected error"
    assert_close(stats[:, 8], rows, policy.FUSED_RTOL, f"{what}: a row's sum of expected squared errors")
    assert_close(stats[:, 7], err2, policy.FUSED_RTOL, f"{what}: a row's sum of squared errors")
    assert_equal(stats[:, 9], stats[:, 8].square(), f"{what}: a row's expected squared errors' sum squared")


@pytest.mark.parametrize("path", ["fused", "torch"])
def test_a_sequences_moments_are_gone_before_the_next_history_comes(path, monkeypatch):
    """The check holds a sequence's own terms (the values' moments, ``[Hkv, L, 3D]`` float32, one and a half
    times its float64 values; its key norms or reach) only while its rows are judged: when the
    oracle's pass has gathered the next sequence's history and yields its first block, they are
    gone (the oracle holds nothing of a finished sequence; held, they put the check's peak over
    the oracle's)."""
    if path == "fused":
        require_verdict_kernel()
    import weakref

    from pagedattn.oracle import check_attention

    refs: dict = {}  # sequence -> weak references to its own terms
    seen_dead: list = []
    real_chunks = gpu_check.iter_chunks if path == "fused" else policy.iter_chunks
    real_moments = gpu_check.sequence_moments if path == "fused" else policy._value_moments
    real_reach = sequence_stats._key_reach
    current = [-1]

    def moments(*args):
        out = real_moments(*args)
        refs.setdefault(current[0], []).extend(weakref.ref(t) for t in out)
        return out

    def reach(*args):  # a sequence's sliding maximum of its key norms (its blocks of several rows)
        out = real_reach(*args)
        refs.setdefault(current[0], []).append(weakref.ref(out))
        return out

    def chunks(*args, **kwargs):
        for c in real_chunks(*args, **kwargs):
            if c.seq != current[0] and current[0] in refs:  # a new sequence: the last one's terms are gone
                seen_dead.append(all(r() is None for r in refs[current[0]]))
            current[0] = c.seq
            yield c
            del c

    monkeypatch.setattr(gpu_check if path == "fused" else policy, "iter_chunks", chunks)
    monkeypatch.setattr(
        gpu_check if path == "fused" else policy, "sequence_moments" if path == "fused" else "_value_moments", moments
    )
    monkeypatch.setattr(sequence_stats, "_key_reach", reach)
    monkeypatch.setattr(gpu_check, "ON_CPU", path == "fused")
    monkeypatch.setattr(policy, "DEVICE_PATH_ON_CPU", True)
    monkeypatch.setattr(gpu_check, "usable", lambda case, tolerance_factor=1.0: path == "fused")
    # the decodes take the moments too (their direct sums, policy.direct_decode, hold no sequence's terms)
    monkeypatch.setattr(policy, "DIRECT_DECODES", False)
    spec = CaseSpec("t", ((300, 20), (50, 1), (280, 16), (80, 1)), num_heads=4, num_kv_heads=2)
    case = spec.build().to(DEVICE)
    out = torch.zeros(case.num_tokens, case.num_heads, case.head_dim, device=DEVICE)
    check_attention(out, case)
    assert len(refs[0]) == len(refs[2]) == len(refs[1]) + 1, refs  # the prefills' reach beside the moments
    assert seen_dead == [True, True, True], seen_dead


def test_the_values_centre_as_a_product_is_their_mean():
    """On a GPU the values' mean over the keys is a product with ones (CUDA's ``mean`` over a middle
    dimension holds a temporary twice their size): the mean to within float64's rounding, with the
    values far from 0 and of both signs."""
    g = torch.Generator().manual_seed(5)
    v = (torch.randn(3, 999, 80, generator=g, dtype=torch.float64) * 3.0 + 1e4).to(DEVICE)
    v[..., ::5] *= -1.0
    mean = v.mean(dim=1, keepdim=True)
    product = sequence_stats._centre(v, by_product=True)
    assert product.shape == mean.shape and product.dtype == torch.float64
    assert_close(product, mean, F64_REORDERED_SUM, "the centre as a product with ones")
    assert_equal(sequence_stats._centre(v, by_product=False), mean, "the centre as a mean")
    # the ones are kept across calls: a longer history grows them, a shorter one takes a prefix
    for length in (2500, 300):
        w = torch.randn(2, length, 64, generator=g, dtype=torch.float64).to(DEVICE)
        fresh = torch.bmm(torch.ones(2, 1, length, dtype=torch.float64, device=DEVICE), w).div_(length)
        got = sequence_stats._centre(w, by_product=True)
        assert got.shape == (2, 1, 64), got.shape
        assert_close(got, fresh, F64_REORDERED_SUM, f"the centre of {length} keys with the kept ones")
    assert max(t.numel() for key, t in sequence_stats._ONES.items() if key[0] == v.device) >= 2500


#: cases whose rows flag, or do not flag, weights below float32's normal range (sinks of ~90
#: and more: the keys' weights ~e**-90 of the sink's, below 2**-126)
FLAG_CASES = {
    "fp32-sinks-dominate": (CaseSpec("t", ((60, 20), (90, 1)), num_heads=4, num_kv_heads=2, sinks=True), 2),
    "bf16-sinks-dominate": (
        CaseSpec("t", ((60, 20), (90, 1)), num_heads=4, num_kv_heads=2, sinks=True, dtype=torch.bfloat16),
        2,
    ),
    "fp32-plain": (CaseSpec("t", ((60, 20), (90, 1)), num_heads=4, num_kv_heads=2), 1),
}


@needs_verdict_kernel
@pytest.mark.parametrize("name", list(FLAG_CASES))
def test_rows_whose_weights_leave_the_normal_range_are_judged_again_with_the_correction(name, monkeypatch):
    """Where the output dtype's weights keep float32's range the fused check's first pass forms
    no correction of subnormal weights and reads no guard: it flags the rows whose logits span
    past ``log(2**-126)``, and a case with one is judged again with the correction. Its verdict is
    the torch path's (which forms the correction from its guard), its error's RMS too: a sink that
    dominates leaves the keys' weights ~1e-40, where the correction's half subnormal spacing is
    much of the bound (a verdict from the first pass alone is not the torch path's). A plain case
    is judged once."""
    from pagedattn.oracle import check_attention_lse, paged_attention_reference_lse

    spec, passes = FLAG_CASES[name]
    case = spec.build()
    if case.sinks is not None:
        case = case.replace(sinks=torch.linspace(90.0, 110.0, case.num_heads))
    # values of 1e15: outputs of ~1e-25, normal (the interpreter reads bfloat16's subnormals wrong)
    case = case.replace(value_cache=(case.value_cache.double() * 1e15).to(case.dtype)).to(DEVICE)
    ref, lse = paged_attention_reference_lse(case)
    out = ref.to(case.dtype)
    out[3, 1, 5] *= 1.5  # an error to place the worst element
    runs: list = []
    real = gpu_check._stats

    def counted(*args, **kwargs):
        runs.append(kwargs.get("correct", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(gpu_check, "_stats", counted)
    monkeypatch.setattr(policy, "DEVICE_PATH_ON_CPU", True)
    verdicts = []
    for on in (False, True):
        monkeypatch.setattr(gpu_check, "ON_CPU", on)
        monkeypatch.setenv(gpu_check.ENV, "1" if on else "0")
        assert gpu_check.usable(case) == on
        verdicts.append(check_attention_lse(out, lse.float(), case))
    assert runs == [False, True][:passes], runs
    for a, b in zip(*verdicts):
        close = abs(a.bound - b.bound) <= policy.FUSED_RTOL * max(abs(a.bound), abs(b.bound))
        where = (a.worst_token, a.worst_head, a.worst_channel) == (b.worst_token, b.worst_head, b.worst_channel)
        assert (a.status, a.num_over) == (b.status, b.num_over) and where and close, f"{a}\n{b}"
        # the error's distribution, the correction's expected error in it (the log-sum-exp's: NaN, not formed)
        for x, y in ((a.rms_ratio, b.rms_ratio), (a.rms_elements, b.rms_elements)):
            assert x == y or (x != x and y != y) or abs(x - y) <= FUSED_RMS_RTOL * max(abs(x), abs(y)), f"{a}\n{b}"


def test_a_reduction_that_did_not_run_is_an_error():
    """The final launch's programs count themselves into the reduced rows and its last, having
    reduced, adds one; a pass whose count is not that (programs that did not run, or a last one
    that did not reduce: zeros, which read as a pass) raises."""
    reduced = torch.zeros(2, gpu_check.ROW_STATS, dtype=torch.float64)
    reduced[1, gpu_check.STATS] = 12.0  # every program counted, none reduced
    p = gpu_check._Pass(torch.zeros(3, gpu_check.ROW_STATS, dtype=torch.float64), None, reduced, 12)
    with pytest.raises(RuntimeError, match="a count of 12, not the final launch's 12 programs"):
        gpu_check._read(p)
    assert gpu_check._read(p._replace(programs=11))[1][gpu_check.STATS] == 12.0


@needs_verdict_kernel
def test_the_rows_flagged_are_those_whose_weights_may_leave_the_normal_range(monkeypatch):
    """Row by row, the verdict kernel flags exactly the rows whose smallest visible logit lies more
    than ``-log(2**-126)`` below their largest (the torch path's guard, from the oracle's own pass),
    with sinks that put the rows' spans on both sides of that edge; every row where
    ``subnormal._subnormal_weights`` finds a weight to correct is among them."""
    monkeypatch.setenv("PAGEDATTN_ORACLE_MAX_BYTES", str(1 << 20))  # several blocks of rows
    spec = CaseSpec("t", ((60, 20), (90, 1), (40, 3)), num_heads=8, num_kv_heads=2, sliding_window=24)
    case = spec.build()
    case = case.replace(sinks=torch.linspace(84.0, 91.0, case.num_heads)).to(DEVICE)
    out = paged_attention_reference(case).to(case.dtype)
    terms = policy._terms(case, "ieee", "fp32", "ieee", guard=False)
    edge = math.log(terms.model.weights_min_normal)
    flags = gpu_check._stats(out, None, case, terms, 1.0, correct=False, flag_below=edge + gpu_check.FLAG_MARGIN).stats[
        :, gpu_check.STATS
    ]
    spans, small = [], []
    device_terms = terms._replace(device_path=True)
    for c in policy.iter_chunks(case, live=policy._live(case), score_floor=True):
        spans.append(c.rows(c.score_floor - c.row_max).reshape(-1))
        extra = subnormal._subnormal_weights(c, device_terms)  # [Hkv, G, n, Lc]: nonzero where corrected
        small.append(c.rows((extra != 0).any(dim=-1)).reshape(-1))
    spans_t, small_t = torch.cat(spans), torch.cat(small)
    want = (spans_t < edge).double()
    assert 0 < int(want.sum()) < want.numel(), "the spans lie on one side of the edge"
    assert torch.equal(flags.cpu(), want.cpu()), f"{int((flags.cpu() != want.cpu()).sum())} rows flagged otherwise"
    assert bool((flags.cpu()[small_t.cpu()] == 1.0).all()), "a row with a weight to correct went unflagged"
    assert int(small_t.sum()) > 0


def test_an_older_triton_keeps_the_torch_path(monkeypatch):
    """A Triton older than MIN_TRITON cannot run the verdict kernels: the check takes its torch
    path (the same verdicts), and the report header says why."""
    import pagedattn.verdict_kernel as vk
    from pagedattn.runner import report

    monkeypatch.setattr(vk, "dist_version", lambda dist: "3.5.1")
    assert "triton 3.5.1 is older than 3.6" in vk.triton_problem()
    monkeypatch.setattr(gpu_check, "triton_problem", vk.triton_problem)
    monkeypatch.setattr(gpu_check, "ON_CPU", True)
    case = make_case_for_usable()
    assert not gpu_check.usable(case), "the verdict kernel must not run on triton 3.5"
    monkeypatch.setattr(report, "triton_problem", vk.triton_problem)
    monkeypatch.setattr(report, "dist_version", lambda dist: "3.5.1")
    (line,) = report._check_lines()
    assert line.startswith("  check: the torch path judges on every device (triton 3.5.1 is older than 3.6"), line
    monkeypatch.setattr(vk, "dist_version", lambda dist: "3.6.0")
    assert vk.triton_problem() == "", "triton 3.6 runs the verdict kernels"
    monkeypatch.setattr(vk, "dist_version", lambda dist: "3.10.0+git1234")
    assert vk.triton_problem() == "", "versions compare as numbers, not strings"


def make_case_for_usable():
    from pagedattn.cases.spec import CaseSpec

    return CaseSpec("t", ((5, 1),), dtype=torch.float32).build()
