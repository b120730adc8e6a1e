"""Weights rounded below the normal range where they meet V: the case's guard and a block's correction.

A weight far below its row's largest rounds to a subnormal in the weights' precision, with an
absolute error of half the subnormal spacing rather than a relative one (``docs/tolerance.md``).
``_weights_stay_normal`` rules that out for a whole case at once, from the norms of its queries
and keys; ``_subnormal_weights`` forms the correction for a block of rows where it cannot be
ruled out.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from pagedattn.oracle.case import PagedCase
from pagedattn.oracle.reference import Chunk
from pagedattn.oracle.sequence_stats import _spent

if TYPE_CHECKING:
    from pagedattn.oracle.policy import _Terms

#: elements of the key pool whose norms are taken at once (``_weights_stay_normal``): bounded temporaries
_POOL_SLICE = 1 << 22


def _weights_stay_normal(case: PagedCase, min_normal: float) -> bool:
    """Whether no softmax weight of ``case`` can fall below ``min_normal`` relative to its row's
    largest, read once on the host: every logit lies within ``S`` of 0, ``S`` from the largest
    norms of the queries and of every key in the pool (Cauchy-Schwarz; the soft-cap, ALiBi's
    largest bias), so a row spans at most ``2 S`` (``S + max |sink|`` with a sink, which joins
    the maximum; with per-head key scales, the largest scale). A margin of 1 covers rounding.
    The maxima are read in one transfer and combined in Python's float64 (on a GPU each tensor
    operation is a launch)."""
    wide = torch.float64 if case.dtype == torch.float64 else torch.float32  # the norm may not narrow
    maxima = [torch.linalg.vector_norm(case.query, dim=-1, dtype=wide).amax()]
    pool = case.key_cache
    step = max(1, _POOL_SLICE // max(1, pool[0].numel()))  # blocks of the pool at a time
    for b0 in range(0, pool.shape[0], step):
        keys = pool[b0 : b0 + step]
        keys = keys if case.kv_dtype == case.dtype else keys.to(case.dtype)  # fp8: no norm of its own
        # the pool's unused slots may hold NaN (poisoned padding): a NaN key's logits are NaN, and
        # the guards never fire on NaN either, so a NaN norm is left out (an infinite one is not)
        maxima.append(torch.linalg.vector_norm(keys, dim=-1, dtype=wide).nan_to_num_(nan=0.0, posinf=math.inf).amax())
    extras = [t.abs().amax() for t in (case.alibi_slopes, case.sinks) if t is not None]
    # per-head key scales: the largest bounds every head's logits (read in the same transfer)
    k_scale = case.k_scale
    if isinstance(k_scale, torch.Tensor):
        extras.append(k_scale.amax())
    q, *ks = torch.stack(maxima + extras).tolist()  # one read: float32 maxima are exact in float64
    ks, rest = ks[: len(ks) - len(extras)], ks[len(ks) - len(extras) :]
    if isinstance(k_scale, torch.Tensor):
        k_scale = rest.pop()
    s = (q * max(ks)) * (case.scale * k_scale)
    if case.logits_soft_cap is not None:
        s = min(s, case.logits_soft_cap)
    if case.alibi_slopes is not None:
        s = s + rest.pop(0) * max(case.max_seq_len - 1, 0)
    span = 2.0 * s if case.sinks is None else s + max(s, rest.pop(0))
    return span < -math.log(min_normal) - 1.0


def _subnormal_weights(c: Chunk, terms: _Terms) -> torch.Tensor | None:
    """The correction of weights rounded below the normal range where they meet V, as weights
    ``[Hkv, G, n, Lc]`` float64 (in the spent scores' storage) to multiply ``|v|`` with, or
    ``None`` where no weight of the block needs it. Weights round relative to the final max
    (each is largest there): relatively while normal, by at most half the subnormal spacing
    below. On the CPU two cheap guards skip it where no p_rel can be subnormal; on a device
    each guard is a read that stalls the host until the device catches up, so there the case is
    judged once (``subnormal_free``: then the guards would all say no) and otherwise the
    correction is formed unconditionally: where no weight is small it adds exactly 0."""
    model = terms.model
    if terms.subnormal_free:
        return None
    assert c.score_floor is not None
    if not terms.device_path and not bool((c.score_floor - c.row_max < math.log(model.weights_min_normal)).any()):
        return None
    l_rel = torch.exp(c.lse - c.row_max)[..., None]  # the denominator in units of the max
    small = c.probs < model.weights_min_normal / l_rel  # [Hkv, G, n, Lc] bool, in place below
    small &= c.probs > 0.0
    if not terms.device_path and not bool(small.any()):
        return None
    extra = torch.mul(c.probs, l_rel, out=_spent(c.scores, torch.float64))
    extra.clamp_(max=model.weights_spacing / 2).div_(l_rel).sub_(c.probs, alpha=terms.u_w)
    return extra.masked_fill_(small.logical_not_(), 0.0)
