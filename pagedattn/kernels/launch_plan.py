"""The Triton kernel's launch plan: which launch each sequence takes, its tiles and its split
of the history, the decode launch's shape, the grids. Plain Python from sizes alone, tested
on any machine; nothing here imports triton."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pagedattn.indexing import next_power_of_2
from pagedattn.kernels.checks import INT32_MAX, OWNER
from pagedattn.kernels.decode_splits import decode_fold, decode_launch_shape, decode_work
from pagedattn.kernels.tuning import TUNING, KernelTuning
from pagedattn.validation import FP8_DTYPES, ProblemError

#: tl.dot needs every dimension >= 16 on NVIDIA GPUs (the interpreter accepts less).
MIN_DOT = 16

#: the most keys a tree-masked tile may hold: its keys fall in at most two of a row's 64-bit
#: words, the two the kernels load a row a masked tile (``triton_tiles._tree_visible``)
TREE_TILE_KEYS = 64
#: a CUDA grid's second and third dimensions hold at most this many programs
GRID_YZ_MAX = 65535


@dataclass(frozen=True)
class LaunchConfig:
    """Every meta-parameter and the grid of one attention launch."""

    grid: tuple[int, int, int]
    GROUP: int
    GROUP_PAD: int
    BLOCK_Q: int
    BLOCK_N: int
    HEAD_DIM: int
    HEAD_DIM_PAD: int
    BLOCK_SIZE: int
    UPCAST: bool  # bf16 on the interpreter: tiles widened to fp32 after their load (see the kernels)
    SPLIT_SIZE: int = 0  # decode launches: keys per split (0: no split) ...
    SPLIT_LONG: int = 0  # ... and per split of a history of at least LONG_FROM keys
    LONG_FROM: int = 0
    SPLIT_SHORT: int = 0  # ... and per split of a history shorter than SHORT_UNDER keys (0: none)
    SHORT_UNDER: int = 0
    FLAT_GRID: bool = False  # decode: one grid axis, kv heads fastest, where three axes cannot hold it
    SPLIT_LOOP: bool = False  # decode: programs walk their splits in one loop (``decode_launch_shape``) ...
    SPLITS_PER_PROGRAM: int = 1  # ... consecutive splits a program takes (a launch shape: the same bits) ...
    SPLIT_GROUPS: int = 0  # ... and the programs of a sequence and kv head, ceil(max_splits / SPLITS_PER_PROGRAM)
    SPLIT_WHOLE: bool = False  # decode: a program walks every split of its sequence and merges them in its loop
    FOLD_PARTS: int = 0  # decode: the merge folds each history's splits in this many parts, then the parts
    LOOP_PARTS: bool = False  # decode: split-loop programs fold their parts in their loop (whole parts each)
    HEAD_DIM_V: int = 0  # the value's columns (MLA: the latent columns of a cache row, a power of two) ...
    HEAD_DIM_V_PAD: int = 0  # ... padded: the accumulator's, the output tile's and the decode scratch's width
    ROPE_PAD: int = 0  # MLA decode: the rest of the row (the rotary columns), padded to a power of two ...
    HEAD_BLOCKS: int = 0  # ... and the blocks of GROUP_PAD query heads a kv head's group takes
    num_warps: int = 4
    num_stages: int = 2
    maxnreg: int | None = None  # a register cap per thread (more programs an SM), or the compiler's choice

    @property
    def rows(self) -> int:
        return self.BLOCK_Q * self.GROUP_PAD

    @property
    def launch_options(self) -> dict[str, int]:
        """The launch's compile options (``num_warps``, ``num_stages``, ``maxnreg`` when set)."""
        opts = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.maxnreg is not None:
            opts["maxnreg"] = self.maxnreg
        return opts


@dataclass(frozen=True)
class LaunchPlan:
    """How one batch is launched.

    Sequences with one new token (decode) and the others (prefill, continuation) go to
    two launches with their own tile shapes. Which launch a sequence takes, its tiles
    and its split of the history depend on that sequence alone, never on the batch, so
    a sequence computes the same bits alone or in any batch. The launch's shape follows
    the batch: its grid, and for decode the split loop, the splits a program takes, whether a
    program merges its whole sequence in its loop (``SPLIT_WHOLE``), whether programs fold the
    merge's parts in their loop (``LOOP_PARTS``), the scratch's size and the register caps
    (``decode_launch_shape``); none of them changes a bit (``test_launch_shape_changes_no_bit``).
    """

    decode_seqs: list[int]
    other_seqs: list[int]
    decode: LaunchConfig | None
    other: LaunchConfig | None
    max_splits: int  # splits of the longest decode history
    mla: bool = False  # both launches are the MLA kernel's (a shared latent cache)
    other_splits: int = 0  # MLA: splits of the longest history of the multi-token launch

    @property
    def scratch_splits(self) -> int:
        """Splits the decode scratch holds a sequence: none stored where every program merges
        its whole sequence in its loop (one, so the kernel's arguments keep their shape)."""
        return 1 if self.decode is not None and self.decode.SPLIT_WHOLE else self.max_splits


def plan_launch(
    seq_lens: list[int],
    query_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    interpreter: bool,
    kv_dtype: torch.dtype | None = None,
    sliding_window: int | None = None,
    tuning: KernelTuning = TUNING,
    *,
    head_dim_v: int | None = None,
    shared_kv: bool = False,
) -> LaunchPlan:
    """The launches of one batch, from sizes alone (``kv_dtype``: the cache's dtype, ``None``
    for the query dtype; an fp8 cache takes its own decode launch shapes and register cap;
    ``sliding_window``: the keys a decode token sees, which set how much work each of its
    splits has, a launch shape only; ``tuning``: the tile and split sizes and thresholds).

    ``head_dim_v``: the value's width (``None``: ``head_dim``); with ``shared_kv`` the value is
    the key row's first ``head_dim_v`` columns (MLA's latent cache), whose decode takes the
    MLA kernel (``plan_mla``)."""
    if shared_kv:
        assert head_dim_v is not None, "a shared latent cache has a value width"
        return plan_mla(
            seq_lens, query_lens, num_heads, num_kv_heads, head_dim, head_dim_v, block_size, dtype, interpreter, tuning
        )
    dv = head_dim if head_dim_v is None else head_dim_v
    group = num_heads // num_kv_heads
    group_pad = next_power_of_2(group)
    # the tile and register rules below read the wider of the key's and the value's widths
    d_pad = max(MIN_DOT, next_power_of_2(max(head_dim, dv)))
    common: dict[str, Any] = dict(
        GROUP=group,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(MIN_DOT, next_power_of_2(head_dim)),
        HEAD_DIM_V=dv,
        HEAD_DIM_V_PAD=max(MIN_DOT, next_power_of_2(dv)),
        BLOCK_SIZE=block_size,
        UPCAST=interpreter and dtype == torch.bfloat16,
    )
    decode_seqs = [b for b, q in enumerate(query_lens) if q == 1]
    other_seqs = [b for b, q in enumerate(query_lens) if q > 1]
    decode = other = None
    max_splits = 0
    if decode_seqs:
        lens = [seq_lens[b] for b in decode_seqs]
        decode, max_splits = _plan_decode(
            lens,
            num_heads,
            num_kv_heads,
            group_pad,
            d_pad,
            dtype,
            interpreter,
            kv_dtype,
            sliding_window,
            tuning,
            common,
        )
    if other_seqs:
        max_q = max(query_lens[b] for b in other_seqs)
        other = _plan_prefill(
            len(other_seqs), max_q, num_kv_heads, group, group_pad, d_pad, dtype, interpreter, tuning, common
        )
    return LaunchPlan(decode_seqs, other_seqs, decode, other, max_splits)


def _plan_decode(
    lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    group_pad: int,
    d_pad: int,
    dtype: torch.dtype,
    interpreter: bool,
    kv_dtype: torch.dtype | None,
    sliding_window: int | None,
    tuning: KernelTuning,
    common: dict[str, Any],
) -> tuple[LaunchConfig, int]:
    """The decode launch of histories of ``lens`` keys, and the most splits one has. One query
    row a head: the group is padded to the dot minimum; each history is split so that a single
    long one still fills the GPU, and the splits are merged by log-sum-exp. A long history takes
    longer splits (fewer partial states, still enough programs): the split reads that history's
    length only."""
    kv_fp8 = kv_dtype in FP8_DTYPES
    per_len = {n: decode_work(n, sliding_window, tuning) for n in set(lens)}  # batches repeat lengths
    work = [per_len[n] for n in lens]
    max_splits = max(n for n, _, _ in work)
    block_n = decode_block_n(dtype, interpreter, tuning)
    # the split loop walks a program's splits as whole tiles: every split size the tuning
    # can give, whatever this batch's histories (so no batch fails where another passes)
    sizes = {tuning.split_size, tuning.split_long} | ({tuning.split_short} if tuning.short_under else set())
    for size in sorted(sizes):
        if size % block_n:
            raise RuntimeError(f"paged_attention: decode splits of {size} keys are not whole tiles of {block_n}")
    # the register caps are sized for 16-bit queries and head_dim <= 128 (wider tiles would
    # spill); the whole-sequence cap also for a GQA group padded to at most 16 rows, and not
    # over an fp8 cache (which has its own cap, the one its launch-shape rule is measured at)
    narrow = dtype != torch.float32 and d_pad <= 128
    cap_ok = narrow and (kv_fp8 or group_pad <= MIN_DOT)
    split_loop, spp, whole_capped = decode_launch_shape(work, num_kv_heads, kv_fp8, cap_ok, tuning)
    # an fp8 cache's decode runs at its register cap where the launch outgrows a wave
    capped = kv_fp8 and narrow and len(lens) * num_kv_heads * max_splits > tuning.decode_wave
    groups = -(-max_splits // spp)
    whole = split_loop and groups == 1
    # programs that fold whole parts in their loop: where every history's parts divide the
    # programs' splits (else every program stores its splits, and the merge folds the parts);
    # a launch-wide choice, so programs holding no part state keep their registers
    folds = {decode_fold(n, tuning) for n, _, _ in per_len.values()}
    loop_parts = split_loop and not whole and max(folds) > 1 and all(spp % f == 0 for f in folds)
    # the scratch ([n_decode, splits, num_heads, HEAD_DIM_V_PAD] fp32; one split where the
    # programs merge in their loop and store none) is addressed in int32; its size also
    # bounds the decode grid's one axis
    scratch = len(lens) * (1 if whole else max_splits) * num_heads * common["HEAD_DIM_V_PAD"]
    if scratch > INT32_MAX:
        raise ProblemError(
            OWNER,
            "seq_lens",
            f"{len(lens)} decode sequences of up to {max_splits} splits need a scratch of "
            f"{scratch} elements; at most 2**31 - 1 (int32 offsets)",
        )
    flat, grid = decode_grid(len(lens), groups, num_kv_heads)
    decode = LaunchConfig(
        grid=grid,
        FLAT_GRID=flat,
        SPLIT_LOOP=split_loop,
        SPLITS_PER_PROGRAM=spp,
        SPLIT_GROUPS=groups,
        SPLIT_WHOLE=whole,
        FOLD_PARTS=tuning.decode_fold_parts,
        LOOP_PARTS=loop_parts,
        GROUP_PAD=max(MIN_DOT, group_pad),
        BLOCK_Q=1,
        BLOCK_N=block_n,
        SPLIT_SIZE=tuning.split_size,
        SPLIT_LONG=tuning.split_long,
        LONG_FROM=tuning.long_from,
        SPLIT_SHORT=tuning.split_short,
        SHORT_UNDER=tuning.short_under,
        maxnreg=tuning.fp8_decode_maxnreg if capped else (tuning.decode_whole_maxnreg if whole_capped else None),
        num_warps=tuning.decode_warps,
        num_stages=2 if dtype == torch.float32 and d_pad > 128 else tuning.decode_stages,
        **common,
    )
    return decode, max_splits


def _plan_prefill(
    n_seqs: int,
    max_q: int,
    num_kv_heads: int,
    group: int,
    group_pad: int,
    d_pad: int,
    dtype: torch.dtype,
    interpreter: bool,
    tuning: KernelTuning,
    common: dict[str, Any],
) -> LaunchConfig:
    """The prefill launch (``common``: the fields both launches share) for ``n_seqs``
    sequences of at most ``max_q`` new tokens. fp32 tiles are twice the bytes and run on the
    FMA units, where the compiler unrolls them: their own, smaller tiles keep compile time
    down (larger on the interpreter, which compiles nothing)."""
    wide = dtype == torch.float32
    if interpreter:
        fp32_rows, fp32_n = tuning.fp32_tile_interpreter, tuning.fp32_tile_interpreter
    else:
        fp32_rows, fp32_n = tuning.fp32_prefill_rows, tuning.fp32_block_n
    rows = max(fp32_rows if wide else tuning.prefill_rows, group_pad, MIN_DOT)
    block_q = rows // group_pad
    block_n = fp32_n if wide else tuning.prefill_block_n
    stages = tuning.prefill_stages if not wide else 2
    # a deeper pipeline only where its K/V buffers fit beside the query tile (16-bit tiles;
    # head_dim 256 keeps 2 stages); the compile test checks the launch limit
    if stages > 2 and (rows + 2 * stages * block_n) * d_pad * 2 > tuning.prefill_shared_budget:
        stages = 2
    q_tiles = -(-max_q // block_q)
    if q_tiles > GRID_YZ_MAX:  # CUDA's grid: 65535 programs on its second axis
        raise ProblemError(
            OWNER,
            "query_start_loc",
            f"a query of {max_q} tokens needs {q_tiles} tiles of {block_q} tokens "
            f"(GQA group {group}, {dtype}); a launch holds at most {GRID_YZ_MAX}",
        )
    return LaunchConfig(
        grid=(n_seqs, q_tiles, num_kv_heads),
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        # the tuned rule: eight warps for tiles of >= 128 rows of head_dim > 64, else four
        num_warps=8 if block_q * group_pad >= 128 and d_pad > 64 else 4,
        num_stages=stages,
        **common,
    )


def plan_mla(
    seq_lens: list[int],
    query_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    head_dim_v: int,
    block_size: int,
    dtype: torch.dtype,
    interpreter: bool,
    tuning: KernelTuning = TUNING,
) -> LaunchPlan:
    """The launches of a batch over a shared latent cache (MLA, ``triton_mla_decode``): rows of
    ``head_dim`` columns whose first ``head_dim_v`` (a power of two, >= 16) are the value. Decode
    sequences take one launch (one token a program), the others a second one (``BLOCK_Q``
    tokens a program, causal or tree-masked), each sequence's tiles and splits from its own
    sizes alone."""
    if head_dim_v < MIN_DOT or head_dim_v & (head_dim_v - 1) or head_dim_v >= head_dim:
        raise ProblemError(
            OWNER,
            "value_cache",
            f"must have a power-of-two head_dim_v >= {MIN_DOT} below head_dim {head_dim} over a shared "
            f"latent cache (MLA), got {head_dim_v}",
        )
    group = num_heads // num_kv_heads
    block_h = min(tuning.mla_block_h, max(MIN_DOT, next_power_of_2(group)))
    head_blocks = -(-group // block_h)
    decode_seqs = [b for b, q in enumerate(query_lens) if q == 1]
    other_seqs = [b for b, q in enumerate(query_lens) if q > 1]
    common: dict[str, Any] = dict(
        GROUP=group,
        GROUP_PAD=block_h,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_v + max(MIN_DOT, next_power_of_2(head_dim - head_dim_v)),  # a row's loaded columns
        HEAD_DIM_V=head_dim_v,
        HEAD_DIM_V_PAD=head_dim_v,
        ROPE_PAD=max(MIN_DOT, next_power_of_2(head_dim - head_dim_v)),
        HEAD_BLOCKS=head_blocks,
        BLOCK_SIZE=block_size,
        UPCAST=interpreter and dtype == torch.bfloat16,
        SPLIT_SIZE=tuning.split_size,
        SPLIT_LONG=tuning.split_long,
        LONG_FROM=tuning.long_from,
        SPLIT_SHORT=tuning.split_short,
        SHORT_UNDER=tuning.short_under,
        num_stages=tuning.mla_stages,
    )
    wide = dtype == torch.float32
    block_n = decode_block_n(dtype, interpreter, tuning) if wide else tuning.mla_block_n
    decode = other = None
    max_splits = other_splits = 0
    if decode_seqs:
        max_splits = _mla_splits(
            [seq_lens[b] for b in decode_seqs], [1] * len(decode_seqs), num_heads, head_dim_v, tuning
        )
        grid = (num_kv_heads * head_blocks, max_splits, len(decode_seqs))
        decode = LaunchConfig(grid=grid, BLOCK_Q=1, BLOCK_N=block_n, num_warps=tuning.mla_warps, **common)
    if other_seqs:
        qs = [query_lens[b] for b in other_seqs]
        other_splits = _mla_splits([seq_lens[b] for b in other_seqs], qs, num_heads, head_dim_v, tuning)
        block_q = max(1, tuning.mla_multi_rows // block_h)
        grid = (-(-max(qs) // block_q) * num_kv_heads * head_blocks, other_splits, len(other_seqs))
        other = LaunchConfig(grid=grid, BLOCK_Q=block_q, BLOCK_N=block_n, num_warps=tuning.mla_multi_warps, **common)
    return LaunchPlan(decode_seqs, other_seqs, decode, other, max_splits, mla=True, other_splits=other_splits)


def _mla_splits(lens: list[int], query_lens: list[int], num_heads: int, head_dim_v: int, tuning: KernelTuning) -> int:
    """The most splits of one of the histories ``lens`` (``decode_split``'s rule), checked against
    the grid's axes and the scratch's int32 offsets (``[sum(query_lens), splits, num_heads,
    head_dim_v]`` fp32)."""
    max_splits = max(decode_work(n, None, tuning)[0] for n in set(lens))
    if max(max_splits, len(lens)) > GRID_YZ_MAX:
        raise ProblemError(
            OWNER,
            "seq_lens",
            f"{len(lens)} MLA sequences of up to {max_splits} splits; a launch holds at most {GRID_YZ_MAX} of each",
        )
    scratch = sum(query_lens) * max_splits * num_heads * head_dim_v
    if scratch > INT32_MAX:
        raise ProblemError(
            OWNER,
            "seq_lens",
            f"{len(lens)} MLA sequences of up to {max_splits} splits need a scratch of "
            f"{scratch} elements; at most 2**31 - 1 (int32 offsets)",
        )
    return max_splits


def decode_grid(n_decode: int, n_groups: int, num_kv_heads: int) -> tuple[bool, tuple[int, int, int]]:
    """The decode launch's grid for ``n_decode`` sequences of ``n_groups`` programs each for
    each kv head (groups of consecutive splits, see ``decode_launch_shape``), and whether it is
    flat (``FLAT_GRID``). Kv heads first, then split groups, then sequences, on three axes, so
    the programs of one split of one sequence start together and read the same pages at once.
    A three-axis grid holds at most ``GRID_YZ_MAX`` programs on its second and third axes: past
    that, one axis in the same order. Scheduling only: a program's work and its bits do not
    depend on it."""
    if max(n_groups, n_decode) > GRID_YZ_MAX:
        return True, (num_kv_heads * n_groups * n_decode, 1, 1)
    return False, (num_kv_heads, n_groups, n_decode)


def decode_block_n(dtype: torch.dtype, interpreter: bool = False, tuning: KernelTuning = TUNING) -> int:
    """Keys per decode step: ``fp32_block_n`` for fp32 queries (sized for compile time;
    ``fp32_tile_interpreter`` on the interpreter), else ``decode_block_n``."""
    if dtype == torch.float32:
        return tuning.fp32_tile_interpreter if interpreter else tuning.fp32_block_n
    return tuning.decode_block_n


def fp8_widening(kv_dtype: torch.dtype, dots_f16: bool, native: bool, even: bool) -> int:
    """The kernels' ``KV_FP8``: 0 for a cache in the query dtype; for an fp8 cache, 2 (e4m3) or
    3 (e5m2) where its K and V tiles are read as 16-bit pairs and widened by one ``cvt`` a pair
    (``_widen_pairs``), else 1 (the compiler widens the tiles, ``_widen_rows``). The pairs need
    fp16 dots (``dots_f16``), a GPU with the conversion (``native``: CUDA, sm_89 or later, not
    the interpreter) and every offset into the caches even (``even``: base pointers, strides,
    head_dim)."""
    if kv_dtype not in FP8_DTYPES:
        return 0
    if not (dots_f16 and native and even):
        return 1
    return 2 + int(kv_dtype == torch.float8_e5m2)
