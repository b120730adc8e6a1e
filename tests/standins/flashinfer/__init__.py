"""A pure-torch stand-in for the parts of ``flashinfer`` (0.5.x) that the adapter calls.

Written by us from FlashInfer's public documentation and API (docstrings of
``BatchDecodeWithPagedKVCacheWrapper``, ``BatchPrefillWithPagedKVCacheWrapper``,
``BatchAttentionWithAttentionSinkWrapper``, ``BatchMLAPagedAttentionWrapper`` in ``mla.py``)
and from what the real package was seen to do on the H200; no FlashInfer code is copied.
Same constructor, ``plan`` and ``run`` signatures (the arguments the adapter uses), same layouts and the same semantics,
including the ones an adapter must convert:

- paged KV: ``[pages, 2, page_size, Hkv, D]`` (NHD) or ``[pages, 2, Hkv, page_size, D]``
  (HND), or a ``(k, v)`` tuple of 4-D tensors; pages by CSR ``kv_indptr``/``kv_indices``
  and ``kv_last_page_len`` in ``1..page_size``;
- causal masks bottom-right aligned; ``window_left`` keys to the left of the query;
- ``plan(custom_mask=)``: a flattened bool ``[q_len, kv_len]`` block per request, packed
  as ``segment_packbits(..., bitorder="little")`` does (``quantization.py``); the kernel
  reads bit ``qo_idx * kv_len + kv_idx`` of the request's packed segment and ignores
  ``causal``. ``plan(packed_custom_mask=)`` takes packed bits as given, with the per-request
  offsets 0.5.3 computes for them: ``cumsum(q_len * kv_len)``, counted in elements, which
  the kernel reads as bytes (right for one request only). A custom mask runs on fa2 (fa3
  has no ``MaskMode::kCustom``); the sink wrapper's variant reads the window only and drops it;
- the lse returned in base 2;
- ALiBi slopes read from ``flashinfer.utils``'s cache, the distance measured from the
  request's first new query row (``kv_idx - qo_idx``), the bias added to the scaled
  score before the soft-cap (which scales again);
- ``k_scale`` folds into ``sm_scale``; ``v_scale`` multiplies the output after the
  kernel, in the output dtype;
- ``run(sinks=...)`` ignored by the decode and prefill wrappers (the fa2/fa3 paths on
  Hopper); ``BatchAttentionWithAttentionSinkWrapper.run(q, kv, sink, sm_scale)`` honours
  the sink and takes ``sm_scale`` from its own arguments, not from ``plan`` nor
  ``k_scale``;
- fp16/bf16 queries only; the CUDA-core decode kernel dispatches GQA group sizes 1, 2,
  3, 4 and 8 only; the fa3 prefill path (chosen by ``backend="auto"`` unless ALiBi)
  cannot mix an fp8 cache with fp16/bf16 queries.

The arithmetic is float32 on whatever device the tensors are on (tests run it on the CPU).
"""

from __future__ import annotations

import math

import torch

from . import utils
from .mla import BatchMLAPagedAttentionWrapper as BatchMLAPagedAttentionWrapper
from .quantization import segment_packbits

__version__ = "0.5.3+standin"

_HALF = (torch.float16, torch.bfloat16)
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_CUDA_CORE_GROUPS = (1, 2, 3, 4, 8)


def _dtype(d) -> torch.dtype:
    return getattr(torch, d) if isinstance(d, str) else d


def _unpack(paged_kv_cache, kv_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k, v)`` as ``[pages, page_size, Hkv, D]`` whatever the layout given."""
    if isinstance(paged_kv_cache, tuple):
        k, v = paged_kv_cache
    else:
        k, v = paged_kv_cache[:, 0], paged_kv_cache[:, 1]
    if kv_layout == "HND":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    return k, v


def _attend(
    q,
    k_pages,
    v_pages,
    qo_indptr,
    kv_indptr,
    kv_indices,
    last_page_len,
    *,
    sm_scale,
    causal,
    window_left,
    soft_cap,
    alibi_slopes,
    sink,
    mask_bits=None,
):
    """The kernels' semantics, float32: ``(out [T, Hq, D] float32, lse [T, Hq] base 2)``.

    ``mask_bits``: ``(packed uint8, mask_indptr)``, a custom mask (replaces ``causal``)."""
    T, Hq, D = q.shape
    page_size, Hkv = k_pages.shape[1], k_pages.shape[2]
    group = Hq // Hkv
    out = torch.zeros(T, Hq, D, dtype=torch.float32, device=q.device)
    lse = torch.full((T, Hq), -math.inf, dtype=torch.float32, device=q.device)
    qo, kvp, last = qo_indptr.tolist(), kv_indptr.tolist(), last_page_len.tolist()
    for r in range(len(qo) - 1):
        pages = kv_indices[kvp[r] : kvp[r + 1]].long()
        kv_len = (len(pages) - 1) * page_size + int(last[r])
        k = k_pages[pages].reshape(-1, Hkv, D)[:kv_len].float().repeat_interleave(group, 1)  # [L, Hq, D]
        v = v_pages[pages].reshape(-1, Hkv, D)[:kv_len].float().repeat_interleave(group, 1)
        qr = q[qo[r] : qo[r + 1]].float()  # [n, Hq, D]
        n = qr.shape[0]
        s = torch.einsum("qhd,khd->hqk", qr, k)  # [Hq, n, L]
        qo_idx = torch.arange(n, device=q.device)[:, None]
        kv_idx = torch.arange(kv_len, device=q.device)[None, :]
        if alibi_slopes is not None:  # distance from the request's first new query row
            s = s * sm_scale + alibi_slopes.float()[:, None, None] * (kv_idx - qo_idx).float()
            if soft_cap:
                s = soft_cap * torch.tanh(s * (sm_scale / soft_cap))
        elif soft_cap:
            s = soft_cap * torch.tanh(s * (sm_scale / soft_cap))
        else:
            s = s * sm_scale
        visible = torch.ones(n, kv_len, dtype=torch.bool, device=q.device)
        if mask_bits is not None:
            visible &= _read_bits(*mask_bits, r, n, kv_len)
        elif causal:
            visible &= kv_idx + n <= kv_len + qo_idx
        if window_left >= 0:
            visible &= kv_idx + n + window_left >= kv_len + qo_idx
        s = s.masked_fill(~visible, -math.inf)
        if sink is not None:
            s = torch.cat([s, sink.float()[:, None, None].expand(Hq, n, 1)], dim=2)
            v = torch.cat([v, torch.zeros_like(v[:1])], dim=0)
        row_lse = torch.logsumexp(s, dim=2)  # [Hq, n]
        p = torch.exp(s - row_lse[..., None])
        out[qo[r] : qo[r + 1]] = torch.einsum("hqk,khd->qhd", p, v)
        lse[qo[r] : qo[r + 1]] = (row_lse / math.log(2.0)).transpose(0, 1)
    return out, lse


def _read_bits(packed: torch.Tensor, mask_indptr: torch.Tensor, r: int, n: int, kv_len: int) -> torch.Tensor:
    """``[n, kv_len]`` bool: bit ``i * kv_len + j`` (little order) of request ``r``'s packed
    segment, which starts at byte ``mask_indptr[r]``; bytes past the buffer read as 0."""
    start = int(mask_indptr[r])
    offsets = torch.arange(n * kv_len, device=packed.device)
    byte = start + offsets // 8
    inside = byte < packed.numel()
    octets = torch.where(inside, packed[byte.clamp(max=max(packed.numel() - 1, 0))].long(), 0)
    return ((octets >> (offsets % 8)) & 1).bool().view(n, kv_len)


class _PagedWrapper:
    """What the three wrappers share: the workspace, ``plan``'s bookkeeping and ``run``."""

    _is_decode = False

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", backend: str = "auto"):
        if kv_layout not in ("NHD", "HND"):
            raise ValueError(f"Invalid kv_layout {kv_layout}")
        self._kv_layout = kv_layout
        self._backend = backend
        self._workspace = float_workspace_buffer
        self._plan: dict | None = None

    def _store_plan(
        self,
        qo_indptr,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        *,
        causal,
        pos_encoding_mode,
        window_left,
        logits_soft_cap,
        sm_scale,
        q_data_type,
        kv_data_type,
        custom_mask=None,
        packed_custom_mask=None,
    ):
        for t, name in ((indptr, "indptr"), (indices, "indices"), (last_page_len, "last_page_len")):
            if t.dtype != torch.int32:
                raise ValueError(f"{name} must have dtype torch.int32, got {t.dtype}")
        q_dtype = _dtype(q_data_type)
        kv_dtype = _dtype(kv_data_type) if kv_data_type is not None else q_dtype
        if q_dtype not in _HALF:
            raise ValueError(f"Unsupported q_data_type {q_dtype}: FlashInfer kernels take float16/bfloat16")
        if kv_dtype not in _HALF + _FP8:
            raise ValueError(f"Unsupported kv_data_type {kv_dtype}")
        if num_qo_heads % num_kv_heads:
            raise ValueError("num_qo_heads must be a multiple of num_kv_heads")
        mask_bits = None
        if custom_mask is not None or packed_custom_mask is not None:
            kv_lens = (indptr[1:] - indptr[:-1] - 1) * page_size + last_page_len
            mask_indptr = torch.cat([indptr.new_zeros(1), ((qo_indptr[1:] - qo_indptr[:-1]) * kv_lens).cumsum(0)])
            if packed_custom_mask is None:
                packed_custom_mask, mask_indptr = segment_packbits(
                    custom_mask.contiguous().view(-1), mask_indptr, bitorder="little"
                )
            mask_bits = (packed_custom_mask, mask_indptr)
        backend = self._backend
        if backend == "auto":  # as on Hopper: fa3 unless a feature only fa2 has
            backend = "fa2" if pos_encoding_mode != "NONE" or mask_bits is not None else "fa3"
        if backend == "fa3" and kv_dtype != q_dtype:
            raise RuntimeError(f"fa3 paged prefill: no GMMA for {q_dtype} queries with a {kv_dtype} cache")
        if backend == "fa3" and mask_bits is not None:
            raise RuntimeError("fa3 paged prefill: MaskMode::kCustom is not supported (cudaErrorNotSupported)")
        self._plan = dict(
            qo_indptr=qo_indptr,
            kv_indptr=indptr,
            kv_indices=indices,
            last_page_len=last_page_len,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            causal=causal,
            alibi=pos_encoding_mode == "ALIBI",
            window_left=window_left,
            soft_cap=logits_soft_cap or 0.0,
            sm_scale=sm_scale if sm_scale is not None else head_dim**-0.5,
            q_dtype=q_dtype,
            kv_dtype=kv_dtype,
            mask_bits=mask_bits,
        )

    def _run(self, q, paged_kv_cache, *, sm_scale, sink, k_scale, v_scale, return_lse):
        plan = self._plan
        if plan is None:
            raise RuntimeError("plan() must be called before run()")
        k, v = _unpack(paged_kv_cache, self._kv_layout)
        if q.dtype != plan["q_dtype"] or k.dtype != plan["kv_dtype"]:
            raise ValueError(f"dtypes {q.dtype}/{k.dtype} differ from plan's {plan['q_dtype']}/{plan['kv_dtype']}")
        if k.shape[1] != plan["page_size"]:
            raise ValueError(f"page_size {k.shape[1]} differs from plan's {plan['page_size']}")
        if k_scale is not None:
            sm_scale *= k_scale
        slopes = utils._get_cache_alibi_slopes_buf(q.shape[1], q.device) if plan["alibi"] else None
        out, lse = _attend(
            q,
            k,
            v,
            plan["qo_indptr"],
            plan["kv_indptr"],
            plan["kv_indices"],
            plan["last_page_len"],
            sm_scale=sm_scale,
            causal=plan["causal"],
            window_left=plan["window_left"],
            soft_cap=plan["soft_cap"],
            alibi_slopes=slopes,
            sink=sink,
            mask_bits=plan["mask_bits"],
        )
        out = out.to(q.dtype)
        if v_scale is not None:  # after the kernel, in the output dtype
            out *= v_scale
        return (out, lse) if return_lse else out


class BatchDecodeWithPagedKVCacheWrapper(_PagedWrapper):
    """Decode: one query per request, ``q`` ``[batch_size, Hq, D]``."""

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        use_tensor_cores=False,
        paged_kv_indptr_buffer=None,
        paged_kv_indices_buffer=None,
        paged_kv_last_page_len_buffer=None,
        backend="auto",
        jit_args=None,
    ):
        super().__init__(float_workspace_buffer, kv_layout, "fa2")
        self.use_tensor_cores = use_tensor_cores

    def plan(
        self,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        pos_encoding_mode="NONE",
        window_left=-1,
        logits_soft_cap=None,
        q_data_type="float16",
        kv_data_type=None,
        data_type=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        non_blocking=True,
        block_tables=None,
        seq_lens=None,
        fixed_split_size=None,
        disable_split_kv=False,
    ):
        group = num_qo_heads // num_kv_heads
        if not self.use_tensor_cores and group not in _CUDA_CORE_GROUPS:
            raise RuntimeError(f"Unsupported group_size: {group}")
        batch = len(last_page_len)
        qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=indptr.device)
        self._store_plan(
            qo_indptr,
            indptr,
            indices,
            last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            causal=False,
            pos_encoding_mode=pos_encoding_mode,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type,
        )

    def run(
        self,
        q,
        paged_kv_cache,
        *args,
        q_scale=None,
        k_scale=None,
        v_scale=None,
        out=None,
        lse=None,
        return_lse=False,
        enable_pdl=None,
        window_left=None,
        sinks=None,
        q_len_per_req=1,
    ):
        # sinks= is accepted and ignored: only the trtllm-gen path (not on Hopper) reads it
        assert self._plan is not None
        return self._run(
            q,
            paged_kv_cache,
            sm_scale=self._plan["sm_scale"],
            sink=None,
            k_scale=k_scale,
            v_scale=v_scale,
            return_lse=return_lse,
        )


class BatchPrefillWithPagedKVCacheWrapper(_PagedWrapper):
    """Prefill / append / mixed batches: ``q`` ``[qo_indptr[-1], Hq, D]``."""

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf=None,
        paged_kv_indptr_buf=None,
        paged_kv_indices_buf=None,
        paged_kv_last_page_len_buf=None,
        custom_mask_buf=None,
        mask_indptr_buf=None,
        backend="auto",
        jit_args=None,
        jit_kwargs=None,
    ):
        super().__init__(float_workspace_buffer, kv_layout, backend)

    def plan(
        self,
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        page_size,
        head_dim_vo=None,
        custom_mask=None,
        packed_custom_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        sm_scale=None,
        window_left=-1,
        logits_soft_cap=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
        non_blocking=True,
        **kwargs,
    ):
        self._store_plan(
            qo_indptr,
            paged_kv_indptr,
            paged_kv_indices,
            paged_kv_last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            page_size,
            causal=causal,
            pos_encoding_mode=pos_encoding_mode,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type,
            custom_mask=custom_mask,
            packed_custom_mask=packed_custom_mask,
        )

    def run(
        self,
        q,
        paged_kv_cache,
        *args,
        q_scale=None,
        k_scale=None,
        v_scale=None,
        out=None,
        lse=None,
        return_lse=False,
        enable_pdl=None,
        window_left=None,
        sinks=None,
    ):
        # sinks= is accepted and ignored, as on the fa2/fa3 paths of 0.5.3 on Hopper
        assert self._plan is not None
        return self._run(
            q,
            paged_kv_cache,
            sm_scale=self._plan["sm_scale"],
            sink=None,
            k_scale=k_scale,
            v_scale=v_scale,
            return_lse=return_lse,
        )


class BatchAttentionWithAttentionSinkWrapper(BatchPrefillWithPagedKVCacheWrapper):
    """The prefill wrapper with a per-head sink logit: ``run(q, kv, sink [Hq] float32, sm_scale)``."""

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf=None,
        paged_kv_indptr_buf=None,
        paged_kv_indices_buf=None,
        paged_kv_last_page_len_buf=None,
        custom_mask_buf=None,
        mask_indptr_buf=None,
        backend="auto",
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16,
        head_dim_qk=128,
        head_dim_vo=128,
        window_left=-1,
    ):
        super().__init__(float_workspace_buffer, kv_layout, backend=backend)
        self._compiled_window = window_left >= 0

    def plan(self, *args, **kwargs):
        if kwargs.get("logits_soft_cap"):
            raise ValueError("the attention-sink variant has no logits soft-cap")
        if kwargs.get("pos_encoding_mode", "NONE") != "NONE":
            raise ValueError("the attention-sink variant has no positional encoding")
        super().plan(*args, **kwargs)
        assert self._plan is not None
        if self._plan["mask_bits"] is not None:  # its variant's logits mask reads the window only
            self._plan.update(mask_bits=None, causal=False)
        if (self._plan["window_left"] >= 0) != self._compiled_window:
            raise ValueError("window_left in plan() disagrees with the one the wrapper was built for")

    def run(
        self,
        q,
        paged_kv_cache,
        *args,
        q_scale=None,
        k_scale=None,
        v_scale=None,
        out=None,
        lse=None,
        return_lse=False,
        enable_pdl=None,
        window_left=None,
        sinks=None,
    ):
        sink, sm_scale = args  # the variant's own arguments; k_scale is not read on this path
        return self._run(
            q, paged_kv_cache, sm_scale=float(sm_scale), sink=sink, k_scale=None, v_scale=v_scale, return_lse=return_lse
        )
