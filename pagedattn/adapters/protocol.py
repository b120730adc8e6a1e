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

IntSpec = Collection[int] | Callable[[int], bool] | None


def _admits(spec: IntSpec, value: int) -> bool:
    if spec is None:
        return True
    if callable(spec) and not isinstance(spec, Collection):
        return bool(spec(value))
    return value in spec  # type: ignore[operator]


@dataclass(frozen=True)
class Capabilities:
    """What a backend claims. ``Capabilities()`` claims the core: fp32/fp16/bf16, any
    head_dim, any block size, any GQA ratio, any length, decode, prefill and
    continuation, on CPU and CUDA. Optional operations (``gather``, ``write_cache``,
    ``lse``) and attention variants are off until claimed.

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
            shown with every case it makes unsupported.
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

    def __post_init__(self) -> None:
        if self.fp32_precision not in ("ieee", "tf32"):
            raise ValueError(f"Capabilities.fp32_precision must be 'ieee' or 'tf32', got {self.fp32_precision!r}")
        unknown = set(self.operations) - OPERATIONS
        if unknown:
            raise ValueError(f"Capabilities.operations: unknown {sorted(unknown)}, known {sorted(OPERATIONS)}")
        unknown = set(self.variants) - set(VARIANTS)
        if unknown:
            raise ValueError(f"Capabilities.variants: unknown {sorted(unknown)}, known {list(VARIANTS)}")
        if not self.tolerance_factor > 0:
            raise ValueError(f"Capabilities.tolerance_factor must be > 0, got {self.tolerance_factor}")

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
        """``None`` when every given property is claimed; else why not, in words."""
        if operation not in self.operations:
            return self._why("operations", f"operation '{operation}' not claimed")
        if dtype is not None and dtype not in self.dtypes:
            return self._why("dtypes", f"dtype {str(dtype).replace('torch.', '')} not claimed")
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

    def case_reason(self, case: PagedCase, operation: str = "attention") -> str | None:
        """``unsupported_reason`` for everything a built case needs."""
        return self.unsupported_reason(
            operation=operation,
            dtype=case.dtype,
            head_dim=case.head_dim,
            block_size=case.block_size,
            gqa_ratio=case.gqa_ratio,
            max_seq_len=case.max_seq_len,
            device=case.device,
            variants=case.variants,
        )

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description, for the report."""

        def spec(s: IntSpec) -> Any:
            if s is None:
                return "any"
            if callable(s) and not isinstance(s, Collection):
                return getattr(s, "__doc__", None) or getattr(s, "__name__", "predicate")
            return sorted(s)  # type: ignore[type-var]

        return {
            "dtypes": sorted(str(d).replace("torch.", "") for d in self.dtypes),
            "head_dims": spec(self.head_dims),
            "block_sizes": spec(self.block_sizes),
            "max_gqa_ratio": self.max_gqa_ratio,
            "max_seq_len": self.max_seq_len,
            "devices": sorted(self.devices),
            "operations": sorted(self.operations),
            "variants": sorted(self.variants),
            "fp32_precision": self.fp32_precision,
            "tolerance_factor": self.tolerance_factor,
            "notes": dict(self.notes),
        }


@runtime_checkable
class Backend(Protocol):
    """A paged-attention implementation under test.

    Required: ``name``, ``capabilities`` and ``paged_attention``. Optional, each
    used only when present: ``version`` (str), ``target`` (str: where the kernel
    really runs, e.g. ``"triton (interpreter, cpu)"``), ``gather(pool, slot_mapping)``
    and ``write_cache(pool, slot_mapping, new)`` when claimed in
    ``capabilities.operations``.

    The suite only ever calls a backend with valid cases it claims to support, and
    never reuses the tensors it passed (a backend that writes into them is caught
    by the input-immutability property, not crashed into).
    """

    name: str
    capabilities: Capabilities

    def paged_attention(self, case: PagedCase) -> torch.Tensor:
        """Args:
            case: the problem, on the device under test.

        Returns:
            ``[num_tokens, num_heads, head_dim]`` in ``case.query.dtype`` on ``case.device``.
        """
        ...


# Optional methods, documented here for adapter writers:
#
#   gather(pool, slot_mapping) -> Tensor
#       pool: [num_blocks, block_size, num_kv_heads, head_dim]; slot_mapping: [n] int64
#       returns [n, num_kv_heads, head_dim], bit-identical to pool.view(-1, ...)[slot_mapping]
#
#   paged_attention_lse(case) -> (Tensor, Tensor)      (operation "lse")
#       the output [num_tokens, num_heads, head_dim] in the query dtype, and the log-sum-exp
#       [num_tokens, num_heads] float32: natural log of each row's softmax denominator,
#       the sink included (see PagedCase). FlashInfer returns log2: multiply by ln 2.
#
#   write_cache(pool, slot_mapping, new) -> None
#       pool: [num_blocks, block_size, num_kv_heads, head_dim], written in place;
#       slot_mapping: [n] int64, a slot < 0 means "skip this row"; new: [n, num_kv_heads, head_dim]
