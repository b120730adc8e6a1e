"""The adapter contract: what a backend is, and what it claims to support."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from pagedattn.oracle.case import VARIANTS, PagedCase

CORE_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
#: ``lse``: ``paged_attention_lse(case) -> (out, lse)``, the output and its log-sum-exp
OPERATIONS = frozenset({"attention", "gather", "write_cache", "lse"})
#: the bitwise properties a backend promises unless it declines them (``Capabilities.invariances``):
#: the same input gives the same bits twice; a sequence's output does not depend on its
#: neighbours in the batch; permuting the physical blocks changes no bit
INVARIANCES = frozenset({"determinism", "batch_invariance", "placement_invariance"})
#: how q·k is formed: ``fp32`` products and sum (or TF32 per ``fp32_precision``), or
#: ``input``: each product rounded to the input dtype, the sum in fp32
QK_PRECISIONS = ("fp32", "input")

IntSpec = Collection[int] | Callable[[int], bool] | None


def _admits(spec: IntSpec, value: int) -> bool:
    if spec is None:
        return True
    if callable(spec) and not isinstance(spec, Collection):
        return bool(spec(value))
    return value in spec


def _spec_text(s: IntSpec) -> Any:
    """An ``IntSpec`` for a report: ``"any"``, the sorted values, or the predicate's docstring."""
    if s is None:
        return "any"
    if callable(s) and not isinstance(s, Collection):
        return _doc_line(s)
    if isinstance(s, range):
        return repr(s)
    return sorted(s)


def _doc_line(fn: Callable[..., Any]) -> str:
    doc = (getattr(fn, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else getattr(fn, "__name__", "predicate")


def _dtype_name(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


def _check_int_spec(owner: str, name: str, spec: IntSpec, *, allow_empty: bool = True) -> None:
    if spec is None or (callable(spec) and not isinstance(spec, Collection)):
        return
    if not isinstance(spec, Collection) or isinstance(spec, str):
        raise ValueError(f"{owner}.{name} must be None, a collection of ints or a predicate int -> bool, got {spec!r}")
    if isinstance(spec, range):  # ints by construction, and possibly far too long to walk
        if not allow_empty and len(spec) == 0:
            raise ValueError(f"{owner}.{name}: an empty collection matches no case; leave it None to match any")
        return
    bad = [x for x in spec if isinstance(x, bool) or not isinstance(x, int)]
    if bad:
        raise ValueError(f"{owner}.{name}: every entry must be an int, got {bad!r}")
    if not allow_empty and len(spec) == 0:
        raise ValueError(f"{owner}.{name}: an empty collection matches no case; leave it None to match any")


def _frozen(owner: str, name: str, value: Any) -> frozenset:
    if isinstance(value, str) or not isinstance(value, Collection):
        raise ValueError(f"{owner}.{name} must be a set, got {value!r}")
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
            raise ValueError(f"Exclusion.reason must be a non-empty string, got {self.reason!r}")
        for name in ("variants", "dtypes", "kv_dtypes", "operations"):
            object.__setattr__(self, name, _frozen("Exclusion", name, getattr(self, name)))
        unknown = set(self.variants) - set(VARIANTS)
        if unknown:
            raise ValueError(f"Exclusion.variants: unknown {sorted(unknown)}, known {list(VARIANTS)}")
        unknown = set(self.operations) - OPERATIONS
        if unknown:
            raise ValueError(f"Exclusion.operations: unknown {sorted(unknown)}, known {sorted(OPERATIONS)}")
        for name in ("dtypes", "kv_dtypes"):
            bad = [d for d in getattr(self, name) if not isinstance(d, torch.dtype)]
            if bad:
                raise ValueError(f"Exclusion.{name}: every entry must be a torch.dtype, got {bad!r}")
        for name in ("block_sizes", "head_dims", "gqa_ratios"):
            _check_int_spec("Exclusion", name, getattr(self, name), allow_empty=False)
        if self.multi_token is not None and not isinstance(self.multi_token, bool):
            raise ValueError(f"Exclusion.multi_token must be True, False or None, got {self.multi_token!r}")
        if not self._given():
            raise ValueError(
                f"Exclusion({self.reason!r}): give at least one field to match; one with none would exclude every case"
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
        if self.block_sizes is not None and not _admits(self.block_sizes, case.block_size):
            return False
        if self.head_dims is not None and not _admits(self.head_dims, case.head_dim):
            return False
        if self.gqa_ratios is not None and not _admits(self.gqa_ratios, case.gqa_ratio):
            return False
        return self.multi_token is None or self.multi_token == (max(case.query_lens) > 1)

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description: the reason and every given field."""
        out: dict[str, Any] = {"reason": self.reason}
        for name, value in self._given().items():
            if name in ("dtypes", "kv_dtypes"):
                out[name] = sorted(_dtype_name(d) for d in value)
            elif name in ("variants", "operations"):
                out[name] = sorted(value)
            elif name == "multi_token":
                out[name] = value
            else:
                out[name] = _spec_text(value)
        return out

    def match_text(self) -> str:
        """What it matches, in words: ``variants alibi+sinks, dtype float16``."""
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
            ``sliding_window``, ``logits_soft_cap``, ``alibi``, ``sinks``, ``fp8_e4m3``,
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
            which some sequence has more than one is unsupported.
        default_scale_only: ``True``: the kernel's softmax scale is fixed at
            ``head_dim ** -0.5``; a case with another scale is unsupported (folding the
            scale into the query adds a rounding the policy does not allow for).
        exclusions: combinations that are not supported, each an ``Exclusion`` with
            its reason (e.g. sinks, but not together with a soft-cap).
        case_filter: ``(case, operation) -> reason or None``, for a limit the fields
            above cannot state (its docstring names it in the report). Called only for
            cases every other claim admits; it must not modify the case.
        qk_precision: ``"fp32"`` or ``"input"``: ``input`` when the kernel forms q·k
            from products rounded to the input dtype (e.g. ``tl.sum(q[None, :] * k, 1)``
            on bf16 tiles), summed in fp32. The policy adds the matching term and the
            report header says so.
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

    def __post_init__(self) -> None:
        if self.fp32_precision not in ("ieee", "tf32"):
            raise ValueError(f"Capabilities.fp32_precision must be 'ieee' or 'tf32', got {self.fp32_precision!r}")
        if self.qk_precision not in QK_PRECISIONS:
            raise ValueError(f"Capabilities.qk_precision must be 'fp32' or 'input', got {self.qk_precision!r}")
        unknown = set(self.operations) - OPERATIONS
        if unknown:
            raise ValueError(f"Capabilities.operations: unknown {sorted(unknown)}, known {sorted(OPERATIONS)}")
        unknown = set(self.variants) - set(VARIANTS)
        if unknown:
            raise ValueError(f"Capabilities.variants: unknown {sorted(unknown)}, known {list(VARIANTS)}")
        if not self.tolerance_factor > 0:
            raise ValueError(f"Capabilities.tolerance_factor must be > 0, got {self.tolerance_factor}")
        for name in ("head_dims", "block_sizes"):
            _check_int_spec("Capabilities", name, getattr(self, name))
        object.__setattr__(self, "invariances", _frozen("Capabilities", "invariances", self.invariances))
        unknown = set(self.invariances) - INVARIANCES
        if unknown:
            raise ValueError(f"Capabilities.invariances: unknown {sorted(unknown)}, known {sorted(INVARIANCES)}")
        for name in sorted(INVARIANCES - self.invariances):
            if not str(self.notes.get(name, "")).strip():
                raise ValueError(f"Capabilities.invariances: '{name}' is not claimed, so notes['{name}'] must say why")
        for name in ("decode_only", "default_scale_only"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Capabilities.{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.exclusions, (str, Exclusion)) or not isinstance(self.exclusions, Collection):
            raise ValueError(f"Capabilities.exclusions must be a tuple of Exclusion, got {self.exclusions!r}")
        object.__setattr__(self, "exclusions", tuple(self.exclusions))
        for i, ex in enumerate(self.exclusions):
            if not isinstance(ex, Exclusion):
                raise ValueError(f"Capabilities.exclusions[{i}] must be an Exclusion, got {type(ex).__name__}")
        if self.case_filter is not None and not callable(self.case_filter):
            raise ValueError(
                f"Capabilities.case_filter must be None or a callable (case, operation) -> str | None, "
                f"got {type(self.case_filter).__name__}"
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
            return self._why("dtypes", f"dtype {_dtype_name(dtype)} not claimed")
        if head_dim is not None and not _admits(self.head_dims, head_dim):
            return self._why("head_dims", f"head_dim {head_dim} not claimed")
        if block_size is not None and not _admits(self.block_sizes, block_size):
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
            return self._why("variants", f"variant{'s' if len(missing) > 1 else ''} {', '.join(sorted(missing))} "
                                         "not claimed")  # fmt: skip
        return None

    def invariance_reason(self, name: str) -> str | None:
        """``None`` when invariance ``name`` (from ``INVARIANCES``) is claimed; else
        ``"invariance '<name>' not claimed (<notes[name]>)"``."""
        if name not in INVARIANCES:
            raise ValueError(f"invariance_reason: unknown invariance {name!r}, known {sorted(INVARIANCES)}")
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
        if self.decode_only:
            q_lens = case.query_lens
            b = max(range(len(q_lens)), key=q_lens.__getitem__)
            if q_lens[b] > 1:
                return self._why("decode_only", f"decode-only: sequence {b} has {q_lens[b]} query tokens, "
                                                "the backend takes one per sequence")  # fmt: skip
        if self.default_scale_only:
            default = float(case.head_dim) ** -0.5
            # a scale written as 1/sqrt(D) instead of D**-0.5 may differ in the last bit: still the default
            if abs(case.scale - default) > 1e-12 * default:
                return self._why("default_scale_only", f"default scale only: scale {case.scale:.6g} is not "
                                 f"head_dim ** -0.5 = {default:.6g}")  # fmt: skip
        for ex in self.exclusions:
            if ex.matches(case, operation):
                return f"excluded ({ex.match_text()}): {ex.reason}"
        if self.case_filter is not None:
            reason = self.case_filter(case, operation)
            if reason is not None and not isinstance(reason, str):
                raise TypeError(
                    f"Capabilities.case_filter must return a reason (str) or None, got {type(reason).__name__}"
                )
            if reason:
                return self._why("case_filter", f"case_filter: {reason}")
        return None

    def limit_lines(self) -> list[str]:
        """One human-readable line per limit, for the report header: every way these
        claims fall short of ``Capabilities()`` (narrowed dtypes, sizes and devices, an
        unclaimed invariance, decode-only, the fixed scale, each exclusion, the case
        filter) and a declared q·k precision other than fp32. Operations and variants
        are opt-in, not limits, and the report lists them apart; so are
        ``fp32_precision`` and ``tolerance_factor``, which the policy line shows."""
        lines: list[str] = []
        if self.dtypes != CORE_DTYPES:
            names = ", ".join(sorted(_dtype_name(d) for d in self.dtypes)) or "none"
            lines.append(self._why("dtypes", f"dtypes: {names} only"))
        for name in ("head_dims", "block_sizes"):
            spec = getattr(self, name)
            if spec is not None:
                text = _spec_text(spec)
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
            lines.append(self._why("case_filter", f"case filter: {_doc_line(self.case_filter)}"))
        if self.qk_precision == "input":
            lines.append(self._why("qk_precision", "q·k precision: products rounded to the input dtype, "
                                   "summed in fp32 (qk_precision 'input')"))  # fmt: skip
        return lines

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description, for the report."""
        return {
            "dtypes": sorted(_dtype_name(d) for d in self.dtypes),
            "head_dims": _spec_text(self.head_dims),
            "block_sizes": _spec_text(self.block_sizes),
            "max_gqa_ratio": self.max_gqa_ratio,
            "max_seq_len": self.max_seq_len,
            "devices": sorted(self.devices),
            "operations": sorted(self.operations),
            "variants": sorted(self.variants),
            "fp32_precision": self.fp32_precision,
            "qk_precision": self.qk_precision,
            "tolerance_factor": self.tolerance_factor,
            "invariances": sorted(self.invariances),
            "decode_only": self.decode_only,
            "default_scale_only": self.default_scale_only,
            "exclusions": [ex.describe() for ex in self.exclusions],
            "case_filter": None if self.case_filter is None else _doc_line(self.case_filter),
            "notes": dict(self.notes),
        }


class Claims(Protocol):
    """What the suite reads of a backend's ``capabilities``: a ``Capabilities``, or the
    isolated backend's view of one that lives in its child process
    (``pagedattn.isolation.RemoteCapabilities``). Adapter writers give a ``Capabilities``."""

    @property
    def dtypes(self) -> frozenset[torch.dtype]: ...
    @property
    def operations(self) -> frozenset[str]: ...
    @property
    def variants(self) -> frozenset[str]: ...
    @property
    def devices(self) -> frozenset[str]: ...
    @property
    def fp32_precision(self) -> str: ...
    @property
    def qk_precision(self) -> str: ...
    @property
    def tolerance_factor(self) -> float: ...
    @property
    def notes(self) -> dict[str, str]: ...
    @property
    def max_seq_len(self) -> int | None: ...
    @property
    def decode_only(self) -> bool: ...
    @property
    def default_scale_only(self) -> bool: ...

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
    ) -> str | None: ...
    def case_reason(self, case: PagedCase, operation: str = "attention") -> str | None: ...
    def invariance_reason(self, name: str) -> str | None: ...
    def describe(self) -> dict[str, Any]: ...
    def limit_lines(self) -> list[str]: ...


@runtime_checkable
class Backend(Protocol):
    """A paged-attention implementation under test: the required part of the contract.

    Required: ``name``, ``capabilities`` and ``paged_attention``. Everything else is
    optional, each a protocol of its own below, used only when the backend has it:
    ``SupportsOut`` (``paged_attention(case, out=...)``), ``SupportsLse``
    (``paged_attention_lse``, operation ``lse``), ``SupportsGather`` (``gather``,
    operation ``gather``), ``SupportsWriteCache`` (``write_cache``, operation
    ``write_cache``), ``SupportsWarmup`` (``warmup``) and ``SupportsClose`` (``close``).
    An operation is run only when it is claimed in ``capabilities.operations`` too. Two
    optional attributes feed the report: ``version`` (str) and ``target`` (str: where the
    kernel really runs, e.g. ``"triton (interpreter, cpu)"``).

    The suite only ever calls a backend with valid cases it claims to support, and
    never reuses the tensors it passed (a backend that writes into them is caught
    by the input-immutability property, not crashed into). A ``pytest.skip(reason)``
    raised by any method reports the case as unsupported with that reason.

    Attributes:
        name: a short name for the report (``"triton"``).
        capabilities: what it claims (a ``Capabilities``).
    """

    name: str

    @property
    def capabilities(self) -> Claims: ...

    def paged_attention(self, case: PagedCase) -> torch.Tensor:
        """Args:
            case: the problem, on the device under test.

        Returns:
            ``[num_tokens, num_heads, head_dim]`` in ``case.query.dtype`` on ``case.device``.
        """
        ...


@runtime_checkable
class SupportsOut(Protocol):
    """``paged_attention(case, out=buf)`` writes the output into ``buf``
    (``[num_tokens, num_heads, head_dim]`` in the query dtype, on the case's device) and
    returns it (or ``None``). Every element must be written: the suite fills ``buf`` with
    a NaN of a payload no arithmetic produces and fails an element still holding it.

    Attributes:
        accepts_out: whether ``out=`` is taken; when a backend has no such attribute the
            suite reads ``paged_attention``'s signature (``pagedattn.isolation.accepts_out``).
    """

    accepts_out: bool

    def paged_attention(self, case: PagedCase, out: torch.Tensor | None = None) -> torch.Tensor | None: ...


@runtime_checkable
class SupportsLse(Protocol):
    """Operation ``lse``."""

    def paged_attention_lse(self, case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
        """The output ``[num_tokens, num_heads, head_dim]`` in the query dtype and the
        log-sum-exp ``[num_tokens, num_heads]`` float32: the natural log of each row's
        softmax denominator, the sink included (see ``PagedCase``). FlashInfer returns
        log2: multiply by ln 2."""
        ...


@runtime_checkable
class SupportsGather(Protocol):
    """Operation ``gather``."""

    def gather(self, pool: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        """``pool``: ``[num_blocks, block_size, num_kv_heads, head_dim]``; ``slot_mapping``:
        ``[n]`` int64. Returns ``[n, num_kv_heads, head_dim]``, bit-identical to
        ``pool.view(-1, num_kv_heads, head_dim)[slot_mapping]`` (NaN payloads included)."""
        ...


@runtime_checkable
class SupportsWriteCache(Protocol):
    """Operation ``write_cache``."""

    def write_cache(self, pool: torch.Tensor, slot_mapping: torch.Tensor, new: torch.Tensor) -> None:
        """Write ``new`` ``[n, num_kv_heads, head_dim]`` into ``pool``
        ``[num_blocks, block_size, num_kv_heads, head_dim]`` in place at the slots of
        ``slot_mapping`` ``[n]`` int64; a slot ``< 0`` means "skip this row". Every other
        slot keeps its bits, and ``new`` is not modified."""
        ...


@runtime_checkable
class SupportsWarmup(Protocol):
    """A JIT backend compiles outside the timed call."""

    def warmup(self, case: PagedCase) -> None:
        """Called once per configuration (``pagedattn.cases.configuration.Configuration.key``:
        dtype, kv dtype, head dim, block size, variants, operation) before the case's own
        call, outside ``--case-timeout``; its result is ignored."""
        ...


@runtime_checkable
class SupportsClose(Protocol):
    """A backend that holds resources (a process, a device context)."""

    def close(self) -> None:
        """Called once, when the session ends."""
        ...
