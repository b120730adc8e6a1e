"""The ``flash_attn`` backend: FlashAttention 2's ``flash_attn_with_kvcache`` over the paged pool.

``flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=, block_table=, causal=True)``
reads the canonical pool as it is (``[num_blocks, page_block_size, Hkv, D]``, pages by
``block_table`` ``[B, max_blocks]`` int32, lengths by ``cache_seqlens`` ``[B]`` int32).
Its query is one dense ``[B, seqlen_q, Hq, D]`` block and its causal mask is bottom-right
aligned (row ``i`` sits at position ``i + cache_seqlens[b] - seqlen_q``), so a ragged
batch is left-padded: sequence ``b``'s ``q_b`` new tokens take the last ``q_b`` rows of
``seqlen_q = max(q_b)``, where they sit at their own positions; the padding rows are
computed and dropped.

Conventions (``docs/variants.md``): ``window_size=(W - 1, 0)``; ``softcap=c``;
``alibi_slopes`` ``[Hq]`` float32 with the bias ``-slope * |p - j|``, which is ours for
every causal key; ``return_softmax_lse=True`` gives the natural-log lse ``[B, Hq,
seqlen_q]``. FlashAttention 2 has no sinks and no fp8 cache (FlashAttention 3's
``k_descale``/``v_descale`` are another package).

Claims from the documentation of flash-attn 2.x: fp16/bf16; head dims up to 256 that
are a multiple of 8; a paged cache needs ``page_block_size`` a multiple of 256; CUDA
only. ``num_splits=0`` lets FlashAttention choose a split of the KV by batch size, and
the padded query block depends on the longest query of the batch: batch invariance is
not claimed.

The third-party package is imported in the constructor; without it the constructor
raises ``ImportError`` ("flash_attn is not installed: pip install flash-attn").
"""

from __future__ import annotations

import torch

from pagedattn.adapters.conventions import window_to_flash_attn
from pagedattn.adapters.protocol import INVARIANCES, Capabilities
from pagedattn.oracle import PagedCase

#: flash-attn 2.x: ``k_cache`` with a ``block_table`` needs page_block_size a multiple of this
PAGE_BLOCK_MULTIPLE = 256


def page_block_size_ok(block_size: int) -> bool:
    """a multiple of 256 (flash-attn 2's rule for a paged KV cache)"""
    return block_size % PAGE_BLOCK_MULTIPLE == 0


def head_dim_ok(head_dim: int) -> bool:
    """a multiple of 8, at most 256"""
    return head_dim % 8 == 0 and head_dim <= 256


def capabilities() -> Capabilities:
    return Capabilities(
        dtypes=frozenset({torch.float16, torch.bfloat16}),
        head_dims=head_dim_ok,
        block_sizes=page_block_size_ok,
        devices=frozenset({"cuda"}),
        operations=frozenset({"attention", "lse"}),
        variants=frozenset({"sliding_window", "logits_soft_cap", "alibi_slopes"}),
        invariances=INVARIANCES - {"batch_invariance"},
        notes={
            "dtypes": "flash-attn 2 takes fp16/bf16",
            "head_dims": "flash-attn 2 docs: head dims up to 256",
            "block_sizes": "flash-attn 2 docs: page_block_size must be a multiple of 256 with a block_table",
            "devices": "CUDA kernels",
            "variants": "flash-attn 2 has no attention sinks and no fp8 cache",
            "batch_invariance": "num_splits=0 chooses the KV split from the batch, and the padded query "
            "block from the batch's longest query",
        },
    )


class FlashAttnBackend:
    """``flash_attn_with_kvcache`` on the canonical pool, one call per case."""

    name = "flash_attn"

    def __init__(self) -> None:
        try:
            import flash_attn
        except ImportError as exc:
            raise ImportError("flash_attn is not installed: pip install flash-attn") from exc
        self._fa = flash_attn
        self.version = f"flash_attn {getattr(flash_attn, '__version__', 'unknown')}"
        self.capabilities = capabilities()

    def paged_attention(self, case: PagedCase) -> torch.Tensor:
        return self._run(case, return_lse=False)

    def paged_attention_lse(self, case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
        return self._run(case, return_lse=True)

    def _run(self, case: PagedCase, return_lse: bool):
        q_lens = case.query_lens
        B, n, dev = case.num_seqs, max(q_lens), case.query.device
        # rows of the padded [B, n] query block that hold each sequence's tokens (the last q_b)
        rows = torch.cat([b * n + torch.arange(n - q, n, device=dev) for b, q in enumerate(q_lens)])  # [T]
        q = case.query.new_zeros(B * n, case.num_heads, case.head_dim)
        q[rows] = case.query
        result = self._fa.flash_attn_with_kvcache(
            q.view(B, n, case.num_heads, case.head_dim),
            case.key_cache,
            case.value_cache,
            cache_seqlens=case.seq_lens,
            block_table=case.block_tables,
            softmax_scale=case.scale,
            causal=True,
            window_size=window_to_flash_attn(case.sliding_window),
            softcap=case.logits_soft_cap or 0.0,
            alibi_slopes=None if case.alibi_slopes is None else case.alibi_slopes.float().contiguous(),
            return_softmax_lse=return_lse,
        )
        if not return_lse:
            return result.reshape(B * n, case.num_heads, case.head_dim)[rows].contiguous()
        out, lse = result  # lse [B, Hq, n], natural log
        lse = lse.float().transpose(1, 2).reshape(B * n, case.num_heads)[rows]
        return out.reshape(B * n, case.num_heads, case.head_dim)[rows].contiguous(), lse.contiguous()
