"""The decode kernel: the sequences of a batch with one new token, their history split
across programs and merged in the same launch.

A program owns one kv head's query group of one sequence (``GROUP`` rows padded to
``GROUP_PAD``) and ``splits_per_program`` consecutive splits of its history (``SPLIT_SIZE``
keys, ``SPLIT_LONG`` for long histories, ``SPLIT_SHORT`` for short ones: the host's
``decode_split``), so one long sequence still fills the GPU. Each split writes its running
max, denominator and weighted-V sum; the program that finishes last combines them by
log-sum-exp, in a fixed order (the history's splits in parts of ``max(1, splits //
FOLD_PARTS)``, each folded, then the parts), in the same launch. A program may walk several
splits in one loop (``SPLIT_LOOP``), folding whole parts there and writing one state a part
(``LOOP_PARTS``), and one that walks all of its sequence's merges them in that loop and
writes nothing else (``SPLIT_WHOLE``). The host's ``plan_launch`` decides, from each
sequence's own sizes only, so results never depend on the rest of the batch.

This module imports triton: import it only after the interpreter has been decided.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pagedattn.kernels.triton_tiles import _attend_tiles, _folded_scale, _page_of, _query_rows, _step

#: integer arguments the JIT must not specialize (on 1, on divisibility by 16): each value class
#: would be a kernel of its own to compile, and none of them shapes a vectorized access. (Not
#: ``stride_pa_seq``: its divisibility by 16, always true, vectorizes the merge's loads.)
_PLAIN_INTS = ("window", "stride_bt", "stride_lt", "n_kv_heads", "n_groups", "splits_per_program", "stride_pml_seq")


@triton.jit
def _combine(m, l_sum, acc, m_s, l_s, acc_s):
    """A running merge of split states, the next split's ``(m_s, l_s, acc_s)`` into ``(m, l_sum, acc)``
    ([ROWS], [ROWS], [ROWS, HEAD_DIM_PAD] fp32; maxima in base 2). From ``m = -inf, l_sum = 0,
    acc = 0`` it returns the first state exactly (weights 0 and 1)."""
    m_new = tl.maximum(m, m_s)
    # both maxima -inf (a split whose every score is -inf, folded into the identity): weights 0,
    # not exp(-inf - -inf) = NaN; a finite maximum is unchanged, so are the bits
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    a = tl.exp2(m - m_safe)  # the partial maxima are in base 2
    b = tl.exp2(m_s - m_safe)
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
):
    """A decode row's end: the sink joins the merged state ``(m, l_sum, acc)``, and the output
    (``o_ptrs`` [ROWS, HEAD_DIM_PAD], under ``o_mask``) and the lse (``lse_ptrs`` [ROWS]) are written."""
    if USE_SINKS:
        sink = tl.load(sinks_ptr + head, mask=row_mask, other=0.0)
        sink = sink * 1.4426950408889634  # in base 2, as the maxima are
        m_new = tl.maximum(m, sink)
        a = tl.exp2(m - m_new)
        l_sum = l_sum * a + tl.exp2(sink - m_new)
        acc = acc * a[:, None]
        m = m_new
    result = acc * (v_scale / l_sum)[:, None]
    tl.store(o_ptrs, result.to(o_ptrs.dtype.element_ty), mask=o_mask)
    if WRITE_LSE:
        lse = (m + tl.log2(l_sum)) * 0.6931471805599453  # base 2 to natural log
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
    qk_scales_ptr,
    v_scales_ptr,
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
    # strides (elements); partials are [n_decode, plan.scratch_splits, num_heads, HEAD_DIM_V_PAD] and [..., 2]
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
    HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SPLIT_SIZE: tl.constexpr,
    SPLIT_LONG: tl.constexpr,
    LONG_FROM: tl.constexpr,
    SPLIT_SHORT: tl.constexpr,
    SHORT_UNDER: tl.constexpr,
    UPCAST: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    USE_SINKS: tl.constexpr,
    KV_FP8: tl.constexpr,
    F16_DOTS: tl.constexpr,
    OFF_I32: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    FLAT_GRID: tl.constexpr,
    SPLIT_LOOP: tl.constexpr,
    SPLIT_WHOLE: tl.constexpr,
    FOLD_PARTS: tl.constexpr,
    LOOP_PARTS: tl.constexpr,
    PER_HEAD_SCALES: tl.constexpr,
):
    """``splits_per_program`` consecutive splits of one decode sequence's history for one kv
    head's query group (the grid's ``n_groups`` programs of a sequence and kv head cover the
    longest history's splits): one split through ``_attend_tiles``, or with ``SPLIT_LOOP`` any
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
    not in every split.

    ``scale`` is the softmax scale times an fp8 cache's ``k_scale`` and ``v_scale`` scales the
    output; with ``PER_HEAD_SCALES`` the program's kv head's instead: ``qk_scales_ptr`` and
    ``v_scales_ptr`` [num_kv_heads] fp32 (the merging program is one of that kv head's)."""
    # kv heads fastest: the programs of one split of one sequence start together and read the
    # same pages (a page row holds every kv head) at once; one axis where three cannot hold it
    if FLAT_GRID:
        pid = tl.program_id(0)
        kv_head = pid % n_kv_heads
        grp = (pid // n_kv_heads) % n_groups
        i = pid // (n_kv_heads * n_groups)  # index among the decode sequences
    else:
        kv_head = tl.program_id(0)
        grp = tl.program_id(1)
        i = tl.program_id(2)  # index among the decode sequences
    seq = tl.load(seq_ids_ptr + i)
    seq_len = tl.load(seq_lens_ptr + seq)
    first = 0
    if USE_WINDOW:  # the new token's first visible key: splits wholly before it have no work
        first = tl.maximum(0, seq_len - window)
    split_size = tl.where(seq_len >= LONG_FROM, SPLIT_LONG, SPLIT_SIZE)  # the host's decode_split
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
        if PER_HEAD_SCALES:  # the kv head's own scales instead of the per-tensor arguments
            scale = tl.load(qk_scales_ptr + kv_head)
            v_scale = tl.load(v_scales_ptr + kv_head)
        t = tl.load(query_start_loc_ptr + seq)
        g = tl.arange(0, GROUP_PAD)
        head = kv_head * GROUP + g
        row_mask = g < GROUP
        d = tl.arange(0, HEAD_DIM_PAD)
        dmask = d < HEAD_DIM
        dv = tl.arange(0, HEAD_DIM_V_PAD)  # the value's columns: the output's and the scratch's
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
        m, l_sum, acc = _identity(GROUP_PAD, HEAD_DIM_V_PAD)
        if not SPLIT_LOOP:  # one split a program (the host sets splits_per_program 1), every tile masked
            lo = tl.maximum(sa * split_size, first)
            hi = tl.minimum(seq_len, sa * split_size + split_size)
            table_ptr = block_tables_ptr + seq * stride_bt
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
                hi,
                hi,
                pos,
                slopes,
                qk_scale,
                s_scale,
                window,
                soft_cap,
                seq_ids_ptr,  # no tree mask: decodes see every key
                0,
                0,
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
                False,
                False,
            )
            # the scratch's addresses formed after the loop, in each branch: formed before the
            # branch, they stay live through this loop (sm_90, triton 3.6: 146 registers, not 118)
            pa = part_acc_ptr + i * stride_pa_seq + head[:, None] * HEAD_DIM_V_PAD + dv[None, :]  # [GROUP_PAD, D]
            pml = part_ml_ptr + i * stride_pml_seq + head * 2  # [GROUP_PAD]
            _store_state(pa, pml, sa, m, l_sum, acc, row_mask, stride_pa_split, stride_pml_split)
        else:
            s_scale = _folded_scale(qk_scale, USE_SOFTCAP, USE_ALIBI)
            pa = part_acc_ptr + i * stride_pa_seq + head[:, None] * HEAD_DIM_V_PAD + dv[None, :]  # [GROUP_PAD, D]
            pml = part_ml_ptr + i * stride_pml_seq + head * 2  # [GROUP_PAD]
            table_ptr = block_tables_ptr + seq * stride_bt
            # One loop over the tiles of every split of the program, so the K/V pipeline runs on
            # across a split's end, where the split's state is stored (or, ``SPLIT_WHOLE``, merged)
            # and restarted: each split computes the same bits as a program of its own would
            # (``splits_per_program`` is a launch shape, not a numerical choice). A split starts at
            # its first visible key (the window's start in the first split) and ends at its last:
            # tiles are masked there.
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
                m_all, l_all, acc_all = _identity(GROUP_PAD, HEAD_DIM_V_PAD)
            if FOLD_PARTS > 0 and (SPLIT_WHOLE or LOOP_PARTS):  # the current part (index, last split), its state
                part = sa // fold
                part_last = tl.minimum(part * fold + fold, n_splits) - 1  # counted on: no division in the loop
                m_p, l_p, acc_p = _identity(GROUP_PAD, HEAD_DIM_V_PAD)
            for _ in range(0, n_tiles):
                j = j0 + tl.arange(0, BLOCK_N)
                # the next tile: on in this split, or the next split's first
                wrap = j0 + BLOCK_N >= end
                next_split = split + wrap.to(tl.int32)
                next_j0 = tl.where(wrap, next_split * split_size, j0 + BLOCK_N)
                next_end = tl.where(wrap, tl.minimum(next_j0 + split_size, seq_len), end)
                # the block-table entries a step ahead, as ``_attend_tiles`` loads them
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
                    seq_ids_ptr,  # no tree mask: decodes see every key
                    0,
                    0,
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
                    True,
                    False,
                    False,
                )
                if wrap:  # the split's last tile: its state to the scratch (or merged here), a fresh one next
                    # (parts of one split are the splits: folding one from the identity gives its
                    # state, so they take the plain path)
                    if SPLIT_WHOLE:
                        if FOLD_PARTS > 0 and fold > 1:  # into the part; a finished part into the whole
                            m_p, l_p, acc_p = _combine(m_p, l_p, acc_p, m, l_sum, acc)
                            if split == part_last:
                                m_all, l_all, acc_all = _combine(m_all, l_all, acc_all, m_p, l_p, acc_p)
                                m_p, l_p, acc_p = _identity(GROUP_PAD, HEAD_DIM_V_PAD)
                                part_last = tl.minimum(part_last + fold, n_splits - 1)
                        else:
                            m_all, l_all, acc_all = _combine(m_all, l_all, acc_all, m, l_sum, acc)
                    elif LOOP_PARTS:
                        if fold > 1:  # into the part; a finished part stored in its slot
                            m_p, l_p, acc_p = _combine(m_p, l_p, acc_p, m, l_sum, acc)
                            if split == part_last:
                                _store_state(
                                    pa, pml, part, m_p, l_p, acc_p, row_mask, stride_pa_split, stride_pml_split
                                )
                                m_p, l_p, acc_p = _identity(GROUP_PAD, HEAD_DIM_V_PAD)
                                part += 1
                                part_last = tl.minimum(part_last + fold, n_splits - 1)
                        else:
                            _store_state(pa, pml, split, m, l_sum, acc, row_mask, stride_pa_split, stride_pml_split)
                    else:
                        _store_state(pa, pml, split, m, l_sum, acc, row_mask, stride_pa_split, stride_pml_split)
                    m, l_sum, acc = _identity(GROUP_PAD, HEAD_DIM_V_PAD)
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
                    out_ptr + t * stride_ot + head[:, None] * stride_oh + dv[None, :],
                    row_mask[:, None] & (dv < HEAD_DIM_V)[None, :],
                    lse_ptr + t * stride_lt + head,
                    USE_SINKS,
                    WRITE_LSE,
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
                    m, l_sum, acc = _identity(GROUP_PAD, HEAD_DIM_V_PAD)
                    one_level = fold == 1  # parts of one split: the splits
                    if LOOP_PARTS:
                        one_level = fold > 0
                    if one_level:  # stored as parts
                        for c in tl.range(first_split // fold, (n_splits + fold - 1) // fold, num_stages=1):
                            m_s, l_s, acc_s = _load_state(pa, pml, c, row_mask, stride_pa_split, stride_pml_split)
                            m, l_sum, acc = _combine(m, l_sum, acc, m_s, l_s, acc_s)
                    else:  # stored as splits: each part folded here, then into the whole at its end
                        m_c, l_c, acc_c = _identity(GROUP_PAD, HEAD_DIM_V_PAD)
                        last = tl.minimum((first_split // fold) * fold + fold, n_splits) - 1
                        for s in tl.range(first_split, n_splits, num_stages=1):
                            m_s, l_s, acc_s = _load_state(pa, pml, s, row_mask, stride_pa_split, stride_pml_split)
                            m_c, l_c, acc_c = _combine(m_c, l_c, acc_c, m_s, l_s, acc_s)
                            if s == last:
                                m, l_sum, acc = _combine(m, l_sum, acc, m_c, l_c, acc_c)
                                m_c, l_c, acc_c = _identity(GROUP_PAD, HEAD_DIM_V_PAD)
                                last = tl.minimum(last + fold, n_splits - 1)
                else:  # the splits in one fold, from the first one's state
                    m, l_sum, acc = _load_state(pa, pml, first_split, row_mask, stride_pa_split, stride_pml_split)
                    for s in tl.range(first_split + 1, n_splits, num_stages=1):
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
                    out_ptr + t * stride_ot + head[:, None] * stride_oh + dv[None, :],
                    row_mask[:, None] & (dv < HEAD_DIM_V)[None, :],
                    lse_ptr + t * stride_lt + head,
                    USE_SINKS,
                    WRITE_LSE,
                )
