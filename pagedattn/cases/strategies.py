"""Hypothesis strategies drawing whole valid cases within a profile's bounds.

Draws are labelled so a shrunk failure reads like a case description; every
axis shrinks toward the small end (one sequence, short history, block size 1).
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from pagedattn.cases.grid import DTYPES, HEAD_DIMS
from pagedattn.cases.spec import CaseSpec

#: (max history, max sequences, max query heads) per profile
BOUNDS = {"quick": (96, 3, 8), "standard": (1024, 6, 16), "thorough": (8192, 8, 32)}


_FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@st.composite
def case_specs(draw, profile: str = "quick", family: str = "search", dtypes=DTYPES, variants=frozenset()) -> CaseSpec:
    """A ``CaseSpec`` with random ragged lengths, heads, layout and dtype, and any of the
    ``variants`` (names from ``pagedattn.oracle.VARIANTS``) switched on or off; each
    shrinks towards off."""
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
    extra: dict = {}
    if "sliding_window" in variants and draw(st.booleans(), label="use sliding_window"):
        extra["sliding_window"] = draw(st.integers(1, max(s for s, _ in seqs) + 1), label="sliding_window")
    if "logits_soft_cap" in variants and draw(st.booleans(), label="use soft_cap"):
        extra["soft_cap"] = draw(st.sampled_from([50.0, 5.0, 1.0]), label="soft_cap")
    if "alibi" in variants:
        extra["alibi"] = draw(st.booleans(), label="alibi")
    if "sinks" in variants:
        extra["sinks"] = draw(st.booleans(), label="sinks")
    fp8 = sorted(set(_FP8) & set(variants))
    if fp8 and draw(st.booleans(), label="use fp8"):
        extra["kv_dtype"] = _FP8[draw(st.sampled_from(fp8), label="kv_dtype")]
        extra["k_scale"] = draw(st.sampled_from([0.37, 2.5]), label="k_scale")
        extra["v_scale"] = draw(st.sampled_from([1.9, 0.3]), label="v_scale")
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
        **extra,
    )
