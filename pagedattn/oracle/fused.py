"""The check's bound and verdict in one Triton kernel per block of rows, on a GPU.

``policy.chunk_bounds`` forms the bound with a few dozen torch operations a block of rows and
``verdict._Verdict`` judges it with a few dozen more. On a GPU each is a launch (and a host's
dispatch of ~8 us), so a check of milliseconds cost 2 to 5 times the oracle's own pass
(``benchmarks/NOTES.md``). Here the oracle's pass is the same (``iter_chunks``, the same blocks),
the score-sized work is the same one float32 product, and everything after it, element by
element (the terms of ``docs/tolerance.md``, the output's rounding, the ratio of each error to its
bound, the worst element and the counts) is one kernel launch a block, which writes a few
statistics per row and head; one reduction (a kernel of one program) and one read per check
follow. The host's other costs are cut too, because on a GPU a check of milliseconds is bound
by its host: a sequence's value moments (bit for bit the torch path's) and its keys' norms are
one kernel (beside the mean's product with ones, ``policy._centre``), the verdict kernel finds a
decode's largest visible key norm by walking them (a block of several rows reads each row's from
their sliding maximum, formed once a sequence), and every launch after a kernel's first goes
through the compiled kernel's own runner (``_launch``).

The numbers are the torch path's: the same formulas in the same order, in float64
(``tests/test_policy.py`` compares the two paths under the Triton interpreter; on a GPU the
kernel may contract a multiply and an add into one rounding, a few float64 ulps of a bound; the
keys' norms are summed in another order than torch's, a float64 rounding or two of theirs).

Used where it can run (``usable``): a CUDA tensor, Triton importable, its interpreter off, a
half or single precision case (a float64 case keeps the torch path), and not turned off with
``PAGEDATTN_FUSED_CHECK=0`` (the torch path then: the same verdicts, slower on a GPU; for a GPU
Triton cannot compile for, or to rule the kernel out). Otherwise, and for the bound tensors
themselves (``attention_error_bound``), the torch path runs.
"""

from __future__ import annotations

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
    reduce: Any  # a check's statistics: the rows' into one (``reduced``'s, in one launch)


def _compiled() -> Kernels:
    global _kernel
    if _kernel is None:
        _kernel = _build()
    return _kernel


def _build() -> Kernels:  # noqa: C901 - the kernels
    import triton
    import triton.language as tl

    # the integers and the tensors' alignment change from block to block: specialized, each
    # combination would be a compile of its own. No pointer is specialized on its alignment either
    # (a launch's key is then its tensors' dtypes: no address read for it, a launch a block on a
    # host-bound check; the kernel's loads are a row of D elements, vectorized or not)
    @triton.jit(
        do_not_specialize=(
            "row0 n p0 first W G Hq D out_st out_sh out_sd lo_st lo_sh kn_sh has_extra has_sink has_alibi has_lse sig"
        ).split(),
        do_not_specialize_on_alignment=(
            "out_ptr o_ptr s12_ptr ex_ptr c_ptr q_ptr rm_ptr fl_ptr lse_ptr kn_ptr kr_ptr ps_ptr sh_ptr sk_ptr sl_ptr "
            "lo_ptr st_ptr ls_ptr"
        ).split(),
    )
    def verdict_kernel(
        out_ptr,  # [T, Hq, D] the backend's whole output, any float dtype, strided (rows row0 + t)
        out_st,
        out_sh,
        out_sd,
        o_ptr,  # [Hq, n, D] float64: the oracle's output (its product's own layout)
        s12_ptr,  # [Hq, n, 2D] float32: sum_j p_j |v_j|, sum_j p_j (v_j - c)^2
        ex_ptr,  # [Hq, n, D] float64: the subnormal-weight correction (has_extra)
        c_ptr,  # [Hkv, D] float64: the sequence's mean value
        q_ptr,  # [Hq, n, D] float64: the queries (their norms)
        rm_ptr,  # [Hq, n] float64: the row's max logit (the sink's included)
        fl_ptr,  # [Hq, n] float64: its smallest visible logit
        lse_ptr,  # [Hq, n] float64: the reference log-sum-exp
        kn_ptr,  # [Hkv, L - first] float64: the sequence's key norms from key ``first``, heads kn_sh apart
        kr_ptr,  # [Hkv, L - first] float64: their sliding maximum, each position's largest visible (n > 1)
        kn_sh,
        ps_ptr,  # [Hq, n] float64: the sink's share (has_sink)
        sh_ptr,  # [Hq, n] float64: the keys' share (has_sink)
        sk_ptr,  # [Hq] float64: the sinks (has_sink)
        sl_ptr,  # [Hq] float64: ALiBi slopes (has_alibi)
        lo_ptr,  # [T, Hq] float32: the backend's whole log-sum-exp, strided (has_lse; rows row0 + t)
        lo_st,
        lo_sh,
        st_ptr,  # [T * Hq, STATS] float64: the output's statistics, row (row0 + t) * Hq + h
        ls_ptr,  # [T * Hq, STATS] float64: the log-sum-exp's (has_lse)
        row0,  # the block's first token
        n,  # its rows
        p0,  # the position of its first row in the sequence
        first,  # the first key any row of the sequence sees (kn's first)
        W,  # the sliding window (0: none)
        G,  # the GQA ratio
        Hq,  # query heads
        D,  # the head dim
        has_extra,  # the flags: branches taken at run time, so that they make no compile of their own
        has_sink,
        has_alibi,
        has_lse,
        a: tl.float64,  # the model's constants (policy._terms): float64 (a float argument is float32)
        row_const: tl.float64,
        pv: tl.float64,
        acc: tl.float64,  # C_ACC u sqrt(L), L the sequence's length
        tol: tl.float64,
        xmin: tl.float64,  # the output dtype's smallest normal (2**emin)...
        sig,  # ...and its significand bits: its half ulp
        BLOCK_D: tl.constexpr,
        BLOCK_K: tl.constexpr,  # key norms read at a time
        U: tl.constexpr,  # policy.U_FP32, C_EXP, C_W: exact in float32, as Triton takes a float constexpr
        C_EXP: tl.constexpr,
        CW: tl.constexpr,
        NS: tl.constexpr,  # STATS
    ):
        pid = tl.program_id(0)
        h = pid // n
        t = pid - h * n
        kv = h // G
        r = h.to(tl.int64) * n + t  # row of the [Hq, n] per-row tensors
        p = p0 + t
        d = tl.arange(0, BLOCK_D)
        dm = d < D
        base = r * D
        # the row's largest ds_j (policy.chunk_bounds, same order of operations)
        q = tl.load(q_ptr + base + d, mask=dm, other=0.0)
        qn = tl.sqrt(tl.sum(q * q, axis=0))
        # the largest norm among the keys the row sees, max(0, p - W + 1) .. p (policy._KeyMax). A
        # block of one row (a decode) walks the sequence's key norms; a block of several reads each
        # row's from the sequence's sliding maximum over the same norms (policy._key_reach), since
        # a walk a row would read O(L) norms for each row and head of a long prefill. A NaN norm
        # the row sees makes its scores, reference and bound NaN whatever this maximum is (a GPU's
        # maximum, and the interpreter's, drop NaN)
        kv64 = kv.to(tl.int64)
        if n == 1:
            k_lo = 0
            if W > 0:
                k_lo = tl.maximum(p - W + 1, 0)
            k_lo = k_lo - first
            k_hi = p + 1 - first
            top = tl.zeros([BLOCK_K], dtype=tl.float64)  # norms are >= 0
            for j0 in range(k_lo, k_hi, BLOCK_K):
                j = j0 + tl.arange(0, BLOCK_K)
                top = tl.maximum(top, tl.load(kn_ptr + kv64 * kn_sh + j, mask=j < k_hi, other=0.0))
            km = tl.max(top, axis=0)
        else:
            km = tl.load(kr_ptr + kv64 * kn_sh + (p - first))
        rm = tl.load(rm_ptr + r)
        fl = tl.load(fl_ptr + r)
        ds = a * qn * km + U * (rm - 2.0 * tl.minimum(fl, 0.0)) + row_const
        if has_alibi:
            reach = p
            if W > 0:
                reach = tl.minimum(p, W - 1)
            ds = ds + U * tl.abs(tl.load(sl_ptr + h)) * reach.to(tl.float64)
        seen = p + 1
        if W > 0:
            seen = tl.minimum(seen, W)
        grow = 1.0 / (1.0 - (seen.to(tl.float64) + 3.0) * U)  # policy._visible_keys_grow
        sqrt_grow = tl.sqrt(grow)
        o = tl.load(o_ptr + base + d, mask=dm, other=0.0)
        s1 = tl.load(s12_ptr + 2 * base + d, mask=dm, other=0.0).to(tl.float64)
        s2 = tl.load(s12_ptr + 2 * base + D + d, mask=dm, other=0.0).to(tl.float64)
        cen = tl.load(c_ptr + kv.to(tl.int64) * D + d, mask=dm, other=0.0)
        dd = cen - o
        o_abs = tl.abs(o)
        lse_s = ds
        if has_sink:
            psk = tl.load(ps_ptr + r)
            share = tl.load(sh_ptr + r)
            spread2 = s2 + (2.0 * dd * o * psk) / grow
            spread2 = spread2 - (dd * dd * share) / grow
            e = tl.sqrt(tl.maximum(spread2, 0.0, propagate_nan=tl.PropagateNan.ALL) * share) * (ds * sqrt_grow)
            lse_s = ds * share
            sink = tl.load(sk_ptr + h)
            w_sink = psk * (U * ((C_EXP + tl.abs(sink)) + tl.abs(sink - rm)))
            e = e + w_sink * o_abs
            lse_s = lse_s + w_sink
        else:
            spread2 = s2 - (dd * dd) / grow
            e = tl.sqrt(tl.maximum(spread2, 0.0, propagate_nan=tl.PropagateNan.ALL)) * (ds * sqrt_grow)
        if has_extra:
            e = e + CW * tl.load(ex_ptr + base + d, mask=dm, other=0.0)
        e = e + ((pv + acc) * grow) * s1
        e = e + acc * o_abs
        # E_round: half an ulp of |o| + e in the output dtype, read off its float64 exponent
        x = tl.maximum(o_abs + e, xmin, propagate_nan=tl.PropagateNan.ALL)
        ex = (x.to(tl.int64, bitcast=True) >> 52) - sig
        e = (e + (ex << 52).to(tl.float64, bitcast=True)) * tol
        at = (row0 + t).to(tl.int64) * out_st + h.to(tl.int64) * out_sh + d.to(tl.int64) * out_sd
        out = tl.load(out_ptr + at, mask=dm, other=0.0)
        out = out.to(tl.float64)
        ratio = tl.abs(out - o) / e
        fin_ref = (o - o) == 0.0
        fin_out = (out - out) == 0.0
        # a bound that is not finite where the reference is (a spread past float32's range) judges
        # nothing: NaN, which fails, as in verdict._Verdict.add
        ratio = tl.where(((e - e) == 0.0) | ~fin_ref, ratio, float("nan"))
        over = tl.sum(tl.where(dm & ~(ratio <= 1.0), 1.0, 0.0), axis=0)
        nonfinite = tl.sum(tl.where(dm & fin_ref & ~fin_out, 1.0, 0.0), axis=0)
        isnan = dm & (ratio != ratio)
        any_nan = tl.max(isnan.to(tl.int32), axis=0) > 0
        finite_r = tl.where(dm & ~isnan, ratio, -1.0)
        worst = tl.max(finite_r, axis=0)
        first_nan = tl.min(tl.where(isnan, d, BLOCK_D), axis=0)
        first_max = tl.min(tl.where(finite_r == worst, d, BLOCK_D), axis=0)
        idx = tl.where(any_nan, first_nan, first_max)
        pick = d == idx
        srow = st_ptr + ((row0 + t).to(tl.int64) * Hq + h) * NS
        tl.store(srow + 0, tl.where(any_nan, float("nan"), worst))
        tl.store(srow + 1, over)
        tl.store(srow + 2, nonfinite)
        tl.store(srow + 3, idx.to(tl.float64))
        tl.store(srow + 4, tl.sum(tl.where(pick, out, 0.0), axis=0))
        tl.store(srow + 5, tl.sum(tl.where(pick, o, 0.0), axis=0))
        tl.store(srow + 6, tl.sum(tl.where(pick, e, 0.0), axis=0))
        if has_lse:
            ref = tl.load(lse_ptr + r)
            e_l = (lse_s + U * (C_EXP + 2.0 * tl.abs(ref)) + acc) * tol
            lo = tl.load(lo_ptr + (row0 + t).to(tl.int64) * lo_st + h.to(tl.int64) * lo_sh).to(tl.float64)
            rl = tl.abs(lo - ref) / e_l
            rl = tl.where(((e_l - e_l) == 0.0) | ((ref - ref) != 0.0), rl, float("nan"))
            exact_inf = (ref - ref != 0.0) & (ref == ref) & (lo == ref)  # an infinite reference matched
            rl = tl.where(exact_inf, 0.0, rl)
            lrow = ls_ptr + ((row0 + t).to(tl.int64) * Hq + h) * NS
            tl.store(lrow + 0, rl)
            tl.store(lrow + 1, tl.where(rl <= 1.0, 0.0, 1.0))
            tl.store(lrow + 2, tl.where(((ref - ref) == 0.0) & ~((lo - lo) == 0.0), 1.0, 0.0))
            tl.store(lrow + 3, 0.0)
            tl.store(lrow + 4, lo)
            tl.store(lrow + 5, ref)
            tl.store(lrow + 6, e_l)

    @triton.jit(do_not_specialize=["v_sh", "k_sh", "L", "D"])
    def moments_kernel(
        v_ptr,  # [Hkv, L, D] float64, rows of D contiguous: a sequence's values...
        v_sh,  # ...heads this far apart
        k_ptr,  # [Hkv, L, D] float64, rows of D contiguous: its keys...
        k_sh,  # ...heads this far apart
        c_ptr,  # [Hkv, 1, D] float64: the values' mean over the keys
        vv_ptr,  # [Hkv, L, 2D] float32: |v| and (v - c)^2
        kn_ptr,  # [Hkv, L] float64: the keys' norms
        L,
        D,
        BLOCK_R: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # policy._value_moments' numbers bit for bit: |fl32(v)|, and fl32 of the float64 square
        # of the float64 difference (it may cancel), each rounded to nearest once
        kv = tl.program_id(1).to(tl.int64)
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        d = tl.arange(0, BLOCK_D)
        m = (rows[:, None] < L) & (d[None, :] < D)
        at = kv * v_sh + rows[:, None].to(tl.int64) * D + d[None, :]
        v = tl.load(v_ptr + at, mask=m, other=0.0)
        c = tl.load(c_ptr + kv * D + d, mask=d < D, other=0.0)
        to = (kv * L + rows[:, None]) * (2 * D) + d[None, :]
        tl.store(vv_ptr + to, tl.abs(v.to(tl.float32)), mask=m)
        dv = v - c[None, :]
        tl.store(vv_ptr + to + D, (dv * dv).to(tl.float32), mask=m)
        # the keys' norms, here rather than a launch or two of their own a block (policy._KeyMax's
        # come from torch's norm: the same to within a float64 rounding or two, see FUSED_RTOL)
        k = tl.load(k_ptr + kv * k_sh + rows[:, None].to(tl.int64) * D + d[None, :], mask=m, other=0.0)
        tl.store(kn_ptr + kv * L + rows, tl.sqrt(tl.sum(k * k, axis=1)), mask=rows < L)

    @triton.jit(do_not_specialize=["N", "per_row"])
    def reduce_kernel(
        st_ptr,  # [N, NS] float64: rows' statistics (the verdict kernel's)
        N,
        per_row,  # elements a row and head (the flat index's unit)
        out_ptr,  # [NS] float64: the check's, as ``reduced`` documents
        NS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # one program walks the rows in order: the worst is the first NaN, or else the first
        # largest (torch.argmax's rule); the counts are integers below 2**53, exact in any order
        i = tl.arange(0, BLOCK)
        best = tl.full([], float("-inf"), tl.float64)
        at = tl.full([], 0, tl.int32)
        found_nan = tl.full([], 0, tl.int32)
        over = tl.full([], 0.0, tl.float64)
        nonfinite = tl.full([], 0.0, tl.float64)
        for i0 in range(0, N, BLOCK):
            rows = i0 + i
            m = rows < N
            row = st_ptr + rows.to(tl.int64) * NS
            x = tl.load(row, mask=m, other=float("-inf"))
            over += tl.sum(tl.load(row + 1, mask=m, other=0.0), axis=0)
            nonfinite += tl.sum(tl.load(row + 2, mask=m, other=0.0), axis=0)
            isnan = m & (x != x)
            first_nan = tl.min(tl.where(isnan, rows, N), axis=0)
            xf = tl.where(isnan, float("-inf"), x)
            top = tl.max(xf, axis=0)
            first_top = tl.min(tl.where(m & (xf == top), rows, N), axis=0)
            chunk_nan = first_nan < N
            higher = (found_nan == 0) & ~chunk_nan & (top > best)
            take_nan = (found_nan == 0) & chunk_nan
            at = tl.where(take_nan, first_nan, tl.where(higher, first_top, at))
            best = tl.where(take_nan, float("nan"), tl.where(higher, top, best))
            found_nan = tl.where(chunk_nan, 1, found_nan)
        worst = st_ptr + at.to(tl.int64) * NS
        tl.store(out_ptr, best)
        tl.store(out_ptr + 1, over)
        tl.store(out_ptr + 2, nonfinite)
        tl.store(out_ptr + 3, at.to(tl.float64) * per_row + tl.load(worst + 3))
        for k in tl.static_range(4, NS):
            tl.store(out_ptr + k, tl.load(worst + k))

    return Kernels(verdict_kernel, moments_kernel, reduce_kernel)


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


def _launch(kernel: Any, grid: tuple[int, ...], args: tuple, consts: dict[str, Any]) -> None:
    """``kernel[grid](*args, **consts)``, with Triton's host cost cut where it can be.

    Triton's JIT binds, specializes and looks up a kernel's arguments on every launch: 31 to 35 us
    of host time for the verdict kernel's 47 on the H200's host (triton 3.6;
    ``benchmarks/NOTES.md``, eighth stop), a launch a block of rows, where the oracle's own pass
    is a few milliseconds of host-bound launches. The kernel it returns (a ``CompiledKernel``)
    launches the same arguments through its own runner in ~14 us. It is kept here by what the JIT
    specializes on (``_spec`` under the kernel's own do-not-specialize flags: the same key or a
    finer one, so a launch it serves is one the JIT would have given the same kernel), per device,
    and serves the launches that match; the others go through the JIT, and so does everything on
    the interpreter (which returns no compiled kernel) and on ROCm (whose Triton also specializes
    on a tensor's storage size). What the runner does not redo: the JIT's debug and
    instrumentation options and its pre-run hooks, read at a key's first launch (none is set by
    this package). ``consts`` are the kernel's last parameters, in order (its constexprs)."""
    device = torch.cuda.current_device() if torch.cuda.is_available() else -1
    plan = _plan(kernel)
    flags = plan if len(plan) >= len(args) else [(False, False)] * len(args)
    key = (kernel, device, tuple(consts.items()), _key(args, flags))
    compiled = _RUNNERS.get(key)
    if compiled is not None:
        compiled[tuple(grid) + (1,) * (3 - len(grid))](*args, *consts.values())
        return
    names = list(getattr(kernel, "arg_names", []))
    assert not names or names[len(names) - len(consts) :] == list(consts), (names, list(consts))
    compiled = kernel[grid](*args, **consts)
    if torch.version.hip is None and hasattr(compiled, "function") and callable(getattr(compiled, "__getitem__", None)):
        if len(_RUNNERS) >= _MAX_RUNNERS:
            _RUNNERS.clear()
        _RUNNERS[key] = compiled  # a compiled kernel (the interpreter returns none)


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

    Args:
        output: ``[T, Hq, D]`` in the query dtype, on the case's device (checked by the caller).
        lse: ``[T, Hq]`` float32, or ``None``.
    """
    terms = policy._terms(case, precision, qk_precision, tanh_precision)
    if case.device.type != "cuda":
        return _rows(output, lse, case, terms, tolerance_factor)
    # Triton launches on the current device, not the tensors': a case on another GPU (a worker's)
    with torch.cuda.device(case.device):
        return _rows(output, lse, case, terms, tolerance_factor)


def _rows(
    output: torch.Tensor, lse: torch.Tensor | None, case: PagedCase, terms: policy._Terms, tolerance_factor: float
) -> list[list[float]]:
    stats, lstats = _stats(output, lse, case, terms, tolerance_factor)
    # rows of 8: each row's start 64-byte aligned, as a tensor of its own would be
    out = torch.empty(1 if lstats is None else 2, 8, dtype=torch.float64, device=case.device)
    reduced(stats, case.head_dim, out=out[0, :STATS])
    if lstats is not None:
        reduced(lstats, 1, out=out[1, :STATS])
    return [row[:STATS] for row in out.tolist()]


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


def _stats(
    output: torch.Tensor, lse: torch.Tensor | None, case: PagedCase, terms: policy._Terms, tolerance_factor: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every row and head's statistics, the output's and the log-sum-exp's: two ``[T * Hq, STATS]``
    float64 tensors on the case's device (the second ``None`` without ``lse``)."""
    kernel = _compiled().verdict
    T, Hq, D = case.num_tokens, case.num_heads, case.head_dim
    kw: dict[str, Any] = dict(dtype=torch.float64, device=case.device)
    stats = torch.empty(T * Hq, STATS, **kw)
    lstats = torch.empty(T * Hq, STATS, **kw) if lse is not None else None
    model = terms.model
    W = case.sliding_window or 0
    consts = {
        "BLOCK_D": _pow2(D),
        "BLOCK_K": KEY_BLOCK,
        "U": policy.U_FP32,
        "C_EXP": policy.C_EXP,
        "CW": policy.C_W,
        "NS": STATS,
    }
    tol, xmin = float(tolerance_factor), 2.0**model.emin
    # the log-sum-exp's place, where there is none: a tensor the kernel never reads (has_lse 0)
    lse_arg, lse_strides = (lse, lse.stride()) if lse is not None else (stats, (0, 0))
    seq, first, centre, vv, kn = -1, 0, torch.empty(0), torch.empty(0), torch.empty(0)
    reach: torch.Tensor | None = None  # the sequence's sliding maximum of kn, at its first block of rows
    for c in iter_chunks(case, live=policy._live(case), score_floor=True):
        Hkv, G, n, Lc = c.probs.shape
        if c.seq != seq:  # the values and keys the sequence's rows see (policy.chunk_bounds)
            seq, first = c.seq, c.keys.start
            # [Hkv, 1, D], [Hkv, L - first, 2D], [Hkv, L - first]
            centre, vv, kn = sequence_moments(c.v_all[:, first:], c.k_all[:, first:])
            reach = None
        if n > 1 and reach is None:  # positions from ``first``: every row's window starts there or later
            reach = policy._key_reach(kn, case.sliding_window)  # [Hkv, L - first]
        assert c.q.is_contiguous()  # the kernel reads its rows as o's: [Hq, n, D], rows of D
        o = torch.bmm(c.probs.view(Hkv, G * n, Lc), c.v)  # [Hkv, G * n, D]: [Hq, n, D]
        p32 = policy._spent(c.scores, torch.float32).copy_(c.probs)
        s12 = torch.bmm(p32.view(Hkv, G * n, Lc), vv[:, c.keys.start - first : c.keys.stop - first])  # [Hq, n, 2D]
        del p32
        extra = policy._subnormal_weights(c, terms)  # in the spent scores' storage: after the product
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
            reach if reach is not None else kn,  # (``kn`` stands in where a block walks: n 1)
            kn.stride(0),
            c.sink_probs if sink else o,
            c.key_share if sink else o,
            terms.sinks if sink else o,
            c.alibi[0] if alibi else o,  # type: ignore[index]
            lse_arg,
            *lse_strides,
            stats,
            lstats if lstats is not None else stats,
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
            terms.a,
            terms.row_const,
            terms.pv,
            acc,
            tol,
            xmin,
            model.significand,
        )
        _launch(kernel, (Hq * n,), args, consts)
        if c.last:  # the sequence's last block: its moments and key norms go before the next
            centre = vv = kn = torch.empty(0)  # one's history comes (the oracle holds none of them)
            reach = None
        del c, o, s12, ex, args  # the block's tensors go before the next block's (args holds them too)
    return stats, lstats


def reduced(stats: torch.Tensor, per_row: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """One check's statistics from its rows' ``[T * Hq, STATS]``: ``[worst ratio (NaN where any
    is NaN), elements over, non-finite, flat index of the worst element (``per_row`` elements a
    row and head), its output, reference, bound]`` float64 ``[STATS]``, on the device (into
    ``out`` if given), in one launch. The worst is the first NaN ratio, or else the first
    largest, in (token, head, channel) order. ``stats`` has at least one row (a case has a
    token)."""
    out = torch.empty(STATS, dtype=torch.float64, device=stats.device) if out is None else out
    _launch(_compiled().reduce, (1,), (stats, stats.shape[0], per_row, out), {"NS": STATS, "BLOCK": 1024})
    return out
