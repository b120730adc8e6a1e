"""The float64 oracle: the most obvious paged attention there is.

Loop over sequences; gather each sequence's history through its block table
(only the blocks it uses); upcast to float64 (an fp8 cache: the stored bytes,
dequantized by ``k_scale``/``v_scale``); dense masked softmax with the case's
variants in the order ``PagedCase`` documents. Vectorized over tokens and heads.
Never mutates its inputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch

from pagedattn.oracle.case import PagedCase

# Query rows per chunk: bounds the float64 score matrix [Hq, rows, L] so that a
# 32k-token causal prefill fits in a few GB instead of a few hundred.
_MAX_SCORE_ELEMENTS = 1 << 26


def index_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[index]`` (along dim 0), bit for bit, for any dtype: one-byte floats (fp8) are
    indexed through their bytes, since torch before 2.10 cannot index fp8 on the CPU."""
    if t.element_size() == 1 and t.is_floating_point():
        return t.view(torch.uint8)[index].view(t.dtype)
    return t[index]


def paged_gather(pool: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """``pool[slot_mapping]`` over the flattened slots of a paged pool.

    Args:
        pool: ``[num_blocks, block_size, ...]`` any dtype.
        slot_mapping: ``[n]`` integer, each in ``[0, num_blocks * block_size)``.

    Returns:
        ``[n, ...]`` same dtype and device as ``pool``; bit-identical copies.
    """
    flat = pool.reshape(pool.shape[0] * pool.shape[1], *pool.shape[2:])
    return index_rows(flat, slot_mapping.to(torch.int64))


def gather_history(case: PagedCase, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of sequence ``seq``: two ``[seq_len, num_kv_heads, head_dim]``
    tensors in the cache dtype, read through the used block-table entries only."""
    slots = case.slot_mapping(seq)
    return paged_gather(case.key_cache, slots), paged_gather(case.value_cache, slots)


def causal_mask(query_len: int, seq_len: int, device: torch.device, sliding_window: int | None = None) -> torch.Tensor:
    """``[query_len, seq_len]`` bool, True where query ``i`` (at absolute position
    ``p = seq_len - query_len + i``) may see key ``j``: ``j <= p`` (bottom-right causal)
    and, with a sliding window ``W``, ``j > p - W``."""
    pos = torch.arange(seq_len - query_len, seq_len, device=device)
    j = torch.arange(seq_len, device=device)[None, :]
    mask = j <= pos[:, None]
    if sliding_window is not None:
        mask &= j > pos[:, None] - sliding_window
    return mask


def dequantized(cache: torch.Tensor, scale: float) -> torch.Tensor:
    """``cache`` in float64, times ``scale`` (the fp8 dequantization; 1.0 otherwise)."""
    out = cache.to(torch.float64)
    return out * scale if scale != 1.0 else out


class Chunk(NamedTuple):
    """A block of query rows of one sequence, everything upcast to float64."""

    seq: int
    tokens: slice  # rows of the packed query / output
    q: torch.Tensor  # [n, Hq, D]
    k: torch.Tensor  # [L, Hq, D], dequantized, kv heads repeated to the query heads
    v: torch.Tensor  # [L, Hq, D], dequantized
    scores: torch.Tensor  # [Hq, n, L], final logits (scaled, capped, biased), -inf where masked
    probs: torch.Tensor  # [Hq, n, L]
    lse: torch.Tensor  # [Hq, n], natural log of the softmax denominator (sink included)
    sink_probs: torch.Tensor | None  # [Hq, n]: the sink's share of the denominator
    bias: torch.Tensor | None  # [Hq, n, L]: the ALiBi term alone (already in scores)


def iter_chunks(case: PagedCase) -> Iterator[Chunk]:
    """The oracle's work, sequence by sequence, in query chunks small enough that the
    float64 score matrix stays a few hundred MB even for a 32k-token prefill."""
    loc = case.query_start_loc_list
    cap = case.logits_soft_cap
    slopes = case.alibi_slopes.to(torch.float64) if case.alibi_slopes is not None else None
    sinks = case.sinks.to(torch.float64) if case.sinks is not None else None
    for b, L in enumerate(case.seq_lens_list):
        k, v = gather_history(case, b)
        k = dequantized(k, case.k_scale).repeat_interleave(case.gqa_ratio, dim=1)  # [L, Hq, D]
        v = dequantized(v, case.v_scale).repeat_interleave(case.gqa_ratio, dim=1)  # [L, Hq, D]
        q_len = loc[b + 1] - loc[b]
        mask = causal_mask(q_len, L, k.device, case.sliding_window)  # [q_len, L]
        step = max(1, _MAX_SCORE_ELEMENTS // (case.num_heads * L))
        for r0 in range(loc[b], loc[b + 1], step):
            tokens = slice(r0, min(loc[b + 1], r0 + step))
            q = case.query[tokens].to(torch.float64)  # [n, Hq, D]
            scores = torch.einsum("qhd,khd->hqk", q, k) * case.scale  # [Hq, n, L]
            if cap is not None:
                scores = cap * torch.tanh(scores / cap)
            bias = None
            if slopes is not None:
                pos = torch.arange(L - q_len + tokens.start - loc[b], L - q_len + tokens.stop - loc[b], device=k.device)
                rel = torch.arange(L, device=k.device)[None, :] - pos[:, None]  # j - p, [n, L]
                bias = slopes[:, None, None] * rel[None].to(torch.float64)
                scores = scores + bias
            m = mask[tokens.start - loc[b] : tokens.stop - loc[b]]
            scores = scores.masked_fill(~m[None], float("-inf"))
            sink_probs = None
            if sinks is None:
                lse = torch.logsumexp(scores, dim=-1)  # [Hq, n]
            else:
                sink = sinks[:, None].expand(-1, scores.shape[1])  # [Hq, n]
                lse = torch.logaddexp(torch.logsumexp(scores, dim=-1), sink)
                sink_probs = torch.exp(sink - lse)
            probs = torch.exp(scores - lse[..., None])  # the sink's share is what these miss of 1
            yield Chunk(b, tokens, q, k, v, scores, probs, lse, sink_probs, bias)


def paged_attention_reference(case: PagedCase) -> torch.Tensor:
    """Attention of every new token over its sequence's paged history, in float64.

    Args:
        case: a valid ``PagedCase`` on any device.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` float64 on the case's device.
    """
    return paged_attention_reference_lse(case)[0]


def paged_attention_reference_lse(case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
    """The output and its log-sum-exp, in float64.

    Returns:
        ``(out, lse)``: ``[num_tokens, num_heads, head_dim]`` and ``[num_tokens, num_heads]``
        float64 on the case's device. ``lse[t, h]`` is the natural log of the softmax
        denominator (``exp(sinks[h])`` included): ``-inf`` for a row that sees no key and
        has no sink (no valid ``PagedCase`` has one: every query sees itself).
    """
    out = torch.empty(case.num_tokens, case.num_heads, case.head_dim, dtype=torch.float64, device=case.device)
    lse = torch.empty(case.num_tokens, case.num_heads, dtype=torch.float64, device=case.device)
    for c in iter_chunks(case):
        out[c.tokens] = torch.einsum("hqk,khd->qhd", c.probs, c.v)
        lse[c.tokens] = c.lse.transpose(0, 1)
    return out, lse
