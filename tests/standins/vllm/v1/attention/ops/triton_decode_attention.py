"""Stand-in for vLLM's Triton MLA ``decode_attention_fwd`` (tests/standins/README.md): the same
signature and argument conventions, computed in pure torch; not vLLM's code.

Conventions: ``q`` ``[B, Hq, Lk]``, one query token per request; ``k_buffer`` ``[pages,
page_size, Hkv, Lk]`` (or ``[pages * page_size, Hkv, Lk]``), ``v_buffer`` the same with ``Lv``
(for MLA a view of ``k_buffer``'s first ``Lv`` columns); ``req_to_token`` ``[B, M]`` page
numbers, key ``j`` of request ``b`` at page ``req_to_token[b, j // page_size]``, slot
``j % page_size``; ``b_seq_len`` ``[B]`` keys per request, the last ``sliding_window`` of them
when given; scores ``q . k * sm_scale``, capped by ``logit_cap > 0``; an fp8 cache is
dequantized with the one-element ``k_scale``/``v_scale`` into the query dtype; with
``is_mla`` and more than one query head per KV head, V is the first ``Lv`` columns of K (the
kernel takes it from the K tile, not from ``v_buffer``). ``o`` ``[B, Hq, Lv]`` gets the output,
``lse`` ``[B, Hq]`` the natural-log log-sum-exp of the scores; ``attn_logits`` must be
``[B, Hq, num_kv_splits, Lv + 1]`` and is otherwise unused.
"""

import torch
from standin_attention import attend


def _rows(buf, pages, slots):
    """``buf[pages, slots]``; an fp8 buffer through its bytes (torch before 2.10 cannot index
    fp8 on the CPU)."""
    if buf.element_size() == 1 and buf.is_floating_point():
        return buf.view(torch.uint8)[pages, slots].view(buf.dtype)
    return buf[pages, slots]


def _scale(scale):
    return 1.0 if scale is None else scale.float().reshape(-1)[0]


def decode_attention_fwd(
    q,
    k_buffer,
    v_buffer,
    o,
    lse,
    req_to_token,
    b_seq_len,
    attn_logits,
    num_kv_splits,
    sm_scale,
    page_size=1,
    logit_cap=0.0,
    k_scale=None,
    v_scale=None,
    is_mla=False,
    sliding_window=None,
):
    assert num_kv_splits == attn_logits.shape[2]
    Lk, Lv = k_buffer.shape[-1], v_buffer.shape[-1]
    assert attn_logits.shape[3] == Lv + 1 and q.shape[-1] == Lk and o.shape[-1] == Lv
    if k_buffer.ndim == 3:
        k_buffer, v_buffer = (b.unflatten(0, (-1, page_size)) for b in (k_buffer, v_buffer))
    assert k_buffer.shape[1] == page_size, "page_size must be the buffer's page dim"
    group = q.shape[1] // v_buffer.shape[-2]
    from_k = is_mla and group > 1  # the grouped kernel's MLA path: V is the K tile's first Lv columns
    for b, seq_len in enumerate(b_seq_len.tolist()):
        j = torch.arange(max(0, seq_len - (sliding_window or seq_len)), seq_len, device=q.device)
        pages, slots = req_to_token[b, j // page_size].long(), j % page_size
        k = _rows(k_buffer, pages, slots)
        v = k[..., :Lv] if from_k else _rows(v_buffer, pages, slots)
        if k.dtype != q.dtype:
            ks = _scale(k_scale)
            vs = ks if from_k else _scale(v_scale)
            k, v = (k.float() * ks).to(q.dtype), (v.float() * vs).to(q.dtype)
        visible = torch.ones(1, len(j), dtype=torch.bool, device=q.device)
        o[b] = attend(q[b : b + 1], k, v, sm_scale, visible, logit_cap)[0].to(o.dtype)
        s = torch.einsum("hd,khd->hk", q[b].float(), k.float().repeat_interleave(group, 1)) * sm_scale
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        lse[b] = torch.logsumexp(s, dim=-1).to(lse.dtype)
