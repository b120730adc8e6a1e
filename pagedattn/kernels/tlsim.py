"""tlsim: the Triton programming model, in plain torch, on any device.

A kernel is a Python function whose first argument is a ``Program`` handle.
``launch(grid, kernel, *args, **meta)`` runs it once per program id (the SPMD
loop). Memory is flat 1-D tensors addressed by integer offset tensors; ``load``
and ``store`` take a mask, and a masked lane never touches memory: its offset is
neutralized *before* indexing, so it may point anywhere, even far out of bounds.
Tiles are built by broadcasting: ``rows[:, None] * C + cols[None, :]``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagedattn.indexing import cdiv, is_byte_float, next_power_of_2
from pagedattn.validation import ProblemError

__all__ = ["Program", "arange", "cdiv", "launch", "load", "next_power_of_2", "store"]


@dataclass(frozen=True)
class Program:
    """The handle a kernel body gets: its position in the grid."""

    pid: tuple[int, int, int]
    grid: tuple[int, int, int]

    def program_id(self, axis: int) -> int:
        return self.pid[axis]

    def num_programs(self, axis: int) -> int:
        return self.grid[axis]


def _grid3(grid: int | tuple[int, ...]) -> tuple[int, int, int]:
    g = (grid,) if isinstance(grid, int) else tuple(grid)
    if not 1 <= len(g) <= 3 or any((not isinstance(x, int)) or x < 0 for x in g):
        raise ProblemError("launch", "grid", f"must be 1 to 3 non-negative ints, got {grid!r}")
    return (g + (1, 1))[:3]  # type: ignore[return-value]


def launch(grid: int | tuple[int, ...], kernel: Callable, *args, **meta) -> None:
    """Run ``kernel(Program, *args, **meta)`` once for every program id of ``grid``
    (axis 0 fastest, as CUDA schedules blocks)."""
    g = _grid3(grid)
    for z, y, x in itertools.product(range(g[2]), range(g[1]), range(g[0])):
        kernel(Program((x, y, z), g), *args, **meta)


def arange(start: int, end: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[end - start]`` int64."""
    return torch.arange(start, end, dtype=torch.int64, device=device)


def _check_flat(buffer: torch.Tensor) -> None:
    if buffer.dim() != 1:
        raise ProblemError("tlsim", "buffer", f"must be flat 1-D memory, got shape {tuple(buffer.shape)}")


def load(
    buffer: torch.Tensor,
    offsets: torch.Tensor,
    mask: torch.Tensor | None = None,
    other: float | int = 0,
) -> torch.Tensor:
    """``buffer[offsets]`` where ``mask``, ``other`` elsewhere (shape of ``offsets``
    broadcast with ``mask``). Masked lanes read element 0 instead of their offset and
    the value is then replaced, so an out-of-bounds masked offset never faults."""
    _check_flat(buffer)
    if is_byte_float(buffer):
        # fp8: through its bytes (older torch cannot index fp8 on the CPU); `other` as fp8 bits
        fill = torch.tensor([other], dtype=torch.float32).to(buffer.dtype).view(torch.uint8)
        return load(buffer.view(torch.uint8), offsets, mask, int(fill)).view(buffer.dtype)
    if mask is None:
        return buffer[offsets]
    offsets, mask = torch.broadcast_tensors(offsets, mask)
    safe = torch.where(mask, offsets, torch.zeros_like(offsets))
    values = buffer[safe]
    return torch.where(mask, values, torch.tensor(other, dtype=values.dtype, device=values.device))


def store(
    buffer: torch.Tensor,
    offsets: torch.Tensor,
    value: torch.Tensor | float,
    mask: torch.Tensor | None = None,
) -> None:
    """``buffer[offsets] = value`` (cast to the buffer dtype) where ``mask``; a masked
    lane writes nothing, wherever its offset points."""
    _check_flat(buffer)
    values = torch.as_tensor(value, device=buffer.device).to(buffer.dtype)
    if mask is None:
        offsets, values = torch.broadcast_tensors(offsets, values)
        buffer[offsets.reshape(-1)] = values.reshape(-1)
        return
    offsets, values, mask = torch.broadcast_tensors(offsets, values, mask)
    buffer[offsets[mask]] = values[mask]
