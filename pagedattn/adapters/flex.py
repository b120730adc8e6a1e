"""The ``flex`` backend: torch FlexAttention over the paged pool.

The pool is laid out as FlexAttention's paged cache (``[1, Hkv, num_blocks *
block_size, D]``, ``pagedattn.adapters.layouts.to_flex``) and paging becomes a
``mask_mod``: query ``t`` of sequence ``b`` may see physical slot ``s`` when the slot
holds logical position ``p <= pos(t)`` of ``b``. FlexAttention computes the whole
batch in one call, skipping the blocks the mask rules out.

Only the slots that sequences use are copied into FlexAttention's pool, as an engine
writes its cache through the slot mapping; the rest stay zero (a dense kernel
multiplies masked weights by whatever sits in V, so poison there would leak NaN).
By default the call runs eagerly (FlexAttention's reference path: every case shape
works, nothing compiles); ``--backend=pagedattn.adapters.flex:compiled`` runs it
through ``torch.compile`` on CUDA, FlexAttention's fused Triton kernel, which
compiles once per case shape.
"""

from __future__ import annotations

from typing import Any

import torch

from pagedattn.adapters.protocol import Capabilities
from pagedattn.kernels.paged_attention import token_to_seq
from pagedattn.oracle import PagedCase

#: Before this torch release, FlexAttention's eager path keeps fp16/bf16 intermediates in
#: the input dtype: the suite measured 7x the policy's bound on torch 2.9.1 (CPU), and a
#: pass on 2.11 (CUDA) and 2.13 (CPU).
FULL_PRECISION_EAGER = (2, 11)


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


class FlexBackend:
    name = "flex"

    def __init__(self, compiled: bool = False) -> None:
        try:
            from torch.nn.attention import flex_attention as fa
        except ImportError as exc:  # torch < 2.5
            raise ImportError(
                f"the flex backend needs torch >= 2.5 (FlexAttention); this is torch {torch.__version__}"
            ) from exc
        self._fa = fa
        self.compile = compiled
        if _torch_version() < FULL_PRECISION_EAGER and not compiled:
            self.capabilities = Capabilities(
                dtypes=frozenset({torch.float32}),
                notes={"dtypes": f"torch {torch.__version__}: eager FlexAttention keeps fp16/bf16 intermediates "
                       "in the input dtype (measured 7x the bound on 2.9.1)"},
            )  # fmt: skip
        else:
            self.capabilities = Capabilities()
        self._compiled: Any = None
        self.version = f"torch {torch.__version__}"

    @property
    def target(self) -> str:
        mode = "compiled on CUDA, eager on the CPU" if self.compile else "eager"
        return f"flex (torch {torch.__version__} FlexAttention; {mode})"

    def _kernel(self, device: torch.device):
        if device.type != "cuda" or not self.compile:
            return self._fa.flex_attention
        if self._compiled is None:
            self._compiled = torch.compile(self._fa.flex_attention, dynamic=False)
        return self._compiled

    def paged_attention(self, case: PagedCase) -> torch.Tensor:
        dev = case.device
        N, bs, Hkv, D = case.key_cache.shape
        S = N * bs
        k_pool = torch.zeros(1, Hkv, S, D, dtype=case.dtype, device=dev)
        v_pool = torch.zeros_like(k_pool)
        phys_to_logical = torch.full((case.num_seqs, S), -1, dtype=torch.int64, device=dev)
        flat_k = case.key_cache.reshape(S, Hkv, D)
        flat_v = case.value_cache.reshape(S, Hkv, D)
        for b in range(case.num_seqs):
            slots = case.slot_mapping(b)  # [L]
            k_pool[0, :, slots] = flat_k[slots].transpose(0, 1)
            v_pool[0, :, slots] = flat_v[slots].transpose(0, 1)
            phys_to_logical[b, slots] = torch.arange(slots.shape[0], device=dev)
        loc = case.query_start_loc.long()
        q_lens = loc[1:] - loc[:-1]
        token_seq = token_to_seq(case.query_start_loc, case.num_tokens)  # [T]
        first = case.seq_lens.long() - q_lens  # absolute position of each sequence's first new token
        token_pos = first[token_seq] + torch.arange(case.num_tokens, device=dev) - loc[token_seq]  # [T]

        def mask_mod(b, h, q_idx, kv_idx):
            logical = phys_to_logical[token_seq[q_idx], kv_idx]
            return (logical >= 0) & (logical <= token_pos[q_idx])

        block_mask = self._fa.create_block_mask(mask_mod, 1, None, case.num_tokens, S, device=dev)
        q = case.query.transpose(0, 1).unsqueeze(0)  # [1, Hq, T, D]
        out = self._kernel(dev)(q, k_pool, v_pool, block_mask=block_mask, scale=case.scale, enable_gqa=True)
        return out[0].transpose(0, 1).contiguous()  # [T, Hq, D]


def compiled() -> FlexBackend:
    """FlexAttention through ``torch.compile`` on CUDA (its fused Triton kernel)."""
    return FlexBackend(compiled=True)
