"""The variant families' cases: one family per attention variant, and their combinations.

Each family holds the cases that caught a shipped bug of its kind: histories long enough that
the decode launch splits them (a window or a sink handled in one split only), windows ending on
and across block edges (off by one), masked keys in every tile (a cap applied after the mask
turns -inf into -c), scales far from 1.0 (ignored).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pagedattn.cases.grid import DTYPES
from pagedattn.cases.spec import CaseSpec

F32, F16, BF16 = DTYPES
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
SPLIT = ((1100, 1), (600, 1))  # decode histories over the Triton kernel's 512-key split


def _sliding_window(profile: str) -> list[CaseSpec]:
    out = []
    for dt in DTYPES:
        # prefill and a continuation: every row's window starts somewhere else
        out.append(CaseSpec("sliding_window", ((40, 40), (50, 9)), block_size=4, sliding_window=8, dtype=dt))
        # decode: W = 1 (only itself), W on a block edge, W longer than the history
        out.append(CaseSpec("sliding_window", ((33, 1), (40, 1), (5, 1)), block_size=16, sliding_window=16, dtype=dt))
    out.append(CaseSpec("sliding_window", ((20, 1), (9, 3)), block_size=3, sliding_window=1, dtype=F32, tag="self"))
    out.append(CaseSpec("sliding_window", ((20, 1), (9, 9)), sliding_window=64, dtype=F16, tag="wide"))
    for dt in (F32, BF16):  # a window ending inside a split, and one starting several splits in
        out.append(CaseSpec("sliding_window", SPLIT, num_heads=8, sliding_window=700, dtype=dt))
        out.append(CaseSpec("sliding_window", SPLIT, num_heads=8, sliding_window=77, dtype=dt))
    out.append(
        CaseSpec(
            "sliding_window",
            ((70, 13),),
            num_heads=8,
            num_kv_heads=1,
            head_dim=80,
            block_size=13,
            layout="permuted",
            sliding_window=30,
            dtype=BF16,
        )
    )
    if profile != "quick":
        for dt in DTYPES:
            out.append(
                CaseSpec(
                    "sliding_window",
                    ((4000, 1), (3000, 300), (600, 600)),
                    num_heads=16,
                    num_kv_heads=4,
                    head_dim=128,
                    layout="permuted",
                    sliding_window=1024,
                    dtype=dt,
                )
            )
    if profile == "thorough":
        for dt in DTYPES:
            out.append(
                CaseSpec(
                    "sliding_window",
                    ((32768, 1), (8192, 8192)),
                    num_heads=8,
                    num_kv_heads=1,
                    head_dim=128,
                    sliding_window=4096,
                    dtype=dt,
                )
            )
    return out


def _logits_soft_cap(profile: str) -> list[CaseSpec]:
    out = []
    for dt in DTYPES:
        # a realistic cap (Gemma 2 uses 50) on a prefill, and a small one the scores saturate
        out.append(CaseSpec("logits_soft_cap", ((33, 33), (40, 7)), logits_soft_cap=50.0, query_gain=8.0, dtype=dt))
        out.append(
            CaseSpec(
                "logits_soft_cap", ((24, 24), (45, 1)), block_size=8, logits_soft_cap=2.5, query_gain=4.0, dtype=dt
            )
        )
    for dt in (F32, BF16):
        out.append(CaseSpec("logits_soft_cap", SPLIT, num_heads=8, logits_soft_cap=5.0, query_gain=4.0, dtype=dt))
    if profile != "quick":
        for dt in DTYPES:
            out.append(
                CaseSpec(
                    "logits_soft_cap",
                    ((2000, 1), (700, 700)),
                    num_heads=16,
                    num_kv_heads=8,
                    head_dim=128,
                    logits_soft_cap=30.0,
                    query_gain=8.0,
                    dtype=dt,
                )
            )
    return out


def _alibi_slopes(profile: str) -> list[CaseSpec]:
    out = []
    for dt in DTYPES:
        out.append(CaseSpec("alibi_slopes", ((33, 33), (40, 7), (17, 1)), num_heads=8, alibi_slopes=True, dtype=dt))
    for dt in (F32, BF16):
        out.append(CaseSpec("alibi_slopes", SPLIT, num_heads=8, alibi_slopes=True, dtype=dt))
    out.append(
        CaseSpec("alibi_slopes", ((30, 4),), num_heads=8, num_kv_heads=1, block_size=3, alibi_slopes=True, dtype=F32)
    )
    if profile != "quick":
        for dt in DTYPES:
            out.append(
                CaseSpec(
                    "alibi_slopes",
                    ((3000, 1), (900, 900)),
                    num_heads=16,
                    num_kv_heads=16,
                    head_dim=128,
                    alibi_slopes=True,
                    dtype=dt,
                )
            )
    return out


def _sinks(profile: str) -> list[CaseSpec]:
    out = []
    for dt in DTYPES:
        out.append(CaseSpec("sinks", ((33, 33), (40, 7), (17, 1)), num_heads=8, sinks=True, dtype=dt))
    for dt in (F32, BF16):  # the sink must join the softmax once, not once per split
        out.append(CaseSpec("sinks", SPLIT, num_heads=8, sinks=True, dtype=dt))
    out.append(CaseSpec("sinks", ((1, 1), (2, 1)), num_heads=4, num_kv_heads=1, sinks=True, dtype=F32, tag="short"))
    if profile != "quick":
        for dt in DTYPES:
            out.append(
                CaseSpec(
                    "sinks", ((4000, 1), (1000, 1000)), num_heads=64, num_kv_heads=8, head_dim=64, sinks=True, dtype=dt
                )
            )
    return out


def _fp8(profile: str) -> list[CaseSpec]:
    out = []
    scales: dict[str, Any] = dict(k_scale=0.37, v_scale=1.9)  # not 1.0, not each other: ignored or swapped scales show
    for dt in DTYPES:
        out.append(CaseSpec("fp8", ((33, 33), (40, 7), (17, 1)), kv_dtype=E4M3, dtype=dt, **scales))
    out.append(CaseSpec("fp8", ((40, 1), (25, 25)), kv_dtype=E5M2, dtype=BF16, **scales))
    out.append(CaseSpec("fp8", ((40, 1), (25, 25)), kv_dtype=E5M2, dtype=F16, k_scale=3.0, v_scale=0.25))
    for dt in (F32, BF16):
        out.append(CaseSpec("fp8", SPLIT, num_heads=8, kv_dtype=E4M3, dtype=dt, **scales))
    out.append(
        CaseSpec("fp8", ((30, 5),), head_dim=80, block_size=13, layout="permuted", kv_dtype=E4M3, dtype=BF16, **scales)
    )
    # per-head scales: distinct per kv head, keys' and values' in another order, so that one
    # head's scales applied to every head, or a head's swapped with another's, shows
    per_head: dict[str, Any] = dict(k_scale=(0.5, 1.0, 2.0, 0.25), v_scale=(2.0, 0.25, 0.5, 1.0))
    for dt, kv in ((F32, E4M3), (BF16, E4M3), (F16, E5M2)):
        out.append(
            CaseSpec(
                "fp8", ((33, 33), (40, 1), (20, 7)), num_heads=8, num_kv_heads=4, kv_dtype=kv, dtype=dt, **per_head
            )
        )
    if profile != "quick":
        for dt in (F16, BF16):
            out.append(
                CaseSpec(
                    "fp8",
                    ((1500, 1), (600, 600)),
                    num_heads=16,
                    num_kv_heads=4,
                    head_dim=128,
                    layout="permuted",
                    kv_dtype=E4M3,
                    dtype=dt,
                    **per_head,
                )
            )
        for dt in (F16, BF16):
            for kv in (E4M3, E5M2):
                out.append(
                    CaseSpec(
                        "fp8",
                        ((4000, 1), (1000, 100), (600, 600)),
                        num_heads=32,
                        num_kv_heads=8,
                        head_dim=128,
                        layout="permuted",
                        kv_dtype=kv,
                        dtype=dt,
                        **scales,
                    )
                )
    return out


def _lse(profile: str) -> list[CaseSpec]:
    out = []
    for dt in DTYPES:
        out.append(CaseSpec("lse", ((33, 33), (40, 7), (17, 1)), dtype=dt))
    for dt in (F32, BF16):  # split decode: the merged lse
        out.append(CaseSpec("lse", SPLIT, num_heads=8, dtype=dt))
    # variants change the lse: the sink joins it; ALiBi's (j - p) shifts it (the output cannot see
    # a bias measured from the wrong origin, the lse can)
    out.append(CaseSpec("lse", ((40, 7), (1100, 1)), num_heads=8, sinks=True, dtype=F32))
    out.append(CaseSpec("lse", ((40, 7), (1100, 1)), num_heads=8, alibi_slopes=True, dtype=F32))
    out.append(CaseSpec("lse", ((40, 40), (1100, 1)), sliding_window=20, logits_soft_cap=5.0, dtype=BF16))
    if profile != "quick":
        for dt in DTYPES:
            out.append(CaseSpec("lse", ((4000, 1), (700, 700)), num_heads=16, num_kv_heads=4, head_dim=128, dtype=dt))
    return out


#: every pair of variants that shipped kernels combine, one small case each (the real models'
#: combinations above cover window+sinks and window+soft-cap): a kernel that drops one variant
#: when the other is on fails its case (vLLM's prefix_prefill ignores the window under ALiBi;
#: its unified attention measures ALiBi from the chunk start, which only sinks expose)
PAIRS: tuple[dict[str, Any], ...] = (
    dict(dtype=F32, alibi_slopes=True, sliding_window=20),
    dict(dtype=BF16, alibi_slopes=True, sinks=True),  # bf16: the properties run it (ALiBi nowhere else there)
    dict(dtype=F16, alibi_slopes=True, logits_soft_cap=5.0, query_gain=4.0),
    dict(dtype=F32, logits_soft_cap=5.0, sinks=True, query_gain=4.0),
    dict(dtype=F16, kv_dtype=E4M3, sliding_window=24, k_scale=0.37, v_scale=1.9),
    dict(dtype=F16, kv_dtype=E4M3, logits_soft_cap=5.0, query_gain=4.0, k_scale=0.37, v_scale=1.9),
    dict(dtype=F32, kv_dtype=E5M2, alibi_slopes=True, k_scale=3.0, v_scale=0.25),
    dict(dtype=F16, kv_dtype=E4M3, sinks=True, k_scale=0.37, v_scale=1.9),
)


def _combined(profile: str) -> list[CaseSpec]:
    """What real models ship together, and every pair of variants shipped kernels combine."""
    out = []
    for dt in DTYPES:
        # gpt-oss: GQA 8:1, head_dim 64, a 128-key window and sinks (on alternate layers)
        out.append(
            CaseSpec(
                "combined",
                ((300, 1), (150, 150), (200, 20)),
                num_heads=16,
                num_kv_heads=2,
                block_size=16,
                layout="permuted",
                sliding_window=128,
                sinks=True,
                dtype=dt,
            )
        )
        # Gemma 2: soft-capped scores in a sliding window
        out.append(
            CaseSpec(
                "combined",
                ((100, 1), (60, 60), (90, 11)),
                num_heads=8,
                num_kv_heads=4,
                head_dim=128,
                sliding_window=32,
                logits_soft_cap=50.0,
                query_gain=8.0,
                dtype=dt,
            )
        )
    for dt in (F16, BF16):  # a quantized cache under a window with sinks
        out.append(
            CaseSpec(
                "combined",
                SPLIT,
                num_heads=8,
                sliding_window=600,
                sinks=True,
                kv_dtype=E4M3,
                k_scale=0.37,
                v_scale=1.9,
                dtype=dt,
            )
        )
    # a decode row and a continuation with context; histories many windows long, and the
    # small ALiBi slopes (down to 2^-8 with 8 heads) leave far keys a real share, so a
    # dropped window shows in every row. Few in bf16: the properties run every bf16 case
    for pair in PAIRS:
        out.append(CaseSpec("combined", ((200, 1), (90, 30)), num_heads=8, num_kv_heads=2, **pair))
    if profile != "quick":
        for dt in DTYPES:
            out.append(
                CaseSpec(
                    "combined",
                    ((8000, 1), (2000, 2000), (3000, 100)),
                    num_heads=64,
                    num_kv_heads=8,
                    layout="permuted",
                    sliding_window=128,
                    sinks=True,
                    dtype=dt,
                )
            )
    return out


#: DeepSeek V2/V3's absorbed MLA: one latent kv head of 576 (512 compressed + 64 rotary), the
#: value its first 512 columns, softmax scale 1/sqrt(192) with YaRN's mscale (not 576 ** -0.5)
MLA_SHAPE: dict[str, Any] = dict(num_kv_heads=1, head_dim=576, head_dim_v=512, mla=True, scale=0.1352)


def _mla(profile: str) -> list[CaseSpec]:
    """The page sizes of the kernels that ship it (FlashMLA 64, vLLM 16 and more, SGLang's token
    pool 1), histories over a decode split, multi-token verification (MTP), and 16 and 128 query
    heads (DeepSeek V2-Lite and V3 per tensor-parallel rank). A kernel that reads the value from
    the wrong columns, or drops the rotary part of the score, fails every case."""
    out = []
    for dt, bs in ((BF16, 64), (F16, 16), (F32, 1)):
        out.append(CaseSpec("mla", ((300, 1), (77, 1), (1100, 1)), num_heads=16, block_size=bs, dtype=dt, **MLA_SHAPE))
    out.append(CaseSpec("mla", ((200, 2), (100, 4)), num_heads=16, block_size=64, dtype=BF16, **MLA_SHAPE))
    out.append(CaseSpec("mla", ((90, 30),), num_heads=16, block_size=16, layout="permuted", dtype=BF16, **MLA_SHAPE))
    out.append(CaseSpec("mla", ((500, 1), (64, 1)), num_heads=128, block_size=64, dtype=BF16, **MLA_SHAPE))
    # an fp8 latent cache, one scale for the shared rows
    out.append(
        CaseSpec(
            "mla",
            ((300, 1), (40, 1)),
            num_heads=16,
            block_size=64,
            kv_dtype=E4M3,
            k_scale=0.37,
            v_scale=0.37,
            dtype=BF16,
            **MLA_SHAPE,
        )
    )
    if profile != "quick":
        for dt in (F16, BF16):
            out.append(
                CaseSpec(
                    "mla",
                    ((4000, 1), (2000, 1), (700, 1), (33, 1)),
                    num_heads=128,
                    block_size=64,
                    layout="permuted",
                    dtype=dt,
                    **MLA_SHAPE,
                )
            )
            out.append(CaseSpec("mla", ((3000, 4), (1000, 2)), num_heads=16, block_size=16, dtype=dt, **MLA_SHAPE))
    if profile == "thorough":
        out.append(CaseSpec("mla", ((32768, 1), (8192, 1)), num_heads=16, block_size=64, dtype=BF16, **MLA_SHAPE))
    return out


def _tree_mask(profile: str) -> list[CaseSpec]:
    """Draft trees verified over a history: branching trees (a chain would equal causal), a
    decode row beside them, trees across block edges and a decode split, and the variants that
    engines run speculative decoding with (soft-cap, sinks, an fp8 cache). A kernel that reads
    the mask as causal, transposes it, or applies it to the history fails."""
    out = []
    for dt in DTYPES:
        out.append(CaseSpec("tree_mask", ((40, 8), (30, 5), (17, 1)), tree_mask=True, dtype=dt))
    for dt in (F32, BF16):
        out.append(CaseSpec("tree_mask", ((1100, 16), (600, 7)), num_heads=8, tree_mask=True, dtype=dt))
    out.append(CaseSpec("tree_mask", ((70, 26), (45, 13)), block_size=13, layout="permuted", tree_mask=True, dtype=F16))
    out.append(CaseSpec("tree_mask", ((64, 64),), num_heads=8, num_kv_heads=1, block_size=1, tree_mask=True, dtype=F32))
    # trees past 64 tokens: a kernel that holds a row's bits in one 64-bit word loses the rest
    out.append(CaseSpec("tree_mask", ((230, 100), (140, 70), (20, 1)), tree_mask=True, dtype=BF16))
    out.append(
        CaseSpec("tree_mask", ((200, 10), (90, 6)), logits_soft_cap=5.0, query_gain=4.0, tree_mask=True, dtype=F16)
    )
    out.append(CaseSpec("tree_mask", ((200, 10), (90, 6)), num_heads=8, sinks=True, tree_mask=True, dtype=BF16))
    out.append(
        CaseSpec("tree_mask", ((200, 10), (90, 6)), kv_dtype=E4M3, k_scale=0.37, v_scale=1.9, tree_mask=True, dtype=F16)
    )
    if profile != "quick":
        for dt in (F16, BF16):
            out.append(
                CaseSpec(
                    "tree_mask",
                    ((4000, 64), (1500, 32), (300, 1)),
                    num_heads=32,
                    num_kv_heads=8,
                    head_dim=128,
                    layout="permuted",
                    tree_mask=True,
                    dtype=dt,
                )
            )
    return out


BUILDERS: dict[str, Callable[[str], list[CaseSpec]]] = {
    "sliding_window": _sliding_window,
    "logits_soft_cap": _logits_soft_cap,
    "alibi_slopes": _alibi_slopes,
    "sinks": _sinks,
    "fp8": _fp8,
    "lse": _lse,
    "combined": _combined,
    "mla": _mla,
    "tree_mask": _tree_mask,
}
