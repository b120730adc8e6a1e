"""Bit-exact checks: gathers and cache writes must reproduce every bit, NaN payloads and
signed zeros included (no tolerance: data movement does no arithmetic)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_dtype(dtype: torch.dtype) -> torch.dtype:
    """The integer dtype of ``dtype``'s width, to read or write its bit patterns."""
    return _BITS[torch.empty((), dtype=dtype).element_size()]


def bits_view(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bit patterns (a view when ``t`` is contiguous, so writes go through)."""
    return t.contiguous().view(bits_dtype(t.dtype))


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bit pattern (NaN payloads and signed zeros included)."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(bits_view(a), bits_view(b.to(a.device))))


@dataclass
class BitCheck:
    """The verdict on a gather or cache write: bit patterns, NaN payloads included."""

    passed: bool
    what: str
    num_different: int = 0
    first_index: tuple[int, ...] = ()
    value: str = ""
    expected: str = ""
    problem: str = ""

    @property
    def status(self) -> str:
        return "passed" if self.passed else "failed"

    def metrics(self) -> dict:
        return {
            "status": self.status,
            "num_different": self.num_different,
            "first_index": list(self.first_index),
            "value": self.value,
            "expected": self.expected,
            "problem": self.problem,
        }

    def __str__(self) -> str:
        if self.problem:
            return f"{self.what} rejected: {self.problem}"
        if self.passed:
            return f"{self.what}: bit-exact"
        return (
            f"{self.what} is not bit-exact: {self.num_different} elements differ; first at index "
            f"{self.first_index} (slot {self.first_index[0] if self.first_index else '?'}): "
            f"got {self.value}, expected {self.expected}"
        )


def _fmt(t: torch.Tensor) -> str:
    width = t.element_size()
    bits = int(bits_view(t.reshape(1))[0]) & ((1 << (8 * width)) - 1)
    return f"{float(t)!r} (bits 0x{bits:0{2 * width}x})"


def check_bitexact(output: torch.Tensor, expected: torch.Tensor, what: str = "gather") -> BitCheck:
    """Compare bit patterns of ``output`` and ``expected`` (same shape and dtype);
    the first index is that of the first differing element in row-major order, so for
    a gather ``[n, Hkv, D]`` its first coordinate is the slot position."""
    if not isinstance(output, torch.Tensor):
        return BitCheck(False, what, problem=f"expected a torch.Tensor, got {type(output).__name__}")
    if tuple(output.shape) != tuple(expected.shape):
        return BitCheck(False, what, problem=f"shape {tuple(output.shape)}, expected {tuple(expected.shape)}")
    if output.dtype != expected.dtype:
        return BitCheck(False, what, problem=f"dtype {output.dtype}, expected {expected.dtype}")
    if output.device != expected.device:
        return BitCheck(False, what, problem=f"device {output.device}, expected {expected.device}")
    diff = bits_view(output) != bits_view(expected)
    n = int(diff.sum())
    if n == 0:
        return BitCheck(True, what)
    idx = tuple(int(i) for i in diff.nonzero()[0])
    return BitCheck(False, what, n, idx, _fmt(output[idx]), _fmt(expected[idx]))
