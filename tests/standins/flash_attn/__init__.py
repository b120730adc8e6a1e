"""A pure-torch stand-in for ``flash_attn.flash_attn_with_kvcache`` (flash-attn 2.x).

Written by us from the function's public docstring (no FlashAttention code is copied):
same signature, same layouts and the same semantics for what the adapter uses:

- ``q`` ``[batch, seqlen_q, nheads, headdim]``; ``k_cache``/``v_cache``
  ``[num_blocks, page_block_size, nheads_k, headdim]`` with ``block_table``
  ``[batch, max_num_blocks]`` int32 and ``cache_seqlens`` ``[batch]`` int32;
  ``page_block_size`` must be a multiple of 256 (``PAGE_BLOCK_MULTIPLE``; the project's
  tests lower it to exercise the mapping on small pages);
- ``causal=True`` aligned bottom-right: query row ``i`` sits at
  ``i + cache_seqlens - seqlen_q``; ``window_size=(left, right)`` keeps keys
  ``p - left .. p + right`` (``-1`` unbounded);
- ``softcap``: ``softcap * tanh(scores * softmax_scale / softcap)``, before the ALiBi bias
  ``-alibi_slopes[h] * |p - j|``;
- a row that sees no key returns zeros and lse ``-inf``;
- ``return_softmax_lse=True`` returns ``(out, lse)``, ``lse`` ``[batch, nheads, seqlen_q]``
  float32 in natural log;
- fp16/bf16 only; headdim a multiple of 8, at most 256.

The arithmetic is float32 on whatever device the tensors are on.
"""

from __future__ import annotations

import math

import torch

__version__ = "2.7.4+standin"

#: flash-attn 2's page rule; tests may lower it to run the mapping on the suite's small pages
PAGE_BLOCK_MULTIPLE = 256


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    if k is not None or v is not None or rotary_cos is not None or cache_batch_idx is not None:
        raise NotImplementedError("the stand-in covers reading a paged cache only")
    if q.dtype not in (torch.float16, torch.bfloat16) or k_cache.dtype != q.dtype:
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
    B, n, Hq, D = q.shape
    if D % 8 or D > 256:
        raise RuntimeError("FlashAttention forward only supports head dimension at most 256 (a multiple of 8)")
    if block_table is None:
        raise NotImplementedError("the stand-in covers the paged cache (block_table) only")
    if block_table.dtype != torch.int32:
        raise RuntimeError("block_table must have dtype torch.int32")
    page = k_cache.shape[1]
    if page % PAGE_BLOCK_MULTIPLE:
        raise RuntimeError(f"Paged KV cache block size must be divisible by {PAGE_BLOCK_MULTIPLE}")
    Hkv = k_cache.shape[2]
    scale = softmax_scale if softmax_scale is not None else D**-0.5
    left, right = window_size
    out = torch.zeros(B, n, Hq, D, dtype=torch.float32, device=q.device)
    lse = torch.full((B, Hq, n), -math.inf, dtype=torch.float32, device=q.device)
    for b in range(B):
        L = int(cache_seqlens[b])
        blocks = block_table[b, : -(-L // page)].long()
        kk = k_cache[blocks].reshape(-1, Hkv, D)[:L].float().repeat_interleave(Hq // Hkv, 1)  # [L, Hq, D]
        vv = v_cache[blocks].reshape(-1, Hkv, D)[:L].float().repeat_interleave(Hq // Hkv, 1)
        s = torch.einsum("qhd,khd->hqk", q[b].float(), kk)  # [Hq, n, L]
        s = softcap * torch.tanh(s * (scale / softcap)) if softcap > 0 else s * scale
        pos = torch.arange(n, device=q.device)[:, None] + (L - n)  # [n, 1]
        j = torch.arange(L, device=q.device)[None, :]
        if alibi_slopes is not None:
            s = s - alibi_slopes.float()[:, None, None] * (pos - j).abs().float()
        visible = torch.ones(n, L, dtype=torch.bool, device=q.device)
        if causal:
            visible &= j <= pos
        if left >= 0:
            visible &= j >= pos - left
        if right >= 0:
            visible &= j <= pos + right
        s = s.masked_fill(~visible, -math.inf)
        row_lse = torch.logsumexp(s, dim=2)  # [Hq, n]
        p = torch.nan_to_num(torch.exp(s - row_lse[..., None]), nan=0.0)  # rows that see nothing: zeros
        out[b] = torch.einsum("hqk,khd->qhd", p, vv)
        lse[b] = row_lse
    out = out.to(q.dtype)
    return (out, lse) if return_softmax_lse else out
