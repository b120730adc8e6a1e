"""The ``sdpa`` backend: torch ``scaled_dot_product_attention`` per sequence over
the gathered history (the "gather, then dense attention" baseline)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedattn.adapters.protocol import Capabilities
from pagedattn.adapters.reference import write_cache_by_indexing
from pagedattn.oracle import PagedCase, gather_history, paged_gather
from pagedattn.oracle.reference import causal_mask


class SDPABackend:
    """Gathers each sequence's K/V into a contiguous tensor and runs torch SDPA in the
    input dtype, with an explicit bottom-right causal mask (SDPA's ``is_causal`` is
    top-left aligned, wrong for a continuation)."""

    name = "sdpa"
    capabilities = Capabilities(operations=frozenset({"attention", "gather", "write_cache"}))

    @property
    def version(self) -> str:
        return f"torch {torch.__version__}"

    def paged_attention(self, case: PagedCase) -> torch.Tensor:
        out = torch.empty(case.num_tokens, case.num_heads, case.head_dim, dtype=case.dtype, device=case.device)
        loc = case.query_start_loc_list
        for b, L in enumerate(case.seq_lens_list):
            k, v = gather_history(case, b)  # [L, Hkv, D]
            k = k.repeat_interleave(case.gqa_ratio, 1).transpose(0, 1)  # [Hq, L, D]
            v = v.repeat_interleave(case.gqa_ratio, 1).transpose(0, 1)
            q = case.query[loc[b] : loc[b + 1]].transpose(0, 1)  # [Hq, n, D]
            mask = causal_mask(q.shape[1], L, q.device)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=case.scale)
            out[loc[b] : loc[b + 1]] = o.transpose(0, 1)
        return out

    def gather(self, pool: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        return paged_gather(pool, slot_mapping)

    def write_cache(self, pool: torch.Tensor, slot_mapping: torch.Tensor, new: torch.Tensor) -> None:
        write_cache_by_indexing(pool, slot_mapping, new)
