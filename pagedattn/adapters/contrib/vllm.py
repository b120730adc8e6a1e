"""``vllm_unified``: vLLM's Triton ``unified_attention`` (its TritonAttention backend's kernel).

vLLM's kernel reads the canonical layout itself (a ``[N, bs, Hkv, D]`` pool, a block
table, ``seqused_k`` and ``cu_seqlens_q``), so the adapter passes the case through and
converts only the variants: the window as FlashAttention's ``window_size=(W - 1, 0)``
(the kernel uses ``1 + window_size[0] = W`` keys, ``(-1, -1)``: none), the soft-cap as a
float (``0``: none), ``alibi_slopes`` and ``sinks`` as ``[Hq]`` float32, and an fp8 cache's
scales as one-element ``k_descale``/``v_descale`` tensors with ``kv_quant_mode`` set to
per-tensor fp8 (the kernel dequantizes K and V into the query dtype).

Like vLLM's backend, the adapter hands the kernel its 3D buffers (16 softmax segments,
``seq_threshold_3D = 128 // num_kv_heads``): a decode-only batch of at most that many
sequences takes the split-softmax 3D launch, anything else the 2D one. A sequence's result
therefore depends on the rest of its batch, which is why batch invariance is not claimed.
The kernel reads block-table entries past a sequence's last block (unmasked loads up to
the end of its last 32-key tile); vLLM's tables are wide, so the adapter pads each row
with block 0 to cover that tile.

Known deviation, excluded from the claims with its reason (and documented in
``docs/variants.md``): the ALiBi bias is ``slope * (key -
context_len)``, measured from the chunk start rather than the query position. For a row
with several new tokens that shifts each row's scores by ``slope * i``, which softmax
hides, unless a sink joins the denominator. ``VllmUnifiedBackend(claims="signature")``
claims everything the signature takes, to show it.

The package is imported in the constructor: without it the constructor raises
``ImportError("vllm is not installed: ...")``.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch

from pagedattn.adapters.contrib._triton import arrange_interpreter, runtime_claims
from pagedattn.adapters.conventions import window_to_flash_attn
from pagedattn.adapters.protocol import Capabilities, Exclusion
from pagedattn.oracle import PER_HEAD_SCALES, SHAPE_VARIANTS, VARIANTS, PagedCase

#: Where vLLM keeps ``unified_attention``, newest first.
MODULES = ("vllm.v1.attention.ops.triton_unified_attention", "vllm.attention.ops.triton_unified_attention")
INSTALL_HINT = "vllm is not installed: pip install vllm"
#: vLLM's TritonAttention backend: the 2D grid should reach this many programs, so decode
#: batches of fewer than ``128 // num_kv_heads`` sequences take the 3D launch instead.
MIN_LAUNCH_GRID_SIZE_2D = 128
NUM_PAR_SOFTMAX_SEGMENTS = 16
#: The largest key tile the launcher picks; block-table rows are padded to cover it.
MAX_TILE = 32

BATCH_NOTE = (
    "unified_attention picks its 2D launch or its 3D split-softmax launch by batch composition (a decode-only "
    "batch of at most 128 // num_kv_heads sequences goes 3D), so a sequence's result depends on its batch"
)
ALIBI_SINKS = Exclusion(
    "vLLM's unified_attention measures the ALiBi distance from the chunk start (key - context_len), not from the "
    "query position; softmax hides the per-row shift until a sink joins the denominator (real deviation, "
    "docs/variants.md)",
    variants=frozenset({"alibi_slopes", "sinks"}),
    multi_token=True,
)


def import_kernel_module():
    """The module holding ``unified_attention``; ``ImportError`` with the install hint when absent."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(INSTALL_HINT)
    tried = []
    for name in MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            tried.append(f"{name}: {exc}")
    raise ImportError("vllm is installed but its Triton unified_attention was not found (" + "; ".join(tried) + ")")


class VllmUnifiedBackend:
    """vLLM's ``unified_attention`` behind the adapter contract.

    Args:
        claims: ``"honest"`` (default): what the kernel does right, limits stated with
            reasons; ``"signature"``: everything its signature takes (for the matrix, to
            show the deviations the honest claims exclude).
    """

    name = "vllm_unified"

    def __init__(self, claims: str = "honest") -> None:
        if claims not in ("honest", "signature"):
            raise ValueError(f"claims must be 'honest' or 'signature', got {claims!r}")
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(INSTALL_HINT)
        self.interpreter = arrange_interpreter()
        import triton

        self._mod = import_kernel_module()
        self._params = set(inspect.signature(self._mod.unified_attention).parameters)
        self._quant_mode = None
        if "kv_quant_mode" in self._params:
            from vllm.v1.kv_cache_interface import KVQuantMode

            self._quant_mode = KVQuantMode
        vllm = importlib.import_module("vllm")
        self.version = f"vllm {getattr(vllm, '__version__', '?')} ({self._mod.__name__}), triton {triton.__version__}"
        self.claims = claims
        notes = {
            "batch_invariance": BATCH_NOTE,
            "fp32_precision": "tl.dot on fp32 tiles uses TF32 on NVIDIA GPUs (Triton's default)",
            "variants": "no per-head fp8 scales: unified_attention's k_descale/v_descale are read as "
            "one scale per layer (the adapter passes [1] tensors); "
            "one head dim for keys and values (no MLA, no head_dim_v) and causal masks only (no tree_mask)",
        }
        self.capabilities = Capabilities(
            variants=frozenset(VARIANTS) - {PER_HEAD_SCALES, *SHAPE_VARIANTS},
            fp32_precision="tf32",
            invariances=frozenset({"determinism", "placement_invariance"}),
            exclusions=(ALIBI_SINKS,) if claims == "honest" else (),
            notes=notes,
            **runtime_claims(self.interpreter, notes),
        )

    @property
    def target(self) -> str:
        where = "Triton interpreter, cpu" if self.interpreter else "compiled, cuda"
        return f"vllm_unified ({self._mod.__name__}.unified_attention; {where}; claims={self.claims})"

    def warmup(self, case: PagedCase) -> None:
        """Compile this configuration once (on the GPU) outside the timed call."""
        if not self.interpreter:
            self.paged_attention(case)

    def block_table(self, case: PagedCase) -> torch.Tensor:
        """``[B, M]`` int32: the case's table, padded with block 0 so that every entry the kernel
        loads (up to the end of a sequence's last 32-key tile) exists."""
        need = -(-(-(-case.max_seq_len // MAX_TILE) * MAX_TILE) // case.block_size) + 1
        bt = case.block_tables.to(torch.int32)
        if bt.shape[1] >= need:
            return bt.contiguous()
        pad = torch.zeros(case.num_seqs, need - bt.shape[1], dtype=torch.int32, device=bt.device)
        return torch.cat([bt, pad], dim=1).contiguous()

    def paged_attention(self, case: PagedCase, out: torch.Tensor | None = None) -> torch.Tensor:
        """Returns ``[T, Hq, D]`` in the query dtype (written into ``out`` when given)."""
        dev = case.device
        q = case.query.contiguous()
        out = torch.empty_like(q) if out is None else out
        fp8 = case.kv_dtype != case.dtype
        kwargs: dict[str, Any] = {}
        if self._quant_mode is not None:
            kwargs["kv_quant_mode"] = self._quant_mode.FP8_PER_TENSOR if fp8 else self._quant_mode.NONE
        if "seq_threshold_3D" in self._params:
            threshold = max(1, MIN_LAUNCH_GRID_SIZE_2D // case.num_kv_heads)
            d_pad = 1 << (case.head_dim - 1).bit_length()
            shape = (threshold, case.num_heads, NUM_PAR_SOFTMAX_SEGMENTS)
            kwargs.update(
                seq_threshold_3D=threshold,
                num_par_softmax_segments=NUM_PAR_SOFTMAX_SEGMENTS,
                softmax_segm_output=torch.empty(*shape, d_pad, dtype=torch.float32, device=dev),
                softmax_segm_max=torch.empty(shape, dtype=torch.float32, device=dev),
                softmax_segm_expsum=torch.empty(shape, dtype=torch.float32, device=dev),
            )
        if case.sinks is not None:
            kwargs["sinks"] = case.sinks.float().contiguous()
        self._mod.unified_attention(
            q=q,
            k=case.key_cache,
            v=case.value_cache,
            out=out,
            cu_seqlens_q=case.query_start_loc.to(torch.int32),
            max_seqlen_q=max(case.query_lens),
            seqused_k=case.seq_lens.to(torch.int32),
            max_seqlen_k=case.max_seq_len,
            softmax_scale=case.scale,
            causal=True,
            window_size=window_to_flash_attn(case.sliding_window),
            block_table=self.block_table(case),
            softcap=case.logits_soft_cap or 0.0,
            q_descale=None,
            k_descale=torch.tensor([case.k_scale], dtype=torch.float32, device=dev),
            v_descale=torch.tensor([case.v_scale], dtype=torch.float32, device=dev),
            alibi_slopes=None if case.alibi_slopes is None else case.alibi_slopes.float().contiguous(),
            **kwargs,
        )
        return out


def signature_claims() -> VllmUnifiedBackend:
    """Everything the signature takes (``--backend=pagedattn.adapters.contrib.vllm:signature_claims``)."""
    return VllmUnifiedBackend(claims="signature")
