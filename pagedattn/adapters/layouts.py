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
| FlashInfer MLA | ``ckv_cache`` ``[N, bs, 512]``, ``kpe_cache`` ``[N, bs, 64]`` | ``kv_indptr``, ``kv_indices``, |
|   |   | ``kv_len_arr``, ``qo_indptr`` |
| FlashMLA | ``[N, 64, 1, 576]``: the latent key cache | ``block_table``, ``cache_seqlens`` |

MLA's latent cache is the case's key cache ``[N, bs, 1, 576]`` (512 compressed ``ckv``
columns, then 64 rotary ``kpe`` columns); the value cache is a view of its first 512.
Tree masks (``tree_mask_to_flashinfer`` and the packed form) convert the case's per-sequence
``[q_b, q_b]`` masks to FlashInfer's ``custom_mask`` over the whole history.

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
        ``(k [T, Hkv, D], v [T, Hkv, D])`` in the cache dtype: row ``t`` holds what the pool
        holds at query token ``t``'s own position (each request's last ``query_len``
        positions), bit for bit, like the ``k``/``v`` an engine computes for the step before
        it writes them into its cache.
    """
    N, bs, H, D = case.key_cache.shape
    slots = torch.cat([case.slot_mapping(b)[c:] for b, c in enumerate(case.context_lens)])
    flat_k, flat_v = case.key_cache.reshape(N * bs, H, D), case.value_cache.reshape(N * bs, H, D)
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
    kv_indptr, kv_indices = _page_lists(case)
    return {
        "q": case.query,
        "kv_cache": kv,
        "kv_layout": layout,
        "kv_indptr": kv_indptr,
        "kv_indices": kv_indices,
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
    tables, pages = _tables_from_csr(args["kv_indptr"], args["kv_indices"])
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


def _page_lists(case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's pages as CSR: ``kv_indptr`` ``[B + 1]`` and ``kv_indices`` (int32)."""
    pages = [case.block_tables[b, : case.num_blocks_used(b)] for b in range(case.num_seqs)]
    return _loc([len(p) for p in pages], case.device), torch.cat(pages).to(torch.int32)


def _tables_from_csr(indptr: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``block_tables`` ``[B, max pages]`` int32 (zero past each row's pages) from CSR page lists,
    and the per-request page lists."""
    bounds = indptr.tolist()
    pages = [indices[bounds[b] : bounds[b + 1]] for b in range(len(bounds) - 1)]
    tables = torch.zeros(len(pages), max(len(p) for p in pages), dtype=torch.int32, device=indices.device)
    for b, p in enumerate(pages):
        tables[b, : len(p)] = p
    return tables, pages


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


# ------------------------------------------------------------------------- MLA
#: FlashMLA's one page size: its kernels tile the latent cache in 64-token blocks
FLASHMLA_BLOCK_SIZE = 64


def _kernel_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself where a CUDA kernel with per-dimension strides can read it (unit last
    stride, every other stride and the start on 16 bytes: 128-bit loads); else a contiguous
    copy. Never a write into ``t``."""
    size = t.element_size()
    aligned = t.data_ptr() % 16 == 0 and all(s * size % 16 == 0 for s in t.stride()[:-1])
    return t if t.stride(-1) == 1 and aligned else t.contiguous()


def split_latent(latent: torch.Tensor, head_dim_v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's two MLA caches from the latent cache.

    Args:
        latent: ``[N, bs, 1, D]``: one latent head, ``head_dim_v`` compressed columns then
            ``D - head_dim_v`` rotary ones (DeepSeek V2/V3: 512 + 64 = 576).

    Returns:
        ``(ckv [N, bs, head_dim_v], kpe [N, bs, D - head_dim_v])`` in the cache dtype: views
        of ``latent`` where its strides allow (``_kernel_view``), else copies.
    """
    if latent.dim() != 4 or latent.shape[2] != 1:
        raise ProblemError(
            "split_latent",
            "latent",
            f"must be [num_blocks, block_size, 1, D] (one latent head), got {tuple(latent.shape)}",
        )
    if not 0 < head_dim_v < latent.shape[-1]:
        raise ProblemError(
            "split_latent",
            "head_dim_v",
            f"must lie in 1..{latent.shape[-1] - 1} (D = {latent.shape[-1]}), got {head_dim_v}",
        )
    rows = latent[:, :, 0]  # [N, bs, D]
    return _kernel_view(rows[..., :head_dim_v]), _kernel_view(rows[..., head_dim_v:])


def join_latent(ckv: torch.Tensor, kpe: torch.Tensor) -> torch.Tensor:
    """The latent cache ``[N, bs, 1, Dc + Dr]`` (contiguous) from ``ckv [N, bs, Dc]`` and ``kpe [N, bs, Dr]``."""
    return torch.cat([ckv, kpe], dim=-1)[:, :, None].contiguous()


def _mla_case_problem(owner: str, case: PagedCase) -> None:
    if not case.shared_kv:
        raise ProblemError(
            owner,
            "case",
            "must be an MLA case (value_cache a view of the key cache's first head_dim_v columns, one kv head)",
        )


def to_flashinfer_mla(case: PagedCase) -> dict:
    """Arguments of FlashInfer's ``BatchMLAPagedAttentionWrapper`` (``plan`` then ``run``).

    Returns a dict: ``q_nope`` ``[T, Hq, Dc]`` and ``q_pe`` ``[T, Hq, Dr]`` (the query's first
    ``Dc = head_dim_v`` columns and the rest), ``ckv_cache`` ``[N, bs, Dc]`` and ``kpe_cache``
    ``[N, bs, Dr]`` (``split_latent``: views where strides allow, never written), ``qo_indptr``
    ``[B+1]``, ``kv_indptr`` ``[B+1]``, ``kv_indices`` (pages, in order) and ``kv_len_arr``
    ``[B]`` (each history's length; FlashInfer's docstring calls it the query length), all
    int32; ``num_heads``, ``head_dim_ckv``, ``head_dim_kpe``, ``page_size``, ``sm_scale``
    (``case.scale``: MLA's scale is the model's, not ``576 ** -0.5``) and ``causal=True``.
    """
    _mla_case_problem("to_flashinfer_mla", case)
    dv = case.head_dim_v
    ckv, kpe = split_latent(case.key_cache, dv)
    kv_indptr, kv_indices = _page_lists(case)
    return {
        "q_nope": _kernel_view(case.query[..., :dv]),
        "q_pe": _kernel_view(case.query[..., dv:]),
        "ckv_cache": ckv,
        "kpe_cache": kpe,
        "qo_indptr": case.query_start_loc.to(torch.int32).clone(),
        "kv_indptr": kv_indptr,
        "kv_indices": kv_indices,
        "kv_len_arr": case.seq_lens.to(torch.int32).clone(),
        "num_heads": case.num_heads,
        "head_dim_ckv": dv,
        "head_dim_kpe": case.head_dim - dv,
        "page_size": case.block_size,
        "sm_scale": case.scale,
        "causal": True,
    }


def from_flashinfer_mla(args: dict) -> PagedCase:
    """The MLA case (latent key cache ``[N, bs, 1, Dc + Dr]``, the value cache its view) from
    ``to_flashinfer_mla``'s dict."""
    latent = join_latent(args["ckv_cache"], args["kpe_cache"])
    tables, _ = _tables_from_csr(args["kv_indptr"], args["kv_indices"])
    return PagedCase(
        query=torch.cat([args["q_nope"], args["q_pe"]], dim=-1),
        key_cache=latent,
        value_cache=latent[..., : args["head_dim_ckv"]],
        block_tables=tables,
        seq_lens=args["kv_len_arr"],
        query_start_loc=args["qo_indptr"],
        scale=args["sm_scale"],
    )


def to_flashmla(case: PagedCase) -> dict:
    """Arguments of FlashMLA's ``flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens,
    head_dim_v, tile_scheduler_metadata, num_splits, softmax_scale=, causal=True)``.

    FlashMLA's cache ``[N, 64, 1, 576]`` is the case's latent key cache itself, at block size
    64 only (``FLASHMLA_BLOCK_SIZE``); the value is its first ``head_dim_v`` columns, as here.
    Its query is ``[B, s_q, Hq, D]``: every sequence has the same number ``s_q`` of new
    tokens (decode, or MTP's fixed draft length); its causal mask is bottom-right aligned.

    Returns a dict: ``q`` (a view of the query), ``k_cache`` (the key cache itself),
    ``block_table`` ``[B, M]``, ``cache_seqlens`` ``[B]`` (int32), ``head_dim_v``,
    ``softmax_scale``, ``causal=True``.
    """
    _mla_case_problem("to_flashmla", case)
    if case.block_size != FLASHMLA_BLOCK_SIZE:
        raise ProblemError(
            "to_flashmla", "block_size", f"must be {FLASHMLA_BLOCK_SIZE} (FlashMLA's page size), got {case.block_size}"
        )
    q_lens = set(case.query_lens)
    if len(q_lens) != 1:
        raise ProblemError(
            "to_flashmla",
            "query_lens",
            f"must be equal (FlashMLA's query is [batch, s_q, heads, D]), got {sorted(q_lens)}",
        )
    s_q = q_lens.pop()
    return {
        "q": case.query.view(case.num_seqs, s_q, case.num_heads, case.head_dim),
        "k_cache": case.key_cache,
        "block_table": case.block_tables.to(torch.int32),
        "cache_seqlens": case.seq_lens.to(torch.int32),
        "head_dim_v": case.head_dim_v,
        "softmax_scale": case.scale,
        "causal": True,
    }


def from_flashmla(args: dict) -> PagedCase:
    """The MLA case from ``to_flashmla``'s dict (the cache is shared, not copied)."""
    q, k = args["q"], args["k_cache"]
    B, s_q, Hq, D = q.shape
    return PagedCase(
        query=q.reshape(B * s_q, Hq, D),
        key_cache=k,
        value_cache=k[..., : args["head_dim_v"]],
        block_tables=args["block_table"],
        seq_lens=args["cache_seqlens"],
        query_start_loc=torch.arange(B + 1, dtype=torch.int32, device=q.device) * s_q,
        scale=args["softmax_scale"],
    )


# ------------------------------------------------------------------ tree masks
def flashinfer_mask_indptr(query_lens: list[int], seq_lens: list[int], device=None) -> torch.Tensor:
    """``[B+1]`` int32: where request ``b``'s ``[q_b, L_b]`` block starts in a flattened
    ``custom_mask`` (FlashInfer's ``_compute_page_mask_indptr``: ``cumsum(q_b * L_b)``)."""
    return _loc([q * n for q, n in zip(query_lens, seq_lens)], device)


def tree_mask_to_flashinfer(tree_mask: torch.Tensor, query_lens: list[int], seq_lens: list[int]) -> torch.Tensor:
    """FlashInfer's flattened ``custom_mask`` from the case's tree mask.

    Args:
        tree_mask: bool ``[sum_b q_b * q_b]`` (``PagedCase.tree_mask``): sequence ``b``'s
            ``[q_b, q_b]`` block, row-major, entry ``[i, j]``: new token ``i`` sees new token ``j``.
        query_lens, seq_lens: ``q_b`` and the history length ``L_b`` (new tokens included).

    Returns:
        bool ``[sum_b q_b * L_b]``: request ``b``'s ``[q_b, L_b]`` block row-major at
        ``flashinfer_mask_indptr[b]``; row ``i`` is True over the ``L_b - q_b`` cached
        columns and holds the tree mask's row ``i`` over the last ``q_b``.
    """
    parts, at = [], 0
    for q, n in zip(query_lens, seq_lens):
        rows = torch.ones(q, n, dtype=torch.bool, device=tree_mask.device)
        rows[:, n - q :] = tree_mask[at : at + q * q].view(q, q)
        parts.append(rows.reshape(-1))
        at += q * q
    if at != tree_mask.numel():
        raise ProblemError(
            "tree_mask_to_flashinfer", "tree_mask", f"must hold sum(q_b * q_b) = {at} entries, got {tree_mask.numel()}"
        )
    return torch.cat(parts)


def tree_mask_from_flashinfer(custom_mask: torch.Tensor, query_lens: list[int], seq_lens: list[int]) -> torch.Tensor:
    """The tree mask ``[sum_b q_b * q_b]`` bool from a flattened ``custom_mask``; a mask that
    hides a cached column is refused (a tree mask sees the whole history)."""
    parts = []
    starts = flashinfer_mask_indptr(query_lens, seq_lens).tolist()
    for b, (q, n) in enumerate(zip(query_lens, seq_lens)):
        rows = custom_mask[starts[b] : starts[b + 1]].view(q, n)
        if not bool(rows[:, : n - q].all()):
            raise ProblemError(
                "tree_mask_from_flashinfer",
                "custom_mask",
                f"request {b} hides a cached column; a tree mask sees the whole history",
            )
        parts.append(rows[:, n - q :].reshape(-1))
    return torch.cat(parts)


def _pack_little(bits: torch.Tensor) -> torch.Tensor:
    """uint8 ``[ceil(n / 8)]``: element ``k`` is bit ``k % 8`` of byte ``k // 8`` (numpy's little bit order)."""
    pad = torch.zeros(-bits.numel() % 8, dtype=torch.bool, device=bits.device)
    octets = torch.cat([bits.bool(), pad]).view(-1, 8).to(torch.int32)
    weights = 1 << torch.arange(8, dtype=torch.int32, device=bits.device)
    return (octets * weights).sum(1).to(torch.uint8)


def pack_mask_bits(
    custom_mask: torch.Tensor, query_lens: list[int], seq_lens: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed form FlashInfer's kernels read, from a flattened ``custom_mask``.

    What ``flashinfer.quantization.segment_packbits(custom_mask, mask_indptr, bitorder="little")``
    gives: each request's bits packed from a byte of its own, element ``k`` of the request's
    block in bit ``k % 8`` of its byte ``k // 8`` (the kernels read
    ``(mask[offset / 8] >> (offset % 8)) & 1`` at ``offset = qo_idx * kv_len + kv_idx``).

    Returns:
        ``(packed uint8 [packed_indptr[-1]], packed_indptr int32 [B+1])``: byte offsets,
        ``packed_indptr[b+1] - packed_indptr[b] = ceil(q_b * L_b / 8)``.
    """
    starts = flashinfer_mask_indptr(query_lens, seq_lens).tolist()
    segments = [_pack_little(custom_mask[starts[b] : starts[b + 1]]) for b in range(len(query_lens))]
    return torch.cat(segments), _loc([len(s) for s in segments], custom_mask.device)


def unpack_mask_bits(
    packed: torch.Tensor, packed_indptr: torch.Tensor, query_lens: list[int], seq_lens: list[int]
) -> torch.Tensor:
    """The flattened bool ``custom_mask`` ``[sum_b q_b * L_b]`` from ``pack_mask_bits``' form."""
    shifts = torch.arange(8, dtype=torch.int32, device=packed.device)
    bounds = packed_indptr.tolist()
    parts = []
    for b, (q, n) in enumerate(zip(query_lens, seq_lens)):
        octets = packed[bounds[b] : bounds[b + 1]].to(torch.int32)
        parts.append(((octets[:, None] >> shifts) & 1).bool().reshape(-1)[: q * n])
    return torch.cat(parts)
