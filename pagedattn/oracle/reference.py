"""The float64 oracle: the most obvious paged attention there is.

Loop over sequences; gather each sequence's history through its block table
(only the blocks it uses); upcast to float64; dense masked softmax. Vectorized
over tokens and heads. Never mutates its inputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch

from pagedattn.oracle.case import PagedCase

# Query rows per chunk: bounds the float64 score matrix [Hq, rows, L] so that a
# 32k-token causal prefill fits in a few GB instead of a few hundred.
_MAX_SCORE_ELEMENTS = 1 << 26


def paged_gather(pool: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """``pool[slot_mapping]`` over the flattened slots of a paged pool.

    Args:
        pool: ``[num_blocks, block_size, ...]`` any dtype.
        slot_mapping: ``[n]`` integer, each in ``[0, num_blocks * block_size)``.

    Returns:
        ``[n, ...]`` same dtype and device as ``pool``; bit-identical copies.
    """
    flat = pool.reshape(pool.shape[0] * pool.shape[1], *pool.shape[2:])
    return flat[slot_mapping.to(torch.int64)]


def gather_history(case: PagedCase, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of sequence ``seq``: two ``[seq_len, num_kv_heads, head_dim]``
    tensors in the cache dtype, read through the used block-table entries only."""
    slots = case.slot_mapping(seq)
    return paged_gather(case.key_cache, slots), paged_gather(case.value_cache, slots)


def causal_mask(query_len: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """``[query_len, seq_len]`` bool, True where query ``i`` (at absolute position
    ``seq_len - query_len + i``) may see key ``j`` (bottom-right causal)."""
    pos = torch.arange(seq_len - query_len, seq_len, device=device)
    return torch.arange(seq_len, device=device)[None, :] <= pos[:, None]


class Chunk(NamedTuple):
    """A block of query rows of one sequence, everything upcast to float64."""

    seq: int
    tokens: slice  # rows of the packed query / output
    q: torch.Tensor  # [n, Hq, D]
    k: torch.Tensor  # [L, Hq, D], kv heads repeated to the query heads
    v: torch.Tensor  # [L, Hq, D]
    scores: torch.Tensor  # [Hq, n, L], scaled, -inf where masked
    probs: torch.Tensor  # [Hq, n, L]


def iter_chunks(case: PagedCase) -> Iterator[Chunk]:
    """The oracle's work, sequence by sequence, in query chunks small enough that the
    float64 score matrix stays a few hundred MB even for a 32k-token prefill."""
    loc = case.query_start_loc_list
    for b, L in enumerate(case.seq_lens_list):
        k, v = gather_history(case, b)
        k = k.to(torch.float64).repeat_interleave(case.gqa_ratio, dim=1)  # [L, Hq, D]
        v = v.to(torch.float64).repeat_interleave(case.gqa_ratio, dim=1)  # [L, Hq, D]
        q_len = loc[b + 1] - loc[b]
        mask = causal_mask(q_len, L, k.device)  # [q_len, L]
        step = max(1, _MAX_SCORE_ELEMENTS // (case.num_heads * L))
        for r0 in range(loc[b], loc[b + 1], step):
            tokens = slice(r0, min(loc[b + 1], r0 + step))
            q = case.query[tokens].to(torch.float64)  # [n, Hq, D]
            scores = torch.einsum("qhd,khd->hqk", q, k) * case.scale  # [Hq, n, L]
            m = mask[tokens.start - loc[b] : tokens.stop - loc[b]]
            scores = scores.masked_fill(~m[None], float("-inf"))
            yield Chunk(b, tokens, q, k, v, scores, torch.softmax(scores, dim=-1))


def paged_attention_reference(case: PagedCase) -> torch.Tensor:
    """Attention of every new token over its sequence's paged history, in float64.

    Args:
        case: a valid ``PagedCase`` on any device.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` float64 on the case's device.
    """
    out = torch.empty(case.num_tokens, case.num_heads, case.head_dim, dtype=torch.float64, device=case.device)
    for c in iter_chunks(case):
        out[c.tokens] = torch.einsum("hqk,khd->qhd", c.probs, c.v)
    return out
