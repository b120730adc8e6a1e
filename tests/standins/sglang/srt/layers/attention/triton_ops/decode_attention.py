"""Stand-in for SGLang's ``decode_attention_fwd`` (tests/standins/README.md): the same
signature and argument conventions, computed in pure torch; not SGLang's code.

Conventions: ``q`` ``[B, Hq, D]``, one query token per request, which sees every key its
``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]`` lists in the token pool ``k_buffer``/
``v_buffer`` ``[slots, Hkv, D]``; scores scaled by ``sm_scale * k_scale``, capped by
``logit_cap > 0``; ``sinks`` ``[Hq]`` join the denominator; the output is multiplied by
``v_scale``. ``k_buffer`` and ``v_buffer`` may differ in width (``Lk``, ``Lv``: MLA's latent pool
and its first ``Lv`` columns); ``o`` is ``[B, Hq, Lv]``. The split buffers must have
``max_kv_splits`` splits and ``attn_logits`` the width ``Lv`` (the kernel finds each split's
log-sum-exp at ``attn_logits``' offset divided by ``Lv``); they are otherwise unused.
"""

import torch
from standin_attention import attend


def decode_attention_fwd(
    q,
    k_buffer,
    v_buffer,
    o,
    kv_indptr,
    kv_indices,
    attn_logits,
    attn_lse,
    num_kv_splits,
    max_kv_splits,
    sm_scale,
    k_scale,
    v_scale,
    logit_cap=0.0,
    sinks=None,
    xai_temperature_len=-1,
):
    assert max_kv_splits == attn_logits.shape[2]
    Lk, Lv = k_buffer.shape[-1], v_buffer.shape[-1]
    assert attn_logits.shape[3] == Lv and q.shape[-1] == Lk and o.shape[-1] == Lv
    assert q.shape[0] <= kv_indptr.shape[0] - 1
    assert q.shape[0] <= attn_logits.shape[0]
    if xai_temperature_len > 0:
        raise NotImplementedError("stand-in: xai_temperature_len is not modelled")
    indptr = kv_indptr.tolist()
    for b in range(q.shape[0]):
        slots = kv_indices[indptr[b] : indptr[b + 1]].long()
        visible = torch.ones(1, len(slots), dtype=torch.bool, device=q.device)
        k, v = k_buffer[slots], v_buffer[slots]
        out = attend(q[b : b + 1], k, v, sm_scale * k_scale, visible, logit_cap, None, sinks)
        o[b] = (out[0] * v_scale).to(o.dtype)
