"""The check's bound and verdict in one Triton kernel per block of rows, on a GPU.

``policy.chunk_bounds`` forms the bound with a few dozen torch operations a block of rows and
``verdict._Verdict`` judges it with a few dozen more. On a GPU each is a launch (and a host's
dispatch of ~8 us), so a check of milliseconds cost 2 to 5 times the oracle's own pass
(``benchmarks/NOTES.md``). Here the oracle's pass is the same (``iter_chunks``, the same blocks),
the score-sized work is the same one float32 product (none for a decode, below), and
everything after it, element by
element (the terms of ``docs/tolerance.md``, the output's rounding, the ratio of each error to its
bound, the worst element and the counts) is one kernel launch a block, which writes a few
statistics per row and head; the last program of the last launch reduces them, and one read per
check follows. The host's other costs are cut too, because on a GPU a check of milliseconds is
bound by its host: a sequence's value moments (bit for bit the torch path's) and its keys' norms
are one kernel (beside the mean's product with ones, ``policy._centre``), and a decode needs
neither (``policy.direct_decode``: the verdict kernel sums over its keys and values itself, and
takes its largest key norm from its keys; a long decode's over slices of its keys in a launch
before it, ``INLINE_DECODE_ELEMS``), the verdict kernel finds another row's largest visible key
norm by walking the sequence's norms (under a short window; a block of several rows otherwise
reads each row's from their sliding maximum, formed once a sequence), the correction of
subnormal weights is formed only where a row needs it (``verdict_rows``), and every launch
after a kernel's first is the compiled kernel's own (``_launch``).

The numbers are the torch path's: the same formulas in the same order, in float64
(``tests/test_policy.py`` compares the two paths under the Triton interpreter; on a GPU the
kernel may contract a multiply and an add into one rounding, a few float64 ulps of a bound; the
keys' norms and a decode's direct sums are summed in another order than torch's, a float64
rounding or two of theirs: ``policy.FUSED_RTOL``).

Used where it can run (``usable``): a CUDA tensor, Triton importable, its interpreter off, a
half or single precision case (a float64 case keeps the torch path), and not turned off with
``PAGEDATTN_FUSED_CHECK=0`` (the torch path then: the same verdicts, slower on a GPU; for a GPU
Triton cannot compile for, or to rule the kernel out). Otherwise, and for the bound tensors
themselves (``attention_error_bound``), the torch path runs.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, NamedTuple

import torch

from pagedattn.oracle import policy
from pagedattn.oracle.case import PagedCase
from pagedattn.oracle.reference import iter_chunks

#: ``0`` turns the fused path off (the torch path judges alone)
ENV = "PAGEDATTN_FUSED_CHECK"
#: run the fused path on CPU tensors too (tests: the kernel under the Triton interpreter)
ON_CPU = False
#: the statistics a row and head leaves, float64: the worst ratio (NaN where any is NaN), the
#: elements over the bound (NaN ratios included), the non-finite outputs where the reference is
#: finite, the worst element's channel, its output, reference and bound
STATS = 7
#: a row's statistics as the verdict kernel writes them: ``STATS``, then whether the row's
#: weights may fall below the normal range where the pass formed no correction for them (1.0;
#: ``_rows`` then judges the case again with it), rows 64 bytes apart
ROW_STATS = 8
#: a row is flagged where its smallest visible logit lies more than ``-log(min normal) - FLAG_MARGIN``
#: below its largest: there a weight may need the correction (``policy._subnormal_weights`` marks
#: ``p_j l < min normal``, whose float64 roundings move that edge by ~1e-15, far less)
FLAG_MARGIN = 2.0**-20
#: where the weights' smallest normal (``DTYPE_TABLE``) is at or above this, a case's first pass
#: forms the correction from the guard, as the torch path does, rather than flag rows and judge
#: again: fp16's 2**-14 is ~9.7 in logits, spanned by 29 of the quick grid's 33 fp16 attention
#: cases, where float32's and bfloat16's 2**-126 (~87) is spanned by 5 of their 102
#: (``benchmarks/results/count_flagged_cases.py``)
NARROW_MIN_NORMAL = 2.0**-60

_kernel: Any = None


def usable(case: PagedCase) -> bool:
    """Whether the fused path runs for ``case``: see the module's docstring."""
    if case.dtype == torch.float64 or os.environ.get(ENV, "1") == "0":
        return False
    if case.device.type == "cpu":
        return ON_CPU
    if case.device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    try:
        _compiled()
    except ImportError:
        return False
    return True


class Kernels(NamedTuple):
    """The check's Triton kernels (``_build``)."""

    verdict: Any  # a block of rows: the bound, the ratios, each row's statistics
    moments: Any  # a sequence's ``[|v|, (v - c)^2]`` in float32 (``policy._value_moments``) and key norms
    decode_sums: Any  # a long decode's value sums and largest key norm over its keys' slices
    reduce: Any  # the rows' statistics into one (``reduced``; the check's own are the verdict kernel's last program's)


def _compiled() -> Kernels:
    global _kernel
    if _kernel is None:
        _kernel = _build()
    return _kernel


def _build() -> Kernels:
    from pagedattn.verdict_kernel import kernel, reductions

    return Kernels(
        kernel.verdict_kernel, reductions.moments_kernel, reductions.decode_sums_kernel, reductions.reduce_kernel
    )


#: key norms the verdict kernel reads at a time (a row's largest visible one)
KEY_BLOCK = 512

#: compiled kernels by what Triton specializes them on (``_launch``), at most ``_MAX_RUNNERS``
_RUNNERS: dict[tuple, Any] = {}
_MAX_RUNNERS = 256
#: per kernel, its leading (non-constexpr) parameters' (do_not_specialize, ..._on_alignment)
_PLANS: dict[Any, list[tuple[bool, bool]]] = {}


def _plan(kernel: Any) -> list[tuple[bool, bool]]:
    """Which of ``kernel``'s parameters Triton specializes on value or alignment: each param's
    own flags (triton 3.6 and 3.9's ``KernelParam``); without them, every parameter is taken as
    specialized (a finer key: never a wrong kernel, only more JIT launches)."""
    plan = _PLANS.get(kernel)
    if plan is None:
        plan = [
            (bool(getattr(p, "do_not_specialize", False)), bool(getattr(p, "do_not_specialize_on_alignment", False)))
            for p in getattr(kernel, "params", [])
        ]
        _PLANS[kernel] = plan
    return plan


def _spec(arg: Any, dns: bool = False, dnsa: bool = False) -> Any:
    """What Triton's JIT specializes ``arg`` on, or more: a tensor's dtype and, unless ``dnsa``,
    its 16-byte alignment; an integer's width and, unless ``dns``, whether it is 1 and whether 16
    divides it; a bool's value; anything else's type (a float's, None's)."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype if dnsa else (arg.dtype, arg.data_ptr() % 16 == 0)
    if isinstance(arg, bool):
        return ("b", arg)
    if isinstance(arg, int):
        width = "i32" if -(2**31) <= arg < 2**31 else "i64" if -(2**63) <= arg < 2**63 else "u64"
        return width if dns else (width, arg == 1, arg % 16 == 0)
    return type(arg).__name__


def _key(args: tuple, flags: list[tuple[bool, bool]]) -> tuple:
    """``tuple(_spec(a, *f) for a, f in zip(args, flags))``, with the common types inline: a
    launch's key is ~45 arguments, and ``_spec`` call by call cost most of what the runner saves
    (~20 us against ~8 on this package's CPU box)."""
    out: list[Any] = []
    add = out.append
    for a, f in zip(args, flags):
        kind = type(a)
        if kind is int:
            width = "i32" if -(2**31) <= a < 2**31 else "i64" if -(2**63) <= a < 2**63 else "u64"
            add(width if f[0] else (width, a == 1, a % 16 == 0))
        elif kind is float:
            add("float")
        elif isinstance(a, torch.Tensor):
            add(a.dtype if f[1] else (a.dtype, a.data_ptr() % 16 == 0))
        else:
            add(_spec(a, *f))
    return tuple(out)


def _launch(kernel: Any, grid: tuple[int, ...], args: tuple, consts: dict[str, Any], key: Any = None) -> None:
    """``kernel[grid](*args, **consts)``, with Triton's host cost cut where it can be.

    Triton's JIT binds, specializes and looks up a kernel's arguments on every launch: 31 to 35 us
    of host time for the verdict kernel's 47 arguments then on the H200's host (triton 3.6;
    ``benchmarks/NOTES.md``, eighth stop), a launch a block of rows, where the oracle's own pass
    is a few milliseconds of host-bound launches. The kernel it returns (a ``CompiledKernel``) is
    kept here by what the JIT specializes on (``_spec`` under the kernel's own do-not-specialize
    flags: the same key or a finer one, so a launch it serves is one the JIT would have given the
    same kernel), per device, and serves the launches that match; the others go through the JIT,
    and so does everything on the interpreter (which returns no compiled kernel) and on ROCm (whose
    Triton also specializes on a tensor's storage size). A kept kernel is launched as its runner
    does (``CompiledKernel.__getitem__`` in triton 3.6 and 3.9: the same call, the launch hooks
    and metadata read each time), less the runner's closure and its device and stream lookups:
    the stream is the device's current one, read from torch as Triton reads it. What is not
    redone: the JIT's debug and instrumentation options and its pre-run hooks, read at a key's
    first launch (none is set by this package). ``consts`` are the kernel's last parameters, in
    order (its constexprs). ``key``: the caller's own key for ``args`` (``_verdict_key``), which
    must decide the JIT's specialization as ``_key`` would, in place of ``_key``."""
    device = torch.cuda.current_device() if _cuda_available() else -1
    if key is None:
        plan = _plan(kernel)
        flags = plan if len(plan) >= len(args) else [(False, False)] * len(args)
        key = _key(args, flags)
    full = (kernel, device, tuple(consts.items()), key)
    kept = _RUNNERS.get(full)
    if kept is not None:
        compiled, direct = kept
        g = tuple(grid) + (1,) * (3 - len(grid))
        if direct:
            stream = torch._C._cuda_getCurrentRawStream(device)
            knobs = _knobs().runtime
            compiled.run(
                g[0],
                g[1],
                g[2],
                stream,
                compiled.function,
                compiled.packed_metadata,
                compiled.launch_metadata(g, stream, *args, *consts.values()),
                knobs.launch_enter_hook,
                knobs.launch_exit_hook,
                *args,
                *consts.values(),
            )
        else:
            compiled[g](*args, *consts.values())
        return
    names = list(getattr(kernel, "arg_names", []))
    assert not names or names[len(names) - len(consts) :] == list(consts), (names, list(consts))
    compiled = kernel[grid](*args, **consts)
    if torch.version.hip is None and hasattr(compiled, "function") and callable(getattr(compiled, "__getitem__", None)):
        if len(_RUNNERS) >= _MAX_RUNNERS:
            _RUNNERS.clear()
        # launched as its runner would be where it has the runner's pieces (triton 3.6, 3.9)
        direct = all(hasattr(compiled, a) for a in ("run", "packed_metadata", "launch_metadata")) and hasattr(
            torch._C, "_cuda_getCurrentRawStream"
        )
        _RUNNERS[full] = (compiled, direct)  # a compiled kernel (the interpreter returns none)


@functools.cache
def _cuda_available() -> bool:
    """``torch.cuda.is_available()``, asked once a process: its Python path cost ~20 us a call
    under cProfile on the H200's host, at each of a combined check's 20 launches
    (``benchmarks/results/check-issue16/h200-check-cprofile-23a-0fe5779.txt``), and the answer
    does not change within a process."""
    return torch.cuda.is_available()


def _knobs() -> Any:
    """``triton.knobs`` (the launch hooks), imported where a kept kernel is first launched."""
    from triton import knobs

    return knobs


def _verdict_key(output: torch.Tensor, lse: torch.Tensor | None, case: PagedCase) -> Any:
    """The verdict kernel's launches' key for ``_launch`` in one check, or ``None``
    (``_key``'s): the kernel specializes none of its pointers on alignment nor any integer on
    its value (``kernel.verdict_kernel``), its other tensors are float64 or float32 by
    construction (``_stats``; the log-sum-exp float32, checked by the caller, or the float32
    product in its place; a decode's float32 placeholder for the product), so what the JIT
    specializes on is the output's dtype and whether an integer needs 64 bits. Every integer is
    below the largest of the output's and the log-sum-exp's strides, the statistics' rows, the
    longest history times the head dim (a history's head stride) and the window: where that is
    below 2**31 the key is the output's dtype (``tests/test_verdict_kernel.py`` checks it against
    ``_key``)."""
    strides = list(output.stride()) + (list(lse.stride()) if lse is not None else [])
    history = case.max_seq_len * case.head_dim
    if max(*strides, case.num_tokens * case.num_heads * ROW_STATS, history, case.sliding_window or 0) >= 2**31:
        return None
    return ("verdict", output.dtype)


def verdict_rows(
    output: torch.Tensor,
    lse: torch.Tensor | None,
    case: PagedCase,
    precision: str,
    qk_precision: str,
    tanh_precision: str,
    tolerance_factor: float,
) -> list[list[float]]:
    """The check of ``output`` (and of ``lse``) against the oracle and the bound of
    ``policy.chunk_bounds`` scaled by ``tolerance_factor``, as ``reduced``'s rows (one, or two
    with ``lse``: the output's, the log-sum-exp's), read to the host in one transfer.

    The correction of weights below the normal range (``policy._subnormal_weights``) is formed
    only where a row needs it. For an output dtype whose weights keep float32's range the pass
    forms none and flags the rows whose logits span past it; the case is judged again, with the
    correction, where any row was flagged (5 of the quick grid's 102 such cases). The torch path
    reads a guard over the whole key pool first (``policy._weights_stay_normal``), a few dozen
    launches and a read that cost a millisecond-long check a tenth of its time; fp16, whose
    weights leave their normal range within ~9.7 in logits, keeps that guard.

    Args:
        output: ``[T, Hq, D]`` in the query dtype, on the case's device (checked by the caller).
        lse: ``[T, Hq]`` float32, or ``None``.
    """
    min_normal = policy.DTYPE_TABLE[case.dtype].weights_min_normal
    flag = min_normal < NARROW_MIN_NORMAL
    terms = policy._terms(case, precision, qk_precision, tanh_precision, guard=not flag)
    if case.device.type != "cuda":
        return _rows(output, lse, case, terms, tolerance_factor, flag)
    # Triton launches on the current device, not the tensors': a case on another GPU (a worker's)
    with torch.cuda.device(case.device):
        return _rows(output, lse, case, terms, tolerance_factor, flag)


def _rows(
    output: torch.Tensor,
    lse: torch.Tensor | None,
    case: PagedCase,
    terms: policy._Terms,
    tolerance_factor: float,
    flag: bool,
) -> list[list[float]]:
    """``verdict_rows``' rows: one pass that flags rows (``flag``) or forms the correction
    where ``terms`` say, then, where a row was flagged, one that forms it."""
    below = math.log(terms.model.weights_min_normal) + FLAG_MARGIN if flag else -math.inf
    rows = _read(_stats(output, lse, case, terms, tolerance_factor, correct=not flag, flag_below=below))
    if rows[0][7] > 0:  # rows whose weights may need the correction: the case again, with it
        rows = _read(_stats(output, lse, case, terms, tolerance_factor, correct=True, flag_below=-math.inf))
    return [row[:STATS] for row in rows[: 1 if lse is None else 2]]


def _read(p: _Pass) -> list[list[float]]:
    """A pass's reduced rows on the host (one transfer), after its count is checked: the final
    launch's programs count themselves and its last, having reduced, one more. A reduction that
    did not run leaves zeros, which would read as a pass."""
    rows = p.reduced.tolist()
    if rows[1][7] != p.programs + 1:
        raise RuntimeError(
            f"the fused check's reduction: a count of {rows[1][7]:g}, not the final launch's {p.programs} programs"
            " and its reduction's 1"
        )
    return rows


def sequence_moments(v: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sequence's terms of the bound in one kernel and the mean's launches (``policy._centre``):
    ``policy._value_moments``' numbers, bit for bit, and the keys' norms.

    Args:
        v: ``[Hkv, L, D]`` float64, rows of D contiguous (a slice of a sequence's values is read
            in place).
        k: ``[Hkv, L, D]`` float64, rows of D contiguous: the keys at the same positions.

    Returns:
        ``(c, vv, kn)``: the values' mean over the keys ``[Hkv, 1, D]`` float64, ``[|v|, (v - c)^2]``
        ``[Hkv, L, 2D]`` float32 and each key's norm ``[Hkv, L]`` float64 (torch's ``norm`` to
        within a float64 rounding or two: another order of the sum), on ``v``'s device.
    """
    Hkv, L, D = v.shape
    if v.stride(2) != 1 or v.stride(1) != D:
        v = v.contiguous()
    if k.stride(2) != 1 or k.stride(1) != D:
        k = k.contiguous()
    centre = policy._centre(v)
    vv = torch.empty(Hkv, L, 2 * D, dtype=torch.float32, device=v.device)
    kn = torch.empty(Hkv, L, dtype=torch.float64, device=v.device)
    block_d = _pow2(D)
    block_r = max(1, 4096 // block_d)
    _launch(
        _compiled().moments,
        (_cdiv(L, block_r), Hkv),
        (v, v.stride(0), k, k.stride(0), centre, vv, kn, L, D),
        {"BLOCK_R": block_r, "BLOCK_D": block_d},
    )
    return centre, vv, kn


def _pow2(n: int) -> int:
    """The power of two at or above ``n``, at least 16."""
    return 1 << max(4, (n - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Pass(NamedTuple):
    """One pass of the fused check over a case (``_stats``), on the case's device."""

    stats: torch.Tensor  # [T * Hq, ROW_STATS] float64: each row and head's, the output's
    lstats: torch.Tensor | None  # [T * Hq, ROW_STATS] float64: the log-sum-exp's (None without lse)
    reduced: torch.Tensor  # [2, 8] float64: ``reduced``'s rows of both; [0, 7] the rows flagged, [1, 7] the count
    programs: int  # the final launch's programs: [1, 7] is one more once its last has reduced


#: a decode's direct sums (``policy.direct_decode``) in the verdict kernel: keys at a time times the
#: head dim's tile. They replace the moments kernel, the mean's two launches, the float32 weights
#: and their product: 5 launches a decode on a host-bound check
INLINE_TILE = 2048

#: a decode whose keys times D are at most this many has its direct sums formed in the verdict
#: kernel itself, a program a head reading its ``Lc D`` keys and values (2 MB here). That program
#: reads ~8 GB/s on the H200 (a 4000-key decode of D=128, 8 MB a program, took ~1 ms of device
#: time), so a longer decode's sums are a launch of their own (``decode_sums_kernel``, a program
#: a head and slice of ``SLICE_DECODE_ELEMS``), which the verdict kernel adds in order: one launch
#: in place of five, with the device's time spread over the keys
INLINE_DECODE_ELEMS = 1 << 17
#: keys times D a program of ``decode_sums_kernel`` reads (512 KB of keys and values at D=128)
SLICE_DECODE_ELEMS = 1 << 15

#: a windowed block of several rows walks the key norms where the window is at most this many
#: keys (a few of the kernel's KEY_BLOCK reads a row), in place of the sequence's sliding
#: maximum: that is 8 torch operations a sequence (``policy._key_reach``), on a host-bound check
KEY_WALK = 2048


def _stats(
    output: torch.Tensor,
    lse: torch.Tensor | None,
    case: PagedCase,
    terms: policy._Terms,
    tolerance_factor: float,
    correct: bool = True,
    flag_below: float = -math.inf,
) -> _Pass:
    """Every row and head's statistics, the output's and the log-sum-exp's, reduced by the last
    launch. ``correct``: the correction of subnormal weights is formed where ``terms`` say
    (``policy._subnormal_weights``); else none is, and a row is flagged where its smallest
    visible logit lies below its largest plus ``flag_below``."""
    kernel = _compiled().verdict
    T, Hq, D = case.num_tokens, case.num_heads, case.head_dim
    kw: dict[str, Any] = dict(dtype=torch.float64, device=case.device)
    both = torch.empty(1 if lse is None else 2, T * Hq, ROW_STATS, **kw)
    stats, lstats = both[0], both[1] if lse is not None else None
    rd = torch.zeros(2, 8, **kw)  # rows of 8: each row's start 64-byte aligned, as a tensor of its own's
    programs = 0
    key = _verdict_key(output, lse, case)
    model = terms.model
    W = case.sliding_window or 0
    block_j = max(1, INLINE_TILE // _pow2(D))  # keys a decode's sums read at a time
    consts = {
        "BLOCK_D": _pow2(D),
        "BLOCK_K": KEY_BLOCK,
        "BLOCK_J": block_j,
        "U": policy.U_FP32,
        "C_EXP": policy.C_EXP,
        "CW": policy.C_W,
        "NS": ROW_STATS,
    }
    tol, xmin = float(tolerance_factor), 2.0**model.emin
    # the log-sum-exp's strides, where there is none: never read (has_lse 0)
    lse_strides = lse.stride() if lse is not None else (0, 0)
    seq, first, centre, vv, kn = -1, 0, torch.empty(0), torch.empty(0), torch.empty(0)
    query_lens = case.query_lens
    reach: torch.Tensor | None = None  # the sequence's sliding maximum of kn, at its first block of rows
    placeholder32: torch.Tensor | None = None  # a float32 pointer never read (inline: no s12)
    for c in iter_chunks(case, live=policy._live(case), score_floor=True):
        Hkv, G, n, Lc = c.probs.shape
        # a decode (policy.direct_decode): its sums over its keys and values, as the torch path's
        # ``_decode_sums`` (no moments, no float32 product), in the verdict kernel (inline 1) or,
        # past INLINE_DECODE_ELEMS, over slices of its keys in a launch before it (inline 2)
        inline = int(policy.direct_decode(c, query_lens, terms.device_path))
        if c.seq != seq:  # the values and keys the sequence's rows see (policy.chunk_bounds)
            seq, first = c.seq, c.keys.start
            if not inline:  # [Hkv, 1, D], [Hkv, L - first, 2D], [Hkv, L - first]
                centre, vv, kn = sequence_moments(c.v_all[:, first:], c.k_all[:, first:])
            reach = None
        walk = n == 1 or 0 < W <= KEY_WALK
        if not walk and reach is None:  # positions from ``first``: every row's window starts there or later
            reach = policy._key_reach(kn, case.sliding_window)  # [Hkv, L - first]
        assert c.q.is_contiguous()  # the kernel reads its rows as o's: [Hq, n, D], rows of D
        o = torch.bmm(c.probs.view(Hkv, G * n, Lc), c.v)  # [Hkv, G * n, D]: [Hq, n, D]
        parts, slices = o, 0  # (a placeholder: not read)
        if inline:
            # the kernels read the weights [Hq, Lc] and the keys' and values' rows of D in place
            assert c.probs.is_contiguous() and c.v.stride()[1:] == (D, 1) and c.k.stride() == c.v.stride()
            if placeholder32 is None:
                placeholder32 = torch.empty(1, dtype=torch.float32, device=case.device)
            s12 = placeholder32
            centre = kn = o  # (placeholders: not read)
            if Lc * D > INLINE_DECODE_ELEMS:
                inline = 2
                chunk = max(1, SLICE_DECODE_ELEMS // (D * block_j)) * block_j  # keys a slice
                slices = _cdiv(Lc, chunk)
                parts = torch.empty(Hq, slices, 2 * D + 1, **kw)
                _launch(
                    _compiled().decode_sums,
                    (Hq, slices),
                    (c.probs, c.v, c.k, c.v.stride(0), o, parts, Lc, G, D, chunk, slices),
                    {"BLOCK_J": block_j, "BLOCK_D": consts["BLOCK_D"]},
                )
        else:
            p32 = policy._spent(c.scores, torch.float32).copy_(c.probs)
            s12 = torch.bmm(p32.view(Hkv, G * n, Lc), vv[:, c.keys.start - first : c.keys.stop - first])  # [Hq, n, 2D]
            del p32
        # in the spent scores' storage: after the product
        extra = policy._subnormal_weights(c, terms) if correct else None
        # [Hq, n, D] float64 (``o`` stands in where there is none: has_extra 0)
        ex = torch.bmm(extra.view(Hkv, G * n, Lc), c.v.abs()) if extra is not None else o
        del extra
        L = case.seq_lens_list[c.seq]
        acc = policy.C_ACC * policy.U_FP32 * math.sqrt(L)
        sink = c.sink_probs is not None
        alibi = c.alibi is not None
        args = (
            output,
            *output.stride(),
            o,
            s12,
            ex,
            centre,
            c.q,
            c.row_max,
            c.score_floor,
            c.lse,
            kn,
            reach if reach is not None else kn,  # (``kn`` stands in where a block walks)
            kn.stride(0),
            c.probs,
            c.v,
            c.k,
            c.v.stride(0),
            Lc,
            parts,
            slices,
            c.sink_probs if sink else o,
            c.key_share if sink else o,
            terms.sinks if sink else o,
            c.alibi[0] if alibi else o,  # type: ignore[index]
            lse if lse is not None else s12,  # (a float32 as a log-sum-exp: one compile for both checks)
            *lse_strides,
            stats,
            lstats if lstats is not None else stats,
            rd,
            c.tokens.start,
            n,
            c.keys.stop - n,
            first,
            W,
            G,
            Hq,
            D,
            int(ex is not o),
            int(sink),
            int(alibi),
            int(lse is not None),
            int(walk),
            inline,
            int(c.last and c.seq == case.num_seqs - 1),  # (every sequence has a new token: PagedCase)
            T * Hq,
            terms.a,
            terms.row_const,
            terms.pv,
            acc,
            tol,
            xmin,
            model.significand,
            flag_below,
        )
        _launch(kernel, (Hq * n,), args, consts, key)
        programs = Hq * n
        if c.last:  # the sequence's last block: its moments and key norms go before the next
            centre = vv = kn = torch.empty(0)  # one's history comes (the oracle holds none of them)
            reach = None
        del c, o, s12, ex, parts, args  # the block's tensors go before the next block's (args holds them too)
    return _Pass(stats, lstats, rd, programs)


def reduced(stats: torch.Tensor, per_row: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """One check's statistics from its rows' ``[T * Hq, NS]`` (``STATS`` or ``ROW_STATS``): ``[worst
    ratio (NaN where any is NaN), elements over, non-finite, flat index of the worst element
    (``per_row`` elements a row and head), its output, reference, bound]`` and, from
    ``ROW_STATS``, the rows flagged: float64 ``[NS]``, on the device (into ``out`` if given), in
    one launch. The worst is the first NaN ratio, or else the first largest, in (token, head,
    channel) order. ``stats`` has at least one row (a case has a token). The check itself
    reduces in its final verdict launch, with the same code (``reduce_rows``)."""
    out = torch.empty(stats.shape[1], dtype=torch.float64, device=stats.device) if out is None else out
    _launch(_compiled().reduce, (1,), (stats, stats.shape[0], per_row, out), {"NS": stats.shape[1], "BLOCK": 1024})
    return out
