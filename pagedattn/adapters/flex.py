"""The ``flex`` backend: torch FlexAttention over the paged pool.

The pool is laid out as FlexAttention's paged cache (``[1, Hkv, num_blocks *
block_size, D]``, ``pagedattn.adapters.layouts.to_flex``) and paging becomes a
``mask_mod``: query ``t`` of sequence ``b`` may see physical slot ``s`` when the slot
holds logical position ``p <= pos(t)`` of ``b``. FlexAttention computes the whole
batch in one call, skipping the blocks the mask rules out.

Only the slots that sequences use are copied into FlexAttention's pool, as an engine
writes its cache through the slot mapping; the rest stay zero (a dense kernel
multiplies masked weights by whatever sits in V, so poison there would leak NaN).
Variants map onto FlexAttention's hooks: the sliding window joins the ``mask_mod``;
soft-cap and ALiBi are a ``score_mod`` (cap first, then the bias, as ``PagedCase``
orders them); an fp8 cache is dequantized into the query dtype as it is copied into
the pool; the log-sum-exp is FlexAttention's ``return_lse``. Sinks have no hook, so
they get a slot of their own: one extra key position, visible to every query, whose
``score_mod`` returns the head's sink logit and whose value is zero.

It claims determinism but not batch or placement invariance (``FLEX_INVARIANCES``, with
the reasons in the notes): the reduction spans the whole pool in physical slot order, so a
sequence's neighbours and where its blocks sit can change its last bits.

By default the call runs eagerly (FlexAttention's reference path: every case shape
works, nothing compiles); ``--backend=pagedattn.adapters.flex:compiled`` runs it
through ``torch.compile`` on CUDA, FlexAttention's fused Triton kernel, which
compiles once per case shape.
"""

from __future__ import annotations

from typing import Any

import torch

from pagedattn.adapters.capabilities import Capabilities
from pagedattn.indexing import index_rows, token_to_seq
from pagedattn.oracle import VARIANTS, PagedCase, kv_row_scales

#: Before this torch release, FlexAttention's eager path keeps fp16/bf16 intermediates in
#: the input dtype: the suite measured 7x the policy's bound on torch 2.9.1 (CPU), and a
#: pass on 2.11 (CUDA) and 2.13 (CPU).
FULL_PRECISION_EAGER = (2, 11)
#: Before this torch release, FlexAttention raises "NYI: non power of 2 embedding dimension"
#: for head dims 48/80/96/112 (measured on 2.6.0; 2.9.1 runs them)
ANY_HEAD_DIM = (2, 9)


#: FlexAttention reduces over the whole physical pool in one call, in slot order: the same
#: input gives the same bits, but a sequence's neighbours and the blocks' placement do not
#: leave them alone (measured: bf16 placement on the CPU; both on the H200, torch 2.11)
FLEX_INVARIANCES = frozenset({"determinism"})
INVARIANCE_NOTES = {
    "batch_invariance": "FlexAttention attends over the whole physical pool in one call; how its key reduction "
    "is blocked depends on the pool's extent and on where the other sequences' blocks sit",
    "placement_invariance": "the key reduction runs in physical slot order, so permuting the physical blocks "
    "reorders the sum and can change the last bit",
}


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def _power_of_two(head_dim: int) -> bool:
    return head_dim > 0 and head_dim & (head_dim - 1) == 0


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
        claims: dict[str, Any] = dict(
            operations=frozenset({"attention", "lse"}), variants=frozenset(VARIANTS), invariances=FLEX_INVARIANCES
        )
        notes = dict(INVARIANCE_NOTES)
        if _torch_version() < ANY_HEAD_DIM:
            claims["head_dims"] = _power_of_two
            notes["head_dims"] = f"torch {torch.__version__}: FlexAttention takes power-of-two head dims only"
        if _torch_version() < FULL_PRECISION_EAGER and not compiled:
            notes["dtypes"] = (
                f"torch {torch.__version__}: eager FlexAttention keeps fp16/bf16 intermediates "
                "in the input dtype (measured 7x the bound on 2.9.1)"
            )
            self.capabilities = Capabilities(dtypes=frozenset({torch.float32}), notes=notes, **claims)
        else:
            self.capabilities = Capabilities(notes=notes, **claims)
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
        return self._run(case, return_lse=False)

    def paged_attention_lse(self, case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
        return self._run(case, return_lse=True)

    def _run(self, case: PagedCase, return_lse: bool):
        dev = case.device
        N, bs, Hkv, D = case.key_cache.shape
        Dv = case.head_dim_v
        S = N * bs
        sink = S if case.sinks is not None else -1  # the sinks' own key position, past the pool
        k_pool = torch.zeros(1, Hkv, S + (sink >= 0), D, dtype=case.dtype, device=dev)
        v_pool = torch.zeros(1, Hkv, S + (sink >= 0), Dv, dtype=case.dtype, device=dev)
        phys_to_logical = torch.full((case.num_seqs, S + (sink >= 0)), -1, dtype=torch.int64, device=dev)
        flat_k = case.key_cache.reshape(S, Hkv, D)
        flat_v = case.value_cache.reshape(S, Hkv, Dv)
        for b in range(case.num_seqs):
            slots = case.slot_mapping(b)  # [L]
            k, v = index_rows(flat_k, slots), index_rows(flat_v, slots)
            if case.kv_dtype != case.dtype:  # fp8: dequantize into the query dtype
                k_scale, v_scale = kv_row_scales(case)
                k = (k.float() * k_scale).to(case.dtype)
                v = (v.float() * v_scale).to(case.dtype)
            k_pool[0, :, slots] = k.transpose(0, 1)
            v_pool[0, :, slots] = v.transpose(0, 1)
            phys_to_logical[b, slots] = torch.arange(slots.shape[0], device=dev)
        loc = case.query_start_loc.long()
        q_lens = loc[1:] - loc[:-1]
        token_seq = token_to_seq(case.query_start_loc, case.num_tokens)  # [T]
        first = case.seq_lens.long() - q_lens  # absolute position of each sequence's first new token
        token_pos = first[token_seq] + torch.arange(case.num_tokens, device=dev) - loc[token_seq]  # [T]
        window = case.sliding_window
        tree = case.tree_mask
        if tree is not None:
            # token t's row of its sequence's mask starts at row_start[t] of the packed mask: the
            # new token j (logical position first + j) it sees is tree[row_start[t] + j]
            offsets = torch.tensor(case.tree_mask_offsets()[:-1], dtype=torch.int64, device=dev)
            row = torch.arange(case.num_tokens, device=dev) - loc[token_seq]  # [T]
            row_start = offsets[token_seq] + row * q_lens[token_seq]  # [T]

        def mask_mod(b, h, q_idx, kv_idx):
            logical = phys_to_logical[token_seq[q_idx], kv_idx]
            visible = (logical >= 0) & (logical <= token_pos[q_idx])
            if window is not None:
                visible = visible & (logical > token_pos[q_idx] - window)
            if tree is not None:
                new = logical - first[token_seq[q_idx]]  # the key's index among the new tokens
                seen = tree[(row_start[q_idx] + new.clamp(min=0)).clamp(max=tree.shape[0] - 1)]
                visible = visible & ((new < 0) | seen)
            return visible | (kv_idx == sink)

        cap, slopes, sinks = case.logits_soft_cap, case.alibi_slopes, case.sinks
        score_mod = None
        if cap is not None or slopes is not None or sinks is not None:
            # Constants stay float32: under eager FlexAttention ``score.dtype`` can read as the
            # query dtype while the scores are float32, and casting the sink logit to it
            # rounded it to fp16 (caught by the sinks family: 3x the bound)
            def score_mod(score, b, h, q_idx, kv_idx):
                if cap is not None:
                    score = cap * torch.tanh(score / cap)
                if slopes is not None:
                    logical = phys_to_logical[token_seq[q_idx], kv_idx]
                    score = score + slopes[h] * (logical - token_pos[q_idx]).to(torch.float32)
                if sinks is not None:
                    score = torch.where(
                        kv_idx == sink, sinks[h], score
                    )  # the sink in fp32, not cast to the score's dtype
                return score

        block_mask = self._fa.create_block_mask(mask_mod, 1, None, case.num_tokens, k_pool.shape[2], device=dev)
        q = case.query.transpose(0, 1).unsqueeze(0)  # [1, Hq, T, D]
        result = self._kernel(dev)(
            q,
            k_pool,
            v_pool,
            score_mod=score_mod,
            block_mask=block_mask,
            scale=case.scale,
            enable_gqa=True,
            return_lse=return_lse,
        )
        if not return_lse:
            return result[0].transpose(0, 1).contiguous()  # [T, Hq, Dv]
        out, lse = result
        return out[0].transpose(0, 1).contiguous(), lse[0].transpose(0, 1).float().contiguous()


def compiled() -> FlexBackend:
    """FlexAttention through ``torch.compile`` on CUDA (its fused Triton kernel)."""
    return FlexBackend(compiled=True)
