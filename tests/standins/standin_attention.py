"""The one computation every stand-in shares: causal attention of a few query rows over
their keys, in float32, from the definition (docs/variants.md)."""

import torch


def attend(q, k, v, scale, visible, softcap=0.0, bias=None, sink=None):
    """Args:
        q: ``[n, Hq, D]``; k, v: ``[L, Hkv, D]`` (any float dtype, used as float32).
        visible: ``[n, L]`` bool.
        softcap: ``c > 0`` caps the scaled score as ``c * tanh(s / c)``; ``0``: none.
        bias: ``[Hq, n, L]`` float32 added after the cap (ALiBi), or None.
        sink: ``[Hq]`` float32 logits joining each row's denominator, or None.

    Returns:
        ``[n, Hq, D]`` float32.
    """
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, 1)
    v = v.float().repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~visible[None], float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.float()[:, None, None].expand(-1, s.shape[1], 1)], dim=2)
    p = torch.softmax(s, dim=-1)[..., : k.shape[0]]
    return torch.einsum("hqk,khd->qhd", p, v)
