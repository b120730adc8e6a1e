"""Converters between the canonical case and the cache layouts real kernels take.

Each ``to_*`` returns what that kernel's call needs; each ``from_*`` reads it back
into a ``PagedCase`` (bit-identical data), so converters are tested by round trips.

| kernel | K / V cache | sequence description |
|---|---|---|
| canonical (vLLM v1) | ``[N, bs, Hkv, D]`` | ``block_tables``, ``seq_lens``, ``query_start_loc`` |
| vLLM split cache (v0 paged_attention) | K ``[N, Hkv, D/x, bs, x]``, V ``[N, Hkv, D, bs]`` | same |
| FlashInfer NHD / HND | ``[N, 2, bs, Hkv, D]`` / ``[N, 2, Hkv, bs, D]`` | ``kv_indptr``, ``kv_indices``, |
|   |   | ``kv_last_page_len``, ``qo_indptr`` |
| FlashAttention (paged) | ``[N, bs, Hkv, D]`` | ``block_table``, ``cache_seqlens``, ``cu_seqlens_q`` |
| SGLang token pool | ``[num_slots, Hkv, D]`` | ``kv_indptr``, ``kv_indices`` (token slots), ``req_to_token`` |
| FlexAttention paged | ``[1, Hkv, N * bs, D]`` | ``page_table`` ``[B, M]`` (logical -> physical page) |
| head-major pages (``to_hnd_cache``) | ``[N, Hkv, bs, D]`` | same as canonical |

Building blocks for kernels that split a step into its cached prefix and its new tokens
(SGLang's extend, decode-only kernels): ``new_tokens_kv`` (the new tokens' K/V as
contiguous ``[T, Hkv, D]`` tensors), ``token_kv_indices`` (per-request token slots, whole
history or prefix only, as CSR), ``req_to_token`` (the same slots as a padded table) and
``to_decode_rows`` (a ragged batch flattened into one decode row per query token).
"""

from __future__ import annotations

import torch

from pagedattn.indexing import index_rows
from pagedattn.oracle import PagedCase
from pagedattn.validation import ProblemError


def _loc(lens: list[int], device) -> torch.Tensor:
    return torch.tensor([0] + lens, device=device).cumsum(0).to(torch.int32)


# ------------------------------------------------------------ building blocks
def to_hnd_cache(cache: torch.Tensor) -> torch.Tensor:
    """``[N, Hkv, bs, D]`` (head-major pages, contiguous) from the canonical ``[N, bs, Hkv, D]``."""
    return cache.transpose(1, 2).contiguous()


def from_hnd_cache(cache: torch.Tensor) -> torch.Tensor:
    """The canonical ``[N, bs, Hkv, D]`` from head-major ``[N, Hkv, bs, D]`` pages (contiguous)."""
    return cache.transpose(1, 2).contiguous()


def token_kv_indices(case: PagedCase, part: str = "all") -> tuple[torch.Tensor, torch.Tensor]:
    """Token slots of every request's history, as CSR (SGLang's ``kv_indptr``/``kv_indices``).

    Args:
        part: ``"all"``: each request's whole history (``seq_len`` slots, what a decode kernel
            reads); ``"prefix"``: only its cached prefix (``seq_len - query_len`` slots, what
            SGLang's extend kernel reads from the pool; the new tokens come contiguous, see
            ``new_tokens_kv``).

    Returns:
        ``kv_indptr`` ``[B + 1]`` int32 and ``kv_indices`` int64 slots into the flattened pool
        ``[N * bs, Hkv, D]``, request after request, in position order.
    """
    if part not in ("all", "prefix"):
        raise ProblemError("token_kv_indices", "part", f"must be 'all' or 'prefix', got {part!r}")
    slots = [case.slot_mapping(b) for b in range(case.num_seqs)]
    if part == "prefix":
        slots = [s[:c] for s, c in zip(slots, case.context_lens)]
    indices = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64, device=case.device)
    return _loc([len(s) for s in slots], case.device), indices.to(torch.int64)


def req_to_token(case: PagedCase, width: int | None = None) -> torch.Tensor:
    """``[B, width]`` int32: row ``b`` holds the token slots of request ``b``'s history in
    position order (SGLang's ``req_to_token_pool``), zero past its length. ``width`` defaults
    to the longest history."""
    width = case.max_seq_len if width is None else width
    if width < case.max_seq_len:
        raise ProblemError("req_to_token", "width", f"must be >= the longest history {case.max_seq_len}, got {width}")
    table = torch.zeros(case.num_seqs, width, dtype=torch.int32, device=case.device)
    for b in range(case.num_seqs):
        table[b, : case.seq_lens_list[b]] = case.slot_mapping(b).to(torch.int32)
    return table


def new_tokens_kv(case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
    """The new tokens' keys and values as contiguous tensors, in query order.

    Returns:
        ``(k [T, Hkv, D], v [T, Hkv, Dv])`` in the cache dtype: row ``t`` holds what the pool
        holds at query token ``t``'s own position (each request's last ``query_len``
        positions), bit for bit, like the ``k``/``v`` an engine computes for the step before
        it writes them into its cache (with a latent cache, ``v`` is a copy of ``k``'s first
        ``Dv`` columns).
    """
    N, bs, H, D = case.key_cache.shape
    slots = torch.cat([case.slot_mapping(b)[c:] for b, c in enumerate(case.context_lens)])
    flat_k, flat_v = case.key_cache.reshape(N * bs, H, D), case.value_cache.reshape(N * bs, H, case.head_dim_v)
    return index_rows(flat_k, slots).contiguous(), index_rows(flat_v, slots).contiguous()


def to_decode_rows(case: PagedCase) -> PagedCase:
    """A ragged batch flattened into decode rows: one sequence per query token.

    Query token ``t`` of request ``b`` at absolute position ``p`` becomes a sequence of
    ``p + 1`` tokens over request ``b``'s block-table row, with ``t`` as its one query. Causal
    attention makes both problems the same: row ``t`` of the flattened case's output is row
    ``t`` of the original's (variants, scales and the pool are shared, not copied). This is
    how a decode-only kernel can serve a prefill; it is not how one claims multi-token cases
    (``Capabilities(decode_only=True)`` says the kernel does not; the suite then judges it on
    the decode forms of the multi-token cases, ``pagedattn.cases.decode_forms``).
    """
    from pagedattn.cases.decode_forms import decode_form  # the one projection (the suite's decode forms)

    return decode_form(case)


# ------------------------------------------------------------------ vLLM split
def to_vllm_split(key_cache: torch.Tensor, value_cache: torch.Tensor, x: int | None = None):
    """vLLM's split cache of its v0 ``paged_attention`` kernels.

    Args:
        key_cache, value_cache: ``[N, bs, Hkv, D]``.
        x: elements per 16 bytes (``16 // element_size`` by default).

    Returns:
        ``(k [N, Hkv, D // x, bs, x], v [N, Hkv, D, bs])``, contiguous.
    """
    N, bs, H, D = key_cache.shape
    x = x or 16 // key_cache.element_size()
    if D % x:
        raise ProblemError("to_vllm_split", "x", f"must divide head_dim {D} (head_dim a multiple of x), got x={x}")
    k = key_cache.view(N, bs, H, D // x, x).permute(0, 2, 3, 1, 4).contiguous()
    v = value_cache.permute(0, 2, 3, 1).contiguous()
    return k, v


def from_vllm_split(k: torch.Tensor, v: torch.Tensor):
    """The canonical ``[N, bs, Hkv, D]`` caches from vLLM's split layout."""
    N, H, Dx, bs, x = k.shape
    key_cache = k.permute(0, 3, 1, 2, 4).reshape(N, bs, H, Dx * x).contiguous()
    value_cache = v.permute(0, 3, 1, 2).contiguous()
    return key_cache, value_cache


# ------------------------------------------------------------------ FlashInfer
def to_flashinfer(case: PagedCase, layout: str = "NHD") -> dict:
    """FlashInfer's paged-KV arguments (``BatchPrefillWithPagedKVCacheWrapper.plan/run``).

    Returns a dict: ``q`` ``[T, Hq, D]``, ``kv_cache`` ``[N, 2, bs, Hkv, D]`` (NHD) or
    ``[N, 2, Hkv, bs, D]`` (HND), ``kv_indptr`` ``[B+1]``, ``kv_indices`` (pages, in
    order), ``kv_last_page_len`` ``[B]`` in ``1..bs``, ``qo_indptr`` ``[B+1]`` (all int32),
    ``page_size``, ``sm_scale``, ``causal=True``.
    """
    if layout not in ("NHD", "HND"):
        raise ProblemError("to_flashinfer", "layout", f"must be 'NHD' or 'HND', got {layout!r}")
    kv = torch.stack([case.key_cache, case.value_cache], dim=1)  # [N, 2, bs, Hkv, D]
    if layout == "HND":
        kv = kv.transpose(2, 3).contiguous()
    pages = [case.block_tables[b, : case.num_blocks_used(b)] for b in range(case.num_seqs)]
    return {
        "q": case.query,
        "kv_cache": kv,
        "kv_layout": layout,
        "kv_indptr": _loc([len(p) for p in pages], case.device),
        "kv_indices": torch.cat(pages).to(torch.int32),
        "kv_last_page_len": ((case.seq_lens - 1) % case.block_size + 1).to(torch.int32),
        "qo_indptr": case.query_start_loc.clone(),
        "page_size": case.block_size,
        "sm_scale": case.scale,
        "causal": True,
    }


def from_flashinfer(args: dict) -> PagedCase:
    kv = args["kv_cache"]
    if args["kv_layout"] == "HND":
        kv = kv.transpose(2, 3)
    indptr = args["kv_indptr"].tolist()
    pages = [args["kv_indices"][indptr[b] : indptr[b + 1]] for b in range(len(indptr) - 1)]
    width = max(len(p) for p in pages)
    tables = torch.zeros(len(pages), width, dtype=torch.int32, device=kv.device)
    for b, p in enumerate(pages):
        tables[b, : len(p)] = p
    bs = args["page_size"]
    lens = [(len(p) - 1) * bs + int(last) for p, last in zip(pages, args["kv_last_page_len"].tolist())]
    return PagedCase(
        query=args["q"],
        key_cache=kv[:, 0].contiguous(),
        value_cache=kv[:, 1].contiguous(),
        block_tables=tables,
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=kv.device),
        query_start_loc=args["qo_indptr"],
        scale=args["sm_scale"],
    )


# -------------------------------------------------------------- FlashAttention
def to_flash_attn(case: PagedCase) -> dict:
    """Arguments of FlashAttention's paged calls: ``flash_attn_with_kvcache(q, k_cache,
    v_cache, cache_seqlens=..., block_table=..., causal=True)`` for decode (``q``
    reshaped ``[B, 1, Hq, D]``) and ``flash_attn_varlen_func(q, k_cache, v_cache,
    cu_seqlens_q=..., seqused_k=cache_seqlens, block_table=...)`` for mixed batches. Its
    causal mask is bottom-right aligned, like ours. The cache layout is ours."""
    return {
        "q": case.query,
        "k_cache": case.key_cache,
        "v_cache": case.value_cache,
        "block_table": case.block_tables,
        "cache_seqlens": case.seq_lens,
        "cu_seqlens_q": case.query_start_loc,
        "max_seqlen_q": max(case.query_lens),
        "max_seqlen_k": case.max_seq_len,
        "softmax_scale": case.scale,
        "causal": True,
    }


def from_flash_attn(args: dict) -> PagedCase:
    return PagedCase(
        query=args["q"],
        key_cache=args["k_cache"],
        value_cache=args["v_cache"],
        block_tables=args["block_table"],
        seq_lens=args["cache_seqlens"],
        query_start_loc=args["cu_seqlens_q"],
        scale=args["softmax_scale"],
    )


# ---------------------------------------------------------------------- SGLang
def to_sglang(case: PagedCase) -> dict:
    """SGLang's token-level pool: every slot of the paged pool is one token.

    Returns ``k_buffer``/``v_buffer`` ``[N * bs, Hkv, D]`` (views of the caches),
    ``kv_indptr`` ``[B+1]`` and ``kv_indices`` (the token slots of each request, in
    order), ``req_to_token`` ``[B, max_len]`` int32 (the same slots as a table),
    ``qo_indptr`` ``[B+1]``, ``seq_lens``, ``sm_scale``.
    """
    N, bs = case.num_blocks, case.block_size
    kv_indptr, kv_indices = token_kv_indices(case)
    return {
        "q": case.query,
        "k_buffer": case.key_cache.reshape(N * bs, case.num_kv_heads, case.head_dim),
        "v_buffer": case.value_cache.reshape(N * bs, case.num_kv_heads, case.head_dim),
        "kv_indptr": kv_indptr,
        "kv_indices": kv_indices,
        "req_to_token": req_to_token(case),
        "qo_indptr": case.query_start_loc.clone(),
        "seq_lens": case.seq_lens.clone(),
        "sm_scale": case.scale,
    }


def from_sglang(args: dict) -> PagedCase:
    """A canonical case with block size 1 over the token pool."""
    k, v = args["k_buffer"], args["v_buffer"]
    return PagedCase(
        query=args["q"],
        key_cache=k[:, None],
        value_cache=v[:, None],
        block_tables=args["req_to_token"].to(torch.int32),
        seq_lens=args["seq_lens"],
        query_start_loc=args["qo_indptr"],
        scale=args["sm_scale"],
    )


# --------------------------------------------------------------- FlexAttention
def to_flex(case: PagedCase) -> dict:
    """torch FlexAttention's paged layout (``torch.nn.attention.experimental._paged_attention``):
    ``k_cache``/``v_cache`` ``[1, Hkv, N * bs, D]`` and ``page_table`` ``[B, M]`` mapping
    logical pages to physical ones (entries past a sequence's pages are 0 there)."""
    N, bs = case.num_blocks, case.block_size
    page_table = torch.zeros_like(case.block_tables)
    for b in range(case.num_seqs):
        n = case.num_blocks_used(b)
        page_table[b, :n] = case.block_tables[b, :n]
    flat = (N * bs, case.num_kv_heads, case.head_dim)
    return {
        "q": case.query,
        "k_cache": case.key_cache.reshape(flat).transpose(0, 1).unsqueeze(0).contiguous(),
        "v_cache": case.value_cache.reshape(flat).transpose(0, 1).unsqueeze(0).contiguous(),
        "page_table": page_table,
        "page_size": bs,
        "seq_lens": case.seq_lens.clone(),
        "qo_indptr": case.query_start_loc.clone(),
        "scale": case.scale,
    }


def from_flex(args: dict) -> PagedCase:
    k, v, bs = args["k_cache"], args["v_cache"], args["page_size"]
    H, S, D = k.shape[1:]
    return PagedCase(
        query=args["q"],
        key_cache=k[0].transpose(0, 1).reshape(S // bs, bs, H, D),
        value_cache=v[0].transpose(0, 1).reshape(S // bs, bs, H, D),
        block_tables=args["page_table"],
        seq_lens=args["seq_lens"],
        query_start_loc=args["qo_indptr"],
        scale=args["scale"],
    )
