"""The prefill kernel: causal prefill and partial continuation, for the sequences of a
batch with more than one new token.

A program owns a tile of ``BLOCK_Q`` query tokens of one sequence times all ``GROUP``
query heads of one kv head (``BLOCK_Q * GROUP_PAD`` rows), so each K/V tile it reads
serves the whole GQA group, and walks the visible history ``BLOCK_N`` keys at a time
through the block table with an online softmax in fp32: first the key tiles every row
sees wholly (below the causal diagonal), without a mask, then the diagonal's, masked.
Speculative decoding's tree masks (``USE_TREE``) are read in the masked tiles, which then
start at the history's end.

This module imports triton: import it only after the interpreter has been decided.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pagedattn.kernels.triton_tiles import _attend_tiles, _folded_scale, _page_of, _query_rows


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
    USE_TREE: tl.constexpr,
):
    """Causal online softmax of the rows ``q`` [ROWS, D] over keys ``lo .. hi-1`` of one
    sequence (its block-table row at ``table_ptr``); row ``r`` sees keys ``<= pos[r]`` and
    ``> pos[r] - window`` with ``USE_WINDOW``. Keys ``lo .. full_hi-1`` (``full_hi - lo`` a
    multiple of ``BLOCK_N``) are visible to every row: their tiles skip the mask. ``qk_scale``
    [ROWS] scales each row's scores (the softmax scale, an fp8 cache's ``k_scale``,
    ``_query_rows``'s unscaling); ``slopes`` [ROWS] are the rows' ALiBi slopes (unused without
    ``USE_ALIBI``). With ``USE_TREE`` the masked tiles also read the rows' tree words
    (``tree_rows`` [ROWS] pointers, ``tree_n`` int64 words a row; ``_tree_visible``) over the new
    tokens after ``context`` keys. The
    returned max ``m`` is in base 2 (natural-log units times log2(e))."""
    s_scale = _folded_scale(qk_scale, USE_SOFTCAP, USE_ALIBI)
    j_next = lo + tl.arange(0, BLOCK_N)
    blk_next = tl.load(table_ptr + _page_of(j_next, BLOCK_SIZE), mask=j_next < hi, other=0)
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
        tree_rows,
        tree_n,
        context,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_vb,
        stride_vs,
        stride_vh,
        BLOCK_N,
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
        False,
        True,
        USE_TREE,
    )
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
        full_hi,
        hi,
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
        BLOCK_N,
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
        True,
        True,
        USE_TREE,
    )
    return m, l_sum, acc


#: integer arguments the JIT must not specialize (on 1, on divisibility by 16): each value class
#: would be a kernel of its own to compile, and none of them shapes a vectorized access
_PLAIN_INTS_PREFILL = ("window", "tree_n", "stride_bt", "stride_lt")


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
    qk_scales_ptr,
    v_scales_ptr,
    tree_words_ptr,
    out_ptr,
    lse_ptr,
    # sizes
    scale,
    v_scale,
    window,
    soft_cap,
    tree_n,
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
    HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    UPCAST: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    USE_SINKS: tl.constexpr,
    KV_FP8: tl.constexpr,
    F16_DOTS: tl.constexpr,
    OFF_I32: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    USE_TREE: tl.constexpr,
    PER_HEAD_SCALES: tl.constexpr,
):
    """One tile of ``BLOCK_Q`` query tokens of one sequence times one kv head's query
    group. The grid's (q_tile, kv_head) programs are taken in the order of decreasing
    q_tile, all kv heads of a q_tile together, so the longest (causal) tiles start first
    and the short ones fill the tail.

    With ``USE_TREE`` the new tokens see each other as their sequence's tree mask says
    (``tree_words_ptr`` [num_tokens, tree_n] int64: bit ``c % 64`` of token ``t``'s word ``c // 64``
    set where it sees its sequence's new token ``c``). The mask is lower-triangular, so
    the causal tile bounds hold; the history's whole tiles skip the mask, every tile past the
    history's last whole one reads it.

    ``scale`` is the softmax scale times an fp8 cache's ``k_scale`` and ``v_scale`` scales the
    output; with ``PER_HEAD_SCALES`` the program's kv head's instead: ``qk_scales_ptr`` and
    ``v_scales_ptr`` [num_kv_heads] fp32."""
    seq = tl.load(seq_ids_ptr + tl.program_id(0))
    n_tiles = tl.num_programs(1)
    n_heads = tl.num_programs(2)
    order = tl.program_id(1) + n_tiles * tl.program_id(2)  # the order programs are launched in
    q_tile = n_tiles - 1 - order // n_heads
    kv_head = order % n_heads
    seq_len = tl.load(seq_lens_ptr + seq)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_tile * BLOCK_Q < q_len:  # the grid is sized for the longest query of the launch
        if PER_HEAD_SCALES:  # the kv head's own scales instead of the per-tensor arguments
            scale = tl.load(qk_scales_ptr + kv_head)
            v_scale = tl.load(v_scales_ptr + kv_head)
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
        acc = tl.zeros([ROWS, HEAD_DIM_V_PAD], dtype=tl.float32)
        # keys below the tile's first row's position are visible to every row (no window):
        # whole tiles of them skip the mask; the rest (the diagonal) is masked
        full_hi = lo
        # each row's tree words (padding rows point at the sequence's last token's: never stored)
        tree_rows = tree_words_ptr + (q_start + tl.minimum(tok, q_len - 1)).to(tl.int64) * tree_n
        if USE_TREE:  # a new token need not see the new tokens before it: the history only
            full_hi = lo + (context - lo) // BLOCK_N * BLOCK_N
        elif not USE_WINDOW:
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
            tree_rows,
            tree_n,
            context,
            stride_kb,
            stride_ks,
            stride_kh,
            stride_vb,
            stride_vs,
            stride_vh,
            BLOCK_N,
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
            USE_TREE,
        )
        if USE_SINKS:
            # the sink joins once, after the keys (weight exp(sink - m), no value), as in the decode
            # merge. Seeded into the running max, it would weigh every key relative to the sink:
            # under a sink far above a row's keys, the weights fall below fp16's range where fp16
            # dots (F16_DOTS) meet V, and the row comes out 0
            sink = tl.load(sinks_ptr + head, mask=row_mask, other=float("-inf")).to(tl.float32)
            sink = sink * 1.4426950408889634
            m_new = tl.maximum(m, sink)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # padding rows
            alpha = tl.exp2(m - m_safe)
            l_sum = l_sum * alpha + tl.exp2(sink - m_safe)
            acc = acc * alpha[:, None]
            m = m_new
        l_safe = tl.where(row_mask, l_sum, 1.0)  # padding rows are never stored
        result = acc * (v_scale / l_safe)[:, None]
        dv = tl.arange(0, HEAD_DIM_V_PAD)
        o_off = (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :]
        o_mask = row_mask[:, None] & (dv < HEAD_DIM_V)[None, :]
        tl.store(out_ptr + o_off, result.to(out_ptr.dtype.element_ty), mask=o_mask)
        if WRITE_LSE:
            lse = (m + tl.log2(l_safe)) * 0.6931471805599453  # base 2 to natural log
            tl.store(lse_ptr + (q_start + tok) * stride_lt + head, lse, mask=row_mask)
