"""Stand-in for ``flashinfer.quantization``'s bit packing, from its documented semantics
(numpy's ``packbits``, per segment): our own code."""

from __future__ import annotations

import torch


def packbits(x: torch.Tensor, bitorder: str = "big") -> torch.Tensor:
    """uint8 ``[ceil(n / 8)]`` from a 1-D binary array; ``"little"``: element ``k`` in bit ``k % 8``
    of byte ``k // 8``; ``"big"``: in bit ``7 - k % 8``."""
    if bitorder not in ("big", "little"):
        raise ValueError(f"bitorder must be 'big' or 'little', got {bitorder!r}")
    pad = torch.zeros(-x.numel() % 8, dtype=torch.bool, device=x.device)
    octets = torch.cat([x.bool(), pad]).view(-1, 8).long()
    shifts = torch.arange(8, device=x.device)
    if bitorder == "big":
        shifts = 7 - shifts
    return (octets << shifts).sum(1).to(torch.uint8)


def segment_packbits(x: torch.Tensor, indptr: torch.Tensor, bitorder: str = "big"):
    """``(packed uint8, new_indptr)``: each segment ``x[indptr[i]:indptr[i+1]]`` packed from a byte
    of its own; ``new_indptr[i+1] - new_indptr[i] = ceil(segment length / 8)``."""
    bounds = indptr.tolist()
    segments = [packbits(x[bounds[i] : bounds[i + 1]], bitorder) for i in range(len(bounds) - 1)]
    sizes = torch.tensor([0] + [len(s) for s in segments], dtype=indptr.dtype, device=indptr.device)
    return torch.cat(segments), sizes.cumsum(0).to(indptr.dtype)
