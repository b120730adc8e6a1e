"""Save and load a case exactly, so that any failure can be replayed."""

from __future__ import annotations

import os
import zipfile
from typing import Any

import torch

from pagedattn.oracle.case import PagedCase
from pagedattn.validation import KV_SCALE_FIELDS, OPTIONAL_TENSOR_FIELDS, SCALAR_FIELDS, TENSOR_FIELDS

FORMAT = "pagedattn-case/1"
#: family names before they took the ``PagedCase`` field names (0.x files still replay)
RENAMED_FAMILIES = {"window": "sliding_window", "softcap": "logits_soft_cap", "alibi": "alibi_slopes"}


class CaseFileError(ValueError):
    """A file that does not hold a saved case; the message names the file and the problem."""


def case_state(case: PagedCase) -> dict[str, Any]:
    """Everything that defines ``case``, on the CPU: ``{"tensors": {...}, "options": {...}}``
    (tensors bit for bit, the optional variant tensors only when set, per-head fp8 scales
    among them; scale and the variants' parameters as plain numbers). A shared latent cache
    (``shared_kv``) is saved once, with ``"value_view"``: the number of leading key columns
    the values are."""
    tensors = {f: t.detach().cpu().clone() for f, t in case.tensors().items()}
    state: dict[str, Any] = {"tensors": tensors, "options": case.options()}
    if case.shared_kv:
        del tensors["value_cache"]
        state["value_view"] = case.head_dim_v
    return state


def case_from_state(state: dict[str, Any], device: str | torch.device = "cpu") -> PagedCase:
    """The case ``case_state`` described, on ``device``."""
    tensors = {f: t.to(device) for f, t in state["tensors"].items()}
    if state.get("value_view") is not None:
        tensors["value_cache"] = tensors["key_cache"][..., : state["value_view"]]
    return PagedCase(**tensors, **state["options"])


def save_case(case: PagedCase, path: str | os.PathLike, **meta: Any) -> None:
    """Write ``case`` (every tensor, bit for bit, on the CPU) and ``meta`` (JSON-like:
    family, id, operation...) to ``path`` with ``torch.save``."""
    payload = {"format": FORMAT, **case_state(case), "meta": dict(meta)}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(payload, path)


def load_case(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[PagedCase, dict]:
    """``(case, meta)`` as saved, on ``device``.

    Raises:
        CaseFileError: the file is missing or unreadable, is not a ``torch.save`` archive,
            does not have the saved case's structure, or holds an invalid case; the
            message names ``path`` and the problem.
    """
    if not os.path.isfile(path):
        raise CaseFileError(f"{path}: no such file" if not os.path.exists(path) else f"{path}: not a file")
    if not zipfile.is_zipfile(path):
        raise CaseFileError(f"{path}: not a saved pagedattn case (not a torch.save zip archive)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged archive
        raise CaseFileError(f"{path}: cannot be read as a saved case ({type(exc).__name__}: {exc})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CaseFileError(f"{path}: not a saved pagedattn case (format {FORMAT!r} expected)")
    if "options" not in payload:  # files written before the variants existed
        payload["options"] = {"scale": payload.get("scale")}
    problem = _structure_problem(payload)
    if problem:
        raise CaseFileError(f"{path}: {problem}")
    try:
        case = case_from_state(payload, device)
    except ValueError as exc:
        raise CaseFileError(f"{path}: holds an invalid case: {exc}") from None
    meta = payload["meta"]
    if meta.get("family") in RENAMED_FAMILIES:
        meta["family"] = RENAMED_FAMILIES[meta["family"]]
    return case, meta


def _structure_problem(payload: dict) -> str:
    """``""`` when ``payload`` has the saved case's structure; else what is wrong."""
    tensors, options, meta = payload.get("tensors"), payload.get("options"), payload.get("meta", {})
    if not isinstance(tensors, dict) or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        return "'tensors' must be a dict of tensors"
    view = payload.get("value_view")
    if view is not None and (isinstance(view, bool) or not isinstance(view, int) or view < 1):
        return f"'value_view' must be a number of key columns >= 1, got {view!r}"
    missing = [f for f in TENSOR_FIELDS if f not in tensors and not (f == "value_cache" and view is not None)]
    unknown = sorted(set(tensors) - set(TENSOR_FIELDS) - set(OPTIONAL_TENSOR_FIELDS) - set(KV_SCALE_FIELDS))
    if missing:
        return f"'tensors' lacks {', '.join(missing)}"
    if unknown:
        return f"'tensors' has unknown fields {', '.join(unknown)}"
    if not isinstance(options, dict) or set(options) - set(SCALAR_FIELDS):
        return f"'options' must be a dict with keys among {list(SCALAR_FIELDS)}"
    both = sorted(set(options) & set(tensors))
    if both:
        return f"'options' and 'tensors' both hold {', '.join(both)}"
    if not isinstance(meta, dict):
        return "'meta' must be a dict"
    payload.setdefault("meta", meta)
    return ""
