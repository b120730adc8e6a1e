"""Converters between ``PagedCase``'s variant conventions and those of other kernels.

``PagedCase`` (and this suite) counts a sliding window ``W`` in keys seen, the query's
own key included: the query at position ``p`` sees keys ``p - W + 1 .. p``. Others
count the keys to the left of the query, or a ``(left, right)`` pair; the log-sum-exp
comes in natural log or base 2; fp8 scales come as floats or per-head tensors. An
adapter converts at its boundary with these functions, so that a case means the same
attention everywhere. ``docs/variants.md`` lists every convention with its source.
"""

from __future__ import annotations

import math

import torch

from pagedattn.validation import ProblemError, sliding_window_problem

LN2 = math.log(2.0)


# ------------------------------------------------------------------- windows
def window_to_flash_attn(sliding_window: int | None) -> tuple[int, int]:
    """FlashAttention's ``window_size=(left, right)`` for a causal call: ``(W - 1, 0)``;
    ``(-1, -1)`` (no window) for ``None``. vLLM's FlashAttention backend passes exactly this."""
    if sliding_window is None:
        return (-1, -1)
    _check_window("window_to_flash_attn", sliding_window)
    return (sliding_window - 1, 0)


def window_from_flash_attn(window_size: tuple[int, int]) -> int | None:
    """``W`` from FlashAttention's causal ``window_size=(left, right)``: ``left + 1``, or
    ``None`` for ``left == -1``. ``right`` must be 0 or -1 (causal attention has no keys to
    the right); a window that sees the future is outside the canonical problem."""
    left, right = window_size
    if right not in (0, -1):
        raise ProblemError(
            "window_from_flash_attn",
            "window_size",
            f"must have right 0 or -1 (causal attention sees no keys to the right), got right={right}",
        )
    if left == -1:
        return None
    if left < 0:
        raise ProblemError(
            "window_from_flash_attn", "window_size", f"must have left >= 0 or -1 (no window), got left={left}"
        )
    return left + 1


def window_to_flashinfer(sliding_window: int | None) -> int:
    """FlashInfer's ``window_left``: keys to the left of the query, ``W - 1``; ``-1`` for no
    window. SGLang passes FlashInfer's value (its ``sliding_window_size``)."""
    if sliding_window is None:
        return -1
    _check_window("window_to_flashinfer", sliding_window)
    return sliding_window - 1


def window_from_flashinfer(window_left: int) -> int | None:
    """``W`` from FlashInfer's ``window_left`` (``-1``: no window)."""
    if window_left == -1:
        return None
    if window_left < 0:
        raise ProblemError(
            "window_from_flashinfer", "window_left", f"must be >= 0 or -1 (no window), got window_left={window_left}"
        )
    return window_left + 1


def _check_window(owner: str, w: int) -> None:
    problem = sliding_window_problem(w)
    if problem:
        raise ProblemError(owner, "sliding_window", problem)


# ----------------------------------------------------------------------- lse
def lse_from_log2(lse2: torch.Tensor) -> torch.Tensor:
    """Natural-log log-sum-exp from a base-2 one (``ln x = log2 x * ln 2``); ``-inf`` stays."""
    return lse2 * LN2


def lse_to_log2(lse: torch.Tensor) -> torch.Tensor:
    """Base-2 log-sum-exp from a natural-log one."""
    return lse / LN2


def lse_from_heads_first(lse: torch.Tensor) -> torch.Tensor:
    """``[num_tokens, num_heads]`` from the ``[num_heads, num_tokens]`` layout that
    FlashAttention's varlen functions and vLLM's ``merge_attn_states`` use."""
    return lse.transpose(0, 1).contiguous()


# ------------------------------------------------------------------- fp8 scales
def scales_from_descale(descale_k: torch.Tensor | float, descale_v: torch.Tensor | float) -> tuple[float, float]:
    """``(k_scale, v_scale)`` from FlashAttention 3's ``k_descale``/``v_descale`` (``[B, Hkv]``
    tensors, or floats) or vLLM's ``k_scale``/``v_scale`` tensors: the same multiplier, the
    dequantized key being ``stored * scale``. The result is per tensor, so a tensor must hold
    one value throughout (per-kv-head scales go to ``PagedCase`` as ``[num_kv_heads]`` tensors
    as they are: FlashAttention 3's ``[B, Hkv]`` rows, when every row is the same)."""
    out = []
    for name, x in (("k_descale", descale_k), ("v_descale", descale_v)):
        if isinstance(x, torch.Tensor):
            flat = x.detach().float().reshape(-1).cpu()
            if flat.numel() == 0 or not bool((flat == flat[0]).all()):
                raise ProblemError(
                    "scales_from_descale",
                    name,
                    "must hold one value (a per-tensor scale; pass per-kv-head scales to PagedCase "
                    "as a [num_kv_heads] tensor), got per-sequence or per-head scales that differ",
                )
            x = float(flat[0])
        out.append(float(x))
    return out[0], out[1]
