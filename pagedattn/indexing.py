"""Index arithmetic that the oracle, the suite, the kernels and the adapters share:
torch only, nothing else of ours, so that none of them imports another for it."""

from __future__ import annotations

import torch


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints (``b > 0``)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``): padded tile sizes."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def is_byte_float(t: torch.Tensor) -> bool:
    """Whether ``t`` holds one-byte floats (fp8), which older torch cannot index on the CPU."""
    return t.element_size() == 1 and t.is_floating_point()


def index_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[index]`` (along dim 0), bit for bit, for any dtype: one-byte floats (fp8) are
    indexed through their bytes, since torch before 2.10 cannot index fp8 on the CPU."""
    if is_byte_float(t):
        return t.view(torch.uint8)[index].view(t.dtype)
    return t[index]


def token_to_seq(query_start_loc: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """``[num_tokens]`` int64: the sequence each packed query row belongs to.

    query_start_loc: ``[num_seqs + 1]`` integer, cumulative query lengths."""
    lens = query_start_loc[1:] - query_start_loc[:-1]
    return torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device), lens.long(), output_size=num_tokens)
