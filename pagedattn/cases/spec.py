"""A case spec: a small, hashable description that builds a deterministic ``PagedCase``.

The spec holds the axes (family, lengths, heads, head_dim, block size, dtype,
layout); ``build(seed)`` draws the data from a generator seeded by the spec's id,
so every pytest-xdist worker builds bit-identical tensors.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

from pagedattn.oracle.case import PagedCase
from pagedattn.validation import FP8_DTYPES, HEAD_DIM_V, MLA, PER_HEAD_SCALES, TREE_MASK, ProblemError

LAYOUTS = ("sequential", "permuted", "interleaved", "shared")
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
#: fp8 cache dtypes by their one name (``fp8_e4m3``, ``fp8_e5m2``): ids, reports, variants

# Extra physical blocks filled with NaN that padding table entries point at.
_POISON_BLOCKS = 2


def case_seed(case_id: str, stream: int = 0) -> int:
    """The one seeding scheme of the project: a case's random stream ``stream`` is seeded by
    its id (``crc32``, stable across processes and Python versions, unlike ``hash``), so a
    case id names the same tensors everywhere. ``CaseSpec.build(seed)`` draws stream
    ``seed``; the suite's own draws for a case take the streams of ``pagedattn.runner.suite``."""
    return zlib.crc32(case_id.encode()) * 1000 + stream


@dataclass(frozen=True)
class CaseSpec:
    """One generated case.

    Attributes:
        family: the suite family it belongs to (``decode``, ``prefill``, ...).
        seqs: ``((seq_len, query_len), ...)`` per sequence.
        num_heads, num_kv_heads, head_dim, block_size: the shape axes.
        dtype: ``torch.float32``, ``torch.float16`` or ``torch.bfloat16``.
        layout: ``sequential`` (blocks in order), ``permuted`` (physical order
            random), ``interleaved`` (sequences alternate blocks), ``shared``
            (sequence 1 reuses sequence 0's first ``shared_blocks`` blocks).
        scale: explicit softmax scale, ``None`` for ``head_dim ** -0.5``.
        poison: NaN in every block and slot a kernel must not read.
        shared_blocks: how many leading blocks are shared (layout ``shared``).
        query_gain: standard deviation of the queries: > 1 sharpens the softmax.
        tag: a suffix that keeps ids unique when two specs differ elsewhere.
        sliding_window: ``PagedCase.sliding_window`` (``None``: off).
        logits_soft_cap: ``PagedCase.logits_soft_cap`` (``None``: off).
        alibi_slopes: whether the case has per-head ALiBi slopes ``2 ** (-8 (h + 1) / num_heads)`` (the ALiBi paper's).
        sinks: per-head sink logits drawn in ``[-1, 6)``, where they take a visible share
            of the softmax from scores of this generator's size.
        kv_dtype: an fp8 cache dtype (``None``: the query dtype). The cache holds
            ``(x / scale).to(kv_dtype)`` of normal draws ``x``, so the dequantized cache
            is of the usual size.
        k_scale, v_scale: the fp8 scales (only with ``kv_dtype``): a float (per tensor) or a
            tuple of ``num_kv_heads`` floats (per kv head, ``fp8_per_head_scales``).
        head_dim_v: the values' head dim (``None``: ``head_dim``).
        mla: the values are a view of the keys' leading ``head_dim_v`` columns (MLA's latent
            cache; ``head_dim_v < head_dim``).
        tree_mask: every multi-token sequence's new tokens form a random tree (each token's
            parent an earlier one, branching), drawn after everything else.
    """

    family: str
    seqs: tuple[tuple[int, int], ...]
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    block_size: int = 16
    dtype: torch.dtype = torch.float32
    layout: str = "sequential"
    scale: float | None = None
    poison: bool = True
    shared_blocks: int = 0
    query_gain: float = 2.0
    tag: str = ""
    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    alibi_slopes: bool = False
    sinks: bool = False
    kv_dtype: torch.dtype | None = None
    k_scale: float | tuple[float, ...] = 1.0
    v_scale: float | tuple[float, ...] = 1.0
    head_dim_v: int | None = None
    mla: bool = False
    tree_mask: bool = False

    def __post_init__(self) -> None:
        if self.mla and not (self.head_dim_v is not None and self.head_dim_v < self.head_dim):
            raise ProblemError(
                "CaseSpec", "head_dim_v", f"must be < head_dim {self.head_dim} with mla, got {self.head_dim_v}"
            )
        if self.kv_dtype is not None and self.kv_dtype not in FP8_DTYPES:
            raise ProblemError("CaseSpec", "kv_dtype", f"must be an fp8 dtype or None, got {self.kv_dtype}")
        if self.layout not in LAYOUTS:
            raise ProblemError("CaseSpec", "layout", f"must be one of {LAYOUTS}, got {self.layout!r}")
        if self.layout == "shared":
            if len(self.seqs) < 2 or self.shared_blocks < 1:
                raise ProblemError(
                    "CaseSpec",
                    "shared_blocks",
                    "must be >= 1 with two sequences or more under "
                    f"layout 'shared', got {self.shared_blocks} with {len(self.seqs)}",
                )
            full = min(s for s, _ in self.seqs[:2]) // self.block_size
            if self.shared_blocks > full:
                raise ProblemError(
                    "CaseSpec",
                    "shared_blocks",
                    f"must be <= the {full} full blocks both sequences have, got {self.shared_blocks}",
                )

    @property
    def variants(self) -> frozenset[str]:
        """The variants the built case uses (``PagedCase.variants``), without building it."""
        on = {
            "sliding_window": self.sliding_window is not None,
            "logits_soft_cap": self.logits_soft_cap is not None,
            "alibi_slopes": self.alibi_slopes,
            "sinks": self.sinks,
        }
        fp8 = {FP8_DTYPES[self.kv_dtype]} if self.kv_dtype is not None else set()
        if self.per_head_scales:
            fp8.add(PER_HEAD_SCALES)
        shape = {
            MLA: self.mla,
            HEAD_DIM_V: not self.mla and self.value_width != self.head_dim,
            TREE_MASK: self.tree_mask,
        }
        return frozenset({name for name, used in {**on, **shape}.items() if used} | fp8)

    @property
    def value_width(self) -> int:
        """The values' head dim."""
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def per_head_scales(self) -> bool:
        """Whether ``k_scale`` or ``v_scale`` is per kv head (a tuple)."""
        return isinstance(self.k_scale, tuple) or isinstance(self.v_scale, tuple)

    @property
    def gqa_ratio(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def max_seq_len(self) -> int:
        return max(s for s, _ in self.seqs)

    @property
    def id(self) -> str:
        parts = [
            self.family,
            f"gqa{self.gqa_ratio}" if self.num_kv_heads > 1 else f"mqa{self.num_heads}",
            f"bs{self.block_size}",
            f"d{self.head_dim}",
            *([f"dv{self.value_width}"] if self.value_width != self.head_dim else []),
            DTYPE_NAMES[self.dtype],
            f"L{self.max_seq_len}",
        ]
        if len(self.seqs) > 1:
            parts.append(f"B{len(self.seqs)}")
        if self.layout != "sequential":
            parts.append(self.layout)
        if self.scale is not None:
            parts.append(f"scale{self.scale:g}")
        if self.sliding_window is not None:
            parts.append(f"win{self.sliding_window}")
        if self.logits_soft_cap is not None:
            parts.append(f"cap{self.logits_soft_cap:g}")
        if self.alibi_slopes:
            parts.append("alibi")
        if self.sinks:
            parts.append("sinks")
        if self.kv_dtype is not None:
            parts.append(FP8_DTYPES[self.kv_dtype])
        if self.per_head_scales:
            parts.append("perhead")
        if self.mla:
            parts.append("mla")
        if self.tree_mask:
            parts.append("tree")
        if self.tag:
            parts.append(self.tag)
        return "-".join(parts)

    def physical_layout(self, gen: torch.Generator) -> tuple[list[list[int]], int, list[int]]:
        """The block tables as lists, the number of physical blocks, and the poison block ids."""
        need = [math.ceil(s / self.block_size) for s, _ in self.seqs]
        logical: list[tuple[int, int]] = []  # (seq, block) pairs that get their own block
        if self.layout == "interleaved":
            for i in range(max(need)):
                logical += [(b, i) for b in range(len(need)) if i < need[b]]
        else:
            for b, n in enumerate(need):
                first = self.shared_blocks if (self.layout == "shared" and b == 1) else 0
                logical += [(b, i) for i in range(first, n)]
        n_poison = _POISON_BLOCKS if self.poison else 0
        num_blocks = len(logical) + n_poison
        if self.layout == "permuted":
            ids = torch.randperm(num_blocks, generator=gen).tolist()
            n = len(logical)
            if n > 1 and ids[:n] == sorted(ids[:n]):
                # a small permutation can come out in order; "permuted" must mean it
                ids[0], ids[1] = ids[1], ids[0]
        else:
            ids = list(range(num_blocks))
        table = [[-1] * n for n in need]
        for (b, i), phys in zip(logical, ids):
            table[b][i] = phys
        if self.layout == "shared":
            table[1][: self.shared_blocks] = table[0][: self.shared_blocks]
        poison_ids = ids[len(logical) :]
        return table, num_blocks, poison_ids

    def build(self, seed: int = 0) -> PagedCase:
        """The case, on the CPU. Deterministic in ``(self.id, seed)``."""
        gen = torch.Generator().manual_seed(case_seed(self.id, seed))
        table, N, poison_ids = self.physical_layout(gen)
        bs, Hkv, D = self.block_size, self.num_kv_heads, self.head_dim
        width = max(len(r) for r in table) + 1  # one padding column at least
        block_tables = torch.empty(len(table), width, dtype=torch.int32)
        for b, row in enumerate(table):
            pad = poison_ids[b % len(poison_ids)] if poison_ids else 0
            block_tables[b] = torch.tensor(row + [pad] * (width - len(row)), dtype=torch.int32)
        k = torch.randn(N, bs, Hkv, D, generator=gen)
        v = torch.randn(N, bs, Hkv, self.value_width, generator=gen)
        # drawn after the data, so that adding a variant to a spec keeps its other tensors
        sinks = torch.rand(self.num_heads, generator=gen) * 7.0 - 1.0 if self.sinks else None
        if self.poison:
            for cache in (k,) if self.mla else (k, v):  # an MLA case's values are re-viewed below
                cache[poison_ids] = float("nan")
                for b, (s, _) in enumerate(self.seqs):
                    tail = s % bs
                    if tail:
                        cache[table[b][-1], tail:] = float("nan")
        qlens = [q for _, q in self.seqs]
        q = torch.randn(sum(qlens), self.num_heads, D, generator=gen) * self.query_gain
        loc = torch.tensor([0] + qlens, dtype=torch.int64).cumsum(0).to(torch.int32)
        k_scale, v_scale = _scale_field(self.k_scale), _scale_field(self.v_scale)
        if self.kv_dtype is not None:
            k, v = (k / _rows(k_scale)).to(self.kv_dtype), (v / _rows(v_scale)).to(self.kv_dtype)
        else:
            k, v = k.to(self.dtype), v.to(self.dtype)
        if self.mla:  # one latent cache: the values are its keys' leading columns
            v = k[..., : self.value_width]
        tree = torch.cat([random_tree_mask(q, gen).reshape(-1) for q in qlens]) if self.tree_mask else None
        H = self.num_heads
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)]) if self.alibi_slopes else None
        return PagedCase(
            query=q.to(self.dtype),
            key_cache=k,
            value_cache=v,
            block_tables=block_tables,
            seq_lens=torch.tensor([s for s, _ in self.seqs], dtype=torch.int32),
            query_start_loc=loc,
            scale=self.scale,  # type: ignore[arg-type]  # None: the default scale
            sliding_window=self.sliding_window,
            logits_soft_cap=self.logits_soft_cap,
            alibi_slopes=slopes,
            sinks=sinks,
            k_scale=k_scale,
            v_scale=v_scale,
            tree_mask=tree,
        )


def random_tree_mask(n: int, gen: torch.Generator) -> torch.Tensor:
    """``[n, n]`` bool: a random tree over ``n`` tokens in topological order, as an ancestor
    matrix (``[i, j]`` True when ``j`` is ``i`` or an ancestor of ``i``). Token ``i``'s parent
    is drawn among the last few before it, so the tree both branches and runs deep, as
    speculative decoding's draft trees do; a chain (causal) is one draw among many."""
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        parent = i - 1 - int(torch.randint(0, min(i, 3), (1,), generator=gen))
        mask[i] |= mask[parent]
    return mask


def _scale_field(x: float | tuple[float, ...]) -> float | torch.Tensor:
    """A spec's fp8 scale as ``PagedCase`` takes it: a float, or ``[num_kv_heads]`` float32."""
    return torch.tensor(x, dtype=torch.float32) if isinstance(x, tuple) else x


def _rows(x: float | torch.Tensor) -> float | torch.Tensor:
    """A scale that divides a cache ``[N, block_size, num_kv_heads, head_dim]``."""
    return x.view(-1, 1) if isinstance(x, torch.Tensor) else x
