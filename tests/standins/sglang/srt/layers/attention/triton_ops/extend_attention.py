"""Stand-in for SGLang's ``extend_attention_fwd`` (tests/standins/README.md): the same
signature and argument conventions, computed in pure torch; not SGLang's code.

Conventions: request ``b``'s new tokens are rows ``qo_indptr[b]:qo_indptr[b + 1]`` of
``q_extend`` and of the contiguous ``k_extend``/``v_extend``; its cached prefix is the
token slots ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]`` of ``k_buffer``/``v_buffer``.
New token ``i`` (position ``P + i``) sees every prefix key and new tokens ``<= i``
(``is_causal``); ``sliding_window_size = S > 0`` keeps keys with ``query - key <= S``,
and ``S <= 0`` means no window (the kernel's ``SLIDING_WINDOW_SIZE > 0`` test);
``logit_cap > 0`` caps the scaled score; ``sinks`` join the denominator. ``custom_mask``
(bool) replaces the causal test among the new tokens: request ``b``'s ``[n, prefix + n]``
matrix, row-major from ``mask_indptr[b]`` (row = new token, column = key); its prefix columns
are read only with ``skip_prefix_custom_mask=False``. With ``is_causal`` too the kernel stops
each query tile at its last row, which the stand-in models as ``j <= i`` among the new tokens
(the same for masks with nothing above the diagonal). ``k``/``v`` may differ in width
(MLA); the output is ``[T, Hq, Lv]``.
"""

import torch
from standin_attention import attend


def extend_attention_fwd(
    q_extend,
    k_extend,
    v_extend,
    o_extend,
    k_buffer,
    v_buffer,
    qo_indptr,
    kv_indptr,
    kv_indices,
    custom_mask,
    is_causal,
    mask_indptr,
    max_len_extend,
    sm_scale=None,
    logit_cap=0.0,
    skip_prefix_custom_mask=True,
    sliding_window_size=-1,
    sinks=None,
    window_kv_offsets=None,
    xai_temperature_len=-1,
):
    if xai_temperature_len > 0 or window_kv_offsets is not None:
        raise NotImplementedError("stand-in: xai temperature and window_kv_offsets are not modelled")
    assert o_extend.shape[-1] == v_extend.shape[-1] == v_buffer.shape[-1]
    sm_scale = sm_scale or 1.0 / (q_extend.shape[-1] ** 0.5)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        slots = kv_indices[kv[b] : kv[b + 1]].long()
        prefix, n = len(slots), qo[b + 1] - qo[b]
        k = torch.cat([k_buffer[slots], k_extend[qo[b] : qo[b + 1]]])
        v = torch.cat([v_buffer[slots], v_extend[qo[b] : qo[b + 1]]])
        pos = prefix + torch.arange(n, device=q_extend.device)
        j = torch.arange(prefix + n, device=q_extend.device)
        visible = torch.ones(n, prefix + n, dtype=torch.bool, device=q_extend.device)
        if is_causal:
            visible &= j[None, :] <= pos[:, None]
        if custom_mask is not None:
            start, size = int(mask_indptr[b]), n * (prefix + n)
            m = custom_mask[start : start + size].bool()
            m = torch.cat([m, m.new_zeros(size - len(m))]).view(n, prefix + n)  # past the end: undefined, here False
            visible[:, prefix:] &= m[:, prefix:]
            if not skip_prefix_custom_mask:
                visible[:, :prefix] &= m[:, :prefix]
        if sliding_window_size > 0:
            visible &= pos[:, None] <= j[None, :] + sliding_window_size
        out = attend(q_extend[qo[b] : qo[b + 1]], k, v, sm_scale, visible, logit_cap, None, sinks)
        o_extend[qo[b] : qo[b + 1]] = out.to(o_extend.dtype)
