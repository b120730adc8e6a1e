"""Decode forms: a multi-token case offered to a decode-only kernel as the decodes it implies.

The ``q_b`` new tokens of sequence ``b`` sit at positions ``seq_lens[b] - q_b .. seq_lens[b] - 1``
and causal attention is bottom-right aligned, so the query row at position ``p`` is the same
problem as a decode of ``p + 1`` tokens over sequence ``b``'s block-table row: the oracle gives
the same output row for both (bit for bit where it takes the row alone, as it takes a decode;
its blocks of rows sum in another order). A decode form keeps everything else of the case: the pool (the
same tensors, not copied), its block size, its scattered, interleaved or shared blocks and
poisoned padding, the fp8 cache and scales, the window, soft-cap, ALiBi (positions stay
absolute) and sinks. The decodes of one sequence share its blocks, as prefix sharing does.
A tree-masked case has none: a row of a tree sees its history and its ancestors, not a
prefix of its sequence, which no decode over a block-table row is.

A long prefill implies thousands of decodes; a decode form keeps at most ``MAX_DECODES``
of them (``decode_rows``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pagedattn.cases.spec import CaseSpec
from pagedattn.indexing import index_rows
from pagedattn.oracle.case import PagedCase
from pagedattn.validation import ProblemError

#: decodes per decode form, at most: the oracle and the check loop over sequences, and a
#: thousand-row prefill as a thousand decodes would cost a CPU run seconds per case
MAX_DECODES = 64
#: what a decode form's id adds to its case's id
SUFFIX = "as-decode"


def decode_rows(query_lens: Sequence[int], max_decodes: int = MAX_DECODES) -> list[int]:
    """The packed query rows a decode form keeps, ascending.

    Every row when there are at most ``max_decodes``. Otherwise each sequence's first and
    last row (its shortest and its longest history), then rows evenly spaced over the
    others, ``max_decodes`` in all (more only where a batch has over ``max_decodes / 2``
    sequences: every sequence keeps its first and last row)."""
    if max_decodes < 1:
        raise ProblemError("decode_rows", "max_decodes", f"must be >= 1, got {max_decodes}")
    total = sum(query_lens)
    if total <= max_decodes:
        return list(range(total))
    ends: set[int] = set()
    start = 0
    for q in query_lens:
        ends |= {start, start + q - 1}
        start += q
    rest = [t for t in range(total) if t not in ends]
    fill = max(0, max_decodes - len(ends))  # < len(rest), as total > max_decodes: the picks are distinct
    return sorted(ends | {rest[i * len(rest) // fill] for i in range(fill)})


def decode_form(case: PagedCase, rows: Iterable[int] | None = None) -> PagedCase:
    """The decodes that ``case`` implies: query row ``rows[i]`` (sequence ``b``, position
    ``p``) becomes sequence ``i``, of ``p + 1`` tokens over ``b``'s block-table row.

    Args:
        case: a valid ``PagedCase``; never modified.
        rows: packed query rows, each in ``[0, num_tokens)`` (default: every row, in order).

    Returns:
        A ``PagedCase`` (validated) with ``len(rows)`` sequences of one query token each:
        ``query`` ``[R, num_heads, head_dim]`` (the rows, copied; ``case.query`` itself for
        every row), ``block_tables`` ``[R, max_blocks_per_seq]`` int32 (the rows' sequences'
        rows, padding included), ``seq_lens`` ``[R]`` int32 (``p + 1``), ``query_start_loc``
        ``[R + 1]`` int32 (``0 .. R``); the caches, scales and variants are ``case``'s own.
        Row ``i`` of its oracle output is row ``rows[i]`` of ``case``'s.
    """
    if case.tree_mask is not None:
        raise ProblemError(
            "decode_form", "case", "must have no tree_mask (a tree's row sees no prefix of its sequence), got one"
        )
    every = rows is None
    picked = list(range(case.num_tokens)) if rows is None else [int(t) for t in rows]
    if not picked or not all(0 <= t < case.num_tokens for t in picked):
        raise ProblemError(
            "decode_form", "rows", f"must be query rows in [0, {case.num_tokens}), at least one, got {picked}"
        )
    loc = case.query_start_loc_list
    seqs = [bisect.bisect_right(loc, t) - 1 for t in picked]  # each row's sequence
    positions = [case.context_lens[b] + t - loc[b] for t, b in zip(picked, seqs)]
    device = case.device
    index = torch.tensor(picked, dtype=torch.int64, device=device)
    return case.replace(
        query=case.query if every else index_rows(case.query, index),
        block_tables=case.block_tables[torch.tensor(seqs, dtype=torch.int64, device=device)].contiguous(),
        seq_lens=torch.tensor(positions, dtype=torch.int32, device=device) + 1,
        query_start_loc=torch.arange(len(picked) + 1, dtype=torch.int32, device=device),
    )


@dataclass(frozen=True)
class DecodeFormSpec:
    """The decode form of a grid case: ``source``'s case (the same data: it is seeded by
    ``source.id``), projected onto ``decode_rows`` of its query rows. Its id is
    ``<source id>-as-decode``; its family, dtypes, shape and variants are ``source``'s."""

    source: CaseSpec
    max_decodes: int = MAX_DECODES

    def __post_init__(self) -> None:
        if not isinstance(self.source, CaseSpec):
            raise ProblemError("DecodeFormSpec", "source", f"must be a CaseSpec, got {type(self.source).__name__}")
        if self.source.tree_mask:
            raise ProblemError(
                "DecodeFormSpec", "source", f"must have no tree mask (its rows see no prefix), got {self.source.id}"
            )
        if all(q == 1 for _, q in self.source.seqs):
            raise ProblemError(
                "DecodeFormSpec", "source", f"must have a sequence of several query tokens, got {self.source.id}"
            )
        if self.max_decodes < 1:
            raise ProblemError("DecodeFormSpec", "max_decodes", f"must be >= 1, got {self.max_decodes}")

    @property
    def id(self) -> str:
        return f"{self.source.id}-{SUFFIX}"

    @property
    def rows(self) -> list[int]:
        """The source's packed query rows that become decodes (``decode_rows``)."""
        return decode_rows([q for _, q in self.source.seqs], self.max_decodes)

    @property
    def seqs(self) -> tuple[tuple[int, int], ...]:
        """``((seq_len, 1), ...)``: one decode per kept row, ``seq_len`` its position + 1."""
        lens: list[int] = []
        for s, q in self.source.seqs:
            lens += range(s - q + 1, s + 1)
        return tuple((lens[t], 1) for t in self.rows)

    @property
    def description(self) -> str:
        """What the decode form is, in words (the report's ``description``)."""
        total, kept = sum(q for _, q in self.source.seqs), len(self.rows)
        which = (
            "every row"
            if kept == total
            else "each sequence's first and last row, the others evenly spaced (at most "
            f"{self.max_decodes} decodes per case)"
        )
        return f"the decodes of {self.source.id}: {kept} of its {total} query rows ({which}), each over its history"

    def build(self, seed: int = 0) -> PagedCase:
        """The decode form of ``source.build(seed)``, on the CPU."""
        return decode_form(self.source.build(seed), self.rows)

    # what the suite reads of a spec without building it: the source's
    @property
    def family(self) -> str:
        return self.source.family

    @property
    def dtype(self) -> torch.dtype:
        return self.source.dtype

    @property
    def kv_dtype(self) -> torch.dtype | None:
        return self.source.kv_dtype

    @property
    def num_heads(self) -> int:
        return self.source.num_heads

    @property
    def num_kv_heads(self) -> int:
        return self.source.num_kv_heads

    @property
    def gqa_ratio(self) -> int:
        return self.source.gqa_ratio

    @property
    def head_dim(self) -> int:
        return self.source.head_dim

    @property
    def value_width(self) -> int:
        return self.source.value_width

    @property
    def block_size(self) -> int:
        return self.source.block_size

    @property
    def variants(self) -> frozenset[str]:
        return self.source.variants

    @property
    def max_seq_len(self) -> int:
        return max(s for s, _ in self.seqs)


def with_decode_forms(specs: Iterable[Any]) -> list[Any]:
    """``specs`` with each grid case of several query tokens in a sequence followed by its
    decode form (what a decode-only backend is offered), tree-masked cases excepted; other
    specs as they are."""
    out: list[Any] = []
    for spec in specs:
        out.append(spec)
        if isinstance(spec, CaseSpec) and any(q > 1 for _, q in spec.seqs) and not spec.tree_mask:
            out.append(DecodeFormSpec(spec))
    return out
