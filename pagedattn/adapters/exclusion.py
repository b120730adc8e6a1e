"""``Exclusion``: a combination a backend does not support, with the reason, as data; and
the vocabulary of claims both it and ``Capabilities`` use (operations, int specs)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch

from pagedattn.oracle.case import PagedCase
from pagedattn.validation import VARIANTS, ProblemError

CORE_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
#: ``lse``: ``paged_attention_lse(case) -> (out, lse)``, the output and its log-sum-exp
OPERATIONS = frozenset({"attention", "gather", "write_cache", "lse"})
#: the bitwise properties a backend promises unless it declines them (``Capabilities.invariances``):
#: the same input gives the same bits twice; a sequence's output does not depend on its
#: neighbours in the batch; permuting the physical blocks changes no bit
INVARIANCES = frozenset({"determinism", "batch_invariance", "placement_invariance"})

IntSpec = Collection[int] | Callable[[int], bool] | None
_EMPTY = "must be None or non-empty (an empty collection matches no case; None matches any), got an empty collection"


def admits(spec: IntSpec, value: int) -> bool:
    if spec is None:
        return True
    if callable(spec) and not isinstance(spec, Collection):
        return bool(spec(value))
    return value in spec


def spec_text(s: IntSpec) -> Any:
    """An ``IntSpec`` for a report: ``"any"``, the sorted values, or the predicate's docstring."""
    if s is None:
        return "any"
    if callable(s) and not isinstance(s, Collection):
        return doc_line(s)
    if isinstance(s, range):
        return repr(s)
    return sorted(s)


def doc_line(fn: Callable[..., Any]) -> str:
    doc = (getattr(fn, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else getattr(fn, "__name__", "predicate")


def dtype_label(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


def check_int_spec(owner: str, name: str, spec: IntSpec, *, allow_empty: bool = True) -> None:
    if spec is None or (callable(spec) and not isinstance(spec, Collection)):
        return
    if not isinstance(spec, Collection) or isinstance(spec, str):
        raise ProblemError(owner, name, f"must be None, a collection of ints or a predicate int -> bool, got {spec!r}")
    if isinstance(spec, range):  # ints by construction, and possibly far too long to walk
        if not allow_empty and len(spec) == 0:
            raise ProblemError(owner, name, _EMPTY)
        return
    bad = [x for x in spec if isinstance(x, bool) or not isinstance(x, int)]
    if bad:
        raise ProblemError(owner, name, f"must hold ints only, got {bad!r}")
    if not allow_empty and len(spec) == 0:
        raise ProblemError(owner, name, _EMPTY)


def frozen_set(owner: str, name: str, value: Any) -> frozenset:
    if isinstance(value, str) or not isinstance(value, Collection):
        raise ProblemError(owner, name, f"must be a set, got {value!r}")
    return frozenset(value)


@dataclass(frozen=True)
class Exclusion:
    """A combination a backend does not support, with the reason.

    A case is excluded when it matches EVERY field that is given (a non-empty set, a
    spec or flag that is not ``None``); fields left at their default match any case.
    At least one field must be given.

    Attributes:
        reason: why, in words; shown with every case it excludes.
        variants: the case uses all of these variants (names from ``VARIANTS``).
        dtypes: the query dtype is one of these.
        kv_dtypes: the cache dtype is one of these (e.g. ``torch.float8_e4m3fn``).
        operations: the operation is one of these (from ``OPERATIONS``).
        block_sizes, head_dims, gqa_ratios: a set, or a predicate ``int -> bool`` (its
            docstring names it in the report), that the case's value satisfies.
        multi_token: ``True``: some sequence has more than one query token;
            ``False``: every sequence has exactly one (a pure decode batch).

    Example: ``Exclusion("sinks only on the plain path", variants=frozenset({"sinks",
    "logits_soft_cap"}))`` excludes every case with both sinks and a soft-cap.
    """

    reason: str
    variants: frozenset[str] = frozenset()
    dtypes: frozenset[torch.dtype] = frozenset()
    kv_dtypes: frozenset[torch.dtype] = frozenset()
    operations: frozenset[str] = frozenset()
    block_sizes: IntSpec = None
    head_dims: IntSpec = None
    gqa_ratios: IntSpec = None
    multi_token: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ProblemError("Exclusion", "reason", f"must be a non-empty string, got {self.reason!r}")
        for name in ("variants", "dtypes", "kv_dtypes", "operations"):
            object.__setattr__(self, name, frozen_set("Exclusion", name, getattr(self, name)))
        unknown = set(self.variants) - set(VARIANTS)
        if unknown:
            raise ProblemError(
                "Exclusion", "variants", f"must be among {list(VARIANTS)}, got unknown {sorted(unknown)}"
            )
        unknown = set(self.operations) - OPERATIONS
        if unknown:
            raise ProblemError(
                "Exclusion", "operations", f"must be among {sorted(OPERATIONS)}, got unknown {sorted(unknown)}"
            )
        for name in ("dtypes", "kv_dtypes"):
            bad = [d for d in getattr(self, name) if not isinstance(d, torch.dtype)]
            if bad:
                raise ProblemError("Exclusion", name, f"must hold torch.dtype entries only, got {bad!r}")
        for name in ("block_sizes", "head_dims", "gqa_ratios"):
            check_int_spec("Exclusion", name, getattr(self, name), allow_empty=False)
        if self.multi_token is not None and not isinstance(self.multi_token, bool):
            raise ProblemError("Exclusion", "multi_token", f"must be True, False or None, got {self.multi_token!r}")
        if not self._given():
            # no single field is at fault: the template without one
            raise ValueError(
                f"Exclusion({self.reason!r}): must give at least one field to match (one with none would exclude "
                "every case), got only the reason"
            )

    def _given(self) -> dict[str, Any]:
        """The fields that constrain, by name."""
        out: dict[str, Any] = {}
        for name in ("variants", "dtypes", "kv_dtypes", "operations"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        for name in ("block_sizes", "head_dims", "gqa_ratios", "multi_token"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    def matches(self, case: PagedCase, operation: str = "attention") -> bool:
        """Whether ``case``, run as ``operation``, is excluded."""
        if not self.variants <= case.variants:
            return False
        if self.dtypes and case.dtype not in self.dtypes:
            return False
        if self.kv_dtypes and case.kv_dtype not in self.kv_dtypes:
            return False
        if self.operations and operation not in self.operations:
            return False
        if self.block_sizes is not None and not admits(self.block_sizes, case.block_size):
            return False
        if self.head_dims is not None and not admits(self.head_dims, case.head_dim):
            return False
        if self.gqa_ratios is not None and not admits(self.gqa_ratios, case.gqa_ratio):
            return False
        return self.multi_token is None or self.multi_token == (max(case.query_lens) > 1)

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description: the reason and every given field."""
        out: dict[str, Any] = {"reason": self.reason}
        for name, value in self._given().items():
            if name in ("dtypes", "kv_dtypes"):
                out[name] = sorted(dtype_label(d) for d in value)
            elif name in ("variants", "operations"):
                out[name] = sorted(value)
            elif name == "multi_token":
                out[name] = value
            else:
                out[name] = spec_text(value)
        return out

    def match_text(self) -> str:
        """What it matches, in words: ``variants alibi_slopes+sinks, dtype float16``."""
        parts = []
        for name, value in self.describe().items():
            if name == "reason":
                continue
            if name == "variants":
                parts.append("variants " + "+".join(value))
            elif name == "multi_token":
                parts.append("multi-token batches" if value else "pure decode batches")
            elif isinstance(value, list):
                parts.append(f"{name} " + "|".join(str(v) for v in value))
            else:
                parts.append(f"{name} {value}")
        return ", ".join(parts)
