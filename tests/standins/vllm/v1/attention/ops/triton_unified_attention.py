"""Stand-in for vLLM's ``unified_attention`` (tests/standins/README.md): the same signature
and argument conventions, computed in pure torch; not vLLM's code.

Conventions (vLLM's ``unified_attention``): caches ``[num_blocks, block_size, Hkv, D]``;
``block_table`` ``[B, M]``; ``seqused_k`` the history lengths; ``cu_seqlens_q`` the query
rows; the new tokens are each sequence's last positions (bottom-right causal);
``window_size = (left, right)`` in FlashAttention's convention, a query seeing
``1 + left`` keys (``left < 0``: no window); ``softcap > 0`` caps the scaled score;
``alibi_slopes`` adds ``slope * (key - query)``; ``sinks`` ``[Hq]`` logits join the
denominator; an fp8 cache with ``kv_quant_mode=FP8_PER_TENSOR`` is dequantized with the
one-element ``k_descale``/``v_descale`` into the query dtype (with ``NONE`` it is cast
unscaled). The 3D-launch buffers are accepted and unused.
"""

import torch
from standin_attention import attend

from vllm.v1.kv_cache_interface import KVQuantMode


def _rows(cache, blocks, offsets):
    """``cache[blocks, offsets]``; an fp8 cache through its bytes (torch before 2.10 cannot
    index fp8 on the CPU)."""
    if cache.element_size() == 1 and cache.is_floating_point():
        return cache.view(torch.uint8)[blocks, offsets].view(cache.dtype)
    return cache[blocks, offsets]


def unified_attention(
    q,
    k,
    v,
    out,
    cu_seqlens_q,
    max_seqlen_q,
    seqused_k,
    max_seqlen_k,
    softmax_scale,
    causal,
    window_size,
    block_table,
    softcap,
    q_descale,
    k_descale,
    v_descale,
    seq_threshold_3D=None,
    num_par_softmax_segments=None,
    softmax_segm_output=None,
    softmax_segm_max=None,
    softmax_segm_expsum=None,
    alibi_slopes=None,
    output_scale=None,
    qq_bias=None,
    sinks=None,
    mm_prefix_range=None,
    use_alibi_sqrt=False,
    kv_quant_mode=KVQuantMode.NONE,
    k_scale_cache=None,
    v_scale_cache=None,
):
    assert causal, "Only causal attention is supported"
    assert q_descale is None, "Q scales not supported"
    for name, arg in (("output_scale", output_scale), ("qq_bias", qq_bias), ("mm_prefix_range", mm_prefix_range)):
        if arg is not None:
            raise NotImplementedError(f"stand-in: {name} is not modelled")
    if use_alibi_sqrt or kv_quant_mode not in (KVQuantMode.NONE, KVQuantMode.FP8_PER_TENSOR):
        raise NotImplementedError("stand-in: only linear ALiBi and per-tensor fp8 are modelled")
    block_size = k.shape[1]
    loc = cu_seqlens_q.tolist()
    for b, seq_len in enumerate(seqused_k.tolist()):
        n = loc[b + 1] - loc[b]
        pos = torch.arange(seq_len - n, seq_len, device=q.device)
        j = torch.arange(seq_len, device=q.device)
        blocks = block_table[b, j // block_size].long()
        kb, vb = (_rows(c, blocks, j % block_size) for c in (k, v))
        if kb.dtype != q.dtype:
            if kv_quant_mode == KVQuantMode.FP8_PER_TENSOR:
                kb, vb = kb.float() * k_descale.float().reshape(()), vb.float() * v_descale.float().reshape(())
            kb, vb = kb.to(q.dtype), vb.to(q.dtype)
        visible = j[None, :] <= pos[:, None]
        if window_size[0] >= 0:
            visible &= pos[:, None] - j[None, :] < 1 + window_size[0]
        bias = None
        if alibi_slopes is not None:
            bias = alibi_slopes.float()[:, None, None] * (j[None, None, :] - pos[None, :, None]).float()
        o = attend(q[loc[b] : loc[b + 1]], kb, vb, softmax_scale, visible, softcap, bias, sinks)
        out[loc[b] : loc[b + 1]] = o.to(out.dtype)
