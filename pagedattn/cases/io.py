"""Save and load a case exactly, so that any failure can be replayed."""

from __future__ import annotations

import os
from typing import Any

import torch

from pagedattn.oracle.case import PagedCase

FORMAT = "pagedattn-case/1"


def case_state(case: PagedCase) -> dict[str, Any]:
    """Everything that defines ``case``, on the CPU: ``{"tensors": {...}, "options": {...}}``
    (tensors bit for bit, the optional variant tensors only when set; scale and the
    variants' parameters as plain numbers)."""
    return {
        "tensors": {f: t.detach().cpu().clone() for f, t in case.tensors().items()},
        "options": case.options(),
    }


def case_from_state(state: dict[str, Any], device: str | torch.device = "cpu") -> PagedCase:
    """The case ``case_state`` described, on ``device``."""
    return PagedCase(**{f: t.to(device) for f, t in state["tensors"].items()}, **state["options"])


def save_case(case: PagedCase, path: str | os.PathLike, **meta: Any) -> None:
    """Write ``case`` (every tensor, bit for bit, on the CPU) and ``meta`` (JSON-like:
    family, id, operation...) to ``path`` with ``torch.save``."""
    payload = {"format": FORMAT, **case_state(case), "meta": dict(meta)}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(payload, path)


def load_case(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[PagedCase, dict]:
    """``(case, meta)`` as saved, on ``device``."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path}: not a saved pagedattn case (format {FORMAT!r} expected)")
    if "options" not in payload:  # files written before the variants existed
        payload["options"] = {"scale": payload.get("scale")}
    return case_from_state(payload, device), payload["meta"]
