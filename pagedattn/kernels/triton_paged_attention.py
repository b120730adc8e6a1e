"""Paged attention as a Triton kernel: a transcription of the tlsim fused loop.

Decode, causal prefill, partial continuation, GQA/MQA and scattered or shared
blocks, for a ragged batch. A program owns a tile of ``BLOCK_Q`` query tokens of
one sequence times all ``GROUP`` query heads of one kv head (``BLOCK_Q *
GROUP_PAD`` rows), so each K/V tile it reads serves the whole GQA group, and walks
the visible history ``BLOCK_N`` keys at a time through the block table with an
online softmax in fp32 (``_attend``, shared by both kernels).

Sequences with one new token go to ``_decode_kernel``, which also splits the
history into pieces of ``SPLIT_SIZE`` keys (``SPLIT_LONG`` for long histories)
across programs (so one long sequence fills the GPU) and writes each piece's
running max, denominator and weighted-V sum; the piece that finishes last
combines them by log-sum-exp, in a fixed order (the history's pieces in parts of
``max(1, pieces // FOLD_PARTS)``, each folded, then the parts), in the same launch. A program may walk several
pieces in one loop (``SPLIT_LOOP``), folding whole parts there and writing one state a part
(``LOOP_PARTS``), and one that walks all of its sequence's merges them in that loop and
writes nothing else (``SPLIT_WHOLE``). The other
sequences go to ``_prefill_kernel``. ``host.plan_launch`` decides, from each
sequence's own sizes only, so results never depend on the rest of the batch.
An fp8 cache is widened tile by tile after its load, to fp16 for bf16 queries
(``_query_rows``): its K and V tiles read as 16-bit pairs of fp8 values, each widened by one
``cvt`` (``_widen_pairs``, sm_89 and later; ``KV_FP8`` 4 or 5, 2 or 3 for V's alone), else by
the compiler (``_widen_rows``, ``KV_FP8`` 1; ``host.fp8_widening`` decides).

The softmax runs in base 2 (``EXP2``): the scale, times log2(e), meets the running
max in one multiply-add per score, and the max and sums stay in base 2 until the
lse is written. Prefill key tiles that every row of a query tile sees wholly (below
the causal diagonal) take no mask (``MASK_SPLIT``), and prefill programs take the
longest causal tiles first (``HEAVY_FIRST``). Decode programs run in the grid order
the host picks (``GRID_ORDER``, ``host.decode_grid``: kv heads first). Caches
whose every offset fits int32 are addressed in int32 (``OFF_I32``, ``OFFSETS_I32``),
and key indices are divided as unsigned (``_page_of``): address arithmetic was two
fifths of the prefill loop's instructions. Each switch is a host constant
(``host.EXP2_SOFTMAX``, ``PREFILL_MASK_SPLIT``, ...), so the benchmark can time the
kernel with and without it in one process.

Without a GPU, Triton runs this under its interpreter, which must be switched
on with ``TRITON_INTERPRET=1`` *before* this module (and triton) is imported:
the ``triton`` backend arranges that. The interpreter computes bf16 wrongly
(triton-lang/triton#11584: bf16 is kept as raw 16-bit integers, so ``tl.dot``
on bf16 returns garbage and fp32->bf16 casts truncate); on the interpreter,
bf16 inputs therefore run with ``UPCAST=True``: every bf16 tile is converted to
fp32 right after its load (exact), the dots run in fp32, and the result is
written to an fp32 buffer that torch rounds to bf16 on the host.

Every integer that becomes a pointer offset is computed on the host by plain
functions in ``pagedattn.kernels.host`` (``check_paged_inputs``, ``plan_launch``),
which never import triton and are tested anywhere. This module imports triton:
import it only after the interpreter has been decided.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from pagedattn.kernels.host import (  # noqa: F401  (re-exported: the host side of this kernel)
    MIN_DOT,
    LaunchConfig,
    LaunchPlan,
    Variants,
    check_paged_inputs,
    check_variants,
    fits_int32,
    fp8_widening,
    plan_launch,
)


def interpreter_active() -> bool:
    """True when Triton kernels run under the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# --------------------------------------------------------------- the kernels
@triton.jit
def _soft_cap(s, cap):
    """``cap * tanh(s / cap)``, written so that it never overflows: ``exp`` of a
    non-positive argument only (``tanh(x) = sign(x) (1 - e) / (1 + e)``, ``e = exp(-2|x|)``)."""
    x = s / cap
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return cap * tl.where(x < 0, -t, t)


@triton.jit
def _query_rows(q, scale, F16_DOTS: tl.constexpr):
    """The query tile ``q`` [ROWS, D] as the dots take it, and each row's score scale [ROWS] fp32.

    With ``F16_DOTS`` (a bf16 query over an fp8 cache) the rows become fp16, so that the
    fp8 tiles need only the hardware's one-instruction fp8->fp16 conversion (fp8->bf16
    goes through fp32 and made the fp8 decode no faster than bf16). Each row is scaled
    by a power of two ``r`` that puts its largest magnitude in [2**13, 2**14): a bf16
    value then fits fp16 exactly (8 significand bits in 11; only elements 2**37 below
    the row's largest can lose bits), and the score scale carries ``1 / r``, exactly."""
    if F16_DOTS:
        qf = q.to(tl.float32)
        amax = tl.max(tl.abs(qf), 1)
        e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF  # biased exponent: amax in [2**(e-127), 2**(e-126))
        r_exp = tl.minimum(tl.maximum(267 - e, 2), 253)  # r = 2**(140 - e), kept a normal fp32
        r = (r_exp << 23).to(tl.float32, bitcast=True)
        unscale = ((254 - r_exp) << 23).to(tl.float32, bitcast=True)  # 1 / r
        return (qf * r[:, None]).to(tl.float16), unscale * scale
    else:
        return q, tl.zeros([q.shape[0]], tl.float32) + scale


@triton.jit
def _widen_rows(x, dtype: tl.constexpr):
    """``x.to(dtype)`` for an fp8 tile [ROWS, D] whose rows are contiguous in memory.

    Written plainly, the compiler moves the conversion past the shared-memory stage and
    reads the fp8 V tile into the dot's operand layout one byte at a time (64
    ``ld.shared.b8`` per thread per tile: the cost that made fp8 decode no faster than
    bf16). The split and join keep the conversion on the loaded, row-contiguous layout,
    so the wide values are staged and read with ``ldmatrix``, as a 16-bit tile is.

    Tiles of fewer than 32 rows convert plainly: on triton 3.6 (H200) the split and join of
    a 16-row fp8 V tile gave wrong outputs (up to 1445x the bound, every row of the prefill;
    the lse right), while the plain conversion, and 32- and 64-row tiles, were right
    (``benchmarks/results/diag_fp8_small_tile.py``, 2026-11-30)."""
    if x.shape[0] < 32:
        return x.to(dtype)
    a, b = tl.split(x.reshape(x.shape[0], x.shape[1] // 2, 2))
    return tl.join(a.to(dtype), b.to(dtype)).reshape(x.shape[0], x.shape[1])


#: one pair of fp8 values (a 16-bit word, the first in its lower byte) to two fp16 values
_E4M3_PAIRS = tl.constexpr("{ .reg .b32 t; cvt.rn.f16x2.e4m3x2 t, $2; mov.b32 {$0, $1}, t; }")
_E5M2_PAIRS = tl.constexpr("{ .reg .b32 t; cvt.rn.f16x2.e5m2x2 t, $2; mov.b32 {$0, $1}, t; }")


@triton.jit
def _widen_pairs(x, E5M2: tl.constexpr):
    """``x`` [ROWS, C] uint16, each two fp8 values of a row (the first in the lower byte, as
    memory holds them), as [ROWS, 2 C] float16: one ``cvt.rn.f16x2.e4m3x2`` (``e5m2x2``) a pair,
    exact (fp16 holds every e4m3 and e5m2 value). sm_89 and later; not on the interpreter.

    ``_widen_rows`` leaves the compiler to widen bytes: it extracts each byte of the loaded
    words, reassembles pairs and converts them (~3 integer instructions a value: a third of the
    fp8 decode loop's instructions on sm_90, triton 3.6). Read as 16-bit pairs, the bytes are
    already where the conversion takes them."""
    asm: tl.constexpr = _E5M2_PAIRS if E5M2 else _E4M3_PAIRS
    lo, hi = tl.inline_asm_elementwise(asm, "=h,=h,h", [x], dtype=(tl.float16, tl.float16), is_pure=True, pack=1)
    return tl.join(lo, hi).reshape(x.shape[0], 2 * x.shape[1])


@triton.jit
def _load_pairs(cache_ptr, off, dp, pmask, kmask, MASKED: tl.constexpr):
    """The fp8 tile [BLOCK_N, HEAD_DIM_PAD // 2] of rows at element offsets ``off`` [BLOCK_N]
    (even) of ``cache_ptr``, as uint16 pairs ``dp`` (``pmask``: those within head_dim; ``kmask``:
    the keys below the history's end, with ``MASKED``); +0.0 pairs where masked."""
    pairs = cache_ptr.to(tl.pointer_type(tl.uint16), bitcast=True) + (off >> 1)[:, None] + dp[None, :]
    if MASKED:
        return tl.load(pairs, mask=kmask[:, None] & pmask[None, :], other=0)
    return tl.load(pairs, mask=pmask[None, :], other=0)


@triton.jit
def _page_of(j, BLOCK_SIZE: tl.constexpr):
    """``j // BLOCK_SIZE`` for key indices ``j >= 0``, divided as unsigned: a shift for a
    power-of-two block (a multiply-high otherwise), without a signed division's fix-ups."""
    return (j.to(tl.uint32) // BLOCK_SIZE).to(tl.int32)


@triton.jit
def _slot_of(j, BLOCK_SIZE: tl.constexpr):
    """``j % BLOCK_SIZE`` for key indices ``j >= 0`` (see ``_page_of``)."""
    return (j.to(tl.uint32) % BLOCK_SIZE).to(tl.int32)


@triton.jit
def _folded_scale(qk_scale, EXP2: tl.constexpr, USE_SOFTCAP: tl.constexpr, USE_ALIBI: tl.constexpr):
    """``_step``'s ``s_scale`` [ROWS]: the rows' score scale times log2(e) where ``_step`` folds
    the scale into the exponent (its ``FOLD``: base 2, no soft-cap, no ALiBi), else the scale."""
    if EXP2 and not (USE_SOFTCAP or USE_ALIBI):
        return qk_scale * 1.4426950408889634
    else:
        return qk_scale


@triton.jit
def _step(
    q,
    m,
    l_sum,
    acc,
    blk,
    j,
    kmask,
    k_cache_ptr,
    v_cache_ptr,
    kv_head,
    pos,
    slopes,
    qk_scale,
    s_scale,
    window,
    soft_cap,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE_FP32: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    KV_FP8: tl.constexpr,
    OFF_I32: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    EXP2: tl.constexpr,
):
    """One key tile of the online softmax: the keys ``j`` [BLOCK_N] (int32; ``kmask``: those
    that exist, below the history's or the split's end) in the cache blocks ``blk`` [BLOCK_N]
    join the rows' running max ``m`` [ROWS], denominator ``l_sum`` [ROWS] and weighted-V sum
    ``acc`` [ROWS, HEAD_DIM_PAD] (fp32), which come back updated. Without ``MASKED`` every key
    is visible to every row: no mask is computed. Shared by ``_attend_tiles`` (prefill) and the
    decode kernel's loop, so both compute a tile alike."""
    d = tl.arange(0, HEAD_DIM_PAD)
    dmask = d < HEAD_DIM
    # FOLD: scores stay unscaled until the exponent, where the scale (with log2(e)) and the
    # max meet in one fused multiply-add; soft-cap and ALiBi need the scaled score first
    # (``_folded_scale``, which forms ``s_scale``, tests the same condition).
    FOLD: tl.constexpr = EXP2 and not (USE_SOFTCAP or USE_ALIBI)
    slot = _slot_of(j, BLOCK_SIZE)
    if OFF_I32:  # every element offset of both caches fits int32 (``run``: ``fits_int32``)
        k_off = blk * stride_kb + slot * stride_ks + kv_head * stride_kh  # [BLOCK_N]
        v_off = blk * stride_vb + slot * stride_vs + kv_head * stride_vh
    else:  # every term in int64: a head-major cache's head stride alone can pass 2**31
        blk, slot_w, head_w = blk.to(tl.int64), slot.to(tl.int64), kv_head.to(tl.int64)
        k_off = blk * stride_kb + slot_w * stride_ks + head_w * stride_kh
        v_off = blk * stride_vb + slot_w * stride_vs + head_w * stride_vh
    if KV_FP8 >= 2:
        dp = tl.arange(0, HEAD_DIM_PAD // 2)
        pmask = dp < HEAD_DIM // 2
    if KV_FP8 >= 4:
        kt = _load_pairs(k_cache_ptr, k_off, dp, pmask, kmask, MASKED)
    elif MASKED:
        kt = tl.load(k_cache_ptr + k_off[None, :] + d[:, None], mask=kmask[None, :] & dmask[:, None], other=0.0)
    else:
        kt = tl.load(k_cache_ptr + k_off[None, :] + d[:, None], mask=dmask[:, None], other=0.0)
    if KV_FP8 >= 2:  # V as 16-bit pairs of fp8 values (``FP8_PAIRS``: even offsets, checked by ``run``)
        v = _load_pairs(v_cache_ptr, v_off, dp, pmask, kmask, MASKED)
    elif MASKED:
        v = tl.load(v_cache_ptr + v_off[:, None] + d[None, :], mask=kmask[:, None] & dmask[None, :], other=0.0)
    else:
        v = tl.load(v_cache_ptr + v_off[:, None] + d[None, :], mask=dmask[None, :], other=0.0)
    if KV_FP8:  # fp8 -> the dots' dtype is exact (fewer exponent and significand bits)
        if KV_FP8 >= 4:
            kt = tl.trans(_widen_pairs(kt, KV_FP8 == 5))
        else:
            kt = kt.to(q.dtype)
        if KV_FP8 >= 2:
            v = _widen_pairs(v, KV_FP8 % 2 == 1)
        else:
            v = _widen_rows(v, q.dtype)
    elif UPCAST:
        kt = kt.to(tl.float32)
        v = v.to(tl.float32)
    if IEEE_FP32:
        s = tl.dot(q, kt, input_precision="ieee")  # [ROWS, BLOCK_N]
    else:
        s = tl.dot(q, kt)
    if not FOLD:
        s = s * qk_scale[:, None]
        if USE_SOFTCAP:  # on the scores, before any mask: a masked score stays -inf
            s = _soft_cap(s, soft_cap)
        if USE_ALIBI:
            s += slopes[:, None] * (j[None, :] - pos[:, None]).to(tl.float32)
        if EXP2:
            s = s * 1.4426950408889634  # log2(e): the running max and sum are in base 2
    if MASKED:
        # masked loads gave zero keys, and a zero key still scores: force them out
        visible = kmask[None, :]
        if CAUSAL:
            visible = visible & (j[None, :] <= pos[:, None])
        if USE_WINDOW:
            visible = visible & (j[None, :] > pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
    if FOLD:
        # s_scale > 0, so the scaled max is the max of the scaled scores
        m_new = tl.maximum(m, tl.max(s, 1) * s_scale)
    else:
        m_new = tl.maximum(m, tl.max(s, 1))
    if MASKED:
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
    else:
        m_safe = m_new  # every row saw a finite score
    if EXP2:
        alpha = tl.exp2(m - m_safe)  # rescale what was accumulated under the old max
        if FOLD:
            p = tl.exp2(s * s_scale[:, None] - m_safe[:, None])
        else:
            p = tl.exp2(s - m_safe[:, None])
    else:
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
    l_sum = l_sum * alpha + tl.sum(p, 1)
    if IEEE_FP32:
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    acc = acc * alpha[:, None] + pv
    return m_new, l_sum, acc


@triton.jit
def _attend_tiles(
    q,
    m,
    l_sum,
    acc,
    blk_next,
    k_cache_ptr,
    v_cache_ptr,
    table_ptr,
    kv_head,
    start,
    stop,
    hi,
    pos,
    slopes,
    qk_scale,
    s_scale,
    window,
    soft_cap,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE_FP32: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    KV_FP8: tl.constexpr,
    TABLE_AHEAD: tl.constexpr,
    OFF_I32: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    EXP2: tl.constexpr,
):
    """The key tiles ``start, start + BLOCK_N, .. < stop`` of ``_attend`` (``hi``: the
    history's end, which bounds every load). Without ``MASKED`` every key of every tile
    is below ``hi`` and visible to every row: no mask is computed and no row can be
    empty. ``blk_next`` [BLOCK_N] carries the first tile's block-table entries
    (``TABLE_AHEAD``); the next loop's come back with the state."""
    for j0 in range(start, stop, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        kmask = j < hi
        # TABLE_AHEAD: each step loads the next tile's block-table entries, one step ahead. Loaded
        # in the step that uses them, they make the K and V loads indirect, and triton (3.6 and
        # 3.9, sm_90) then waits for every copy in flight at the top of each step
        # (cp.async.wait_group 0): one tile in flight, its latency paid every step. Carried
        # from the step before, the K and V tiles are multi-buffered (wait_group 2 at 3 stages).
        if TABLE_AHEAD:
            blk = blk_next
            j_next = j + BLOCK_N
            blk_next = tl.load(table_ptr + _page_of(j_next, BLOCK_SIZE), mask=j_next < hi, other=0)
        else:
            blk = tl.load(table_ptr + _page_of(j, BLOCK_SIZE), mask=kmask, other=0)
        m, l_sum, acc = _step(
            q,
            m,
            l_sum,
            acc,
            blk,
            j,
            kmask,
            k_cache_ptr,
            v_cache_ptr,
            kv_head,
            pos,
            slopes,
            qk_scale,
            s_scale,
            window,
            soft_cap,
            stride_kb,
            stride_ks,
            stride_kh,
            stride_vb,
            stride_vs,
            stride_vh,
            HEAD_DIM,
            HEAD_DIM_PAD,
            BLOCK_SIZE,
            UPCAST,
            IEEE_FP32,
            USE_WINDOW,
            USE_SOFTCAP,
            USE_ALIBI,
            KV_FP8,
            OFF_I32,
            MASKED,
            CAUSAL,
            EXP2,
        )
    return m, l_sum, acc, blk_next


@triton.jit
def _attend(
    q,
    m,
    l_sum,
    acc,
    k_cache_ptr,
    v_cache_ptr,
    table_ptr,
    kv_head,
    lo,
    full_hi,
    hi,
    pos,
    slopes,
    qk_scale,
    window,
    soft_cap,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE_FP32: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    KV_FP8: tl.constexpr,
    TABLE_AHEAD: tl.constexpr,
    OFF_I32: tl.constexpr,
    CAUSAL: tl.constexpr,
    EXP2: tl.constexpr,
    MASK_SPLIT: tl.constexpr,
):
    """Online softmax of the rows ``q`` [ROWS, D] over keys ``lo .. hi-1`` of one
    sequence (its block-table row at ``table_ptr``); row ``r`` sees keys ``<= pos[r]``
    (with ``CAUSAL``; else every key below ``hi``) and ``> pos[r] - window`` with
    ``USE_WINDOW``. Keys ``lo .. full_hi-1`` (``full_hi - lo`` a multiple of ``BLOCK_N``)
    are visible to every row: with ``MASK_SPLIT`` their tiles skip the mask. ``qk_scale`` [ROWS] scales each
    row's scores (the softmax scale, an fp8 cache's ``k_scale``, ``_query_rows``'s
    unscaling); ``slopes`` [ROWS] are the rows' ALiBi slopes (unused without ``USE_ALIBI``).
    With ``EXP2`` the returned max ``m`` is in base 2 (natural-log units times log2(e))."""
    s_scale = _folded_scale(qk_scale, EXP2, USE_SOFTCAP, USE_ALIBI)
    j_next = lo + tl.arange(0, BLOCK_N)
    blk_next = tl.load(table_ptr + _page_of(j_next, BLOCK_SIZE), mask=j_next < hi, other=0)
    if MASK_SPLIT:  # without it, every tile takes the masked path (full_hi is ignored)
        m, l_sum, acc, blk_next = _attend_tiles(
            q,
            m,
            l_sum,
            acc,
            blk_next,
            k_cache_ptr,
            v_cache_ptr,
            table_ptr,
            kv_head,
            lo,
            full_hi,
            hi,
            pos,
            slopes,
            qk_scale,
            s_scale,
            window,
            soft_cap,
            stride_kb,
            stride_ks,
            stride_kh,
            stride_vb,
            stride_vs,
            stride_vh,
            BLOCK_N,
            HEAD_DIM,
            HEAD_DIM_PAD,
            BLOCK_SIZE,
            UPCAST,
            IEEE_FP32,
            USE_WINDOW,
            USE_SOFTCAP,
            USE_ALIBI,
            KV_FP8,
            TABLE_AHEAD,
            OFF_I32,
            False,
            CAUSAL,
            EXP2,
        )
        start = full_hi
    else:
        start = lo
    m, l_sum, acc, blk_next = _attend_tiles(
        q,
        m,
        l_sum,
        acc,
        blk_next,
        k_cache_ptr,
        v_cache_ptr,
        table_ptr,
        kv_head,
        start,
        hi,
        hi,
        pos,
        slopes,
        qk_scale,
        s_scale,
        window,
        soft_cap,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_vb,
        stride_vs,
        stride_vh,
        BLOCK_N,
        HEAD_DIM,
        HEAD_DIM_PAD,
        BLOCK_SIZE,
        UPCAST,
        IEEE_FP32,
        USE_WINDOW,
        USE_SOFTCAP,
        USE_ALIBI,
        KV_FP8,
        TABLE_AHEAD,
        OFF_I32,
        True,
        CAUSAL,
        EXP2,
    )
    return m, l_sum, acc


#: integer arguments the JIT must not specialize (on 1, on divisibility by 16): each value class
#: would be a kernel of its own to compile, and none of them shapes a vectorized access (the
#: H200 thorough profile compiled 182 decode kernels for 139 configurations with them specialized)
#: (Not ``stride_pa_seq``: its divisibility by 16, always true, vectorizes the merge's loads.)
#: The prefill kernel has the first three; the decode kernel all.
_PLAIN_INTS_PREFILL = ("window", "stride_bt", "stride_lt")
_PLAIN_INTS = (*_PLAIN_INTS_PREFILL, "n_kv_heads", "n_groups", "splits_per_program", "stride_pml_seq")


@triton.jit(do_not_specialize=list(_PLAIN_INTS_PREFILL))
def _prefill_kernel(
    # pointers
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    seq_ids_ptr,
    alibi_ptr,
    sinks_ptr,
    out_ptr,
    lse_ptr,
    # sizes
    scale,
    v_scale,
    window,
    soft_cap,
    # strides (elements)
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    stride_ot,
    stride_oh,
    stride_lt,
    # meta-parameters
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE_FP32: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    USE_SINKS: tl.constexpr,
    KV_FP8: tl.constexpr,
    F16_DOTS: tl.constexpr,
    TABLE_AHEAD: tl.constexpr,
    OFF_I32: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    EXP2: tl.constexpr,
    MASK_SPLIT: tl.constexpr,
    HEAVY_FIRST: tl.constexpr,
):
    """One tile of ``BLOCK_Q`` query tokens of one sequence times one kv head's query
    group. ``EXP2``: the softmax in base 2 with the scale folded in (``_attend_tiles``);
    ``MASK_SPLIT``: the key tiles every row sees wholly take no mask; ``HEAVY_FIRST``:
    the grid's (q_tile, kv_head) programs are taken in the order of decreasing q_tile,
    all kv heads of a q_tile together, so the longest (causal) tiles start first and the
    short ones fill the tail."""
    seq = tl.load(seq_ids_ptr + tl.program_id(0))
    if HEAVY_FIRST:
        n_tiles = tl.num_programs(1)
        n_heads = tl.num_programs(2)
        order = tl.program_id(1) + n_tiles * tl.program_id(2)  # the order programs are launched in
        q_tile = n_tiles - 1 - order // n_heads
        kv_head = order % n_heads
    else:
        q_tile = tl.program_id(1)
        kv_head = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_tile * BLOCK_Q < q_len:  # the grid is sized for the longest query of the launch
        ROWS: tl.constexpr = BLOCK_Q * GROUP_PAD
        r = tl.arange(0, ROWS)
        tok = q_tile * BLOCK_Q + r // GROUP_PAD  # query index within the sequence
        g = r % GROUP_PAD
        row_mask = (tok < q_len) & (g < GROUP)
        head = kv_head * GROUP + g
        d = tl.arange(0, HEAD_DIM_PAD)
        dmask = d < HEAD_DIM
        q_off = (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
        q = tl.load(q_ptr + q_off, mask=row_mask[:, None] & dmask[None, :], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        q, qk_scale = _query_rows(q, scale, F16_DOTS)
        context = seq_len - q_len
        pos = context + tok  # absolute position of each row: it sees keys 0..pos
        n_keys = context + tl.minimum(q_len, (q_tile + 1) * BLOCK_Q)  # visible to the tile's last row
        lo = 0
        if USE_WINDOW:  # the tile's first row sees nothing before its window
            lo = tl.maximum(0, context + q_tile * BLOCK_Q - window + 1)
        slopes = tl.load(alibi_ptr + head, mask=row_mask, other=0.0) if USE_ALIBI else tl.zeros([ROWS], tl.float32)
        m = tl.full([ROWS], float("-inf"), dtype=tl.float32)
        l_sum = tl.zeros([ROWS], dtype=tl.float32)
        acc = tl.zeros([ROWS, HEAD_DIM_PAD], dtype=tl.float32)
        # keys below the tile's first row's position are visible to every row (no window):
        # whole tiles of them skip the mask; the rest (the diagonal) is masked
        full_hi = lo
        if not USE_WINDOW:
            full_hi = lo + (context + q_tile * BLOCK_Q + 1 - lo) // BLOCK_N * BLOCK_N
        m, l_sum, acc = _attend(
            q,
            m,
            l_sum,
            acc,
            k_cache_ptr,
            v_cache_ptr,
            block_tables_ptr + seq * stride_bt,
            kv_head,
            lo,
            full_hi,
            n_keys,
            pos,
            slopes,
            qk_scale,
            window,
            soft_cap,
            stride_kb,
            stride_ks,
            stride_kh,
            stride_vb,
            stride_vs,
            stride_vh,
            BLOCK_N,
            HEAD_DIM,
            HEAD_DIM_PAD,
            BLOCK_SIZE,
            UPCAST,
            IEEE_FP32,
            USE_WINDOW,
            USE_SOFTCAP,
            USE_ALIBI,
            KV_FP8,
            TABLE_AHEAD,
            OFF_I32,
            True,
            EXP2,
            MASK_SPLIT,
        )
        if USE_SINKS:
            # the sink joins once, after the keys (weight exp(sink - m), no value), as in the decode
            # merge. Seeding the running max with it weighed every key relative to the sink: under
            # a sink far above a row's keys, the weights fell below fp16's range where fp16 dots
            # (F16_DOTS) meet V, and the row came out 0 (H200 thorough search, 2026-12-01)
            sink = tl.load(sinks_ptr + head, mask=row_mask, other=float("-inf")).to(tl.float32)
            if EXP2:
                sink = sink * 1.4426950408889634
            m_new = tl.maximum(m, sink)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # padding rows
            if EXP2:
                alpha = tl.exp2(m - m_safe)
                l_sum = l_sum * alpha + tl.exp2(sink - m_safe)
            else:
                alpha = tl.exp(m - m_safe)
                l_sum = l_sum * alpha + tl.exp(sink - m_safe)
            acc = acc * alpha[:, None]
            m = m_new
        l_safe = tl.where(row_mask, l_sum, 1.0)  # padding rows are never stored
        result = acc * (v_scale / l_safe)[:, None]
        o_off = (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
        tl.store(out_ptr + o_off, result.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & dmask[None, :])
        if WRITE_LSE:
            if EXP2:
                lse = (m + tl.log2(l_safe)) * 0.6931471805599453
            else:
                lse = m + tl.log(l_safe)
            tl.store(lse_ptr + (q_start + tok) * stride_lt + head, lse, mask=row_mask)


@triton.jit
def _combine(m, l_sum, acc, m_s, l_s, acc_s, EXP2: tl.constexpr):
    """A running merge of split states, the next split's ``(m_s, l_s, acc_s)`` into ``(m, l_sum, acc)``
    ([ROWS], [ROWS], [ROWS, HEAD_DIM_PAD] fp32; maxima in base 2 with ``EXP2``). From ``m = -inf,
    l_sum = 0, acc = 0`` it returns the first state exactly (weights 0 and 1)."""
    m_new = tl.maximum(m, m_s)
    # both maxima -inf (a split whose every score is -inf, folded into the identity): weights 0,
    # not exp(-inf - -inf) = NaN; a finite maximum is unchanged, so are the bits
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    if EXP2:  # the partial maxima are in base 2
        a = tl.exp2(m - m_safe)
        b = tl.exp2(m_s - m_safe)
    else:
        a = tl.exp(m - m_safe)
        b = tl.exp(m_s - m_safe)
    l_sum = l_sum * a + l_s * b
    acc = acc * a[:, None] + acc_s * b[:, None]
    return m_new, l_sum, acc


@triton.jit
def _identity(ROWS: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """The merge's identity (``_combine``): ``m = -inf, l_sum = 0, acc = 0`` ([ROWS], [ROWS],
    [ROWS, HEAD_DIM_PAD] fp32), also the running softmax's start."""
    m = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    return m, tl.zeros([ROWS], dtype=tl.float32), tl.zeros([ROWS, HEAD_DIM_PAD], dtype=tl.float32)


@triton.jit
def _store_state(pa, pml, slot, m, l_sum, acc, row_mask, stride_pa_split, stride_pml_split):
    """A split's or part's state (``m, l_sum, acc``: [ROWS], [ROWS], [ROWS, HEAD_DIM_PAD] fp32) to
    the scratch's ``slot`` (``pa``: [ROWS, HEAD_DIM_PAD], ``pml``: [ROWS] pointers at slot 0)."""
    tl.store(pa + slot * stride_pa_split, acc, mask=row_mask[:, None])
    tl.store(pml + slot * stride_pml_split, m, mask=row_mask)
    tl.store(pml + slot * stride_pml_split + 1, l_sum, mask=row_mask)


@triton.jit
def _load_state(pa, pml, slot, row_mask, stride_pa_split, stride_pml_split):
    """The state ``_store_state`` wrote to ``slot``, for the merge: loaded .cg (through L2, where
    other programs stored it; an SM's L1 may hold a stale line)."""
    m = tl.load(pml + slot * stride_pml_split, mask=row_mask, other=0.0, cache_modifier=".cg")
    l_sum = tl.load(pml + slot * stride_pml_split + 1, mask=row_mask, other=1.0, cache_modifier=".cg")
    acc = tl.load(pa + slot * stride_pa_split, mask=row_mask[:, None], other=0.0, cache_modifier=".cg")
    return m, l_sum, acc


@triton.jit
def _finish(
    m,
    l_sum,
    acc,
    sinks_ptr,
    head,
    row_mask,
    v_scale,
    o_ptrs,
    o_mask,
    lse_ptrs,
    USE_SINKS: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    EXP2: tl.constexpr,
):
    """A decode row's end: the sink joins the merged state ``(m, l_sum, acc)``, and the output
    (``o_ptrs`` [ROWS, HEAD_DIM_PAD], under ``o_mask``) and the lse (``lse_ptrs`` [ROWS]) are written."""
    if USE_SINKS:
        sink = tl.load(sinks_ptr + head, mask=row_mask, other=0.0)
        if EXP2:
            sink = sink * 1.4426950408889634
            m_new = tl.maximum(m, sink)
            a = tl.exp2(m - m_new)
            l_sum = l_sum * a + tl.exp2(sink - m_new)
        else:
            m_new = tl.maximum(m, sink)
            a = tl.exp(m - m_new)
            l_sum = l_sum * a + tl.exp(sink - m_new)
        acc = acc * a[:, None]
        m = m_new
    result = acc * (v_scale / l_sum)[:, None]
    tl.store(o_ptrs, result.to(o_ptrs.dtype.element_ty), mask=o_mask)
    if WRITE_LSE:
        if EXP2:
            lse = (m + tl.log2(l_sum)) * 0.6931471805599453
        else:
            lse = m + tl.log(l_sum)
        tl.store(lse_ptrs, lse, mask=row_mask)


@triton.jit(do_not_specialize=list(_PLAIN_INTS))
def _decode_kernel(
    # pointers
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    seq_ids_ptr,
    alibi_ptr,
    sinks_ptr,
    part_acc_ptr,
    part_ml_ptr,
    done_ptr,
    out_ptr,
    lse_ptr,
    # sizes
    scale,
    v_scale,
    window,
    soft_cap,
    n_kv_heads,
    n_groups,
    splits_per_program,
    # strides (elements); partials are [n_decode, plan.scratch_splits, num_heads, HEAD_DIM_PAD] and [..., 2]
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    stride_pa_seq,
    stride_pa_split,
    stride_pml_seq,
    stride_pml_split,
    stride_ot,
    stride_oh,
    stride_lt,
    # meta-parameters
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SPLIT_SIZE: tl.constexpr,
    SPLIT_LONG: tl.constexpr,
    LONG_FROM: tl.constexpr,
    SPLIT_SHORT: tl.constexpr,
    SHORT_UNDER: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE_FP32: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    USE_SINKS: tl.constexpr,
    KV_FP8: tl.constexpr,
    F16_DOTS: tl.constexpr,
    TABLE_AHEAD: tl.constexpr,
    OFF_I32: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    EXP2: tl.constexpr,
    GRID_ORDER: tl.constexpr,
    SPLIT_LOOP: tl.constexpr,
    SPLIT_WHOLE: tl.constexpr,
    FOLD_PARTS: tl.constexpr,
    LOOP_PARTS: tl.constexpr,
):
    """``splits_per_program`` consecutive splits of one decode sequence's history for one kv
    head's query group (the grid's ``n_groups`` programs of a sequence and kv head cover the
    longest history's splits): one split through ``_attend``, or with ``SPLIT_LOOP`` any
    number in one loop over their tiles. The program whose count completes the sequence's
    splits merges them all (one launch: no second kernel to wait for). With ``SPLIT_WHOLE``
    each program walks every split of its sequence and merges them in its loop instead, in
    the merge's order with the same arithmetic (``_combine``), and stores, counts and reads
    nothing.

    Otherwise each split writes its running max, denominator and weighted-V sum (or, with
    ``LOOP_PARTS``, each part of ``fold`` splits its folded state); then its program counts the
    splits it did in ``done_ptr`` [n_decode, num_kv_heads] int32 (zero between launches: the
    merging program resets it, so a captured CUDA graph can replay the launch). The merge's
    order is the history's own: its splits in parts of ``fold`` (``n_splits // FOLD_PARTS``), each
    folded from the identity in split order, then the parts in order; whoever ran them: the
    same bits in any batch, any launch shape and any schedule. The sink joins there, once,
    not in every split."""
    if GRID_ORDER == 1:
        # one axis, kv heads fastest: the programs of one split of one sequence start
        # together and read the same pages (a page row holds every kv head) at once
        pid = tl.program_id(0)
        kv_head = pid % n_kv_heads
        grp = (pid // n_kv_heads) % n_groups
        i = pid // (n_kv_heads * n_groups)  # index among the decode sequences
    elif GRID_ORDER == 2:  # the same order on three axes
        kv_head = tl.program_id(0)
        grp = tl.program_id(1)
        i = tl.program_id(2)
    else:
        i = tl.program_id(0)  # index among the decode sequences
        grp = tl.program_id(1)
        kv_head = tl.program_id(2)
    seq = tl.load(seq_ids_ptr + i)
    seq_len = tl.load(seq_lens_ptr + seq)
    first = 0
    if USE_WINDOW:  # the new token's first visible key: splits wholly before it have no work
        first = tl.maximum(0, seq_len - window)
    split_size = tl.where(seq_len >= LONG_FROM, SPLIT_LONG, SPLIT_SIZE)  # host.decode_split
    if SHORT_UNDER > 0:
        split_size = tl.where(seq_len < SHORT_UNDER, SPLIT_SHORT, split_size)
    first_split = first // split_size
    n_splits = (seq_len + split_size - 1) // split_size
    # The merge's order (the same in any batch and launch shape): each part of ``fold``
    # consecutive splits folded from the merge's identity, then the parts, in order (``fold`` from
    # the history's length alone, the host's ``decode_fold``: keep the two alike; 0: the
    # splits in one fold). With ``LOOP_PARTS`` (the host's choice: every program's splits are
    # whole parts, the split loop's programs starting at multiples of ``fold``) a program folds
    # its parts in its loop and stores one state a part: fewer stores, a shorter merge.
    fold = n_splits * 0 + 1
    if FOLD_PARTS > 0:
        fold = tl.maximum(n_splits // FOLD_PARTS, 1)
    # this program's splits: sa .. sb-1 (the grid is sized for the longest history of the launch)
    sa = tl.maximum(grp * splits_per_program, first_split)
    sb = tl.minimum(grp * splits_per_program + splits_per_program, n_splits)
    if sa < sb:
        t = tl.load(query_start_loc_ptr + seq)
        g = tl.arange(0, GROUP_PAD)
        head = kv_head * GROUP + g
        row_mask = g < GROUP
        d = tl.arange(0, HEAD_DIM_PAD)
        dmask = d < HEAD_DIM
        q = tl.load(
            q_ptr + t * stride_qt + head[:, None] * stride_qh + d[None, :],
            mask=row_mask[:, None] & dmask[None, :],
            other=0.0,
        )
        if UPCAST:
            q = q.to(tl.float32)
        q, qk_scale = _query_rows(q, scale, F16_DOTS)
        pos = tl.full([GROUP_PAD], 0, dtype=tl.int32) + (seq_len - 1)  # the new token sees everything
        slopes = tl.load(alibi_ptr + head, mask=row_mask, other=0.0) if USE_ALIBI else tl.zeros([GROUP_PAD], tl.float32)
        m, l_sum, acc = _identity(GROUP_PAD, HEAD_DIM_PAD)
        if not SPLIT_LOOP:  # one split a program (the host sets splits_per_program 1)
            lo = tl.maximum(sa * split_size, first)
            hi = tl.minimum(seq_len, sa * split_size + split_size)
            m, l_sum, acc = _attend(
                q,
                m,
                l_sum,
                acc,
                k_cache_ptr,
                v_cache_ptr,
                block_tables_ptr + seq * stride_bt,
                kv_head,
                lo,
                lo,
                hi,
                pos,
                slopes,
                qk_scale,
                window,
                soft_cap,
                stride_kb,
                stride_ks,
                stride_kh,
                stride_vb,
                stride_vs,
                stride_vh,
                BLOCK_N,
                HEAD_DIM,
                HEAD_DIM_PAD,
                BLOCK_SIZE,
                UPCAST,
                IEEE_FP32,
                USE_WINDOW,
                USE_SOFTCAP,
                USE_ALIBI,
                KV_FP8,
                TABLE_AHEAD,
                OFF_I32,
                False,
                EXP2,
                False,
            )
            # the scratch's addresses formed after the loop, in each branch: formed before the
            # branch they stayed live through this loop (sm_90, triton 3.6: 146 registers, not 118)
            pa = part_acc_ptr + i * stride_pa_seq + head[:, None] * HEAD_DIM_PAD + d[None, :]  # [GROUP_PAD, D]
            pml = part_ml_ptr + i * stride_pml_seq + head * 2  # [GROUP_PAD]
            _store_state(pa, pml, sa, m, l_sum, acc, row_mask, stride_pa_split, stride_pml_split)
        else:
            s_scale = _folded_scale(qk_scale, EXP2, USE_SOFTCAP, USE_ALIBI)
            pa = part_acc_ptr + i * stride_pa_seq + head[:, None] * HEAD_DIM_PAD + d[None, :]  # [GROUP_PAD, D]
            pml = part_ml_ptr + i * stride_pml_seq + head * 2  # [GROUP_PAD]
            table_ptr = block_tables_ptr + seq * stride_bt
            # One loop over the tiles of every split of the program, so the K/V pipeline runs on
            # across a split's end, where the split's state is stored (or, ``SPLIT_WHOLE``, merged)
            # and restarted: each split
            # computes the same bits as a program of its own would (``splits_per_program`` is a
            # launch shape, not a numerical choice). A split starts at its first visible key
            # (the window's start in the first split) and ends at its last: tiles are masked there.
            split = sa
            j0 = tl.maximum(sa * split_size, first)
            end = tl.minimum(sa * split_size + split_size, seq_len)
            n_tiles = (end - j0 + BLOCK_N - 1) // BLOCK_N
            rest_hi = tl.minimum(sb * split_size, seq_len)
            rest_lo = sa * split_size + split_size
            n_tiles += tl.maximum(rest_hi - rest_lo + BLOCK_N - 1, 0) // BLOCK_N
            j_next = j0 + tl.arange(0, BLOCK_N)
            blk_next = tl.load(table_ptr + _page_of(j_next, BLOCK_SIZE), mask=j_next < end, other=0)
            if SPLIT_WHOLE:  # the merged state so far, from the merge's identity (``_combine``)
                m_all, l_all, acc_all = _identity(GROUP_PAD, HEAD_DIM_PAD)
            if FOLD_PARTS > 0 and (SPLIT_WHOLE or LOOP_PARTS):  # the current part (index, last split), its state
                part = sa // fold
                part_last = tl.minimum(part * fold + fold, n_splits) - 1  # counted on: no division in the loop
                m_p, l_p, acc_p = _identity(GROUP_PAD, HEAD_DIM_PAD)
            for _ in range(0, n_tiles):
                j = j0 + tl.arange(0, BLOCK_N)
                # the next tile: on in this split, or the next split's first
                wrap = j0 + BLOCK_N >= end
                next_split = split + wrap.to(tl.int32)
                next_j0 = tl.where(wrap, next_split * split_size, j0 + BLOCK_N)
                next_end = tl.where(wrap, tl.minimum(next_j0 + split_size, seq_len), end)
                # the block-table entries a step ahead, always (``TABLE_AHEAD`` is ``_attend_tiles``'
                # switch: this loop has no single-buffered form)
                blk = blk_next
                j_next = next_j0 + tl.arange(0, BLOCK_N)
                blk_next = tl.load(table_ptr + _page_of(j_next, BLOCK_SIZE), mask=j_next < next_end, other=0)
                m, l_sum, acc = _step(
                    q,
                    m,
                    l_sum,
                    acc,
                    blk,
                    j,
                    j < end,
                    k_cache_ptr,
                    v_cache_ptr,
                    kv_head,
                    pos,
                    slopes,
                    qk_scale,
                    s_scale,
                    window,
                    soft_cap,
                    stride_kb,
                    stride_ks,
                    stride_kh,
                    stride_vb,
                    stride_vs,
                    stride_vh,
                    HEAD_DIM,
                    HEAD_DIM_PAD,
                    BLOCK_SIZE,
                    UPCAST,
                    IEEE_FP32,
                    USE_WINDOW,
                    USE_SOFTCAP,
                    USE_ALIBI,
                    KV_FP8,
                    OFF_I32,
                    True,
                    False,
                    EXP2,
                )
                if wrap:  # the split's last tile: its state to the scratch (or merged here), a fresh one next
                    # (parts of one split are the splits: folding one from the identity gives its
                    # state, so they take the plain path)
                    if SPLIT_WHOLE:
                        if FOLD_PARTS > 0 and fold > 1:  # into the part; a finished part into the whole
                            m_p, l_p, acc_p = _combine(m_p, l_p, acc_p, m, l_sum, acc, EXP2)
                            if split == part_last:
                                m_all, l_all, acc_all = _combine(m_all, l_all, acc_all, m_p, l_p, acc_p, EXP2)
                                m_p, l_p, acc_p = _identity(GROUP_PAD, HEAD_DIM_PAD)
                                part_last = tl.minimum(part_last + fold, n_splits - 1)
                        else:
                            m_all, l_all, acc_all = _combine(m_all, l_all, acc_all, m, l_sum, acc, EXP2)
                    elif LOOP_PARTS:
                        if fold > 1:  # into the part; a finished part stored in its slot
                            m_p, l_p, acc_p = _combine(m_p, l_p, acc_p, m, l_sum, acc, EXP2)
                            if split == part_last:
                                _store_state(
                                    pa, pml, part, m_p, l_p, acc_p, row_mask, stride_pa_split, stride_pml_split
                                )
                                m_p, l_p, acc_p = _identity(GROUP_PAD, HEAD_DIM_PAD)
                                part += 1
                                part_last = tl.minimum(part_last + fold, n_splits - 1)
                        else:
                            _store_state(pa, pml, split, m, l_sum, acc, row_mask, stride_pa_split, stride_pml_split)
                    else:
                        _store_state(pa, pml, split, m, l_sum, acc, row_mask, stride_pa_split, stride_pml_split)
                    m, l_sum, acc = _identity(GROUP_PAD, HEAD_DIM_PAD)
                split = next_split
                j0 = next_j0
                end = next_end
            if SPLIT_WHOLE:  # the program merged every split of its sequence, in the merge's order: done
                _finish(
                    m_all,
                    l_all,
                    acc_all,
                    sinks_ptr,
                    head,
                    row_mask,
                    v_scale,
                    out_ptr + t * stride_ot + head[:, None] * stride_oh + d[None, :],
                    row_mask[:, None] & dmask[None, :],
                    lse_ptr + t * stride_lt + head,
                    USE_SINKS,
                    WRITE_LSE,
                    EXP2,
                )
        if not SPLIT_WHOLE:  # (with it, the program merged its sequence's splits in the loop above)
            # every thread's stores precede the count (the barrier), and the count releases
            # them to the merging program, which acquires them with its own count
            tl.debug_barrier()
            done = done_ptr + i * n_kv_heads + kv_head
            if tl.atomic_add(done, sb - sa, sem="acq_rel") == n_splits - first_split - (sb - sa):
                tl.atomic_xchg(done, 0)  # ready for the next launch (or graph replay)
                # a running merge in the merge's order (the same bits in any batch and any
                # schedule), from the first split with visible keys (``_combine`` guards a
                # row whose maxima are all -inf). The loads are .cg (L2, where the other programs'
                # stores are; an SM's L1 may hold a stale line), and the loop is not pipelined:
                # a pipelined load becomes cp.async.ca, which reads through L1
                # (test_kernel_compiles_for_hopper_without_a_gpu checks the machine code).
                if FOLD_PARTS > 0:  # the parts in order, each folded from the identity
                    m, l_sum, acc = _identity(GROUP_PAD, HEAD_DIM_PAD)
                    one_level = fold == 1  # parts of one split: the splits
                    if LOOP_PARTS:
                        one_level = fold > 0
                    if one_level:  # stored as parts
                        for c in tl.range(first_split // fold, (n_splits + fold - 1) // fold, num_stages=1):
                            m_s, l_s, acc_s = _load_state(pa, pml, c, row_mask, stride_pa_split, stride_pml_split)
                            m, l_sum, acc = _combine(m, l_sum, acc, m_s, l_s, acc_s, EXP2)
                    else:  # stored as splits: each part folded here, then into the whole at its end
                        m_c, l_c, acc_c = _identity(GROUP_PAD, HEAD_DIM_PAD)
                        last = tl.minimum((first_split // fold) * fold + fold, n_splits) - 1
                        for s in tl.range(first_split, n_splits, num_stages=1):
                            m_s, l_s, acc_s = _load_state(pa, pml, s, row_mask, stride_pa_split, stride_pml_split)
                            m_c, l_c, acc_c = _combine(m_c, l_c, acc_c, m_s, l_s, acc_s, EXP2)
                            if s == last:
                                m, l_sum, acc = _combine(m, l_sum, acc, m_c, l_c, acc_c, EXP2)
                                m_c, l_c, acc_c = _identity(GROUP_PAD, HEAD_DIM_PAD)
                                last = tl.minimum(last + fold, n_splits - 1)
                else:  # the splits in one fold, from the first one's state
                    m, l_sum, acc = _load_state(pa, pml, first_split, row_mask, stride_pa_split, stride_pml_split)
                    for s in tl.range(first_split + 1, n_splits, num_stages=1):
                        m_s, l_s, acc_s = _load_state(pa, pml, s, row_mask, stride_pa_split, stride_pml_split)
                        m, l_sum, acc = _combine(m, l_sum, acc, m_s, l_s, acc_s, EXP2)
                _finish(
                    m,
                    l_sum,
                    acc,
                    sinks_ptr,
                    head,
                    row_mask,
                    v_scale,
                    out_ptr + t * stride_ot + head[:, None] * stride_oh + d[None, :],
                    row_mask[:, None] & dmask[None, :],
                    lse_ptr + t * stride_lt + head,
                    USE_SINKS,
                    WRITE_LSE,
                    EXP2,
                )


@dataclass
class PreparedBatch:
    """A validated, planned batch: what ``run`` needs besides the tensors it reads.

    Build it once per batch with ``prepare`` (the checks and the one device-to-host
    transfer happen there) and call ``run`` for every layer, as serving engines build
    their attention metadata once per step. Everything ``run`` needs beyond its
    arguments is allocated here, so ``run`` can be captured in a CUDA graph.
    """

    plan: LaunchPlan
    scale: float  # the softmax scale times k_scale (an fp8 cache's dequantization)
    query_shape: tuple[int, ...]
    cache_shape: tuple[int, ...]
    dtype: torch.dtype
    kv_dtype: torch.dtype
    device: torch.device
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    decode_ids: torch.Tensor | None
    other_ids: torch.Tensor | None
    part_acc: torch.Tensor | None  # [n_decode, plan.scratch_splits, num_heads, HEAD_DIM_PAD] fp32
    part_ml: torch.Tensor | None  # [n_decode, plan.scratch_splits, num_heads, 2] fp32
    done: torch.Tensor | None  # [n_decode, num_kv_heads] int32, zero between launches
    upcast_out: torch.Tensor | None  # [num_tokens, num_heads, head_dim] fp32 (interpreter, bf16 only)
    variants: Variants = Variants()
    fp8_native: bool = False  # the device converts fp8 pairs to fp16 in one instruction (sm_89+, CUDA, compiled)


def prepare(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    **variants,
) -> PreparedBatch:
    """Check every input (``ValueError`` naming the field), plan the launches and
    allocate their scratch. Arguments as for ``paged_attention``."""
    # the slopes' and sinks' finiteness rides on the one device-to-host transfer of the core checks
    lens, loc = check_paged_inputs(
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        out,
        alibi_slopes=variants.get("alibi_slopes"),
        sinks=variants.get("sinks"),
    )
    var = check_variants(query, key_cache, scale=scale, **variants)
    interp = interpreter_active()
    if query.device.type != "cuda" and not interp:
        raise RuntimeError(
            "paged_attention: tensors are on the CPU but the Triton interpreter is off; set TRITON_INTERPRET=1 "
            "before importing triton (the `triton` backend does this) or move the tensors to a GPU"
        )
    T, Hq, D = query.shape
    Hkv = key_cache.shape[2]
    plan = plan_launch(
        lens,
        [loc[i + 1] - loc[i] for i in range(len(lens))],
        Hq,
        Hkv,
        D,
        key_cache.shape[1],
        query.dtype,
        interp,
        key_cache.dtype,
        var.sliding_window,
    )
    dev = query.device
    n_dec = len(plan.decode_seqs)
    d_pad = plan.decode.HEAD_DIM_PAD if plan.decode is not None else 0
    upcast = any(cfg.UPCAST for cfg in (plan.decode, plan.other) if cfg is not None)
    return PreparedBatch(
        plan=plan,
        scale=float(D**-0.5 if scale is None else scale) * var.k_scale,
        query_shape=tuple(query.shape),
        cache_shape=tuple(key_cache.shape),
        dtype=query.dtype,
        kv_dtype=key_cache.dtype,
        device=dev,
        block_tables=block_tables,
        seq_lens=seq_lens,
        query_start_loc=query_start_loc,
        decode_ids=torch.tensor(plan.decode_seqs, dtype=torch.int32, device=dev) if n_dec else None,
        other_ids=torch.tensor(plan.other_seqs, dtype=torch.int32, device=dev) if plan.other_seqs else None,
        part_acc=torch.empty(n_dec, plan.scratch_splits, Hq, d_pad, dtype=torch.float32, device=dev) if n_dec else None,
        part_ml=torch.empty(n_dec, plan.scratch_splits, Hq, 2, dtype=torch.float32, device=dev) if n_dec else None,
        done=torch.zeros(n_dec, Hkv, dtype=torch.int32, device=dev) if n_dec else None,
        upcast_out=torch.empty(T, Hq, D, dtype=torch.float32, device=dev) if upcast else None,
        variants=var,
        fp8_native=_fp8_native(dev, interp),
    )


def _fp8_native(device: torch.device, interpreter: bool) -> bool:
    """Whether ``device`` runs ``cvt.rn.f16x2.e4m3x2`` (``_widen_pairs``): CUDA, sm_89 or later,
    compiled (the interpreter runs no inline assembly)."""
    if interpreter or device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def run(
    prep: PreparedBatch,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    *,
    compile_only: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The launches of a prepared batch, over tensors of the prepared shapes (checked
    here without touching the device: shapes, dtypes, devices, last-dim strides).

    ``out`` [num_tokens, num_heads, head_dim] (query dtype) and, with ``return_lse``,
    ``lse`` [num_tokens, num_heads] float32 are written when given, else allocated.
    Given both, ``run`` allocates nothing and never waits for the device, so it can be
    captured in a CUDA graph and replayed (one prepared batch per graph: the batch's
    block tables, lengths and scratch are read where ``prepare`` found or made them, so
    keep the prepared batch alive as long as the graph: freed, its scratch would be
    reused by other tensors, and a replay would count splits in their memory).
    ``compile_only``: compile the batch's kernels (Triton's ``warmup``: into its in-memory
    and on-disk caches) and launch nothing; ``out`` is returned unwritten. Safe from a
    second thread while other batches run (the conformance suite's warm-up ahead); on the
    interpreter, which compiles nothing, it does nothing.
    Returns ``out``, or ``(out, lse)`` when prepared with ``return_lse=True``."""
    for name, t, shape, dtype in (
        ("query", query, prep.query_shape, prep.dtype),
        ("key_cache", key_cache, prep.cache_shape, prep.kv_dtype),
        ("value_cache", value_cache, prep.cache_shape, prep.kv_dtype),
    ):
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != prep.device or t.stride(-1) != 1:
            raise ValueError(
                f"paged_attention.run: {name} must match the prepared batch: shape {shape}, {dtype}, "
                f"{prep.device}, contiguous last dimension; got {tuple(t.shape)}, {t.dtype}, {t.device}"
            )
    if out is None:
        out = torch.empty_like(query)
    elif (
        tuple(out.shape) != prep.query_shape
        or out.dtype != prep.dtype
        or out.device != prep.device
        or out.stride(-1) != 1
        or not fits_int32(out)
    ):
        raise ValueError(
            f"paged_attention.run: out must be {prep.dtype} of shape {prep.query_shape} on {prep.device}, with a "
            "contiguous last dimension and every element offset <= 2**31 - 1"
        )
    plan, var = prep.plan, prep.variants
    T, Hq = prep.query_shape[:2]
    if lse is not None and not var.return_lse:
        raise ValueError("paged_attention.run: lse given, but the batch was prepared without return_lse=True")
    if lse is None and var.return_lse:
        lse = torch.empty(T, Hq, dtype=torch.float32, device=prep.device)
    elif lse is not None and (tuple(lse.shape) != (T, Hq) or lse.dtype != torch.float32 or lse.device != prep.device):
        raise ValueError(f"paged_attention.run: lse must be float32 of shape {(T, Hq)} on {prep.device}")
    # bf16 on the interpreter: write fp32, round with torch (the interpreter truncates)
    target = prep.upcast_out if prep.upcast_out is not None else out
    lse_buf = lse if lse is not None else target  # an unused pointer still needs a tensor of the device
    alibi = var.alibi_slopes if var.alibi_slopes is not None else target
    sinks = var.sinks if var.sinks is not None else target
    window = var.sliding_window or 0
    cap = var.logits_soft_cap or 1.0
    kv_fp8 = prep.kv_dtype != prep.dtype
    f16_dots = kv_fp8 and prep.dtype == torch.bfloat16 and F16_DOTS_FOR_FP8
    strides_kv = (
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
    )
    # the pairs' 16-bit loads: every offset into both caches even
    even = (
        kv_fp8
        and prep.fp8_native
        and prep.cache_shape[3] % 2 == 0
        and key_cache.data_ptr() % 2 == 0
        and value_cache.data_ptr() % 2 == 0
        and all(s % 2 == 0 for s in strides_kv)
    )
    flags = dict(
        USE_WINDOW=var.sliding_window is not None,
        USE_SOFTCAP=var.logits_soft_cap is not None,
        USE_ALIBI=var.alibi_slopes is not None,
        USE_SINKS=var.sinks is not None,
        KV_FP8=fp8_widening(prep.kv_dtype, prep.dtype == torch.float16 or f16_dots, prep.fp8_native, even),
        F16_DOTS=f16_dots,
        TABLE_AHEAD=TABLE_AHEAD,
        OFF_I32=OFFSETS_I32 and fits_int32(key_cache) and fits_int32(value_cache),
        WRITE_LSE=var.return_lse,
    )
    tables, seq_lens, loc = prep.block_tables, prep.seq_lens, prep.query_start_loc
    if plan.decode is not None:
        cfg, part_acc, part_ml = plan.decode, prep.part_acc, prep.part_ml
        assert part_acc is not None and part_ml is not None  # prepared with the decode launch
        _launcher(_decode_kernel, cfg.grid, compile_only)(
            query,
            key_cache,
            value_cache,
            tables,
            seq_lens,
            loc,
            prep.decode_ids,
            alibi,
            sinks,
            part_acc,
            part_ml,
            prep.done,
            target,
            lse_buf,
            prep.scale,
            var.v_scale,
            window,
            cap,
            prep.cache_shape[2],
            cfg.SPLIT_GROUPS,
            cfg.SPLITS_PER_PROGRAM,
            query.stride(0),
            query.stride(1),
            *strides_kv,
            tables.stride(0),
            part_acc.stride(0),
            part_acc.stride(1),
            part_ml.stride(0),
            part_ml.stride(1),
            target.stride(0),
            target.stride(1),
            lse_buf.stride(0),
            GROUP=cfg.GROUP,
            GROUP_PAD=cfg.GROUP_PAD,
            BLOCK_N=cfg.BLOCK_N,
            HEAD_DIM=cfg.HEAD_DIM,
            HEAD_DIM_PAD=cfg.HEAD_DIM_PAD,
            BLOCK_SIZE=cfg.BLOCK_SIZE,
            SPLIT_SIZE=cfg.SPLIT_SIZE,
            SPLIT_LONG=cfg.SPLIT_LONG,
            LONG_FROM=cfg.LONG_FROM,
            SPLIT_SHORT=cfg.SPLIT_SHORT,
            SHORT_UNDER=cfg.SHORT_UNDER,
            UPCAST=cfg.UPCAST,
            IEEE_FP32=cfg.IEEE_FP32,
            EXP2=cfg.EXP2,
            GRID_ORDER=cfg.GRID_ORDER,
            SPLIT_LOOP=cfg.SPLIT_LOOP,
            SPLIT_WHOLE=cfg.SPLIT_WHOLE,
            FOLD_PARTS=cfg.FOLD_PARTS,
            LOOP_PARTS=cfg.LOOP_PARTS,
            **flags,
            **cfg.launch_options,
        )
    if plan.other is not None:
        cfg = plan.other
        _launcher(_prefill_kernel, cfg.grid, compile_only)(
            query,
            key_cache,
            value_cache,
            tables,
            seq_lens,
            loc,
            prep.other_ids,
            alibi,
            sinks,
            target,
            lse_buf,
            prep.scale,
            var.v_scale,
            window,
            cap,
            query.stride(0),
            query.stride(1),
            *strides_kv,
            tables.stride(0),
            target.stride(0),
            target.stride(1),
            lse_buf.stride(0),
            GROUP=cfg.GROUP,
            GROUP_PAD=cfg.GROUP_PAD,
            BLOCK_Q=cfg.BLOCK_Q,
            BLOCK_N=cfg.BLOCK_N,
            HEAD_DIM=cfg.HEAD_DIM,
            HEAD_DIM_PAD=cfg.HEAD_DIM_PAD,
            BLOCK_SIZE=cfg.BLOCK_SIZE,
            UPCAST=cfg.UPCAST,
            IEEE_FP32=cfg.IEEE_FP32,
            EXP2=cfg.EXP2,
            MASK_SPLIT=cfg.MASK_SPLIT,
            HEAVY_FIRST=cfg.HEAVY_FIRST,
            **flags,
            **cfg.launch_options,
        )
    if target is not out and not compile_only:
        out.copy_(target)
    return (out, lse) if lse is not None and var.return_lse else out


#: bf16 queries over an fp8 cache run fp16 dots (see ``_query_rows``); False keeps bf16
#: dots with fp8->bf16 tiles, the slower path it replaced (kept for the benchmark).
F16_DOTS_FOR_FP8 = True


def _launcher(kernel: Any, grid: tuple[int, int, int], compile_only: bool) -> Any:
    """``kernel[grid]``, or with ``compile_only`` its compile without a launch (``warmup``;
    a no-op on the interpreter)."""
    if not compile_only:
        return kernel[grid]
    if interpreter_active():
        return lambda *args, **kwargs: None
    return functools.partial(kernel.warmup, grid=grid)


#: Address the caches in int32 where every offset fits (``host.fits_int32``), int64 otherwise: a
#: 64-bit multiply is three instructions a key on sm_90, and address arithmetic was two fifths
#: of the prefill loop's instructions (issue 17, fourth round: with the unsigned key division
#: of ``_page_of``, 401 instead of 509 a step; causal prefill at 8k 438 instead of 362 TFLOP/s
#: on the H200). False takes the int64 path everywhere (kept for the benchmark and its test).
OFFSETS_I32 = True

#: Load each key tile's block-table entries one step ahead (see ``_attend``); False is the
#: single-buffered loop it replaced (kept for the benchmark: not timed on a GPU yet).
TABLE_AHEAD = True


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    *,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    return_lse: bool = False,
    compile_only: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Paged attention over a ragged batch: ``run(prepare(...), ...)``.

    Args:
        query: ``[num_tokens, num_heads, head_dim]`` float32/float16/bfloat16.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``,
            the query dtype or float8_e4m3fn/float8_e5m2; any strides with a contiguous
            last dimension.
        block_tables: ``[num_seqs, max_blocks]`` int32 (entries past a sequence's last
            block are never read).
        seq_lens: ``[num_seqs]`` int32, new tokens included.
        query_start_loc: ``[num_seqs + 1]`` int32.
        scale: softmax scale, default ``head_dim ** -0.5``.
        out: optional ``[num_tokens, num_heads, head_dim]`` query-dtype tensor to write.
        sliding_window: ``W >= 1``: the query at position ``p`` sees keys ``p-W+1 .. p``.
        logits_soft_cap: ``c > 0``: scores become ``c * tanh(s / c)`` before masking.
        alibi_slopes: ``[num_heads]`` float32: score ``+= slope[h] * (j - p)``.
        sinks: ``[num_heads]`` float32: a logit per head that joins the denominator.
        k_scale, v_scale: dequantization scales of an fp8 cache (1.0 otherwise).
        return_lse: also return the log-sum-exp.
        compile_only: compile this batch's kernels and launch nothing (``run``).

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in the query dtype (``out`` if given);
        with ``return_lse``, also ``[num_tokens, num_heads]`` float32, the natural log of
        each row's softmax denominator (the sink included).
    """
    prep = prepare(
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        out,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        k_scale=k_scale,
        v_scale=v_scale,
        return_lse=return_lse,
    )
    return run(prep, query, key_cache, value_cache, out, compile_only=compile_only)
