"""The ``flashinfer`` backend: FlashInfer's paged-KV wrappers, routed as serving engines route them.

FlashInfer splits every call into ``plan`` (host-side scheduling over the batch's page
lists, and the JIT compile of the kernel for this dtype / head dim / variant set) and
``run`` (the kernel). Engines (vLLM, SGLang) pick the wrapper by batch composition, and
this adapter does the same:

- sinks: ``BatchAttentionWithAttentionSinkWrapper``. On Hopper (0.5.3) the fa2/fa3
  paths of the other wrappers ignore ``run(sinks=...)``; only this one honours it.
- every sequence has one new token: ``BatchDecodeWithPagedKVCacheWrapper``, on tensor
  cores when the GQA ratio is over 4 (vLLM's rule; the CUDA-core kernel has group sizes
  1, 2, 3, 4 and 8 only).
- a tree mask (speculative-decoding verification): ``BatchPrefillWithPagedKVCacheWrapper``
  with ``plan(custom_mask=..., causal=False)``, a decode batch included. The mask is
  FlashInfer's flattened ``[q_len, kv_len]`` block per request
  (``layouts.tree_mask_to_flashinfer``: the history's columns True, the tree over the new
  tokens' columns), which ``plan`` packs (``segment_packbits``, little bit order, a byte of
  its own per request). The adapter passes the bool mask, not ``packed_custom_mask``: for
  packed bits 0.5.3's ``plan`` keeps the per-request offsets in elements, which the kernel
  reads as bytes. A custom mask runs on the fa2 kernels (fa3 has no custom mask mode).
- anything else: ``BatchPrefillWithPagedKVCacheWrapper(causal=True)``; FlashInfer's
  causal mask is bottom-right aligned, like ours.

That routing costs batch invariance: a sequence's output depends on whether its
neighbours make the batch pure decode (another kernel), and ``plan`` sizes its KV
splits from the whole batch. The adapter declares it (``invariances`` without
``batch_invariance``, the reason in ``notes``).

Conventions, converted at this boundary (``docs/variants.md``): ``window_left = W - 1``;
``logits_soft_cap = c``; the log-sum-exp comes back in base 2 (``lse_from_log2``); fp8
scales are ``run(k_scale=, v_scale=)`` floats (the key scale folds into ``sm_scale``, the
value scale multiplies the output). ALiBi is ``pos_encoding_mode="ALIBI"`` with slopes
that FlashInfer computes itself from the head count and keeps in a cache; it takes no
slopes argument, so the adapter puts the case's slopes into that cache for the call and
restores it after. FlashInfer measures the ALiBi distance from the request's first new
query (row ``i``), not from the query's absolute position ``p = i + L - q``: the output
is the same (softmax does not see a per-row constant), the log-sum-exp is larger by
``slope * (L - q)``, which the adapter subtracts.

The soft-cap is approximate, and declared (``tanh_precision="approx"``): the soft-cap
variants of FlashInfer's fa2 and fa3 kernels (``include/flashinfer/attention/variants.cuh``,
``attention/hopper/variants.cuh``) scale the raw score by ``sm_scale`` times the cap's
reciprocal from ``math::ptx_rcp`` (PTX ``rcp.approx``, within 1 ulp) and take ``math::tanh``
(``include/flashinfer/math.cuh``: PTX ``tanh.approx.f32``, relative error up to 2**-11); the
cap multiplies back in through the log2 scale of the softmax.

Combination limits, as ``Exclusion`` data: the sink wrapper has no soft-cap, no ALiBi
and drops a custom mask; FlashInfer applies the ALiBi bias before the soft-cap (and the
scale inside it a second time), where ``PagedCase`` caps first. FlashInfer's kernels take fp16/bf16
queries only. The JIT compiles one module per (wrapper, dtype, kv dtype, head dim,
variant set), 20-73 s each on the H200: ``warmup(case)`` runs the case once so the
compile happens outside ``--case-timeout``.

The third-party package is imported in the constructor; without it the constructor
raises ``ImportError`` ("flashinfer is not installed: pip install flashinfer-python").
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from pagedattn.adapters.conventions import lse_from_log2, window_to_flashinfer
from pagedattn.adapters.layouts import to_flashinfer, tree_mask_to_flashinfer
from pagedattn.adapters.protocol import INVARIANCES, Capabilities, Exclusion
from pagedattn.oracle import HEAD_DIM_V, MLA, PER_HEAD_SCALES, VARIANTS, PagedCase

#: float workspace per device (FlashInfer's recommended 128 MB); zeroed before its first use
WORKSPACE_BYTES = 128 * 1024 * 1024
#: the largest GQA ratio the CUDA-core decode kernel dispatches without tensor cores (vLLM's rule)
CUDA_CORE_MAX_GROUP = 4

EXCLUSIONS = (
    Exclusion(
        "BatchAttentionWithAttentionSinkWrapper (the only wrapper that honours sinks) has no soft-cap",
        variants=frozenset({"sinks", "logits_soft_cap"}),
    ),
    Exclusion(
        "BatchAttentionWithAttentionSinkWrapper (the only wrapper that honours sinks) has no ALiBi",
        variants=frozenset({"sinks", "alibi_slopes"}),
    ),
    Exclusion(
        "BatchAttentionWithAttentionSinkWrapper (the only wrapper that honours sinks) drops a custom mask: "
        "its variant's logits mask reads the window only",
        variants=frozenset({"sinks", "tree_mask"}),
    ),
    Exclusion(
        "FlashInfer adds the ALiBi bias before the soft-cap and scales the biased score again inside it; "
        "PagedCase caps the scaled score first",
        variants=frozenset({"alibi_slopes", "logits_soft_cap"}),
    ),
)


def capabilities() -> Capabilities:
    """What the adapter claims for FlashInfer 0.5.x (see the module docstring for the reasons)."""
    return Capabilities(
        dtypes=frozenset({torch.float16, torch.bfloat16}),
        head_dims=frozenset({64, 128, 256}),
        devices=frozenset({"cuda"}),
        operations=frozenset({"attention", "lse"}),
        variants=frozenset(VARIANTS) - {PER_HEAD_SCALES, MLA, HEAD_DIM_V},
        invariances=INVARIANCES - {"batch_invariance"},
        exclusions=EXCLUSIONS,
        tanh_precision="approx",
        notes={
            "dtypes": "FlashInfer's paged kernels take fp16/bf16 queries; no fp32",
            "head_dims": "the head dims FlashInfer's fa2/fa3 kernels are built and tested for",
            "devices": "CUDA kernels",
            "variants": "no per-head fp8 scales: run(k_scale=, v_scale=) are read as floats (k_scale "
            "folds into sm_scale, v_scale multiplies the output); a per-head tensor is not claimed. No MLA "
            "(the flashinfer_mla backend runs BatchMLAPagedAttentionWrapper) and no head_dim_v != head_dim: the "
            "decode wrapper has one head_dim and the fa3 paged prefill kernels dispatch head_dim_qk == head_dim_vo "
            "only (hopper/prefill_sm90.cuh)",
            "batch_invariance": "pure-decode batches run the decode wrapper, mixed batches the prefill "
            "wrapper (as engines route them), and plan() sizes the KV split from the whole batch",
            "tanh_precision": "LogitsSoftCap takes math::tanh (PTX tanh.approx.f32, relative error up to 2**-11) "
            "of the score scaled by sm_scale * math::ptx_rcp(cap) (rcp.approx)",
        },
    )


class FlashInferBackend:
    """FlashInfer's decode, prefill and sink wrappers behind one ``paged_attention``.

    Args:
        kv_layout: ``"NHD"`` (``[pages, 2, page_size, Hkv, D]``, the canonical pool's own
            order) or ``"HND"``.
    """

    name = "flashinfer"

    def __init__(self, kv_layout: str = "NHD") -> None:
        try:
            import flashinfer
            import flashinfer.utils
        except ImportError as exc:
            raise ImportError("flashinfer is not installed: pip install flashinfer-python") from exc
        self._fi = flashinfer
        self.kv_layout = kv_layout
        self.version = f"flashinfer {getattr(flashinfer, '__version__', 'unknown')}"
        self.capabilities = capabilities()
        self._workspace: dict[torch.device, torch.Tensor] = {}

    @property
    def target(self) -> str:
        where = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
        return f"{self.version} (cuda: {where}; decode / prefill / sink wrappers by batch)"

    def warmup(self, case: PagedCase) -> None:
        """Runs the case once through every wrapper its configuration can route to: ``plan``
        JIT-compiles (or loads) each one's module. The suite warms a configuration up once,
        on its first case; a pure-decode batch and a mixed one of the same configuration take
        different wrappers (``route``), so both are compiled here, outside the case's timeout
        (on the H200 a compile inside the timed call ran past a 180 s ``--case-timeout``)."""
        lse = "lse" in self.capabilities.operations
        if case.sinks is not None:
            routes: tuple[str, ...] = ("sink",)
        elif case.tree_mask is not None:  # every batch of the configuration takes the masked prefill
            routes = ("prefill",)
        else:
            routes = ("decode", "prefill")
        for route in routes:
            self._run(self._decode_rows(case) if route == "decode" else case, return_lse=lse, route=route)
        if case.device.type == "cuda":
            torch.cuda.synchronize(case.device)

    @staticmethod
    def _decode_rows(case: PagedCase) -> PagedCase:
        """The case's last query token of each sequence: a pure-decode batch of the same
        configuration (its queries ``[B, Hq, D]``, the same cache, tables and lengths)."""
        if all(q == 1 for q in case.query_lens):
            return case
        ends = case.query_start_loc[1:] - 1
        starts = torch.arange(case.num_seqs + 1, dtype=case.query_start_loc.dtype, device=case.query.device)
        return case.replace(query=case.query[ends], query_start_loc=starts)

    def paged_attention(self, case: PagedCase) -> torch.Tensor:
        return self._run(case, return_lse=False)

    def paged_attention_lse(self, case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
        return self._run(case, return_lse=True)

    # ------------------------------------------------------------------ routing
    def route(self, case: PagedCase) -> str:
        """``"sink"``, ``"decode"`` or ``"prefill"``: the wrapper this case runs through."""
        if case.sinks is not None:
            return "sink"
        if case.tree_mask is not None:
            return "prefill"
        if all(q == 1 for q in case.query_lens):
            return "decode"
        return "prefill"

    def _workspace_for(self, device: torch.device) -> torch.Tensor:
        if device not in self._workspace:
            self._workspace[device] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        return self._workspace[device]

    def _run(self, case: PagedCase, return_lse: bool, route: str | None = None):
        a = to_flashinfer(case, layout=self.kv_layout)
        ws = self._workspace_for(case.query.device)
        fp8 = case.kv_dtype != case.dtype
        route = route or self.route(case)
        window_left = window_to_flashinfer(case.sliding_window)
        pos_encoding = "ALIBI" if case.alibi_slopes is not None else "NONE"
        common: dict[str, Any] = dict(
            window_left=window_left,
            logits_soft_cap=case.logits_soft_cap,
            q_data_type=case.dtype,
            kv_data_type=case.kv_dtype,
        )
        pages = (a["kv_indptr"], a["kv_indices"], a["kv_last_page_len"])
        scales: dict[str, Any] = dict(k_scale=case.k_scale, v_scale=case.v_scale) if fp8 else {}
        # The fa3 (Hopper) path multiplies Q and K in one GMMA of one dtype: an fp8 cache with
        # fp16/bf16 queries takes FlashInfer's fa2 kernels
        backend = "fa2" if fp8 else "auto"
        if route == "decode":
            wrapper = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                ws, self.kv_layout, use_tensor_cores=case.gqa_ratio > CUDA_CORE_MAX_GROUP
            )
            wrapper.plan(
                *pages,
                case.num_heads,
                case.num_kv_heads,
                case.head_dim,
                case.block_size,
                pos_encoding_mode=pos_encoding,
                sm_scale=case.scale,
                **common,
            )
            call_args: tuple = ()
        elif route == "prefill":
            wrapper = self._fi.BatchPrefillWithPagedKVCacheWrapper(ws, self.kv_layout, backend=backend)
            # a tree mask replaces the causal mask; FlashInfer packs it in plan()
            custom = None
            if case.tree_mask is not None:
                custom = tree_mask_to_flashinfer(case.tree_mask, case.query_lens, case.seq_lens_list)
            wrapper.plan(
                a["qo_indptr"],
                *pages,
                case.num_heads,
                case.num_kv_heads,
                case.head_dim,
                case.block_size,
                custom_mask=custom,
                causal=custom is None,
                pos_encoding_mode=pos_encoding,
                sm_scale=case.scale,
                **common,
            )
            call_args = ()
        else:
            wrapper = self._fi.BatchAttentionWithAttentionSinkWrapper(
                ws,
                self.kv_layout,
                backend=backend,
                q_data_type=case.dtype,
                kv_data_type=case.kv_dtype,
                head_dim_qk=case.head_dim,
                head_dim_vo=case.head_dim,
                window_left=window_left,
            )
            wrapper.plan(
                a["qo_indptr"],
                *pages,
                case.num_heads,
                case.num_kv_heads,
                case.head_dim,
                case.block_size,
                causal=True,
                sm_scale=case.scale,
                **common,
            )
            # The sink kernel reads sm_scale from its own argument list and never sees
            # run(k_scale=): the key scale is folded in here
            sm_scale = case.scale * (case.k_scale if fp8 else 1.0)
            assert case.sinks is not None  # route() sends only cases with sinks here
            call_args = (case.sinks.float().contiguous(), sm_scale)
            scales.pop("k_scale", None)
        with self._alibi_slopes(case):
            result = wrapper.run(a["q"], a["kv_cache"], *call_args, return_lse=return_lse, **scales)
        if not return_lse:
            return result
        out, lse2 = result
        return out, self._lse(case, lse2)

    def _lse(self, case: PagedCase, lse2: torch.Tensor) -> torch.Tensor:
        """Natural-log lse ``[T, Hq]`` float32 from FlashInfer's base-2 one, the ALiBi origin moved
        from the request's first new query to position 0 (see the module docstring)."""
        lse = lse_from_log2(lse2.float())
        if case.alibi_slopes is None:
            return lse.contiguous()
        lens = torch.tensor(case.seq_lens_list, dtype=torch.float32, device=lse.device)
        q_lens = torch.tensor(case.query_lens, dtype=torch.float32, device=lse.device)
        offset = torch.repeat_interleave(lens - q_lens, torch.tensor(case.query_lens, device=lse.device))  # [T]
        return (lse - offset[:, None] * case.alibi_slopes.float()[None, :]).contiguous()

    @contextlib.contextmanager
    def _alibi_slopes(self, case: PagedCase):
        """FlashInfer reads ALiBi slopes from ``flashinfer.utils._cache_buf``, filled from the
        head count (``get_alibi_slopes``); it has no argument for them. The case's slopes sit
        there for the call, and whatever was there before is put back."""
        if case.alibi_slopes is None:
            yield
            return
        cache = self._fi.utils._cache_buf
        key = (f"alibi_slopes_{case.num_heads}", case.query.device)
        saved = cache.get(key)
        cache[key] = case.alibi_slopes.to(device=case.query.device, dtype=torch.float32).contiguous()
        try:
            yield
        finally:
            if saved is None:
                cache.pop(key, None)
            else:
                cache[key] = saved
