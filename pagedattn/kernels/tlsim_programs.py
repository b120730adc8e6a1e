"""Paged attention as tlsim programs: the gather, the cache write, and the fused
streaming kernel that the Triton kernel transcribes.

Each kernel reads like its Triton counterpart: pointers (flat buffers), sizes,
strides, then meta-parameters in UPPER_CASE. The host wrappers below compute
every integer that becomes an offset (strides, grid, padded tile sizes).
"""

from __future__ import annotations

import torch

from pagedattn.indexing import token_to_seq
from pagedattn.kernels import tlsim as tl
from pagedattn.oracle import PagedCase
from pagedattn.validation import ProblemError, check_slot_mapping


# --------------------------------------------------------------------- gather
def _gather_kernel(
    prog: tl.Program,
    # pointers
    pool,
    table,
    out,
    # sizes
    seq_len: int,
    # strides (elements)
    stride_block: int,
    stride_slot: int,
    # meta
    ROW: int,
    BLOCK_SIZE: int,
    TILE: int,
):
    pos = prog.program_id(0) * TILE + tl.arange(0, TILE)  # [TILE]
    mask = pos < seq_len  # the ragged last tile
    blk = tl.load(table, pos // BLOCK_SIZE, mask, 0)
    src = blk * stride_block + (pos % BLOCK_SIZE) * stride_slot  # [TILE]
    cols = tl.arange(0, ROW)
    vals = tl.load(pool, src[:, None] + cols[None, :], mask[:, None])
    tl.store(out, pos[:, None] * ROW + cols[None, :], vals, mask[:, None])


def gather_sequence(pool: torch.Tensor, block_table: torch.Tensor, seq_len: int, tile: int = 16) -> torch.Tensor:
    """One sequence's history read through its block table (the oracle's
    ``gather_history`` as a tlsim program).

    Args:
        pool: ``[num_blocks, block_size, num_kv_heads, head_dim]`` any dtype.
        block_table: ``[max_blocks]`` int32, the sequence's row (padding never read).
        seq_len: tokens to read.
        tile: positions per program.

    Returns:
        ``[seq_len, num_kv_heads, head_dim]``, bit-identical to ``pool[slots]``.
    """
    pool = pool.contiguous()
    N, bs = pool.shape[:2]
    row = pool[0, 0].numel()
    out = torch.empty(seq_len, *pool.shape[2:], dtype=pool.dtype, device=pool.device)
    tl.launch(
        tl.cdiv(seq_len, tile),
        _gather_kernel,
        pool.view(-1),
        block_table.contiguous().view(-1).to(torch.int64),
        out.view(-1),
        seq_len,
        bs * row,
        row,
        ROW=row,
        BLOCK_SIZE=bs,
        TILE=tile,
    )
    return out


def _slots_kernel(prog: tl.Program, pool, slots, rows, n: int, ROW: int, TILE: int, WRITE: bool):
    i = prog.program_id(0) * TILE + tl.arange(0, TILE)
    in_range = i < n
    slot = tl.load(slots, i, in_range, -1)
    mask = in_range & (slot >= 0)  # slot < 0: skip the row
    cols = tl.arange(0, ROW)
    pool_off = slot[:, None] * ROW + cols[None, :]
    row_off = i[:, None] * ROW + cols[None, :]
    if WRITE:
        tl.store(pool, pool_off, tl.load(rows, row_off, mask[:, None]), mask[:, None])
    else:
        tl.store(rows, row_off, tl.load(pool, pool_off, mask[:, None]), mask[:, None])


def gather_slots(pool: torch.Tensor, slot_mapping: torch.Tensor, tile: int = 16) -> torch.Tensor:
    """``pool.view(-1, ...)[slot_mapping]``: ``[n, num_kv_heads, head_dim]`` from a
    ``[num_blocks, block_size, num_kv_heads, head_dim]`` pool; every slot in
    ``[0, num_blocks * block_size)`` (``pagedattn.validation.check_slot_mapping``)."""
    check_slot_mapping("gather_slots", pool, slot_mapping)
    pool = pool.contiguous()
    row = pool[0, 0].numel()
    n = slot_mapping.shape[0]
    out = torch.empty(n, *pool.shape[2:], dtype=pool.dtype, device=pool.device)
    tl.launch(
        tl.cdiv(n, tile),
        _slots_kernel,
        pool.view(-1),
        slot_mapping.to(torch.int64),
        out.view(-1),
        n,
        ROW=row,
        TILE=tile,
        WRITE=False,
    )
    return out


def write_slots(pool: torch.Tensor, slot_mapping: torch.Tensor, new: torch.Tensor, tile: int = 16) -> None:
    """``pool.view(-1, ...)[slot] = new[i]`` for every ``slot >= 0``, in place.
    pool must be contiguous (it is written through a flat view); slots and ``new`` as
    ``pagedattn.validation.check_slot_mapping`` states."""
    check_slot_mapping("write_slots", pool, slot_mapping, new)
    if not pool.is_contiguous():
        raise ProblemError(
            "write_slots",
            "pool",
            f"must be contiguous (it is written in place through a flat view), got strides {pool.stride()}",
        )
    row = pool[0, 0].numel()
    n = slot_mapping.shape[0]
    tl.launch(
        tl.cdiv(n, tile),
        _slots_kernel,
        pool.view(-1),
        slot_mapping.to(torch.int64),
        new.contiguous().view(-1),
        n,
        ROW=row,
        TILE=tile,
        WRITE=True,
    )


# ----------------------------------------------------------- fused attention
def _attention_kernel(
    prog: tl.Program,
    # pointers (flat buffers)
    q,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    query_start_loc,
    token_seq,
    alibi_slopes,
    sinks,
    out,
    lse,
    # sizes
    scale: float,
    k_scale: float,
    v_scale: float,
    sliding_window: int,
    logits_soft_cap: float,
    # strides (elements)
    stride_qt: int,
    stride_qh: int,
    stride_kb: int,
    stride_ks: int,
    stride_kh: int,
    stride_bt: int,
    stride_ot: int,
    stride_oh: int,
    # meta
    GROUP: int,
    HEAD_DIM: int,
    HEAD_DIM_PAD: int,
    BLOCK_SIZE: int,
    TILE: int,
    USE_WINDOW: bool,
    USE_SOFTCAP: bool,
    USE_ALIBI: bool,
    USE_SINKS: bool,
    WRITE_LSE: bool,
):
    t = prog.program_id(0)  # query token
    kv_head = prog.program_id(1)  # all GROUP query heads of this kv head
    seq = int(tl.load(token_seq, tl.arange(t, t + 1))[0])
    seq_len = int(tl.load(seq_lens, tl.arange(seq, seq + 1))[0])
    bounds = tl.load(query_start_loc, tl.arange(seq, seq + 2))
    q_start, q_len = int(bounds[0]), int(bounds[1] - bounds[0])
    pos = seq_len - q_len + (t - q_start)  # absolute position: sees keys 0..pos
    n_keys = pos + 1
    first = max(0, pos - sliding_window + 1) if USE_WINDOW else 0  # the window's first key
    # start on a tile edge below it: tiles stay aligned, the mask drops the keys before it
    lo = first - first % TILE

    heads = kv_head * GROUP + tl.arange(0, GROUP)  # [G]
    d = tl.arange(0, HEAD_DIM_PAD)
    dmask = d < HEAD_DIM  # padded channels
    q_tile = tl.load(q, t * stride_qt + heads[:, None] * stride_qh + d[None, :], dmask[None, :]).float()  # [G, Dp]
    slopes = tl.load(alibi_slopes, heads) if USE_ALIBI else torch.zeros(GROUP, device=q.device)

    m = torch.full((GROUP,), float("-inf"), device=q.device)
    l_sum = torch.zeros(GROUP, device=q.device)
    acc = torch.zeros(GROUP, HEAD_DIM_PAD, device=q.device)
    if USE_SINKS:  # the sink starts the running softmax: weight exp(sink - m), no value
        m = tl.load(sinks, heads).float()
        l_sum = torch.ones(GROUP, device=q.device)
    for j0 in range(lo, n_keys, TILE):
        j = j0 + tl.arange(0, TILE)
        kmask = (j < n_keys) & (j >= first)
        blk = tl.load(block_tables, seq * stride_bt + j // BLOCK_SIZE, kmask, 0)
        base = blk * stride_kb + (j % BLOCK_SIZE) * stride_ks + kv_head * stride_kh  # [TILE]
        both = kmask[:, None] & dmask[None, :]
        k = tl.load(k_cache, base[:, None] + d[None, :], both).float()  # [TILE, Dp], fp8 upcast exactly
        v = tl.load(v_cache, base[:, None] + d[None, :], both).float()
        s = (q_tile @ k.T) * (scale * k_scale)  # [G, TILE]
        if USE_SOFTCAP:
            s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
        if USE_ALIBI:
            s = s + slopes[:, None] * (j - pos).float()[None, :]
        # a masked load gave zero keys, and a zero key still scores: force them out (after the cap)
        s = torch.where(kmask[None, :], s, torch.tensor(float("-inf"), device=s.device))
        m_new = torch.maximum(m, s.amax(dim=1))
        alpha = torch.exp(m - m_new)  # rescale what was accumulated under the old max
        p = torch.exp(s - m_new[:, None])
        l_sum = l_sum * alpha + p.sum(dim=1)
        acc = acc * alpha[:, None] + p @ v
        m = m_new
    result = acc * (v_scale / l_sum)[:, None]
    tl.store(out, t * stride_ot + heads[:, None] * stride_oh + d[None, :], result, dmask[None, :])
    if WRITE_LSE:
        tl.store(lse, t * (GROUP * prog.num_programs(1)) + heads, m + torch.log(l_sum))


def paged_attention(case: PagedCase, tile: int = 16, return_lse: bool = False):
    """The fused streaming kernel over a ragged batch, as tlsim programs.

    One program per (query token, kv head) walks the token's visible history (its
    sliding window only, when the case has one) a tile of ``tile`` keys at a time
    through the block table, with an online softmax in fp32 that starts from the sink
    when the case has sinks; the full history is never assembled. fp8 caches are read
    as stored and upcast exactly; ``k_scale`` joins the score scale, ``v_scale`` the
    final normalization.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in the query dtype; with ``return_lse``,
        also ``[num_tokens, num_heads]`` float32 (natural log, sink included).
    """
    if case.per_head_scales:
        raise NotImplementedError("tlsim paged_attention: no per-head fp8 scales (one k_scale, one v_scale)")
    q = case.query.contiguous()
    k = case.key_cache.contiguous()
    v = case.value_cache.contiguous()
    tables = case.block_tables.contiguous()
    out = torch.empty_like(q)
    lse = torch.empty(case.num_tokens, case.num_heads, dtype=torch.float32, device=q.device)
    none = torch.zeros(1, device=q.device)  # a placeholder buffer for an unused pointer
    tl.launch(
        (case.num_tokens, case.num_kv_heads),
        _attention_kernel,
        q.view(-1),
        k.view(-1),
        v.view(-1),
        tables.view(-1).to(torch.int64),
        case.seq_lens.to(torch.int64),
        case.query_start_loc.to(torch.int64),
        token_to_seq(case.query_start_loc, case.num_tokens),
        case.alibi_slopes if case.alibi_slopes is not None else none,
        case.sinks if case.sinks is not None else none,
        out.view(-1),
        lse.view(-1),
        case.scale,
        case.k_scale,
        case.v_scale,
        case.sliding_window or 0,
        case.logits_soft_cap or 0.0,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=case.gqa_ratio,
        HEAD_DIM=case.head_dim,
        HEAD_DIM_PAD=tl.next_power_of_2(case.head_dim),
        BLOCK_SIZE=case.block_size,
        TILE=tile,
        USE_WINDOW=case.sliding_window is not None,
        USE_SOFTCAP=case.logits_soft_cap is not None,
        USE_ALIBI=case.alibi_slopes is not None,
        USE_SINKS=case.sinks is not None,
        WRITE_LSE=return_lse,
    )
    return (out, lse) if return_lse else out
