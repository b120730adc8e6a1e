"""Hypothesis strategies drawing whole valid cases within a profile's bounds.

Draws are labelled so a shrunk failure reads like a case description; every
axis shrinks toward the small end (one sequence, short history, block size 1).
"""

from __future__ import annotations

from hypothesis import strategies as st

from pagedattn.cases.grid import DTYPES, HEAD_DIMS
from pagedattn.cases.spec import CaseSpec

#: (max history, max sequences, max query heads) per profile
BOUNDS = {"quick": (96, 3, 8), "standard": (1024, 6, 16), "thorough": (8192, 8, 32)}


@st.composite
def case_specs(draw, profile: str = "quick", family: str = "search", dtypes=DTYPES) -> CaseSpec:
    """A ``CaseSpec`` with random ragged lengths, heads, layout and dtype."""
    max_len, max_seqs, max_heads = BOUNDS[profile]
    num_seqs = draw(st.integers(1, max_seqs), label="num_seqs")
    seqs = []
    for _ in range(num_seqs):
        seq_len = draw(st.integers(1, max_len), label="seq_len")
        kind = draw(st.sampled_from(["decode", "prefill", "continuation"]), label="kind")
        if kind == "decode":
            q = 1
        elif kind == "prefill":
            q = seq_len
        else:
            q = draw(st.integers(1, seq_len), label="query_len")
        seqs.append((seq_len, q))
    num_kv_heads = draw(st.sampled_from([1, 2]), label="num_kv_heads")
    ratio = draw(st.sampled_from([r for r in (1, 2, 4, 8) if r * num_kv_heads <= max_heads]), label="gqa")
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8, 13, 16, 32]), label="block_size")
    layout = draw(st.sampled_from(["sequential", "permuted", "interleaved"]), label="layout")
    return CaseSpec(
        family,
        tuple(seqs),
        num_heads=num_kv_heads * ratio,
        num_kv_heads=num_kv_heads,
        head_dim=draw(st.sampled_from(HEAD_DIMS[:4]), label="head_dim"),
        block_size=block_size,
        dtype=draw(st.sampled_from(list(dtypes)), label="dtype"),
        layout=layout,
        scale=draw(st.one_of(st.none(), st.floats(0.01, 1.0)), label="scale"),
        query_gain=draw(st.sampled_from([0.5, 1.0, 2.0, 4.0]), label="query_gain"),
    )
