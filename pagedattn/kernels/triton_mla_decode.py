"""The MLA kernel: absorbed-form multi-head latent attention (DeepSeek V2/V3) over a paged
latent cache: decode, and the few new tokens a sequence of multi-token prediction or tree
verification (speculative decoding).

The cache holds one row a token: ``HEAD_DIM_V`` latent columns then ``HEAD_DIM - HEAD_DIM_V``
rotary ones (512 + 64 in DeepSeek); the key is the whole row and the value its latent part,
so the value is never read apart from the key. A program owns ``BLOCK_H`` query heads of one
kv head (MLA: the only one) for ``BLOCK_Q`` new tokens of one sequence (1 in a decode launch)
and one split of its history: each key tile is loaded once, as a latent part [BLOCK_N,
HEAD_DIM_V] and a rotary part [BLOCK_N, ROPE_PAD] (576 columns are no power of two; neither
part is padded past its next power of two), and serves every row, in two dots for the score
and one for P·V on the latent part already loaded. The splits are the decode kernel's
(``decode_split``: a rule of the history's own length) and merge as its do: the program that
completes a tile's count merges the splits in their order (the same bits in any batch); a
tile of one split is finished by its program without the scratch.

This module imports triton: import it only after the interpreter has been decided.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pagedattn.kernels.triton_decode import _combine, _finish, _identity, _load_state, _store_state
from pagedattn.kernels.triton_tiles import _page_of, _slot_of, _tree_visible

#: integer arguments the JIT must not specialize (each value class would be a kernel of its own)
_PLAIN_INTS_MLA = ("tree_n", "stride_bt", "stride_lt", "head_blocks", "head_programs")


@triton.jit
def _mla_tile(
    q_lat,
    q_rope,
    m,
    l_sum,
    acc,
    blk,
    j,
    kmask,
    pos,
    context,
    tree_rows,
    tree_n,
    cache_ptr,
    kv_head,
    s_scale,
    stride_kb,
    stride_ks,
    stride_kh,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    ROPE_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    UPCAST: tl.constexpr,
    KV_FP8: tl.constexpr,
    OFF_I32: tl.constexpr,
    MULTI: tl.constexpr,
    USE_TREE: tl.constexpr,
):
    """One key tile of the online softmax: the keys ``j`` [BLOCK_N] (``kmask``: those below the
    split's end) in cache blocks ``blk`` [BLOCK_N] join the rows' running max ``m`` [ROWS]
    (base 2), denominator ``l_sum`` [ROWS] and weighted-value sum ``acc`` [ROWS, HEAD_DIM_V]
    fp32. ``q_lat`` [ROWS, HEAD_DIM_V] and ``q_rope`` [ROWS, ROPE_PAD] are the query's two
    parts; ``s_scale`` [ROWS] the softmax scale (times an fp8 cache's ``k_scale``) times log2(e),
    folded into the exponent. An fp8 cache's tile is widened to the query dtype after its load.

    With ``MULTI`` (several new tokens a sequence) row ``r`` sees keys ``<= pos[r]``, its
    absolute position; with ``USE_TREE`` it sees of the new tokens (after ``context`` keys) only
    those its sequence's tree mask allows, read as bits of its ``tree_n`` words at ``tree_rows``
    [ROWS] (``_tree_visible``)."""
    slot = _slot_of(j, BLOCK_SIZE)
    if OFF_I32:
        off = blk * stride_kb + slot * stride_ks + kv_head * stride_kh  # [BLOCK_N]
    else:
        off = blk.to(tl.int64) * stride_kb + slot.to(tl.int64) * stride_ks + kv_head.to(tl.int64) * stride_kh
    dv = tl.arange(0, HEAD_DIM_V)
    dr = tl.arange(0, ROPE_PAD)
    ROPE: tl.constexpr = HEAD_DIM - HEAD_DIM_V
    # the latent part is the value too: loaded once, for the score's dot and for P·V
    k_lat = tl.load(cache_ptr + off[:, None] + dv[None, :], mask=kmask[:, None], other=0.0)  # [BLOCK_N, HEAD_DIM_V]
    k_rope = tl.load(
        cache_ptr + off[:, None] + HEAD_DIM_V + dr[None, :], mask=kmask[:, None] & (dr < ROPE)[None, :], other=0.0
    )  # [BLOCK_N, ROPE_PAD]
    if KV_FP8:  # fp8 -> the query dtype is exact (fewer exponent and significand bits)
        k_lat = k_lat.to(q_lat.dtype)
        k_rope = k_rope.to(q_rope.dtype)
    elif UPCAST:
        k_lat = k_lat.to(tl.float32)
        k_rope = k_rope.to(tl.float32)
    s = tl.dot(q_lat, tl.trans(k_lat), input_precision="ieee")  # [ROWS, BLOCK_N]
    s = tl.dot(q_rope, tl.trans(k_rope), s, input_precision="ieee")
    # masked loads give zero keys, and a zero key still scores: force them out
    visible = kmask[None, :]
    if MULTI:
        visible = visible & (j[None, :] <= pos[:, None])
        if USE_TREE:  # new keys on or below the diagonal: the mask's bit (every history key is seen)
            visible = visible & _tree_visible(tree_rows, tree_n, j - context)
    s = tl.where(visible, s, float("-inf"))
    # s_scale > 0, so the scaled max is the max of the scaled scores
    m_new = tl.maximum(m, tl.max(s, 1) * s_scale)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s * s_scale[:, None] - m_safe[:, None])
    l_sum = l_sum * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(k_lat.dtype), k_lat, input_precision="ieee")
    return m_new, l_sum, acc


@triton.jit(do_not_specialize=list(_PLAIN_INTS_MLA))
def _mla_decode_kernel(
    # pointers
    q_ptr,
    cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    seq_ids_ptr,
    scratch_rows_ptr,
    tree_words_ptr,
    part_acc_ptr,
    part_ml_ptr,
    done_ptr,
    sinks_ptr,
    qk_scales_ptr,
    v_scales_ptr,
    out_ptr,
    lse_ptr,
    # sizes
    scale,
    v_scale,
    head_blocks,
    head_programs,
    tree_n,
    # strides (elements); partials are [scratch rows, max_splits, num_heads, HEAD_DIM_V] and [..., 2]
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_bt,
    stride_pa_row,
    stride_pa_split,
    stride_pml_row,
    stride_pml_split,
    stride_ot,
    stride_oh,
    stride_lt,
    # meta-parameters
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    ROPE_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SPLIT_SIZE: tl.constexpr,
    SPLIT_LONG: tl.constexpr,
    LONG_FROM: tl.constexpr,
    SPLIT_SHORT: tl.constexpr,
    SHORT_UNDER: tl.constexpr,
    UPCAST: tl.constexpr,
    KV_FP8: tl.constexpr,
    OFF_I32: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    USE_SINKS: tl.constexpr,
    PER_HEAD_SCALES: tl.constexpr,
    MULTI: tl.constexpr,
    USE_TREE: tl.constexpr,
):
    """One split of one sequence's history for ``BLOCK_Q`` of its new tokens times ``BLOCK_H``
    query heads of one kv head (rows token-major). The grid is (the longest query's tiles of
    ``BLOCK_Q`` tokens x ``head_programs`` = kv heads x ``head_blocks`` blocks a kv head, heads
    fastest; the longest history's splits; sequences); a program past its tile's last split,
    or past its sequence's new tokens, ends at once. ``MULTI``: sequences of several new tokens,
    causal (``USE_TREE``: tree-masked, ``tree_words_ptr`` [num_tokens, tree_n] int64, bit ``c % 64``
    of token ``t``'s word ``c // 64`` set where it sees its sequence's new token ``c``); without it, one
    new token a sequence (``BLOCK_Q`` 1, no mask).

    A split writes its running max, denominator and weighted-value sum to the scratch (its
    rows from ``scratch_rows_ptr[i]``, the launch's tokens before sequence ``i``) and counts
    itself in ``done_ptr`` [sequences, programs of axis 0] int32 (zero between launches: the
    merging program resets it, so a CUDA graph can replay the launch); the program whose count
    completes the tile's splits merges them in split order (``_combine`` from the identity: the
    same bits whoever ran them); ``USE_SINKS``: the head's sink (``sinks_ptr`` [num_heads] fp32)
    joins the denominator there, once. A tile of one split is finished by its program, which stores
    and counts nothing (merging one state from the identity gives that state's bits).

    ``scale`` is the softmax scale times an fp8 cache's ``k_scale`` and ``v_scale`` scales the
    output; with ``PER_HEAD_SCALES`` the kv head's instead: ``qk_scales_ptr`` and ``v_scales_ptr``
    [num_kv_heads] fp32 (MLA's one kv head)."""
    ROWS: tl.constexpr = BLOCK_Q * BLOCK_H
    hb = tl.program_id(0) % head_programs
    q_tile = tl.program_id(0) // head_programs
    split = tl.program_id(1)
    i = tl.program_id(2)  # index among the launch's sequences
    seq = tl.load(seq_ids_ptr + i)
    seq_len = tl.load(seq_lens_ptr + seq)
    t0 = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - t0
    context = seq_len - q_len
    split_size = tl.where(seq_len >= LONG_FROM, SPLIT_LONG, SPLIT_SIZE)  # the host's decode_split
    if SHORT_UNDER > 0:
        split_size = tl.where(seq_len < SHORT_UNDER, SPLIT_SHORT, split_size)
    # the keys the tile's last token sees, in whole splits of its history's size
    n_keys = context + tl.minimum(q_len, q_tile * BLOCK_Q + BLOCK_Q)
    n_splits = (n_keys + split_size - 1) // split_size
    if (split < n_splits) & (q_tile * BLOCK_Q < q_len):
        kv_head = hb // head_blocks
        if PER_HEAD_SCALES:  # the kv head's own scales instead of the per-tensor arguments
            scale = tl.load(qk_scales_ptr + kv_head)
            v_scale = tl.load(v_scales_ptr + kv_head)
        r = tl.arange(0, ROWS)
        tok = q_tile * BLOCK_Q + r // BLOCK_H  # the row's new token within its sequence
        g = (hb % head_blocks) * BLOCK_H + r % BLOCK_H  # the row's head within the kv head's group
        row_mask = (g < GROUP) & (tok < q_len)
        head = kv_head * GROUP + g
        dv = tl.arange(0, HEAD_DIM_V)
        dr = tl.arange(0, ROPE_PAD)
        q_row = q_ptr + (t0 + tok)[:, None] * stride_qt + head[:, None] * stride_qh
        q_lat = tl.load(q_row + dv[None, :], mask=row_mask[:, None], other=0.0)  # [ROWS, HEAD_DIM_V]
        rope_mask = row_mask[:, None] & (dr < HEAD_DIM - HEAD_DIM_V)[None, :]
        q_rope = tl.load(q_row + HEAD_DIM_V + dr[None, :], mask=rope_mask, other=0.0)  # [ROWS, ROPE_PAD]
        if UPCAST:
            q_lat = q_lat.to(tl.float32)
            q_rope = q_rope.to(tl.float32)
        s_scale = tl.zeros([ROWS], tl.float32) + scale * 1.4426950408889634  # log2(e): base-2 softmax
        pos = context + tok  # [ROWS] each row's absolute position: it sees keys 0..pos
        # each row's tree words (padding rows point at the sequence's last token's: never stored)
        tree_rows = tree_words_ptr + (t0 + tl.minimum(tok, q_len - 1)).to(tl.int64) * tree_n
        lo = split * split_size
        hi = tl.minimum(n_keys, lo + split_size)
        table_ptr = block_tables_ptr + seq * stride_bt
        m, l_sum, acc = _identity(ROWS, HEAD_DIM_V)
        # the block-table entries a step ahead, so the K loads are not indirect on a load of
        # their own step (the decode kernel's ``_attend_tiles`` says why)
        j_next = lo + tl.arange(0, BLOCK_N)
        blk_next = tl.load(table_ptr + _page_of(j_next, BLOCK_SIZE), mask=j_next < hi, other=0)
        for j0 in range(lo, hi, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)
            blk = blk_next
            j_next = j + BLOCK_N
            blk_next = tl.load(table_ptr + _page_of(j_next, BLOCK_SIZE), mask=j_next < hi, other=0)
            m, l_sum, acc = _mla_tile(
                q_lat,
                q_rope,
                m,
                l_sum,
                acc,
                blk,
                j,
                j < hi,
                pos,
                context,
                tree_rows,
                tree_n,
                cache_ptr,
                kv_head,
                s_scale,
                stride_kb,
                stride_ks,
                stride_kh,
                HEAD_DIM,
                HEAD_DIM_V,
                ROPE_PAD,
                BLOCK_SIZE,
                UPCAST,
                KV_FP8,
                OFF_I32,
                MULTI,
                USE_TREE,
            )
        o_ptrs = out_ptr + (t0 + tok)[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :]
        lse_ptrs = lse_ptr + (t0 + tok) * stride_lt + head
        if n_splits == 1:  # the tile's whole history in this program: finished here
            _finish(
                m,
                l_sum,
                acc,
                sinks_ptr,
                head,
                row_mask,
                v_scale,
                o_ptrs,
                row_mask[:, None],
                lse_ptrs,
                USE_SINKS,
                WRITE_LSE,
            )
        else:
            row = tl.load(scratch_rows_ptr + i) + tok  # [ROWS] the scratch's row of each token
            pa = part_acc_ptr + row[:, None] * stride_pa_row + head[:, None] * HEAD_DIM_V + dv[None, :]
            pml = part_ml_ptr + row * stride_pml_row + head * 2  # [ROWS]
            _store_state(pa, pml, split, m, l_sum, acc, row_mask, stride_pa_split, stride_pml_split)
            # every thread's stores precede the count (the barrier), and the count releases
            # them to the merging program, which acquires them with its own count
            tl.debug_barrier()
            done = done_ptr + i * tl.num_programs(0) + tl.program_id(0)
            if tl.atomic_add(done, 1, sem="acq_rel") == n_splits - 1:
                tl.atomic_xchg(done, 0)  # ready for the next launch (or graph replay)
                # the splits in order from the identity; .cg loads, no pipelining (the decode
                # kernel's merge says why)
                m, l_sum, acc = _identity(ROWS, HEAD_DIM_V)
                for s in tl.range(0, n_splits, num_stages=1):
                    m_s, l_s, acc_s = _load_state(pa, pml, s, row_mask, stride_pa_split, stride_pml_split)
                    m, l_sum, acc = _combine(m, l_sum, acc, m_s, l_s, acc_s)
                _finish(
                    m,
                    l_sum,
                    acc,
                    sinks_ptr,
                    head,
                    row_mask,
                    v_scale,
                    o_ptrs,
                    row_mask[:, None],
                    lse_ptrs,
                    USE_SINKS,
                    WRITE_LSE,
                )
