"""The core families' cases: decode, prefill, continuation, GQA, layouts, mixed batches, data movement.

Each builder takes a profile (``pagedattn.cases.grid``) and returns its family's cases for it,
the smaller profiles' included: ``quick`` sizes for the CPU, ``standard`` longer histories and
larger batches, ``thorough`` long contexts for a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

from pagedattn.cases.grid import BLOCK_SIZES, DTYPES, HEAD_DIMS
from pagedattn.cases.spec import CaseSpec

F32, F16, BF16 = DTYPES


def _decode(profile: str) -> list[CaseSpec]:
    out = []
    for dt in DTYPES:
        # a one-token history, a history one past a block, a longer one: in one batch
        out.append(CaseSpec("decode", ((1, 1), (17, 1), (70, 1)), dtype=dt))
        out.append(CaseSpec("decode", ((37, 1), (5, 1)), head_dim=80, block_size=13, dtype=dt))
        out.append(CaseSpec("decode", ((300, 1),), num_heads=8, num_kv_heads=2, head_dim=128, dtype=dt))
    out.append(CaseSpec("decode", ((45, 1), (64, 1)), scale=0.3, dtype=F32))
    for dt in (F32, BF16):  # histories that GPU kernels split across programs and merge
        out.append(CaseSpec("decode", ((1100, 1), (600, 1)), num_heads=8, head_dim=64, dtype=dt))
    if profile != "quick":
        for dt in DTYPES:
            out.append(CaseSpec("decode", tuple((L, 1) for L in (1, 511, 1024, 2048)), num_heads=8, dtype=dt))
            out.append(CaseSpec("decode", ((4000, 1),) * 2, num_heads=16, num_kv_heads=4, head_dim=128, dtype=dt))
    if profile == "thorough":
        for dt in DTYPES:
            out.append(CaseSpec("decode", ((32768, 1),), num_heads=8, num_kv_heads=1, head_dim=128, dtype=dt))
            out.append(CaseSpec("decode", ((16384, 1), (8191, 1)), num_heads=8, head_dim=128, dtype=dt))
    return out


def _prefill(profile: str) -> list[CaseSpec]:
    out = []
    for dt in DTYPES:
        out.append(CaseSpec("prefill", ((33, 33), (16, 16)), dtype=dt))
        out.append(CaseSpec("prefill", ((20, 20),), head_dim=96, block_size=3, dtype=dt))
    out.append(CaseSpec("prefill", ((1, 1), (48, 48)), scale=0.05, dtype=F32))
    # a value width of its own: MLA's prefill (uncompressed keys of 192 = 128 + 64 rotary,
    # values of 128, as DeepSeek V2/V3 compute a prompt); a kernel that sizes the output or
    # the value tile by the key's head dim fails it
    for dt in (F32, BF16):
        out.append(
            CaseSpec(
                "prefill", ((40, 40), (23, 23)), num_heads=8, num_kv_heads=8, head_dim=192, head_dim_v=128, dtype=dt
            )
        )
    if profile != "quick":
        for dt in DTYPES:
            out.append(CaseSpec("prefill", ((600, 600), (129, 129)), num_heads=8, head_dim=128, dtype=dt))
    if profile == "thorough":
        for dt in DTYPES:
            out.append(CaseSpec("prefill", ((4096, 4096),), num_heads=8, head_dim=128, dtype=dt))
    return out


def _continuation(profile: str) -> list[CaseSpec]:
    out = []
    for dt in DTYPES:
        out.append(CaseSpec("continuation", ((40, 7), (50, 25)), scale=0.3, dtype=dt))
        out.append(CaseSpec("continuation", ((64, 16), (17, 2)), head_dim=48, block_size=16, dtype=dt))
    for dt in (F16, BF16):  # a long history at half precision: where an accumulator kept in it shows
        out.append(CaseSpec("continuation", ((1600, 32),), num_heads=4, num_kv_heads=2, dtype=dt))
    out.append(  # chunked prefill with MLA's value width, over split-length histories
        CaseSpec(
            "continuation", ((700, 20), (90, 9)), num_heads=8, num_kv_heads=8, head_dim=192, head_dim_v=128, dtype=F16
        )
    )
    if profile != "quick":
        for dt in DTYPES:
            out.append(CaseSpec("continuation", ((1500, 300), (777, 77)), num_heads=8, head_dim=128, dtype=dt))
    if profile == "thorough":
        for dt in DTYPES:
            out.append(CaseSpec("continuation", ((18432, 2048),), num_heads=8, head_dim=128, dtype=dt))
    return out


def _gqa(profile: str) -> list[CaseSpec]:
    out = []
    for ratio in (1, 2, 4, 8):
        for dt in (F32, BF16):
            out.append(CaseSpec("gqa", ((23, 1), (30, 5)), num_heads=2 * ratio, num_kv_heads=2, dtype=dt))
    for dt in DTYPES:  # MQA: a single kv head
        out.append(CaseSpec("gqa", ((23, 1), (30, 5)), num_heads=8, num_kv_heads=1, dtype=dt))
    if profile != "quick":
        for dt in DTYPES:
            out.append(CaseSpec("gqa", ((900, 1), (700, 64)), num_heads=32, num_kv_heads=4, head_dim=128, dtype=dt))
    return out


def _layout(profile: str) -> list[CaseSpec]:
    out = []
    for dt in DTYPES:
        for layout in ("permuted", "interleaved"):
            out.append(CaseSpec("layout", ((40, 1), (35, 9), (20, 20)), block_size=4, layout=layout, dtype=dt))
        out.append(CaseSpec("layout", ((40, 1), (37, 5)), block_size=8, layout="shared", shared_blocks=3, dtype=dt))
    for bs in BLOCK_SIZES:
        for dt in (F32, F16) if bs in (1, 13) else (BF16,):
            out.append(
                CaseSpec("layout", ((3 * bs + 1, 1), (2 * bs + 3, 3)), block_size=bs, layout="permuted", dtype=dt)
            )
    for dt in DTYPES:  # history ending exactly on a block boundary, and one past it
        out.append(CaseSpec("layout", ((32, 1), (48, 4)), block_size=16, dtype=dt, tag="boundary"))
        out.append(CaseSpec("layout", ((33, 1), (49, 4)), block_size=16, dtype=dt, tag="boundary+1"))
    for d in HEAD_DIMS:
        out.append(CaseSpec("layout", ((19, 1), (12, 4)), head_dim=d, layout="permuted", dtype=BF16 if d % 32 else F32))
    if profile != "quick":
        for dt in DTYPES:
            for d in HEAD_DIMS:
                out.append(
                    CaseSpec("layout", ((300, 1), (200, 30)), head_dim=d, block_size=16, layout="permuted", dtype=dt)
                )
    return out


def _mixed(profile: str) -> list[CaseSpec]:
    out = []
    for dt in DTYPES:  # decode, continuation and full prefill in one batch
        out.append(CaseSpec("mixed", ((50, 1), (24, 24), (41, 6), (9, 1)), layout="permuted", dtype=dt))
    if profile != "quick":
        for dt in DTYPES:
            out.append(
                CaseSpec(
                    "mixed",
                    ((2000, 1), (256, 256), (1000, 100), (3, 1), (513, 1)),
                    num_heads=8,
                    head_dim=128,
                    layout="permuted",
                    dtype=dt,
                )
            )
    return out


def _data_movement(family: str, profile: str) -> list[CaseSpec]:
    """Gather and cache-write cases: the layouts that break address arithmetic."""
    out = []
    for dt in DTYPES:
        for bs, layout in ((1, "permuted"), (3, "interleaved"), (16, "permuted"), (13, "sequential")):
            out.append(CaseSpec(family, ((40, 1), (29, 3)), block_size=bs, layout=layout, dtype=dt))
    out.append(CaseSpec(family, ((40, 1), (37, 5)), block_size=8, layout="shared", shared_blocks=2, dtype=F16))
    if profile != "quick":
        for dt in DTYPES:
            out.append(CaseSpec(family, ((3000, 1), (1000, 7)), num_heads=8, head_dim=128, layout="permuted", dtype=dt))
    return out


BUILDERS: dict[str, Callable[[str], list[CaseSpec]]] = {
    "decode": _decode,
    "prefill": _prefill,
    "continuation": _continuation,
    "gqa": _gqa,
    "layout": _layout,
    "mixed": _mixed,
    "gather": lambda p: _data_movement("gather", p),
    "cache_write": lambda p: _data_movement("cache_write", p),
}
