"""Hypothesis strategies drawing whole valid cases within a profile's bounds.

Draws are labelled so a shrunk failure reads like a case description; every
axis shrinks toward the small end (one sequence, short history, block size 1).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
from hypothesis import strategies as st

from pagedattn.cases.configuration import SWITCHED as _SWITCHED
from pagedattn.cases.configuration import Configuration
from pagedattn.cases.grid import DTYPES, FREE_BLOCK_SIZES, FREE_GQA_RATIOS, FREE_HEAD_DIMS
from pagedattn.cases.spec import CaseSpec
from pagedattn.validation import FP8_DTYPES, HEAD_DIM_V, MLA, PER_HEAD_SCALES, TREE_MASK

#: (max history, max sequences, max query heads) per profile
BOUNDS = {"quick": (96, 3, 8), "standard": (1024, 6, 16), "thorough": (8192, 8, 32)}


_FP8_NAMES = FP8_DTYPES
_FP8 = {v: k for k, v in FP8_DTYPES.items()}


@st.composite
def case_specs(
    draw,
    profile: str = "quick",
    family: str = "search",
    dtypes: Sequence[torch.dtype] = DTYPES,
    variants: Collection[str] = frozenset(),
    *,
    configurations: Sequence[Configuration] = (),
    head_dims: Sequence[int] = FREE_HEAD_DIMS,
    block_sizes: Sequence[int] = FREE_BLOCK_SIZES,
    gqa_ratios: Sequence[int] = FREE_GQA_RATIOS,
    decode_only: bool = False,
    default_scale_only: bool = False,
    max_seq_len: int | None = None,
) -> CaseSpec:
    """A ``CaseSpec`` with random ragged lengths, layout, scale and query gain.

    Without ``configurations``: heads, head_dim, block size and dtype are drawn too (from
    ``gqa_ratios``, ``head_dims``, ``block_sizes`` and ``dtypes``), and any of the
    ``variants`` (names from ``pagedattn.oracle.VARIANTS``) is switched on or off (each
    shrinks towards off). With ``configurations``: one of them fixes those (and the
    variants that are on), so that a kernel which compiles per shape reuses its compiles;
    MLA and a value width of their own come only with a configuration that has them, a tree
    mask either way (without a window or ALiBi, which no case combines with it).

    ``decode_only``: one new token per sequence. ``default_scale_only``: the scale stays
    ``head_dim ** -0.5``. ``max_seq_len`` caps the history below the profile's bound."""
    max_len, max_seqs, max_heads = BOUNDS[profile]
    max_len = min(max_len, max_seq_len or max_len)
    num_seqs = draw(st.integers(1, max_seqs), label="num_seqs")
    seqs = []
    kinds = ["decode"] if decode_only else ["decode", "prefill", "continuation"]
    for _ in range(num_seqs):
        seq_len = draw(st.integers(1, max_len), label="seq_len")
        kind = draw(st.sampled_from(kinds), label="kind")
        if kind == "decode":
            q = 1
        elif kind == "prefill":
            q = seq_len
        else:
            q = draw(st.integers(1, seq_len), label="query_len")
        seqs.append((seq_len, q))
    if configurations:
        cfg = draw(st.sampled_from(list(configurations)), label="configuration")
        on: Collection[str] = cfg.variants
        shape: dict = dict(
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            block_size=cfg.block_size,
            dtype=cfg.dtype,
        )
        fp8 = [_FP8_NAMES[cfg.kv_dtype]] if cfg.kv_dtype is not None else []
        if MLA in on or HEAD_DIM_V in on:
            shape.update(head_dim_v=cfg.head_dim_v, mla=MLA in on)
    else:
        num_kv_heads = draw(st.sampled_from([1, 2]), label="num_kv_heads")
        ratios = [r for r in gqa_ratios if r * num_kv_heads <= max_heads] or [min(gqa_ratios)]
        ratio = draw(st.sampled_from(ratios), label="gqa")
        block_size = draw(st.sampled_from(list(block_sizes)), label="block_size")
        on = [v for v in _SWITCHED if v in variants and draw(st.booleans(), label=f"use {v}")]
        if TREE_MASK in variants and not {"sliding_window", "alibi_slopes"} & set(on):
            if draw(st.booleans(), label="use tree_mask"):
                on.append(TREE_MASK)
        fp8 = sorted(set(_FP8) & set(variants))
        fp8 = [draw(st.sampled_from(fp8), label="kv_dtype")] if fp8 and draw(st.booleans(), label="use fp8") else []
        shape = dict(num_heads=num_kv_heads * ratio, num_kv_heads=num_kv_heads, block_size=block_size)
    layout = draw(st.sampled_from(["sequential", "permuted", "interleaved"]), label="layout")
    extra: dict = {}
    if "sliding_window" in on:
        extra["sliding_window"] = draw(st.integers(1, max(s for s, _ in seqs) + 1), label="sliding_window")
    if "logits_soft_cap" in on:
        extra["logits_soft_cap"] = draw(st.sampled_from([50.0, 5.0, 1.0]), label="logits_soft_cap")
    extra["alibi_slopes"] = "alibi_slopes" in on
    extra["sinks"] = "sinks" in on
    extra["tree_mask"] = TREE_MASK in on
    if fp8:
        extra["kv_dtype"] = _FP8[fp8[0]]
        if configurations:  # the configuration says whether its scales are per head
            per_head = PER_HEAD_SCALES in on
        else:
            per_head = PER_HEAD_SCALES in variants and draw(st.booleans(), label="per-head scales")
        if per_head:
            n = shape["num_kv_heads"]
            pick = st.sampled_from([0.25, 0.5, 1.0, 2.0, 0.37])
            extra["k_scale"] = tuple(draw(st.lists(pick, min_size=n, max_size=n), label="k_scale"))
            extra["v_scale"] = tuple(draw(st.lists(pick, min_size=n, max_size=n), label="v_scale"))
        else:
            extra["k_scale"] = draw(st.sampled_from([0.37, 2.5]), label="k_scale")
            extra["v_scale"] = draw(st.sampled_from([1.9, 0.3]), label="v_scale")
    if not configurations:
        shape["head_dim"] = draw(st.sampled_from(list(head_dims)), label="head_dim")
        shape["dtype"] = draw(st.sampled_from(list(dtypes)), label="dtype")
    scale = None if default_scale_only else draw(st.one_of(st.none(), st.floats(0.01, 1.0)), label="scale")
    return CaseSpec(
        family,
        tuple(seqs),
        layout=layout,
        scale=scale,
        query_gain=draw(st.sampled_from([0.5, 1.0, 2.0, 4.0]), label="query_gain"),
        **shape,
        **extra,
    )
