"""``Capabilities``: what a backend claims, and why a case is not claimed."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import torch

from pagedattn.adapters.exclusion import (
    CORE_DTYPES,
    INVARIANCES,
    OPERATIONS,
    Exclusion,
    IntSpec,
    admits,
    check_int_spec,
    doc_line,
    dtype_label,
    frozen_set,
    spec_text,
)
from pagedattn.oracle.case import PagedCase
from pagedattn.oracle.policy import PARTIALS_PRECISIONS, PRECISIONS, QK_PRECISIONS, TANH_PRECISIONS
from pagedattn.validation import VARIANTS, ProblemError, default_scale

#: where a declared score or partials precision applies (``Capabilities.declared_on``): every
#: case, only cases whose every sequence is a decode, or only decodes with one query head per
#: kv head (the path on which split-K decode kernels form q·k from input-dtype products)
DECLARED_SCOPES = ("all", "decode", "decode_mha")


def declared_applies(scope: str, case: PagedCase) -> bool:
    """Whether a precision declared on ``scope`` (``DECLARED_SCOPES``) covers ``case``."""
    if scope == "all":
        return True
    decode = max(case.query_lens) == 1
    return decode and (scope == "decode" or case.gqa_ratio == 1)


def policy_for(claims: Any, case: PagedCase) -> dict[str, Any]:
    """The check's keyword arguments for ``case`` under ``claims`` (a ``Capabilities`` or anything
    with its precision fields): the declared q·k and partials precisions only where
    ``declared_on`` covers the case, the others everywhere."""
    scoped = declared_applies(claims.declared_on, case)
    return {
        "precision": claims.fp32_precision,
        "qk_precision": claims.qk_precision if scoped else "fp32",
        "tanh_precision": claims.tanh_precision,
        "partials_precision": claims.partials_precision if scoped else "fp32",
        "tolerance_factor": claims.tolerance_factor,
    }


#: the operations that read the query: the only ones ``decode_only`` narrows
QUERY_OPERATIONS = frozenset({"attention", "lse"})


def _either(names: tuple[str, ...]) -> str:
    """``'fp32' or 'input'``; ``'fp32', 'scaled_query' or 'input'``."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


_QK_TEXT = {
    "input": "products rounded to the input dtype, summed in fp32, the score rounded once (qk_precision 'input')",
    "scaled_query": "the scale folded into the query in the input dtype (qk_precision 'scaled_query')",
}
_SCOPE_TEXT = {"decode": "decodes", "decode_mha": "decodes with one query head per kv head"}


@dataclass(frozen=True)
class Capabilities:
    """What a backend claims. ``Capabilities()`` claims the core: fp32/fp16/bf16, any
    head_dim, any block size, any GQA ratio, any length, any scale, decode, prefill and
    continuation, on CPU and CUDA, and every invariance (``INVARIANCES``). Optional
    operations (``gather``, ``write_cache``, ``lse``) and attention variants are off
    until claimed.

    Attributes:
        dtypes: query/cache dtypes it accepts.
        head_dims: ``None`` (any), a set, or a predicate ``int -> bool``.
        block_sizes: ``None`` (any), a set, or a predicate.
        max_gqa_ratio: largest ``num_heads // num_kv_heads``, ``None`` for any.
        max_seq_len: longest history, ``None`` for any.
        devices: device types (``"cpu"``, ``"cuda"``).
        operations: subset of ``{"attention", "gather", "write_cache", "lse"}``.
        variants: claimed attention variants, from ``pagedattn.oracle.VARIANTS``:
            ``sliding_window``, ``logits_soft_cap``, ``alibi_slopes``, ``sinks``, ``fp8_e4m3``,
            ``fp8_e5m2`` (an fp8 cache of that format with a query of a claimed dtype).
            A case runs only when the backend claims every variant it uses.
        fp32_precision: ``"ieee"`` or ``"tf32"``: how its fp32 dot products round
            their operands. The policy widens its bound for TF32 and the report says so.
        tolerance_factor: an explicit multiplier on every attention bound (1.0 = the
            policy as written). Always shown in the report.
        notes: why a claim is narrowed, keyed by field name (``{"dtypes": "..."}``);
            shown with every case it makes unsupported. An invariance that is not
            claimed MUST have its reason here, keyed by its name.
        invariances: the bitwise properties claimed, a subset of ``INVARIANCES``
            (``determinism``, ``batch_invariance``, ``placement_invariance``); all by
            default. One left out is reported as not claimed, with ``notes[<name>]``.
            Input immutability, poisoned padding and a fully written ``out=`` are
            correctness, never optional, so they are not here.
        decode_only: ``True``: the kernel takes one query token per sequence; a case in
            which some sequence has more than one is unsupported as attention (or lse),
            and the suite judges its decode form instead (``pagedattn.cases.decode_forms``).
            Gathers and cache writes read no query: the claim does not narrow them.
        default_scale_only: ``True``: the kernel's softmax scale is fixed at
            ``head_dim ** -0.5``; a case with another scale is unsupported. (A kernel that
            folds the scale into the query in the input dtype declares that rounding:
            ``qk_precision="scaled_query"``.)
        exclusions: combinations that are not supported, each an ``Exclusion`` with
            its reason (e.g. sinks, but not together with a soft-cap).
        case_filter: ``(case, operation) -> reason or None``, for a limit the fields
            above cannot state (its docstring names it in the report). Called only for
            cases every other claim admits; it must not modify the case.
        qk_precision: ``"fp32"``, ``"scaled_query"`` or ``"input"``: ``scaled_query`` when the
            kernel folds the softmax scale (times ``log2 e``) into the query and rounds it to the
            input dtype; ``input`` when it forms q·k from products rounded to the input dtype
            (e.g. ``tl.sum(q[None, :] * k, 1)`` on bf16 tiles), summed in fp32, and may round
            the score to the input dtype once (one rounding per product: folding the scale as
            well is a second, which no declaration covers). The policy adds the matching term
            and the report header says so.
        partials_precision: ``"fp32"`` or ``"input"``: ``input`` when a split history's
            partial outputs are stored in the input dtype before the merge.
        declared_on: where ``qk_precision`` and ``partials_precision`` apply, one of
            ``DECLARED_SCOPES``: ``"all"`` (default), ``"decode"`` (cases whose every sequence
            has one query token) or ``"decode_mha"`` (those with one query head per kv head);
            elsewhere the case is judged as if they were ``"fp32"``.
        tanh_precision: ``"ieee"`` or ``"approx"``: ``approx`` when the kernel's soft-cap
            evaluates tanh approximately (PTX ``tanh.approx.f32``, with an approximate
            reciprocal of the cap, as FlashInfer does). The policy adds the matching term to
            soft-capped cases only and the report header says so.
    """

    dtypes: frozenset[torch.dtype] = CORE_DTYPES
    head_dims: IntSpec = None
    block_sizes: IntSpec = None
    max_gqa_ratio: int | None = None
    max_seq_len: int | None = None
    devices: frozenset[str] = frozenset({"cpu", "cuda"})
    operations: frozenset[str] = frozenset({"attention"})
    variants: frozenset[str] = frozenset()
    fp32_precision: str = "ieee"
    tolerance_factor: float = 1.0
    notes: dict[str, str] = field(default_factory=dict)
    invariances: frozenset[str] = INVARIANCES
    decode_only: bool = False
    default_scale_only: bool = False
    exclusions: tuple[Exclusion, ...] = ()
    case_filter: Callable[[PagedCase, str], str | None] | None = None
    qk_precision: str = "fp32"
    tanh_precision: str = "ieee"
    partials_precision: str = "fp32"
    declared_on: str = "all"

    def __post_init__(self) -> None:
        if self.fp32_precision not in PRECISIONS:
            raise ProblemError(
                "Capabilities", "fp32_precision", f"must be {_either(PRECISIONS)}, got {self.fp32_precision!r}"
            )
        if self.qk_precision not in QK_PRECISIONS:
            raise ProblemError(
                "Capabilities", "qk_precision", f"must be {_either(QK_PRECISIONS)}, got {self.qk_precision!r}"
            )
        if self.tanh_precision not in TANH_PRECISIONS:
            raise ProblemError(
                "Capabilities",
                "tanh_precision",
                f"must be {_either(TANH_PRECISIONS)}, got {self.tanh_precision!r}",
            )
        if self.partials_precision not in PARTIALS_PRECISIONS:
            raise ProblemError(
                "Capabilities",
                "partials_precision",
                f"must be {_either(PARTIALS_PRECISIONS)}, got {self.partials_precision!r}",
            )
        if self.declared_on not in DECLARED_SCOPES:
            raise ProblemError(
                "Capabilities", "declared_on", f"must be one of {DECLARED_SCOPES}, got {self.declared_on!r}"
            )
        unknown = set(self.operations) - OPERATIONS
        if unknown:
            raise ProblemError(
                "Capabilities", "operations", f"must be among {sorted(OPERATIONS)}, got unknown {sorted(unknown)}"
            )
        unknown = set(self.variants) - set(VARIANTS)
        if unknown:
            raise ProblemError(
                "Capabilities", "variants", f"must be among {list(VARIANTS)}, got unknown {sorted(unknown)}"
            )
        if not 0 < self.tolerance_factor < float("inf"):  # an infinite bound judges nothing
            raise ProblemError(
                "Capabilities", "tolerance_factor", f"must be > 0 and finite, got {self.tolerance_factor}"
            )
        for name in ("head_dims", "block_sizes"):
            check_int_spec("Capabilities", name, getattr(self, name))
        object.__setattr__(self, "invariances", frozen_set("Capabilities", "invariances", self.invariances))
        unknown = set(self.invariances) - INVARIANCES
        if unknown:
            raise ProblemError(
                "Capabilities", "invariances", f"must be among {sorted(INVARIANCES)}, got unknown {sorted(unknown)}"
            )
        for name in sorted(INVARIANCES - self.invariances):
            if not str(self.notes.get(name, "")).strip():
                raise ProblemError(
                    "Capabilities", "notes", f"must say why each unclaimed invariance is not, got no notes['{name}']"
                )
        for name in ("decode_only", "default_scale_only"):
            if not isinstance(getattr(self, name), bool):
                raise ProblemError("Capabilities", name, f"must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.exclusions, (str, Exclusion)) or not isinstance(self.exclusions, Collection):
            raise ProblemError("Capabilities", "exclusions", f"must be a tuple of Exclusion, got {self.exclusions!r}")
        object.__setattr__(self, "exclusions", tuple(self.exclusions))
        for i, ex in enumerate(self.exclusions):
            if not isinstance(ex, Exclusion):
                raise ProblemError("Capabilities", f"exclusions[{i}]", f"must be an Exclusion, got {type(ex).__name__}")
        if self.case_filter is not None and not callable(self.case_filter):
            raise ProblemError(
                "Capabilities",
                "case_filter",
                f"must be None or a callable (case, operation) -> str | None, got {type(self.case_filter).__name__}",
            )

    def _why(self, key: str, text: str) -> str:
        note = self.notes.get(key)
        return f"{text} ({note})" if note else text

    def unsupported_reason(
        self,
        *,
        operation: str = "attention",
        dtype: torch.dtype | None = None,
        head_dim: int | None = None,
        block_size: int | None = None,
        gqa_ratio: int | None = None,
        max_seq_len: int | None = None,
        device: str | torch.device | None = None,
        variants: Collection[str] = (),
    ) -> str | None:
        """``None`` when every given property is claimed; else why not, in words.

        Covers the per-field claims only; ``case_reason`` adds the limits that need the
        whole case (decode-only, the fixed scale, exclusions, the case filter)."""
        if operation not in self.operations:
            return self._why("operations", f"operation '{operation}' not claimed")
        if dtype is not None and dtype not in self.dtypes:
            return self._why("dtypes", f"dtype {dtype_label(dtype)} not claimed")
        if head_dim is not None and not admits(self.head_dims, head_dim):
            return self._why("head_dims", f"head_dim {head_dim} not claimed")
        if block_size is not None and not admits(self.block_sizes, block_size):
            return self._why("block_sizes", f"block_size {block_size} not claimed")
        if gqa_ratio is not None and self.max_gqa_ratio is not None and gqa_ratio > self.max_gqa_ratio:
            return self._why("max_gqa_ratio", f"GQA ratio {gqa_ratio} over max_gqa_ratio {self.max_gqa_ratio}")
        if max_seq_len is not None and self.max_seq_len is not None and max_seq_len > self.max_seq_len:
            return self._why("max_seq_len", f"seq_len {max_seq_len} over max_seq_len {self.max_seq_len}")
        if device is not None:
            dev = torch.device(device).type
            if dev not in self.devices:
                return self._why("devices", f"device '{dev}' not claimed")
        missing = set(variants) - set(self.variants)
        if missing:
            return self._why(
                "variants", f"variant{'s' if len(missing) > 1 else ''} {', '.join(sorted(missing))} not claimed"
            )
        return None

    def invariance_reason(self, name: str) -> str | None:
        """``None`` when invariance ``name`` (from ``INVARIANCES``) is claimed; else
        ``"invariance '<name>' not claimed (<notes[name]>)"``."""
        if name not in INVARIANCES:
            raise ProblemError("invariance_reason", "name", f"must be one of {sorted(INVARIANCES)}, got {name!r}")
        if name in self.invariances:
            return None
        return self._why(name, f"invariance '{name}' not claimed")

    def case_reason(self, case: PagedCase, operation: str = "attention") -> str | None:
        """``None`` when the backend claims ``case`` run as ``operation``; else why not.

        Applies, in order: the per-field claims (``unsupported_reason``), decode-only,
        the fixed scale, each exclusion, then the case filter."""
        reason = self.unsupported_reason(
            operation=operation,
            dtype=case.dtype,
            head_dim=case.head_dim,
            block_size=case.block_size,
            gqa_ratio=case.gqa_ratio,
            max_seq_len=case.max_seq_len,
            device=case.device,
            variants=case.variants,
        )
        if reason:
            return reason
        if self.decode_only and operation in QUERY_OPERATIONS:
            q_lens = case.query_lens
            b = max(range(len(q_lens)), key=q_lens.__getitem__)
            if q_lens[b] > 1:
                return self._why(
                    "decode_only",
                    f"decode-only: sequence {b} has {q_lens[b]} query tokens, the backend takes one per sequence",
                )
        if self.default_scale_only:
            default = default_scale(case.head_dim)
            # a scale written as 1/sqrt(D) instead of D**-0.5 may differ in the last bit: still the default
            if abs(case.scale - default) > 1e-12 * default:
                return self._why(
                    "default_scale_only",
                    f"default scale only: scale {case.scale:.6g} is not head_dim ** -0.5 = {default:.6g}",
                )
        for ex in self.exclusions:
            if ex.matches(case, operation):
                return f"excluded ({ex.match_text()}): {ex.reason}"
        if self.case_filter is not None:
            reason = self.case_filter(case, operation)
            if reason is not None and not isinstance(reason, str):
                raise TypeError(
                    f"Capabilities.case_filter: must return a reason (str) or None, got {type(reason).__name__}"
                )
            if reason:
                return self._why("case_filter", f"case_filter: {reason}")
        return None

    def limit_lines(self) -> list[str]:
        """One human-readable line per limit, for the report header: every way these
        claims fall short of ``Capabilities()`` (narrowed dtypes, sizes and devices, an
        unclaimed invariance, decode-only, the fixed scale, each exclusion, the case
        filter), a declared q·k precision other than fp32 and an approximate soft-cap tanh. Operations and variants
        are opt-in, not limits, and the report lists them apart; so are
        ``fp32_precision`` and ``tolerance_factor``, which the policy line shows."""
        lines: list[str] = []
        if self.dtypes != CORE_DTYPES:
            names = ", ".join(sorted(dtype_label(d) for d in self.dtypes)) or "none"
            lines.append(self._why("dtypes", f"dtypes: {names} only"))
        for name in ("head_dims", "block_sizes"):
            spec = getattr(self, name)
            if spec is not None:
                text = spec_text(spec)
                text = ", ".join(str(x) for x in text) if isinstance(text, list) else text
                lines.append(self._why(name, f"{name}: {text} only"))
        if self.max_gqa_ratio is not None:
            lines.append(self._why("max_gqa_ratio", f"GQA ratio up to {self.max_gqa_ratio}"))
        if self.max_seq_len is not None:
            lines.append(self._why("max_seq_len", f"seq_len up to {self.max_seq_len}"))
        if self.devices != frozenset({"cpu", "cuda"}):
            lines.append(self._why("devices", f"devices: {', '.join(sorted(self.devices)) or 'none'} only"))
        for name in sorted(INVARIANCES - self.invariances):
            lines.append(self.invariance_reason(name) or "")
        if self.decode_only:
            lines.append(self._why("decode_only", "decode-only: one query token per sequence"))
        if self.default_scale_only:
            lines.append(self._why("default_scale_only", "default scale only: scale = head_dim ** -0.5"))
        for ex in self.exclusions:
            lines.append(f"excludes {ex.match_text()}: {ex.reason}")
        if self.case_filter is not None:
            lines.append(self._why("case_filter", f"case filter: {doc_line(self.case_filter)}"))
        scope = "" if self.declared_on == "all" else f", on {_SCOPE_TEXT[self.declared_on]} only"
        if self.qk_precision != "fp32":
            lines.append(self._why("qk_precision", f"q·k precision: {_QK_TEXT[self.qk_precision]}{scope}"))
        if self.partials_precision != "fp32":
            lines.append(
                self._why(
                    "partials_precision",
                    f"split-K partial outputs stored in the input dtype (partials_precision 'input'){scope}",
                )
            )
        if self.tanh_precision == "approx":
            lines.append(
                self._why(
                    "tanh_precision",
                    "soft-cap tanh: approximate, tanh.approx.f32 and an approximate 1/cap (tanh_precision 'approx')",
                )
            )
        return lines

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description, for the report."""
        return {
            "dtypes": sorted(dtype_label(d) for d in self.dtypes),
            "head_dims": spec_text(self.head_dims),
            "block_sizes": spec_text(self.block_sizes),
            "max_gqa_ratio": self.max_gqa_ratio,
            "max_seq_len": self.max_seq_len,
            "devices": sorted(self.devices),
            "operations": sorted(self.operations),
            "variants": sorted(self.variants),
            "fp32_precision": self.fp32_precision,
            "qk_precision": self.qk_precision,
            "tanh_precision": self.tanh_precision,
            "partials_precision": self.partials_precision,
            "declared_on": self.declared_on,
            "tolerance_factor": self.tolerance_factor,
            "invariances": sorted(self.invariances),
            "decode_only": self.decode_only,
            "default_scale_only": self.default_scale_only,
            "exclusions": [ex.describe() for ex in self.exclusions],
            "case_filter": None if self.case_filter is None else doc_line(self.case_filter),
            "notes": dict(self.notes),
        }
