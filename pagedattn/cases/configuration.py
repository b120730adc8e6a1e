"""What a backend compiles for: the one notion of a case's configuration.

A JIT kernel specializes on the dtypes, head_dim, block size, the heads and which
variants are on; lengths, layouts, scales and the variants' parameters are runtime
values. The suite orders its cases by ``Configuration.key`` (the report's
``configuration``), keeps each key on one pytest-xdist worker and warms a backend up
once per key; the search draws within the grid's configurations.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from pagedattn.cases.grid import DTYPES
from pagedattn.cases.spec import DTYPE_NAMES, CaseSpec
from pagedattn.oracle.case import PagedCase
from pagedattn.validation import FP8_DTYPES, PER_HEAD_SCALES, SHAPE_VARIANTS

#: the variants a configuration switches on by name (an fp8 cache is its ``kv_dtype``)
SWITCHED = ("sliding_window", "logits_soft_cap", "alibi_slopes", "sinks")
#: the variants a configuration names: the switched ones, per-head fp8 scales (a kernel reads
#: a tensor of scales where it read a number), and the shape variants (MLA's shared rows, a
#: value width of its own, a tree mask: another path of a kernel, or another kernel)
CONFIGURED = frozenset(SWITCHED) | {PER_HEAD_SCALES, *SHAPE_VARIANTS}


def dtype_name(dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> str:
    """``bf16``; with an fp8 cache, the query and cache dtypes: ``bf16/fp8_e4m3``."""
    name = DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))
    if kv_dtype is not None and kv_dtype != dtype:
        name += "/" + FP8_DTYPES.get(kv_dtype, str(kv_dtype).replace("torch.", ""))
    return name


class Configuration(NamedTuple):
    """What a kernel that compiles per shape specializes on.

    Attributes:
        dtype: the query dtype.
        head_dim, block_size, num_heads, num_kv_heads: the shape.
        kv_dtype: the cache dtype when it differs from ``dtype`` (an fp8 cache), else ``None``.
        variants: the variants switched on, among ``CONFIGURED`` (an fp8 cache is ``kv_dtype``;
            ``fp8_per_head_scales`` comes with one).
        head_dim_v: the values' head dim where it differs from ``head_dim``, else ``None``.
    """

    dtype: torch.dtype
    head_dim: int
    block_size: int
    num_heads: int
    num_kv_heads: int
    kv_dtype: torch.dtype | None = None
    variants: frozenset[str] = frozenset()
    head_dim_v: int | None = None

    @classmethod
    def of_spec(cls, spec: CaseSpec) -> Configuration:
        """The configuration of a grid spec, without building its case."""
        return cls(
            spec.dtype,
            spec.head_dim,
            spec.block_size,
            spec.num_heads,
            spec.num_kv_heads,
            spec.kv_dtype,
            frozenset(spec.variants & CONFIGURED),
            None if spec.value_width == spec.head_dim else spec.value_width,
        )

    @classmethod
    def of_case(cls, case: PagedCase) -> Configuration:
        """The configuration of a built case."""
        kv = None if case.kv_dtype == case.dtype else case.kv_dtype
        return cls(
            case.dtype,
            case.head_dim,
            case.block_size,
            case.num_heads,
            case.num_kv_heads,
            kv,
            frozenset(case.variants & CONFIGURED),
            None if case.head_dim_v == case.head_dim else case.head_dim_v,
        )

    @property
    def all_variants(self) -> frozenset[str]:
        """Every variant name it uses, fp8 included (as ``PagedCase.variants`` names them)."""
        return self.variants | ({FP8_DTYPES[self.kv_dtype]} if self.kv_dtype is not None else set())

    @property
    def gqa_ratio(self) -> int:
        return self.num_heads // self.num_kv_heads

    def sort_key(self) -> tuple[object, ...]:
        """Simplest first, so that a draw shrinks towards it."""
        return (
            len(self.all_variants),
            self.num_heads,
            self.head_dim,
            self.block_size,
            DTYPES.index(self.dtype),
            str(self.kv_dtype),
            sorted(self.variants),
        )

    def key(self, operation: str) -> str:
        """The compile key of the configuration run as ``operation``, e.g.
        ``bf16|kv=bf16|d128|bs16|sinks+sliding_window|attention`` (``d576/512`` where the
        values' head dim differs): the report's
        ``configuration``, the order of the run and its ``xdist_group``. The heads are left
        out: cases that differ only in their heads share a key (and one warm-up)."""
        q = DTYPE_NAMES.get(self.dtype, str(self.dtype).replace("torch.", ""))
        kv = q if self.kv_dtype is None else FP8_DTYPES.get(self.kv_dtype, str(self.kv_dtype))
        var = "+".join(sorted(self.all_variants)) or "plain"
        dims = f"d{self.head_dim}" + (f"/{self.head_dim_v}" if self.head_dim_v is not None else "")
        return f"{q}|kv={kv}|{dims}|bs{self.block_size}|{var}|{operation}"
