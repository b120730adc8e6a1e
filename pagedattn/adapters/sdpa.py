"""The ``sdpa`` backend: torch ``scaled_dot_product_attention`` per sequence over
the gathered history (the "gather, then dense attention" baseline)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedattn.adapters.capabilities import Capabilities
from pagedattn.oracle import (
    HEAD_DIM_V,
    MLA,
    PER_HEAD_SCALES,
    TREE_MASK,
    PagedCase,
    gather_history,
    kv_row_scales,
    paged_gather,
    write_cache_by_indexing,
)
from pagedattn.oracle.reference import causal_mask


class SDPABackend:
    """Gathers each sequence's K/V into a contiguous tensor and runs torch SDPA in the
    input dtype, with an explicit bottom-right causal mask (SDPA's ``is_causal`` is
    top-left aligned, wrong for a continuation).

    Variants SDPA can express: the sliding window (in the mask), ALiBi (a float32 mask:
    the bias, ``-inf`` where masked; with fp16/bf16 the call runs in float32, because the
    bias in the query dtype loses the bits the policy counts on) and fp8 caches
    (dequantized into the query dtype first, as vLLM's kernels do; per-head scales too), a value
    width of its own (MLA's latent values among them: SDPA takes ``Ev != E``) and tree masks (in
    the mask). Not soft-cap or sinks: SDPA has no hook for either."""

    name = "sdpa"
    capabilities = Capabilities(
        operations=frozenset({"attention", "gather", "write_cache"}),
        variants=frozenset(
            {"sliding_window", "alibi_slopes", "fp8_e4m3", "fp8_e5m2", PER_HEAD_SCALES, MLA, HEAD_DIM_V, TREE_MASK}
        ),
        notes={"variants": "SDPA has no hook for a logits soft-cap or attention sinks"},
    )

    @property
    def version(self) -> str:
        return f"torch {torch.__version__}"

    def paged_attention(self, case: PagedCase) -> torch.Tensor:
        out = torch.empty(case.num_tokens, case.num_heads, case.head_dim_v, dtype=case.dtype, device=case.device)
        loc = case.query_start_loc_list
        for b, L in enumerate(case.seq_lens_list):
            k, v = gather_history(case, b)  # [L, Hkv, D]
            if case.kv_dtype != case.dtype:
                k_scale, v_scale = kv_row_scales(case)
                k = (k.float() * k_scale).to(case.dtype)
                v = (v.float() * v_scale).to(case.dtype)
            k = k.repeat_interleave(case.gqa_ratio, 1).transpose(0, 1)  # [Hq, L, D]
            v = v.repeat_interleave(case.gqa_ratio, 1).transpose(0, 1)
            q = case.query[loc[b] : loc[b + 1]].transpose(0, 1)  # [Hq, n, D]
            n = q.shape[1]
            mask = causal_mask(n, L, q.device, case.sliding_window)
            tree = case.tree_mask_of(b)
            if tree is not None:  # the new tokens' columns: the tree's, not the causal triangle
                mask[:, L - n :] = tree
            if case.alibi_slopes is not None:
                rel = torch.arange(L, device=q.device)[None, :] - torch.arange(L - n, L, device=q.device)[:, None]
                bias = case.alibi_slopes[:, None, None] * rel[None].float()  # [Hq, n, L]
                mask = bias.masked_fill(~mask[None], float("-inf"))  # float32
                # A half-precision float mask (or one SDPA rounds to the query dtype) loses the
                # bias's low bits: slope 0.707 over 527 keys reaches 372, where the fp16 ulp is
                # 0.25 (15.9x the bound). Kernels add the bias to fp32 scores; so do we: the
                # half-precision operands upcast exactly, and the output rounds once at the end
                q, k, v = q.float(), k.float(), v.float()
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=case.scale)
            out[loc[b] : loc[b + 1]] = o.transpose(0, 1)
        return out

    def gather(self, pool: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        return paged_gather(pool, slot_mapping)

    def write_cache(self, pool: torch.Tensor, slot_mapping: torch.Tensor, new: torch.Tensor) -> None:
        write_cache_by_indexing(pool, slot_mapping, new)
