"""``sglang_decode`` and ``sglang_extend``: SGLang's Triton attention kernels.

SGLang keeps its KV cache as a token pool: ``k_buffer``/``v_buffer`` ``[slots, Hkv, D]``,
one token per slot, each request's tokens listed in ``kv_indices`` (CSR by
``kv_indptr``). The canonical pool flattened to ``[N * bs, Hkv, D]`` is such a pool (a view,
no copy), and ``pagedattn.adapters.layouts`` gives the index lists.

``sglang_decode`` calls ``decode_attention_fwd`` (``triton_ops/decode_attention.py``): one
query token per request (``decode_only``), a split-KV first stage (up to 8 splits, SGLang's
default ``triton_attention_num_kv_splits``; the adapter picks each request's split count
from its own length, so batch composition changes nothing) and a reduction that adds the
sink. The kernel has no window argument: SGLang narrows ``kv_indices`` to the window's
keys for sliding-window layers, and so does the adapter (the last ``W`` slots). With one
query head per KV head it forms ``q . k`` as ``tl.sum(q[None, :] * k, 1)`` on input-dtype
tiles, products rounded to bf16/fp16 before the sum: declared as ``qk_precision="input"`` on that
path alone (``declared_on="decode_mha"``); its grouped path forms q.k with ``tl.dot``.

MLA (``"mla"``): SGLang's MLA token pool holds one latent row per token, ``[slots, 1, 576]``
(512 compressed columns, then 64 rotary ones), and passes ``k_buffer`` = that pool and
``v_buffer`` = its first 512 columns (a view, same storage); the kernels read ``Lk`` and
``Lv`` from the buffers' widths. The adapter does the same with the case's latent cache
flattened to slots (``mla_value_buffer``). With 16-128 query heads on one latent head the
decode takes its grouped path (``tl.dot`` q.k, fp32 accumulation; at ``Lk = 576`` it splits
the dot into 512 + 64 columns), so the ``"input"`` q.k declaration does not cover it. A
separate value cache of another width (``"head_dim_v"``) goes through the same arguments.
The split buffer ``attn_logits`` is ``[B, Hq, splits, Lv]``: the kernel finds each split's
log-sum-exp at ``attn_logits``' offset divided by ``Lv``, so its last dim must be ``Lv``.

``sglang_extend`` calls ``extend_attention_fwd`` (``triton_ops/extend_attention.py``): the
cached prefix through prefix-only ``kv_indices`` into the pool, the new tokens' K/V as
contiguous tensors (``layouts.new_tokens_kv``), causal within them. A tree mask
(speculative verification, ``"tree_mask"``) goes in as SGLang's ``custom_mask``: per request,
the ``[q_len, seq_len]`` bool matrix (row = new token, column = key, the history's columns
True) flattened row-major at ``mask_indptr[b]`` (``sglang_custom_mask``), with
``is_causal=True`` and ``skip_prefix_custom_mask=True`` as SGLang's verify step passes them:
the kernel then reads no history column, replaces its causal test by the mask on the new
tokens, and still stops each query tile's loop at the tile's last row (``IS_CAUSAL``),
which loses nothing because a tree mask has nothing above its diagonal. Its window is
``sliding_window_size = W - 1`` (keys with ``q - k <= W - 1``), and ``0`` means "no window"
(the kernel tests ``SLIDING_WINDOW_SIZE > 0``), so ``W = 1`` cannot be expressed: those
cases are excluded with the reason (a real deviation, documented in
``docs/variants.md``). It takes no fp8 scales and no ALiBi.

The kernels are imported in the constructors: without SGLang they raise
``ImportError("sglang is not installed: ...")``. ``claims="signature"`` claims everything
the signatures take (for the matrix).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from pagedattn.adapters.contrib._triton import arrange_interpreter, grouped_head_blocks, runtime_claims
from pagedattn.adapters.conventions import window_to_flashinfer
from pagedattn.adapters.layouts import (
    flashinfer_mask_indptr,
    new_tokens_kv,
    token_kv_indices,
    tree_mask_to_flashinfer,
)
from pagedattn.adapters.protocol import Capabilities
from pagedattn.oracle import PagedCase

INSTALL_HINT = "sglang is not installed: pip install sglang"
OPS = "sglang.srt.layers.attention.triton_ops"
#: SGLang's default ``--triton-attention-num-kv-splits``.
MAX_KV_SPLITS = 8
#: Keys per split that the first stage rounds to (``_MIN_BLOCK_KV`` in decode_attention.py).
MIN_BLOCK_KV = 32
FP8_DECODE = (
    "with an fp8 cache the first stage forms P.V as tl.dot(p.to(v.dtype), v) (GQA path): the probabilities are "
    "rounded to fp8"
)
EXTEND_WINDOW_1 = (
    "SGLang's extend kernel takes sliding_window_size = W - 1 and reads 0 as 'no window', so W = 1 (each query "
    "sees only itself) runs unwindowed (real deviation, docs/variants.md)"
)


def _import(module: str):
    if importlib.util.find_spec("sglang") is None:
        raise ImportError(INSTALL_HINT)
    return importlib.import_module(f"{OPS}.{module}")


def _version(module) -> str:
    import triton

    sglang = importlib.import_module("sglang")
    return f"sglang {getattr(sglang, '__version__', '?')} ({module.__name__}), triton {triton.__version__}"


def mla_value_buffer(k_buffer: torch.Tensor, head_dim_v: int) -> torch.Tensor:
    """SGLang's MLA ``v_buffer``: the latent pool's first ``head_dim_v`` columns, a view.

    Args:
        k_buffer: ``[slots, 1, head_dim]`` (576: 512 latent, 64 rotary), the cache dtype.

    Returns:
        ``[slots, 1, head_dim_v]``, the same storage and row stride.
    """
    return k_buffer[..., :head_dim_v]


def _token_pool(case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
    """``k_buffer`` ``[N * bs, Hkv, D]`` and ``v_buffer`` ``[N * bs, Hkv, Dv]``: views of the
    canonical pool (with a latent cache, ``v_buffer`` is ``k_buffer``'s first ``Dv`` columns)."""
    N, bs, H, D = case.key_cache.shape
    k_buffer = case.key_cache.view(N * bs, H, D)
    if case.shared_kv:
        return k_buffer, mla_value_buffer(k_buffer, case.head_dim_v)
    return k_buffer, case.value_cache.view(N * bs, H, case.head_dim_v)


def sglang_custom_mask(case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's ``custom_mask`` and ``mask_indptr`` from ``case.tree_mask``: FlashInfer's layout
    (``layouts.tree_mask_to_flashinfer``), as SGLang's verify step builds it for both backends.

    Returns:
        ``custom_mask``: ``[sum_b q_b * seq_len_b]`` bool: request ``b``'s ``[q_b, seq_len_b]``
        matrix, row-major (row ``i`` = new token ``i``, column ``j`` = key ``j`` of its
        history), its ``context_len`` history columns True, the last ``q_b`` columns
        ``case.tree_mask_of(b)``; ``mask_indptr``: ``[B + 1]`` int32, where each matrix starts.
    """
    if case.tree_mask is None:
        raise ValueError("sglang_custom_mask: the case has no tree_mask")
    q_lens, seq_lens = case.query_lens, case.seq_lens_list
    return tree_mask_to_flashinfer(case.tree_mask, q_lens, seq_lens), flashinfer_mask_indptr(
        q_lens, seq_lens, case.device
    )


def split_count(seq_len: int) -> int:
    """Splits for one request's history: one per 32 keys, at most ``MAX_KV_SPLITS``. Chosen
    from the request's own length, so batching does not change its arithmetic."""
    return max(1, min(MAX_KV_SPLITS, -(-seq_len // MIN_BLOCK_KV)))


def _load(module: str, claims: str) -> tuple[bool, Any, str]:
    """The checks and imports both adapters start with: the claims mode, the package (an
    ``ImportError`` with the install hint when absent), the interpreter arranged before
    triton loads; returns (interpreter on, the kernel module, its version)."""
    if claims not in ("honest", "signature"):
        raise ValueError(f"claims must be 'honest' or 'signature', got {claims!r}")
    if importlib.util.find_spec("sglang") is None:
        raise ImportError(INSTALL_HINT)
    interpreter = arrange_interpreter()
    mod = _import(module)
    return interpreter, mod, _version(mod)


class SGLangDecodeBackend:
    """SGLang's ``decode_attention_fwd`` (one query token per request)."""

    name = "sglang_decode"

    def __init__(self, claims: str = "honest") -> None:
        self.interpreter, self._mod, self.version = _load("decode_attention", claims)
        self.claims = claims
        notes = {
            "decode_only": "decode_attention_fwd takes one query token per request",
            "qk_precision": "with one query head per KV head, q.k is tl.sum(q[None, :] * k, 1) on input-dtype tiles",
            "fp32_precision": "the GQA path's tl.dot on fp32 tiles uses TF32 on NVIDIA GPUs",
        }
        variants = {"sliding_window", "logits_soft_cap", "sinks", "mla", "head_dim_v"}
        if claims == "signature":
            variants |= {"fp8_e4m3", "fp8_e5m2"}
        else:
            notes["variants"] = (
                f"no ALiBi argument; no tree masks (one query token per request); fp8 not claimed: {FP8_DECODE}"
            )
        self.capabilities = Capabilities(
            variants=frozenset(variants),
            decode_only=True,
            qk_precision="input",
            declared_on="decode_mha",  # the grouped path (GQA > 1) forms q.k with tl.dot
            fp32_precision="tf32",
            case_filter=grouped_head_blocks if claims == "honest" else None,
            notes=notes,
            **runtime_claims(self.interpreter, notes),
        )

    @property
    def target(self) -> str:
        where = "Triton interpreter, cpu" if self.interpreter else "compiled, cuda"
        return f"sglang_decode ({self._mod.__name__}.decode_attention_fwd; {where}; claims={self.claims})"

    def warmup(self, case: PagedCase) -> None:
        if not self.interpreter:
            self.paged_attention(case)

    def paged_attention(self, case: PagedCase, out: torch.Tensor | None = None) -> torch.Tensor:
        """Returns ``[B, Hq, Dv]`` (one row per request) in the query dtype."""
        if max(case.query_lens) != 1:  # the suite never asks (decode_only); a direct caller might
            raise ValueError(f"sglang_decode: query_lens must all be 1 (decode), got {case.query_lens}")
        dev = case.device
        k_buffer, v_buffer = _token_pool(case)
        kv_indptr, kv_indices = token_kv_indices(case)
        if case.sliding_window is not None:  # the window's keys only, as SGLang feeds sliding-window layers
            keep = [kv_indices[s:e][-case.sliding_window :] for s, e in zip(kv_indptr[:-1], kv_indptr[1:])]
            kv_indptr = torch.tensor([0] + [len(k) for k in keep], device=dev).cumsum(0).to(torch.int32)
            kv_indices = torch.cat(keep)
        lens = (kv_indptr[1:] - kv_indptr[:-1]).tolist()
        B, H, _ = case.query.shape
        Dv = case.head_dim_v
        q = case.query.contiguous()
        out = q.new_empty(B, H, Dv) if out is None else out
        self._mod.decode_attention_fwd(
            q,
            k_buffer,
            v_buffer,
            out,
            kv_indptr,
            kv_indices,
            torch.empty(B, H, MAX_KV_SPLITS, Dv, dtype=torch.float32, device=dev),  # last dim Lv: see above
            torch.empty(B, H, MAX_KV_SPLITS, dtype=torch.float32, device=dev),
            torch.tensor([split_count(n) for n in lens], dtype=torch.int32, device=dev),
            MAX_KV_SPLITS,
            case.scale,
            case.k_scale,
            case.v_scale,
            logit_cap=case.logits_soft_cap or 0.0,
            sinks=None if case.sinks is None else case.sinks.float().contiguous(),
        )
        return out


class SGLangExtendBackend:
    """SGLang's ``extend_attention_fwd`` (a cached prefix plus new tokens per request)."""

    name = "sglang_extend"

    def __init__(self, claims: str = "honest") -> None:
        self.interpreter, self._mod, self.version = _load("extend_attention", claims)
        self.claims = claims
        notes = {
            "variants": "extend_attention_fwd takes no ALiBi slopes and no fp8 scales",
            "fp32_precision": "tl.dot on fp32 tiles uses TF32 on NVIDIA GPUs",
        }
        self.capabilities = Capabilities(
            variants=frozenset({"sliding_window", "logits_soft_cap", "sinks", "mla", "head_dim_v", "tree_mask"}),
            fp32_precision="tf32",
            case_filter=_window_one if claims == "honest" else None,
            notes=notes,
            **runtime_claims(self.interpreter, notes),
        )

    @property
    def target(self) -> str:
        where = "Triton interpreter, cpu" if self.interpreter else "compiled, cuda"
        return f"sglang_extend ({self._mod.__name__}.extend_attention_fwd; {where}; claims={self.claims})"

    def warmup(self, case: PagedCase) -> None:
        if not self.interpreter:
            self.paged_attention(case)

    def paged_attention(self, case: PagedCase, out: torch.Tensor | None = None) -> torch.Tensor:
        """Returns ``[T, Hq, Dv]`` in the query dtype."""
        k_buffer, v_buffer = _token_pool(case)
        prefix_indptr, prefix_indices = token_kv_indices(case, "prefix")
        k_new, v_new = new_tokens_kv(case)
        if case.shared_kv:  # the new tokens' latent rows, and their first Dv columns as values, as SGLang passes them
            v_new = mla_value_buffer(k_new, case.head_dim_v)
        custom_mask, mask_indptr = sglang_custom_mask(case) if case.tree_mask is not None else (None, None)
        q = case.query.contiguous()
        T, H, _ = q.shape
        out = q.new_empty(T, H, case.head_dim_v) if out is None else out
        self._mod.extend_attention_fwd(
            q,
            k_new,
            v_new,
            out,
            k_buffer,
            v_buffer,
            case.query_start_loc.to(torch.int32),
            prefix_indptr,
            prefix_indices,
            custom_mask,
            True,  # is_causal: with a tree mask too, as SGLang's verify step (see above)
            mask_indptr,
            max(case.query_lens),
            sm_scale=case.scale,
            skip_prefix_custom_mask=True,  # the history is all visible: its columns are not read
            logit_cap=case.logits_soft_cap or 0.0,
            sliding_window_size=window_to_flashinfer(case.sliding_window),
            sinks=None if case.sinks is None else case.sinks.float().contiguous(),
        )
        return out


def _window_one(case: PagedCase, operation: str) -> str | None:
    """A window of one key (W = 1) is excluded: SGLang's extend kernel reads sliding_window_size = W - 1 = 0 as
    no window."""
    return EXTEND_WINDOW_1 if case.sliding_window == 1 else None


def decode_signature_claims() -> SGLangDecodeBackend:
    return SGLangDecodeBackend(claims="signature")


def extend_signature_claims() -> SGLangExtendBackend:
    return SGLangExtendBackend(claims="signature")
