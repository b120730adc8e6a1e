"""Stand-in for ``flashinfer.utils``: the ALiBi slope cache the wrappers read.

Written by us from FlashInfer's documented behaviour (not its code): with
``pos_encoding_mode="ALIBI"`` the kernels take their slopes from a per-(head count,
device) cache filled with the ALiBi paper's geometric slopes; there is no slopes argument.
"""

from __future__ import annotations

import math

import torch

#: (name, device) -> cached tensor, as FlashInfer keys its ALiBi slopes
_cache_buf: dict = {}


def get_alibi_slopes(n_heads: int) -> torch.Tensor:
    """``[n_heads]`` float32: the ALiBi paper's slopes ``2^(-8 i / n)`` (interleaved past a power of 2)."""
    n = 2 ** math.floor(math.log2(n_heads))
    base = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    extra = [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(n_heads - n)]
    return torch.tensor(base + extra, dtype=torch.float32)


def _get_cache_alibi_slopes_buf(num_qo_heads: int, device: torch.device) -> torch.Tensor:
    key = (f"alibi_slopes_{num_qo_heads}", device)
    if key not in _cache_buf:
        _cache_buf[key] = get_alibi_slopes(num_qo_heads).to(device)
    return _cache_buf[key]
