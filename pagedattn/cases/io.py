"""Save and load a case exactly, so that any failure can be replayed."""

from __future__ import annotations

import os
from typing import Any

import torch

from pagedattn.oracle.case import _TENSOR_FIELDS, PagedCase

FORMAT = "pagedattn-case/1"


def save_case(case: PagedCase, path: str | os.PathLike, **meta: Any) -> None:
    """Write ``case`` (every tensor, bit for bit, on the CPU) and ``meta`` (JSON-like:
    family, id, operation...) to ``path`` with ``torch.save``."""
    payload = {
        "format": FORMAT,
        "tensors": {f: getattr(case, f).detach().cpu().clone() for f in _TENSOR_FIELDS},
        "scale": case.scale,
        "meta": dict(meta),
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(payload, path)


def load_case(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[PagedCase, dict]:
    """``(case, meta)`` as saved, on ``device``."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path}: not a saved pagedattn case (format {FORMAT!r} expected)")
    case = PagedCase(**payload["tensors"], scale=payload["scale"])
    return case.to(device), payload["meta"]
