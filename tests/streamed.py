"""Torch models of real kernels, for calibrating the policy: a streamed online
softmax with fp32 accumulation (tile size, weight rounding as options) and the
same loop with one planted precision bug at a time."""

from __future__ import annotations

import torch

from pagedattn.oracle import PagedCase, gather_history
from pagedattn.oracle.reference import causal_mask

PRECISION_BUGS = ("exp_bf16", "acc_fp16", "query_bf16", "drop_key", "scale_1pct", "no_rescale")


def streamed_attention(
    case: PagedCase, tile: int = 16, round_weights: bool = False, bug: str | None = None
) -> torch.Tensor:
    """``[T, Hq, D]`` in the query dtype: online softmax over key tiles of ``tile`` keys,
    all arithmetic in fp32; ``round_weights`` rounds ``p`` to the input dtype before the
    weighted-V product, as flash-style kernels do."""
    out = torch.empty(case.num_tokens, case.num_heads, case.head_dim, dtype=case.dtype)
    loc = case.query_start_loc.tolist()
    scale = case.scale * (1.01 if bug == "scale_1pct" else 1.0)
    for b, L in enumerate(case.seq_lens_list):
        k, v = gather_history(case, b)
        k = k.float().repeat_interleave(case.gqa_ratio, 1).transpose(0, 1)  # [Hq, L, D]
        v = v.float().repeat_interleave(case.gqa_ratio, 1).transpose(0, 1)
        q = case.query[loc[b] : loc[b + 1]]
        if bug == "query_bf16":
            q = q.to(torch.bfloat16)
        q = q.float().transpose(0, 1)  # [Hq, n, D]
        n = q.shape[1]
        allowed = causal_mask(n, L, q.device)  # [n, L]
        if bug == "drop_key":
            allowed[:, 0] = False if L > 1 else allowed[:, 0]
        m = torch.full((case.num_heads, n, 1), float("-inf"))
        l = torch.zeros(case.num_heads, n, 1)
        acc = torch.zeros(case.num_heads, n, case.head_dim)
        for j0 in range(0, L, tile):
            j1 = min(L, j0 + tile)
            s = (q @ k[:, j0:j1].transpose(1, 2)) * scale  # [Hq, n, t]
            s = s.masked_fill(~allowed[None, :, j0:j1], float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            x = s - m_safe
            p = torch.exp(x.to(torch.bfloat16)).float() if bug == "exp_bf16" else torch.exp(x)
            alpha = torch.exp(m - m_safe)
            if bug == "no_rescale":
                alpha = torch.ones_like(alpha)
            l = l * alpha + p.sum(-1, keepdim=True)
            pv = p.to(case.dtype).float() if round_weights else p
            acc = acc * alpha + pv @ v[:, j0:j1]
            if bug == "acc_fp16":
                acc = acc.half().float()
            m = m_new
        out[loc[b] : loc[b + 1]] = (acc / l).transpose(0, 1).to(case.dtype)
    return out


def sdpa_attention(case: PagedCase) -> torch.Tensor:
    """torch SDPA per sequence over the gathered history, in the input dtype."""
    out = torch.empty(case.num_tokens, case.num_heads, case.head_dim, dtype=case.dtype)
    loc = case.query_start_loc.tolist()
    for b, L in enumerate(case.seq_lens_list):
        k, v = gather_history(case, b)
        k = k.repeat_interleave(case.gqa_ratio, 1).transpose(0, 1)
        v = v.repeat_interleave(case.gqa_ratio, 1).transpose(0, 1)
        q = case.query[loc[b] : loc[b + 1]].transpose(0, 1)
        mask = causal_mask(q.shape[1], L, q.device)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=case.scale)
        out[loc[b] : loc[b + 1]] = o.transpose(0, 1)
    return out
