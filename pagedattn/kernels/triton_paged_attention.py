"""Paged attention as a Triton kernel: a transcription of the tlsim fused loop.

Decode, causal prefill, partial continuation, GQA/MQA and scattered or shared
blocks, for a ragged batch in one launch. One program owns a tile of
``BLOCK_Q`` query tokens of one sequence times all ``GROUP`` query heads of one
kv head (``ROWS = BLOCK_Q * GROUP_PAD`` rows), so each K/V tile it reads serves
the whole GQA group, and walks the visible history ``BLOCK_N`` keys at a time
through the block table with an online softmax in fp32.

Without a GPU, Triton runs this under its interpreter, which must be switched
on with ``TRITON_INTERPRET=1`` *before* this module (and triton) is imported:
the ``triton`` backend arranges that. The interpreter computes bf16 wrongly
(triton-lang/triton#11584: bf16 is kept as raw 16-bit integers, so ``tl.dot``
on bf16 returns garbage and fp32->bf16 casts truncate); on the interpreter,
bf16 inputs therefore run with ``UPCAST=True``: every bf16 tile is converted to
fp32 right after its load (exact), the dots run in fp32, and the result is
written to an fp32 buffer that torch rounds to bf16 on the host.

Every integer that becomes a pointer offset is computed on the host by plain
functions (``check_paged_inputs``, ``launch_config``) that are tested anywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from pagedattn.kernels.tlsim import next_power_of_2

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def interpreter_active() -> bool:
    """True when Triton kernels run under the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ----------------------------------------------------------------- host side
def check_paged_inputs(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> None:
    """Every check the kernel needs before a launch; raises ``ValueError`` naming the
    field and the bound. Reads the small int tensors on the host."""

    def fail(field: str, msg: str) -> ValueError:
        return ValueError(f"paged_attention: {field}: {msg}")

    named = dict(query=query, key_cache=key_cache, value_cache=value_cache, block_tables=block_tables,
                 seq_lens=seq_lens, query_start_loc=query_start_loc)  # fmt: skip
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise fail(name, f"must be a torch.Tensor, got {type(t).__name__}")
    for name, t, rank in (("query", query, 3), ("key_cache", key_cache, 4), ("value_cache", value_cache, 4),
                          ("block_tables", block_tables, 2), ("seq_lens", seq_lens, 1),
                          ("query_start_loc", query_start_loc, 1)):  # fmt: skip
        if t.dim() != rank:
            raise fail(name, f"must have rank {rank}, got shape {tuple(t.shape)}")
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.dtype not in _FLOAT_DTYPES:
            raise fail(name, f"dtype must be float32, float16 or bfloat16, got {t.dtype}")
    if not (query.dtype == key_cache.dtype == value_cache.dtype):
        raise fail("key_cache", f"query, key_cache and value_cache must share a dtype, got "
                                f"{query.dtype}, {key_cache.dtype}, {value_cache.dtype}")  # fmt: skip
    for name in ("block_tables", "seq_lens", "query_start_loc"):
        if named[name].dtype != torch.int32:
            raise fail(name, f"must be int32, got {named[name].dtype}")
    dev = query.device
    for name, t in named.items():
        if t.device != dev:
            raise fail(name, f"is on {t.device}, query is on {dev}: one device for all")
    if key_cache.shape != value_cache.shape:
        raise fail("value_cache", f"shape {tuple(value_cache.shape)} != key_cache {tuple(key_cache.shape)}")
    T, Hq, D = query.shape
    N, bs, Hkv, Dk = key_cache.shape
    if Dk != D:
        raise fail("key_cache", f"head_dim {Dk} must equal query head_dim {D}")
    if min(T, Hq, D, N, bs, Hkv) < 1:
        raise fail("query", f"empty dimension in query {tuple(query.shape)} or cache {tuple(key_cache.shape)}")
    if Hq % Hkv:
        raise fail("query", f"num_heads {Hq} must be a multiple of num_kv_heads {Hkv}")
    for name in ("query", "key_cache", "value_cache"):
        if named[name].stride(-1) != 1:
            raise fail(name, f"the last (head_dim) dimension must be contiguous (stride 1), got strides "
                             f"{named[name].stride()}")  # fmt: skip
    for name, dim in (("block_tables", 1), ("seq_lens", 0), ("query_start_loc", 0)):
        if named[name].stride(dim) != 1:
            raise fail(name, f"dimension {dim} must be contiguous (stride 1), got strides {named[name].stride()}")
    # The kernel addresses the cache with int64 block offsets but int32 everything else.
    if key_cache.stride(1) * bs > 2**31 - 1 or query.numel() > 2**31 - 1:
        raise fail("key_cache", "a block or the query exceeds 2**31 elements; int32 offsets would overflow")
    B = seq_lens.shape[0]
    if B < 1:
        raise fail("seq_lens", "must hold at least one sequence")
    if block_tables.shape[0] != B:
        raise fail("block_tables", f"has {block_tables.shape[0]} rows, seq_lens has {B}")
    if query_start_loc.shape[0] != B + 1:
        raise fail("query_start_loc", f"must have num_seqs + 1 = {B + 1} entries, got {query_start_loc.shape[0]}")
    if scale is not None and not (0.0 < float(scale) < float("inf")):
        raise fail("scale", f"must be finite and > 0, got {scale}")
    loc = query_start_loc.tolist()
    lens = seq_lens.tolist()
    if loc[0] != 0 or loc[-1] != T:
        raise fail("query_start_loc", f"must start at 0 and end at num_tokens = {T}, got {loc[0]} .. {loc[-1]}")
    M = block_tables.shape[1]
    tables = block_tables.cpu()
    for b in range(B):
        q_b = loc[b + 1] - loc[b]
        if q_b < 1:
            raise fail("query_start_loc", f"sequence {b} has {q_b} new tokens; every sequence needs >= 1")
        if not q_b <= lens[b]:
            raise fail("seq_lens", f"seq_lens[{b}]={lens[b]} is below its query length {q_b}")
        need = -(-lens[b] // bs)
        if need > M:
            raise fail("seq_lens", f"seq_lens[{b}]={lens[b]} needs {need} blocks, block_tables has {M} columns")
        used = tables[b, :need]
        if need and (int(used.min()) < 0 or int(used.max()) >= N):
            raise fail("block_tables", f"row {b} holds a block id outside [0, num_blocks={N})")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.shape != query.shape or out.dtype != query.dtype:
            raise fail("out", f"must be a {query.dtype} tensor of shape {tuple(query.shape)}")
        if out.device != dev:
            raise fail("out", f"is on {out.device}, query is on {dev}")
        if out.stride(-1) != 1:
            raise fail("out", "the last dimension must be contiguous")


@dataclass(frozen=True)
class LaunchConfig:
    """Every meta-parameter and the grid of one launch."""

    grid: tuple[int, int, int]  # (num_seqs, query tiles, num_kv_heads)
    GROUP: int
    GROUP_PAD: int
    BLOCK_Q: int
    BLOCK_N: int
    HEAD_DIM: int
    HEAD_DIM_PAD: int
    BLOCK_SIZE: int
    UPCAST: bool
    IEEE_FP32: bool

    @property
    def rows(self) -> int:
        return self.BLOCK_Q * self.GROUP_PAD


#: tl.dot needs every dimension >= 16 on NVIDIA GPUs (the interpreter accepts less).
MIN_DOT = 16


def launch_config(
    num_seqs: int,
    max_query_len: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    interpreter: bool,
    block_n: int = 32,
    rows: int = 16,
) -> LaunchConfig:
    """The grid and tile sizes, from sizes alone.

    ``BLOCK_Q`` depends on the GQA group only, never on the other sequences of the
    batch, so a sequence computes the same bits alone or in any batch.
    """
    group = num_heads // num_kv_heads
    group_pad = next_power_of_2(group)
    block_q = max(1, rows // group_pad)
    return LaunchConfig(
        grid=(num_seqs, -(-max_query_len // block_q), num_kv_heads),
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        BLOCK_N=max(MIN_DOT, next_power_of_2(block_n)),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(MIN_DOT, next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size,
        UPCAST=interpreter and dtype == torch.bfloat16,
        IEEE_FP32=True,
    )


# --------------------------------------------------------------- the kernel
_kernel = None


def _build_kernel():
    """Define the @triton.jit kernel on first use, so that importing this module
    (for the host-side functions) never needs triton."""
    import triton
    import triton.language as tl

    @triton.jit
    def _paged_attention_kernel(
        # pointers
        q_ptr,
        k_cache_ptr,
        v_cache_ptr,
        block_tables_ptr,
        seq_lens_ptr,
        query_start_loc_ptr,
        out_ptr,
        # sizes
        scale,
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
    ):
        seq = tl.program_id(0)
        q_tile = tl.program_id(1)
        kv_head = tl.program_id(2)
        seq_len = tl.load(seq_lens_ptr + seq)
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
        if q_tile * BLOCK_Q < q_len:  # the grid is sized for the longest query of the batch
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
            context = seq_len - q_len
            pos = context + tok  # absolute position of each row: it sees keys 0..pos
            # keys visible to the last query of this tile
            n_keys = context + tl.minimum(q_len, (q_tile + 1) * BLOCK_Q)

            m = tl.full([ROWS], float("-inf"), dtype=tl.float32)
            l_sum = tl.zeros([ROWS], dtype=tl.float32)
            acc = tl.zeros([ROWS, HEAD_DIM_PAD], dtype=tl.float32)
            for j0 in range(0, n_keys, BLOCK_N):
                j = j0 + tl.arange(0, BLOCK_N)
                kmask = j < n_keys
                blk = tl.load(block_tables_ptr + seq * stride_bt + j // BLOCK_SIZE, mask=kmask, other=0)
                blk = blk.to(tl.int64)
                slot = j % BLOCK_SIZE
                k_off = blk * stride_kb + slot * stride_ks + kv_head * stride_kh  # [BLOCK_N]
                v_off = blk * stride_vb + slot * stride_vs + kv_head * stride_vh
                kt = tl.load(k_cache_ptr + k_off[None, :] + d[:, None], mask=kmask[None, :] & dmask[:, None], other=0.0)
                v = tl.load(v_cache_ptr + v_off[:, None] + d[None, :], mask=kmask[:, None] & dmask[None, :], other=0.0)
                if UPCAST:
                    kt = kt.to(tl.float32)
                    v = v.to(tl.float32)
                if IEEE_FP32:
                    s = tl.dot(q, kt, input_precision="ieee") * scale  # [ROWS, BLOCK_N]
                else:
                    s = tl.dot(q, kt) * scale
                # masked loads gave zero keys, and a zero key still scores: force them out
                visible = kmask[None, :] & (j[None, :] <= pos[:, None])
                s = tl.where(visible, s, float("-inf"))
                m_new = tl.maximum(m, tl.max(s, 1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
                alpha = tl.exp(m - m_safe)  # rescale what was accumulated under the old max
                p = tl.exp(s - m_safe[:, None])
                l_sum = l_sum * alpha + tl.sum(p, 1)
                if IEEE_FP32:
                    pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
                else:
                    pv = tl.dot(p.to(v.dtype), v)
                acc = acc * alpha[:, None] + pv
                m = m_new
            l_safe = tl.where(row_mask, l_sum, 1.0)  # padding rows are never stored
            result = acc / l_safe[:, None]
            o_off = (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
            tl.store(out_ptr + o_off, result.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & dmask[None, :])

    return _paged_attention_kernel


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Paged attention over a ragged batch, one Triton launch.

    Args:
        query: ``[num_tokens, num_heads, head_dim]`` float32/float16/bfloat16.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``,
            query dtype; any strides with a contiguous last dimension.
        block_tables: ``[num_seqs, max_blocks]`` int32 (entries past a sequence's last
            block are never read).
        seq_lens: ``[num_seqs]`` int32, new tokens included.
        query_start_loc: ``[num_seqs + 1]`` int32.
        scale: softmax scale, default ``head_dim ** -0.5``.
        out: optional ``[num_tokens, num_heads, head_dim]`` query-dtype tensor to write.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in the query dtype (``out`` if given).
    """
    global _kernel
    check_paged_inputs(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale, out)
    if scale is None:
        scale = query.shape[-1] ** -0.5
    interp = interpreter_active()
    if query.device.type != "cuda" and not interp:
        raise RuntimeError(
            "paged_attention: tensors are on the CPU but the Triton interpreter is off; set TRITON_INTERPRET=1 "
            "before importing triton (the `triton` backend does this) or move the tensors to a GPU"
        )
    loc = query_start_loc.tolist()
    max_q = max(loc[i + 1] - loc[i] for i in range(len(loc) - 1))
    T, Hq, D = query.shape
    cfg = launch_config(seq_lens.shape[0], max_q, Hq, key_cache.shape[2], D, key_cache.shape[1], query.dtype, interp)
    if out is None:
        out = torch.empty_like(query)
    # bf16 on the interpreter: write fp32, round with torch (the interpreter truncates)
    target = torch.empty(out.shape, dtype=torch.float32, device=out.device) if cfg.UPCAST else out
    if _kernel is None:
        _kernel = _build_kernel()
    _kernel[cfg.grid](
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, target,
        float(scale),
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        target.stride(0), target.stride(1),
        GROUP=cfg.GROUP, GROUP_PAD=cfg.GROUP_PAD, BLOCK_Q=cfg.BLOCK_Q, BLOCK_N=cfg.BLOCK_N,
        HEAD_DIM=cfg.HEAD_DIM, HEAD_DIM_PAD=cfg.HEAD_DIM_PAD, BLOCK_SIZE=cfg.BLOCK_SIZE,
        UPCAST=cfg.UPCAST, IEEE_FP32=cfg.IEEE_FP32,
    )  # fmt: skip
    if cfg.UPCAST:
        out.copy_(target)
    return out
