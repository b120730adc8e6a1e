"""The ``@triton.jit`` helpers both paged-attention kernels share: the query rows as the
dots take them, the fp8 cache's widening, the key index's page and slot, and one key tile
of the online softmax (``_step``) with its loop (``_attend_tiles``).

The softmax runs in base 2: the scale, times log2(e), meets the running max in one
multiply-add per score, and the max and sums stay in base 2 until the lse is written.
Caches whose every offset fits int32 are addressed in int32 (``OFF_I32``), and key
indices are divided as unsigned (``_page_of``): address arithmetic is a large share of
the loop's instructions.

An fp8 cache is widened tile by tile after its load, to fp16 for bf16 queries
(``_query_rows``): its K and V tiles read as 16-bit pairs of fp8 values, each widened by
one ``cvt`` (``_widen_pairs``, sm_89 and later; ``KV_FP8`` 2 or 3), else by the compiler
(``_widen_rows``, ``KV_FP8`` 1; the host's ``fp8_widening`` decides).

This module imports triton: import it only after the interpreter has been decided.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
    goes through fp32, which leaves the fp8 decode no faster than bf16). Each row is scaled
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
    ``ld.shared.b8`` per thread per tile: a cost that leaves fp8 decode no faster than
    bf16). The split and join keep the conversion on the loaded, row-contiguous layout,
    so the wide values are staged and read with ``ldmatrix``, as a 16-bit tile is.

    Tiles of fewer than 32 rows convert plainly: on triton 3.6 (H200) the split and join of
    a 16-row fp8 V tile give wrong outputs (every row of the prefill; the lse right), while
    the plain conversion, and 32- and 64-row tiles, are right."""
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
def _tree_visible(tree_rows, tree_n, jn):
    """Whether each row sees each key, [ROWS, BLOCK_N] bool, by its sequence's tree mask: ``jn``
    [BLOCK_N] int32 is the key's index among the sequence's new tokens (< 0: a history key, always
    seen); ``tree_rows`` [ROWS] points at each row's ``tree_n`` int64 words, bit ``c % 64`` of word
    ``c // 64`` set where the row sees new token ``c``. A tile of at most 64 keys spans at most two
    words: each row loads those two, so a tree of any length costs two loads a row a masked tile."""
    tl.static_assert(jn.shape[0] <= 64, "a key tile spans at most two of a row's 64-bit words (TREE_TILE_KEYS)")
    w0 = tl.maximum(tl.min(jn, 0), 0) // 64  # the word of the tile's first new key
    word0 = tl.load(tree_rows + w0)
    # the next word, or word0 again past the row's last (the keys past the tree do not exist)
    word1 = tl.load(tree_rows + tl.minimum(w0 + 1, tree_n - 1))
    rel = jn - 64 * w0  # [BLOCK_N] the key's bit counted from word0's first
    bit0 = (word0[:, None] >> tl.minimum(tl.maximum(rel, 0), 63).to(tl.int64)[None, :]) & 1
    bit1 = (word1[:, None] >> tl.minimum(tl.maximum(rel - 64, 0), 63).to(tl.int64)[None, :]) & 1
    bits = tl.where((rel < 64)[None, :], bit0, bit1)
    return (jn[None, :] < 0) | (bits != 0)


@triton.jit
def _folded_scale(qk_scale, USE_SOFTCAP: tl.constexpr, USE_ALIBI: tl.constexpr):
    """``_step``'s ``s_scale`` [ROWS]: the rows' score scale times log2(e) where ``_step`` folds
    the scale into the exponent (its ``FOLD``: no soft-cap, no ALiBi), else the scale."""
    if not (USE_SOFTCAP or USE_ALIBI):
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
    tree_rows,
    tree_n,
    context,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    UPCAST: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    KV_FP8: tl.constexpr,
    OFF_I32: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    USE_TREE: tl.constexpr,
):
    """One key tile of the online softmax: the keys ``j`` [BLOCK_N] (int32; ``kmask``: those
    that exist, below the history's or the split's end) in the cache blocks ``blk`` [BLOCK_N]
    join the rows' running max ``m`` [ROWS], denominator ``l_sum`` [ROWS] and weighted-V sum
    ``acc`` [ROWS, HEAD_DIM_V_PAD] (fp32), which come back updated (keys of ``HEAD_DIM``
    columns, values of ``HEAD_DIM_V``). The softmax runs in base 2:
    ``m`` is in natural-log units times log2(e). Without ``MASKED`` every key is visible to
    every row: no mask is computed. With ``USE_TREE`` (and ``CAUSAL``) a new token sees the
    new tokens its sequence's tree mask allows (they follow ``context`` history keys), read as
    bits of its row's ``tree_n`` words at ``tree_rows`` [ROWS] (``_tree_visible``). Shared by
    ``_attend_tiles`` and the decode kernel's split loop, so both compute a tile alike."""
    d = tl.arange(0, HEAD_DIM_PAD)
    dmask = d < HEAD_DIM
    # FOLD: scores stay unscaled until the exponent, where the scale (with log2(e)) and the
    # max meet in one fused multiply-add; soft-cap and ALiBi need the scaled score first
    # (``_folded_scale``, which forms ``s_scale``, tests the same condition).
    FOLD: tl.constexpr = not (USE_SOFTCAP or USE_ALIBI)
    slot = _slot_of(j, BLOCK_SIZE)
    if OFF_I32:  # every element offset of both caches fits int32 (the host's ``fits_int32``)
        k_off = blk * stride_kb + slot * stride_ks + kv_head * stride_kh  # [BLOCK_N]
        v_off = blk * stride_vb + slot * stride_vs + kv_head * stride_vh
    else:  # every term in int64: a head-major cache's head stride alone can pass 2**31
        blk, slot_w, head_w = blk.to(tl.int64), slot.to(tl.int64), kv_head.to(tl.int64)
        k_off = blk * stride_kb + slot_w * stride_ks + head_w * stride_kh
        v_off = blk * stride_vb + slot_w * stride_vs + head_w * stride_vh
    dv = tl.arange(0, HEAD_DIM_V_PAD)
    dvmask = dv < HEAD_DIM_V
    if KV_FP8 >= 2:  # K and V as 16-bit pairs of fp8 values (every offset even: the host checks)
        dp = tl.arange(0, HEAD_DIM_PAD // 2)
        pmask = dp < HEAD_DIM // 2
        dvp = tl.arange(0, HEAD_DIM_V_PAD // 2)
        kt = _load_pairs(k_cache_ptr, k_off, dp, pmask, kmask, MASKED)
        v = _load_pairs(v_cache_ptr, v_off, dvp, dvp < HEAD_DIM_V // 2, kmask, MASKED)
    elif MASKED:
        kt = tl.load(k_cache_ptr + k_off[None, :] + d[:, None], mask=kmask[None, :] & dmask[:, None], other=0.0)
        v = tl.load(v_cache_ptr + v_off[:, None] + dv[None, :], mask=kmask[:, None] & dvmask[None, :], other=0.0)
    else:
        kt = tl.load(k_cache_ptr + k_off[None, :] + d[:, None], mask=dmask[:, None], other=0.0)
        v = tl.load(v_cache_ptr + v_off[:, None] + dv[None, :], mask=dvmask[None, :], other=0.0)
    # fp8 -> the dots' dtype is exact (fewer exponent and significand bits)
    if KV_FP8 >= 2:
        kt = tl.trans(_widen_pairs(kt, KV_FP8 == 3))
        v = _widen_pairs(v, KV_FP8 == 3)
    elif KV_FP8:
        kt = kt.to(q.dtype)
        v = _widen_rows(v, q.dtype)
    elif UPCAST:
        kt = kt.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, kt, input_precision="ieee")  # [ROWS, BLOCK_N]
    if not FOLD:
        s = s * qk_scale[:, None]
        if USE_SOFTCAP:  # on the scores, before any mask: a masked score stays -inf
            s = _soft_cap(s, soft_cap)
        if USE_ALIBI:
            s += slopes[:, None] * (j[None, :] - pos[:, None]).to(tl.float32)
        s = s * 1.4426950408889634  # log2(e): the running max and sum are in base 2
    if MASKED:
        # masked loads give zero keys, and a zero key still scores: force them out
        visible = kmask[None, :]
        if CAUSAL:
            visible = visible & (j[None, :] <= pos[:, None])
            if USE_TREE:  # new keys on or below the diagonal: the mask's bit (every history key is seen)
                visible = visible & _tree_visible(tree_rows, tree_n, j - context)
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
    alpha = tl.exp2(m - m_safe)  # rescale what was accumulated under the old max
    if FOLD:
        p = tl.exp2(s * s_scale[:, None] - m_safe[:, None])
    else:
        p = tl.exp2(s - m_safe[:, None])
    l_sum = l_sum * alpha + tl.sum(p, 1)
    pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
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
    end,
    hi,
    pos,
    slopes,
    qk_scale,
    s_scale,
    window,
    soft_cap,
    tree_rows,
    tree_n,
    context,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    UPCAST: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    KV_FP8: tl.constexpr,
    OFF_I32: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    USE_TREE: tl.constexpr,
):
    """The key tiles ``start, start + BLOCK_N, .. < end`` of one sequence's history (its
    block-table row at ``table_ptr``; ``hi``: the history's end, which bounds every load) into
    the rows' running softmax state. Without ``MASKED`` every key of every tile is below ``hi``
    and visible to every row: no mask is computed and no row can be empty. ``blk_next``
    [BLOCK_N] carries the first tile's block-table entries; the next loop's come back with the
    state."""
    for j0 in range(start, end, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        kmask = j < hi
        # each step loads the next tile's block-table entries, one step ahead. Loaded in the
        # step that uses them, they make the K and V loads indirect, and triton (3.6 and 3.9,
        # sm_90) then waits for every copy in flight at the top of each step
        # (cp.async.wait_group 0): one tile in flight, its latency paid every step. Carried
        # from the step before, the K and V tiles are multi-buffered (wait_group 2 at 3 stages).
        blk = blk_next
        j_next = j + BLOCK_N
        blk_next = tl.load(table_ptr + _page_of(j_next, BLOCK_SIZE), mask=j_next < hi, other=0)
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
            tree_rows,
            tree_n,
            context,
            stride_kb,
            stride_ks,
            stride_kh,
            stride_vb,
            stride_vs,
            stride_vh,
            HEAD_DIM,
            HEAD_DIM_PAD,
            HEAD_DIM_V,
            HEAD_DIM_V_PAD,
            BLOCK_SIZE,
            UPCAST,
            USE_WINDOW,
            USE_SOFTCAP,
            USE_ALIBI,
            KV_FP8,
            OFF_I32,
            MASKED,
            CAUSAL,
            USE_TREE,
        )
    return m, l_sum, acc, blk_next
