"""The float64 oracle: the most obvious paged attention there is.

Loop over sequences; gather each sequence's history through its block table
(only the blocks it uses); upcast to float64 (an fp8 cache: the stored bytes,
dequantized by ``k_scale``/``v_scale``); dense masked softmax with the case's
variants in the order ``PagedCase`` documents. Vectorized over tokens and heads.
Never mutates its inputs.

Two economies, neither of which changes a number: a block of query rows only
computes the keys some row of it can see (a causal prefill skips the keys past its
last row, a sliding window the keys before its first row's window), and the rows
come in blocks small enough that one block's float64 score tensors stay under a
memory cap (``PAGEDATTN_ORACLE_MAX_BYTES``, default 2 GiB).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NamedTuple

import torch

from pagedattn.indexing import index_rows
from pagedattn.oracle.case import PagedCase
from pagedattn.validation import ProblemError

#: Working memory of one block of rows (its float64 score-sized tensors), unless
#: ``PAGEDATTN_ORACLE_MAX_BYTES`` says otherwise: a 32k-token prefill fits in it.
DEFAULT_MAX_BYTES = 2 << 30
MAX_BYTES_ENV = "PAGEDATTN_ORACLE_MAX_BYTES"
#: Rows per block are also capped so that a block computes not many more keys than its
#: rows see: under a window W a block of n rows spans W + n - 1 keys (n ~ W: about twice
#: the W each row sees), and a causal block of n rows computes an n x n triangle for nothing.
_MIN_ROWS = 64
_CAUSAL_ROWS = 256


def max_bytes() -> int:
    """The oracle's memory cap in bytes: ``$PAGEDATTN_ORACLE_MAX_BYTES`` or 2 GiB."""
    raw = os.environ.get(MAX_BYTES_ENV)
    if raw is None:
        return DEFAULT_MAX_BYTES
    try:
        value = int(float(raw))
    except ValueError:
        raise ProblemError("os.environ", MAX_BYTES_ENV, f"must be a number of bytes, got {raw!r}") from None
    if value < 1 << 20:
        raise ProblemError("os.environ", MAX_BYTES_ENV, f"must be at least 1 MiB (1048576), got {value}")
    return value


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


def write_cache_by_indexing(pool: torch.Tensor, slot_mapping: torch.Tensor, new: torch.Tensor) -> None:
    """``pool.view(-1, ...)[slot] = new[i]`` for every ``slot >= 0``, in place: the
    reference of the cache write.

    pool: ``[num_blocks, block_size, num_kv_heads, head_dim]``; slot_mapping: ``[n]``
    integer; new: ``[n, num_kv_heads, head_dim]``, same dtype as ``pool``.
    """
    keep = slot_mapping >= 0
    flat = pool.view(pool.shape[0] * pool.shape[1], *pool.shape[2:])
    flat[slot_mapping[keep].to(torch.int64)] = new[keep]


def gather_history(case: PagedCase, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of sequence ``seq``: ``[seq_len, num_kv_heads, head_dim]`` and
    ``[seq_len, num_kv_heads, head_dim_v]`` in the cache dtype, read through the used
    block-table entries only (a shared latent cache's values are its keys' leading columns,
    gathered as such)."""
    slots = case.slot_mapping(seq)
    return paged_gather(case.key_cache, slots), paged_gather(case.value_cache, slots)


def causal_mask(
    query_len: int, seq_len: int, device: torch.device, sliding_window: int | None = None, keys: slice | None = None
) -> torch.Tensor:
    """``[query_len, seq_len]`` bool, True where query ``i`` (at absolute position
    ``p = seq_len - query_len + i``) may see key ``j``: ``j <= p`` (bottom-right causal)
    and, with a sliding window ``W``, ``j > p - W``. ``keys`` restricts the columns to
    the key positions ``keys.start .. keys.stop - 1`` (then ``[query_len, len(keys)]``)."""
    lo, hi = (0, seq_len) if keys is None else (keys.start, keys.stop)
    pos = torch.arange(seq_len - query_len, seq_len, device=device)
    j = torch.arange(lo, hi, device=device)[None, :]
    mask = j <= pos[:, None]
    if sliding_window is not None:
        mask &= j > pos[:, None] - sliding_window
    return mask


def kv_row_scales(case: PagedCase) -> tuple[float | torch.Tensor, float | torch.Tensor]:
    """``(k_scale, v_scale)`` shaped to multiply rows ``[..., num_kv_heads, head_dim]`` (what
    ``gather_history`` returns): a float as it is, a per-head tensor as ``[num_kv_heads, 1]``."""
    k, v = case.k_scale, case.v_scale
    return (k[:, None] if isinstance(k, torch.Tensor) else k), (v[:, None] if isinstance(v, torch.Tensor) else v)


def dequantized(cache: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """``cache`` ``[Hkv, L, D]`` in float64 and contiguous, times ``scale`` (the fp8
    dequantization; 1.0 otherwise): a float, or ``[Hkv]`` float32, kv head ``g``'s rows times
    ``scale[g]``. One new tensor: a transposed view is converted and laid out in one pass (on the
    CPU each fresh tensor of a long history costs its pages' first touch as well)."""
    # copy=True: a float64 input is copied too (``to`` would return it as it is, strided, and
    # the in-place scaling would then change the caller's tensor)
    out = cache.to(torch.float64, memory_format=torch.contiguous_format, copy=True)
    if isinstance(scale, torch.Tensor):  # per kv head; float32 to float64 is exact
        return out.mul_(scale.to(torch.float64).view(-1, 1, 1))
    return out.mul_(scale) if scale != 1.0 else out


class Chunk(NamedTuple):
    """A block of ``n`` query rows of one sequence against the ``Lc`` keys they can see,
    everything in float64, grouped by kv head: query head ``h = kv * G + g`` (``G`` the
    GQA ratio) is ``[kv, g]``, so no K/V is repeated per query head."""

    seq: int
    tokens: slice  # rows of the packed query / output
    keys: slice  # positions of the chunk's keys in the sequence's history
    q: torch.Tensor  # [Hkv, G, n, D]
    k: torch.Tensor  # [Hkv, Lc, D], dequantized
    v: torch.Tensor  # [Hkv, Lc, Dv], dequantized
    scores: torch.Tensor  # [Hkv, G, n, Lc], final logits (scaled, capped, biased), -inf where masked
    probs: torch.Tensor  # [Hkv, G, n, Lc], 0 where masked
    row_max: torch.Tensor  # [Hkv, G, n], max of the row's logits, the sink's included
    lse: torch.Tensor  # [Hkv, G, n], natural log of the softmax denominator (sink included)
    sink_probs: torch.Tensor | None  # [Hkv, G, n]: the sink's share of the denominator
    key_share: torch.Tensor | None  # [Hkv, G, n]: the keys' share, sum_j probs (None: 1, no sink)
    alibi: tuple[torch.Tensor, torch.Tensor] | None  # slopes [Hkv, G, 1, 1], j - p [n, Lc]
    score_floor: torch.Tensor | None  # [Hkv, G, n]: the row's smallest logit over the keys it sees
    k_all: torch.Tensor  # [Hkv, L, D]: the sequence's whole history of keys (k is k_all[:, keys])
    v_all: torch.Tensor  # [Hkv, L, Dv]: the sequence's whole history (v is v_all[:, keys])
    last: bool  # the sequence's last block of rows (the next block, if any, is another sequence's)

    def output(self, v: torch.Tensor | None = None, probs: torch.Tensor | None = None) -> torch.Tensor:
        """``probs @ v`` as ``[n, Hq, F]``: ``v`` ``[Hkv, Lc, F]`` (default ``self.v``),
        ``probs`` ``[Hkv, G, n, Lc]`` (default ``self.probs``)."""
        v = self.v if v is None else v
        probs = self.probs if probs is None else probs
        h, g, n, lc = probs.shape
        o = torch.bmm(probs.view(h, g * n, lc), v)  # [Hkv, G*n, F]
        return o.view(h, g, n, -1).permute(2, 0, 1, 3).reshape(n, h * g, -1)

    def rows(self, t: torch.Tensor) -> torch.Tensor:
        """A per-row ``[Hkv, G, n]`` tensor as ``[n, Hq]``."""
        return t.permute(2, 0, 1).reshape(t.shape[2], -1)


def _rows_per_chunk(case: PagedCase, q_len: int, seq_len: int, budget: int, live: int) -> int:
    """Query rows per chunk so that ``live`` float64 ``[Hq, n, Lc]`` tensors fit ``budget`` bytes."""
    elems = max(1, budget // (8 * live * case.num_heads))  # n * Lc per head
    shrink = max(1, live // 2)  # a consumer with more live tensors takes proportionally fewer rows
    W = case.sliding_window
    if W is None:
        return max(1, min(q_len, elems // seq_len, _CAUSAL_ROWS // shrink))
    # n rows under a window span at most W + n - 1 keys; more rows than ~W only adds masked work
    n = max(1, min(q_len, max(W, _MIN_ROWS) // shrink))
    while n > 1 and n * min(seq_len, W + n - 1) > elems:
        n //= 2
    return n


def _visible_floor(
    scores: torch.Tensor,
    hidden: torch.Tensor,
    p0: int,
    p1: int,
    first_key: int,
    window: int | None,
    context_len: int | None = None,
) -> torch.Tensor:
    """Each row's smallest logit over the keys it sees: ``[Hkv, G, n]`` from a block's unmasked
    ``scores`` ``[Hkv, G, n, Lc]`` (rows at positions ``p0 .. p1``, keys from ``first_key``) and its
    ``hidden`` mask ``[n, Lc]``. A single row sees every key of its block, unless a tree hides
    some. The hidden scores are set to ``+inf`` in place first (the caller masks them with
    ``-inf`` next). On a device all at once (one launch); on the CPU, where a pass over the
    scores costs a share of the oracle's time, only in the columns some row does not see: the
    keys after ``p0`` (causal) and those up to ``p1 - W`` (window), ``n - 1`` columns each;
    every row sees the keys between. Under a tree mask (``context_len`` given) a row may not see
    any new token: every row sees the history before ``context_len`` only."""
    n = scores.shape[2]
    if n == 1 and context_len is None:  # a tree's row may not see every key of its block
        return scores.amin(dim=-1)
    lo = 0 if window is None else max(0, p1 - window + 1) - first_key  # columns every row sees: lo .. hi - 1
    hi = (p0 + 1 if context_len is None else context_len) - first_key
    if scores.device.type != "cpu" or hi - lo < 1:
        return scores.masked_fill_(hidden, float("inf")).amin(dim=-1)
    for cols in (slice(0, lo), slice(hi, scores.shape[3])):
        if cols.stop > cols.start:
            scores[..., cols].masked_fill_(hidden[:, cols], float("inf"))
    return scores.amin(dim=-1)


def iter_chunks(
    case: PagedCase, live: int = 2, budget: int | None = None, score_floor: bool = False
) -> Iterator[Chunk]:
    """The oracle's work, sequence by sequence, in blocks of query rows over the keys
    they can see, sized so that ``live`` float64 score-sized tensors of one block fit
    ``budget`` bytes (default ``max_bytes()``): a consumer that keeps more tensors of
    the block's size alive asks for smaller blocks. ``score_floor``: also each row's
    smallest logit over the keys it sees (one more pass over the block's scores)."""
    budget = max_bytes() if budget is None else budget
    loc = case.query_start_loc_list
    cap = case.logits_soft_cap
    W = case.sliding_window
    Hkv, G, D = case.num_kv_heads, case.gqa_ratio, case.head_dim
    slopes = case.alibi_slopes.to(torch.float64).view(Hkv, G, 1, 1) if case.alibi_slopes is not None else None
    sinks = case.sinks.to(torch.float64).view(Hkv, G, 1) if case.sinks is not None else None
    for b, L in enumerate(case.seq_lens_list):
        tree = case.tree_mask_of(b)  # [q_len, q_len] bool, None: causal
        k_all, v_all = gather_history(case, b)
        k_all = dequantized(k_all.transpose(0, 1), case.k_scale)  # [Hkv, L, D]
        v_all = dequantized(v_all.transpose(0, 1), case.v_scale)
        q_len = loc[b + 1] - loc[b]
        step = _rows_per_chunk(case, q_len, L, budget, live)
        for i0 in range(0, q_len, step):
            i1 = min(q_len, i0 + step)
            n = i1 - i0
            p0, p1 = L - q_len + i0, L - q_len + i1 - 1  # positions of the first and last row
            keys = slice(0 if W is None else max(0, p0 - W + 1), p1 + 1)
            k, v = k_all[:, keys], v_all[:, keys]  # [Hkv, Lc, D] views, rows of D contiguous
            tokens = slice(loc[b] + i0, loc[b] + i1)
            q = case.query[tokens].to(torch.float64).view(n, Hkv, G, D).permute(1, 2, 0, 3).contiguous()
            scores = torch.bmm(q.view(Hkv, G * n, D), k.transpose(1, 2)).view(Hkv, G, n, -1)
            scores *= case.scale
            if cap is not None:  # in place: c * tanh(s / c)
                scores /= cap
                scores.tanh_()
                scores *= cap
            alibi = None
            pos = torch.arange(p0, p1 + 1, device=k.device)
            if slopes is not None:
                rel = (torch.arange(keys.start, keys.stop, device=k.device)[None, :] - pos[:, None]).to(torch.float64)
                alibi = (slopes, rel)  # bias = slopes * rel, [Hkv, G, n, Lc]
                scores += slopes * rel
            j = torch.arange(keys.start, keys.stop, device=k.device)[None, :]
            hidden = j > pos[:, None]  # [n, Lc]
            if W is not None:
                hidden |= j <= pos[:, None] - W
            ctx = None
            if tree is not None:  # the new tokens' columns: hidden where the row's tree mask says so
                ctx = L - q_len
                hidden[:, ctx - keys.start :] = ~tree[i0:i1, : p1 + 1 - ctx]
            floor = _visible_floor(scores, hidden, p0, p1, keys.start, W, ctx) if score_floor else None
            scores.masked_fill_(hidden, float("-inf"))
            row_max = scores.amax(dim=-1)  # [Hkv, G, n]; every row sees itself, so finite
            if sinks is not None:
                row_max = torch.maximum(row_max, sinks)
            probs = torch.sub(scores, row_max[..., None]).exp_()
            denom = probs.sum(-1)  # [Hkv, G, n]
            sink_probs = key_share = None
            if sinks is not None:  # both shares from their own sums: 1 - sink_probs may cancel to 0
                sink_w = torch.exp(sinks - row_max)
                keys_w = denom.clone()
                denom += sink_w
                sink_probs, key_share = sink_w / denom, keys_w / denom
            probs /= denom[..., None]
            lse = row_max + torch.log(denom)
            yield Chunk(
                b,
                tokens,
                keys,
                q,
                k,
                v,
                scores,
                probs,
                row_max,
                lse,
                sink_probs,
                key_share,
                alibi,
                floor,
                k_all,
                v_all,
                i1 == q_len,
            )
            del scores, probs  # before the next block's are allocated: one block alive at a time


def paged_attention_reference(case: PagedCase) -> torch.Tensor:
    """Attention of every new token over its sequence's paged history, in float64.

    Args:
        case: a valid ``PagedCase`` on any device.

    Returns:
        ``[num_tokens, num_heads, head_dim_v]`` float64 on the case's device.
    """
    return paged_attention_reference_lse(case)[0]


def paged_attention_reference_lse(case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
    """The output and its log-sum-exp, in float64.

    Returns:
        ``(out, lse)``: ``[num_tokens, num_heads, head_dim_v]`` and ``[num_tokens, num_heads]``
        float64 on the case's device. ``lse[t, h]`` is the natural log of the softmax
        denominator (``exp(sinks[h])`` included).
    """
    out = torch.empty(case.num_tokens, case.num_heads, case.head_dim_v, dtype=torch.float64, device=case.device)
    lse = torch.empty(case.num_tokens, case.num_heads, dtype=torch.float64, device=case.device)
    for c in iter_chunks(case):
        out[c.tokens] = c.output()
        lse[c.tokens] = c.rows(c.lse)
        del c  # its score-sized tensors go before the next block's come
    return out, lse
