"""Host-side arithmetic of the Triton kernel: input checks, the launch plan, every
integer that becomes a pointer offset or a grid size. Plain Python and torch, tested
on any machine; nothing here imports triton."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

import torch

from pagedattn.indexing import next_power_of_2
from pagedattn.problem import (
    FP8_DTYPES,
    ProblemError,
    check_options,
    check_per_head,
    check_tensors,
    positive_float_problem,
)

#: the owner the kernel's errors name: ``paged_attention.seq_lens: must ...``
OWNER = "paged_attention"
#: query dtypes the kernel computes in
QUERY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: the kernel receives its scales as fp32 arguments: outside fp32's normal range a scale
#: would become inf or flush to 0 (every score 0) on the way in
FP32_MAX = float(torch.finfo(torch.float32).max)
FP32_TINY = float(torch.finfo(torch.float32).tiny)
#: what the kernel indexes with int32 (the query, the output, the decode scratch; the caches
#: too where every offset fits, else int64: ``triton_paged_attention.OFFSETS_I32``)
INT32_MAX = 2**31 - 1


def last_offset(t: torch.Tensor) -> int:
    """The largest element offset of ``t`` from its first element, through its strides
    (what an int32 offset must hold to address every element)."""
    return sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))


def fits_int32(t: torch.Tensor) -> bool:
    """True when every element offset of ``t`` (``last_offset``) is at most 2**31 - 1: the
    kernel can address it in int32."""
    return last_offset(t) <= INT32_MAX


def _check_int32_offsets(name: str, t: torch.Tensor) -> None:
    """``ProblemError`` naming ``name`` when an element of ``t`` lies past an int32 offset."""
    if not fits_int32(t):
        raise ProblemError(OWNER, name, f"must keep every element offset <= 2**31 - 1 (int32), got {last_offset(t)}")


def fp32_scale_problem(x: float) -> str:
    """``""`` when the real number ``x > 0`` survives the conversion to an fp32 argument
    (inside ``[FP32_TINY, FP32_MAX]``); else what is wrong."""
    if not FP32_TINY <= x <= FP32_MAX:
        normal = f"[{FP32_TINY:.3g}, {FP32_MAX:.4g}]"
        return f"must be inside fp32's normal range {normal} (the kernel's fp32 argument), got {x:g}"
    return ""


def check_paged_inputs(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    *,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[list[int], list[int]]:
    """Every check of the tensors the kernel needs before a launch: the problem's rules
    (``pagedattn.problem.check_tensors``, as ``PagedCase`` applies them) and the kernel's
    own (a contiguous last dimension, int32 offsets, fp32 scales, ``out``). Raises
    ``ProblemError`` (a ``ValueError``) naming the field and the bound. Returns
    ``(seq_lens, query_start_loc)`` as lists: the values reach the host once, in one
    transfer, and serve the launch plan too.

    Args:
        query: ``[num_tokens, num_heads, head_dim]`` float32/float16/bfloat16.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, the
            query dtype or float8_e4m3fn/float8_e5m2.
        block_tables: ``[num_seqs, max_blocks]`` int32; seq_lens: ``[num_seqs]`` int32;
            query_start_loc: ``[num_seqs + 1]`` int32.
        scale: a real number > 0 inside fp32's normal range, or ``None`` (the default).
        out: optional ``[num_tokens, num_heads, head_dim]`` in the query dtype.
        alibi_slopes, sinks: optional ``[num_heads]`` float32, finite: checked here
            because their finiteness rides on the same transfer (a separate check would
            cost the launch a second device synchronization).
    """
    lens_loc = check_tensors(
        OWNER,
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        query_dtypes=QUERY_DTYPES,
    )
    assert lens_loc is not None  # sync=True reads the values
    named = dict(query=query, key_cache=key_cache, value_cache=value_cache)
    for name, t in named.items():
        if t.stride(-1) != 1:
            raise ProblemError(
                OWNER, name, f"must have a contiguous last (head_dim) dimension (stride 1), got strides {t.stride()}"
            )
    for name, t, dim in (
        ("block_tables", block_tables, 1),
        ("seq_lens", seq_lens, 0),
        ("query_start_loc", query_start_loc, 0),
    ):
        if t.stride(dim) != 1:
            raise ProblemError(
                OWNER, name, f"must be contiguous in dimension {dim} (stride 1), got strides {t.stride()}"
            )
    # The kernel addresses the query and the output with int32 offsets (the caches in int64
    # where they need it): their strides must keep every element within 2**31 - 1.
    _check_int32_offsets("query", query)
    if scale is not None:
        problem = positive_float_problem(scale) or fp32_scale_problem(float(scale))
        if problem:
            raise ProblemError(OWNER, "scale", problem)
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.shape != query.shape or out.dtype != query.dtype:
            got = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise ProblemError(OWNER, "out", f"must be a {query.dtype} tensor of shape {tuple(query.shape)}, got {got}")
        if out.device != query.device:
            raise ProblemError(OWNER, "out", f"must be on the query's device {query.device}, got {out.device}")
        if out.stride(-1) != 1:
            raise ProblemError(OWNER, "out", f"must have a contiguous last dimension, got strides {out.stride()}")
        _check_int32_offsets("out", out)
    return lens_loc


@dataclass(frozen=True)
class Variants:
    """The attention variants of one batch, checked (see ``check_variants``)."""

    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    alibi_slopes: torch.Tensor | None = None  # [num_heads] float32
    sinks: torch.Tensor | None = None  # [num_heads] float32
    k_scale: float = 1.0
    v_scale: float = 1.0
    return_lse: bool = False


def check_variants(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    *,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    return_lse: bool = False,
    scale: float | None = None,
) -> Variants:
    """The variants' arguments, checked on the host (no device transfer): the problem's
    rules (``pagedattn.problem.check_options``/``check_per_head``) and the kernel's own
    (an int32 window, fp32 scales, contiguous per-head tensors). Raises
    ``ProblemError`` (a ``ValueError``) naming the field and the bound.

    ``scale`` is the softmax scale as given to ``check_paged_inputs`` (``None``: the
    default ``head_dim ** -0.5``): the kernel receives ``scale * k_scale`` as one fp32
    argument, so that product must stay inside fp32's normal range. Whether
    ``alibi_slopes`` and ``sinks`` are finite is checked by ``check_paged_inputs``, in
    its one device transfer."""
    check_options(
        OWNER,
        key_cache.dtype,
        scale=scale,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    if sliding_window is not None and sliding_window > INT32_MAX:
        raise ProblemError(
            OWNER, "sliding_window", f"must be <= 2**31 - 1 (an int32 in the kernel), got {sliding_window}"
        )
    problem = fp32_scale_problem(float(scale)) if scale is not None else ""
    if problem:
        raise ProblemError(OWNER, "scale", problem)
    softmax_scale = float(query.shape[2]) ** -0.5 if scale is None else float(scale)
    for name, x in (("k_scale", softmax_scale * float(k_scale)), ("v_scale", float(v_scale))):
        problem = fp32_scale_problem(x)
        if problem:
            what = "scale * k_scale" if name == "k_scale" else "v_scale"
            raise ProblemError(OWNER, name, f"{what} {problem}")
    for name, t in (("alibi_slopes", alibi_slopes), ("sinks", sinks)):
        check_per_head(OWNER, name, t, query.shape[1], query.device)
        if t is not None and t.stride(0) != 1:
            raise ProblemError(OWNER, name, f"must be contiguous, got stride {t.stride(0)}")
    return Variants(
        sliding_window=sliding_window,
        logits_soft_cap=None if logits_soft_cap is None else float(logits_soft_cap),
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        k_scale=float(k_scale),
        v_scale=float(v_scale),
        return_lse=bool(return_lse),
    )


#: tl.dot needs every dimension >= 16 on NVIDIA GPUs (the interpreter accepts less).
MIN_DOT = 16
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
    UPCAST: bool
    IEEE_FP32: bool
    SPLIT_SIZE: int = 0  # decode launches: keys per split (0: no split) ...
    SPLIT_LONG: int = 0  # ... and per split of a history of at least LONG_FROM keys
    LONG_FROM: int = 0
    SPLIT_SHORT: int = 0  # ... and per split of a history shorter than SHORT_UNDER keys (0: none)
    SHORT_UNDER: int = 0
    EXP2: bool = False  # the softmax in base 2, the scale folded into the exponent's multiply-add
    MASK_SPLIT: bool = False  # key tiles that every row sees wholly take no mask
    HEAVY_FIRST: bool = False  # prefill: the longest causal tiles are launched first
    GRID_ORDER: int = 0  # decode: the grid's order of programs (``DECODE_GRIDS``)
    SPLIT_LOOP: bool = False  # decode: programs walk their splits in one loop (``decode_launch_shape``) ...
    SPLITS_PER_PROGRAM: int = 1  # ... consecutive splits a program takes (a launch shape: the same bits) ...
    SPLIT_GROUPS: int = 0  # ... and the programs of a sequence and kv head, ceil(max_splits / SPLITS_PER_PROGRAM)
    SPLIT_WHOLE: bool = False  # decode: a program walks every split of its sequence and merges them in its loop
    FOLD_PARTS: int = 0  # decode: the merge folds each history's splits in this many parts, then the parts
    LOOP_PARTS: bool = False  # decode: split-loop programs fold their parts in their loop (whole parts each)
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
    merge's parts in their loop (``LOOP_PARTS``), the scratch's size and the register caps (an
    fp8 cache's, whole sequences at three programs an SM; ``decode_launch_shape``); none of
    them changes a bit (``test_launch_shape_changes_no_bit``).
    """

    decode_seqs: list[int]
    other_seqs: list[int]
    decode: LaunchConfig | None
    other: LaunchConfig | None
    max_splits: int  # splits of the longest decode history

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
) -> LaunchPlan:
    """The launches of one batch, from sizes alone (``kv_dtype``: the cache's dtype,
    ``None`` for the query dtype; an fp8 cache may take its own decode tiles and splits;
    ``sliding_window``: the keys a decode token sees, which set how much work each of its
    splits has, a launch shape only)."""
    kv_fp8 = kv_dtype in FP8_DTYPES
    group = num_heads // num_kv_heads
    group_pad = next_power_of_2(group)
    d_pad = max(MIN_DOT, next_power_of_2(head_dim))
    common: dict[str, Any] = dict(
        GROUP=group,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=d_pad,
        BLOCK_SIZE=block_size,
        UPCAST=interpreter and dtype == torch.bfloat16,
        IEEE_FP32=True,
        EXP2=EXP2_SOFTMAX,
    )
    decode_seqs = [b for b, q in enumerate(query_lens) if q == 1]
    other_seqs = [b for b, q in enumerate(query_lens) if q > 1]
    decode = other = None
    max_splits = 0
    if decode_seqs:
        # one query row per head: pad the group to the dot minimum; split the history so
        # that a single long sequence still fills the GPU, then merge by log-sum-exp
        # a long history takes longer splits: fewer partial states to write and merge, and
        # still enough programs to fill the GPU alone; the choice reads that history's length only
        lens = [seq_lens[b] for b in decode_seqs]
        per_len = {n: decode_work(n, kv_fp8, sliding_window) for n in set(lens)}  # batches repeat lengths
        work = [per_len[n] for n in lens]
        max_splits = max(n for n, _, _ in work)
        block_n = decode_block_n(dtype, kv_fp8, interpreter)
        # the split loop walks a program's splits as whole tiles: every split size the tuning
        # constants can give, whatever this batch's histories (so no batch fails where another passes)
        sizes = {_split_size(kv_fp8), SPLIT_LONG} | ({SPLIT_SHORT} if SHORT_UNDER else set())
        for size in sorted(sizes):
            if size % block_n:
                raise RuntimeError(f"paged_attention: decode splits of {size} keys are not whole tiles of {block_n}")
        # the register caps below are sized for 16-bit queries and head_dim <= 128 (wider tiles
        # would spill); the whole-sequence cap also for a GQA group padded to at most 16 rows,
        # and not over an fp8 cache (its own cap: FP8_DECODE_MAXNREG). Under it, sm_90 (ptxas -v), bf16
        # D=128 spills 36 / 28 bytes of stores / loads (triton 3.6; 36 / 28 on 3.9) without the
        # variants and 64 / 56 (12 / 12) with every one on (window, soft-cap, ALiBi, sinks, lse),
        # the merge's part state live through the loop; the H200 figures (without variants) are
        # those of the cap before the parts, which spilled nothing, within 0.2 points
        narrow = dtype != torch.float32 and d_pad <= 128
        # over an fp8 cache, the cap its split loop's rule is measured at (FP8_DECODE_MAXNREG)
        cap_ok = narrow and (FP8_DECODE_MAXNREG is not None if kv_fp8 else group_pad <= MIN_DOT)
        split_loop, spp, whole_capped = decode_launch_shape(work, num_kv_heads, kv_fp8, cap_ok)
        # an fp8 cache's decode at a register cap where the launch outgrows a wave (see FP8_DECODE_MAXNREG)
        capped = kv_fp8 and narrow and len(decode_seqs) * num_kv_heads * max_splits > DECODE_WAVE
        groups = -(-max_splits // spp)
        whole = split_loop and groups == 1 and DECODE_MERGE_IN_LOOP
        # programs that fold whole parts in their loop: where every history's parts divide the
        # programs' splits (else every program stores its splits, and the merge folds the parts);
        # a launch-wide choice, so programs holding no part state keep their registers
        folds = {decode_fold(n) for n, _, _ in per_len.values()}
        loop_parts = split_loop and not whole and max(folds) > 1 and all(spp % f == 0 for f in folds)
        # the scratch ([n_decode, splits, num_heads, HEAD_DIM_PAD] fp32; one split where the
        # programs merge in their loop and store none) is addressed in int32; its size also
        # bounds the decode grid's one axis
        scratch = len(decode_seqs) * (1 if whole else max_splits) * num_heads * d_pad
        if scratch > INT32_MAX:
            raise ProblemError(
                OWNER,
                "seq_lens",
                f"{len(decode_seqs)} decode sequences of up to {max_splits} splits need a scratch of "
                f"{scratch} elements; at most 2**31 - 1 (int32 offsets)",
            )
        order, grid = decode_grid(len(decode_seqs), groups, num_kv_heads)
        decode = LaunchConfig(
            grid=grid,
            GRID_ORDER=order,
            SPLIT_LOOP=split_loop,
            SPLITS_PER_PROGRAM=spp,
            SPLIT_GROUPS=groups,
            SPLIT_WHOLE=whole,
            FOLD_PARTS=DECODE_FOLD_PARTS,
            LOOP_PARTS=loop_parts,
            GROUP_PAD=max(MIN_DOT, group_pad),
            BLOCK_Q=1,
            BLOCK_N=block_n,
            SPLIT_SIZE=_split_size(kv_fp8),
            SPLIT_LONG=SPLIT_LONG,
            LONG_FROM=LONG_FROM,
            SPLIT_SHORT=SPLIT_SHORT,
            SHORT_UNDER=SHORT_UNDER,
            maxnreg=FP8_DECODE_MAXNREG if capped else (DECODE_WHOLE_MAXNREG if whole_capped else DECODE_MAXNREG),
            num_warps=(FP8_DECODE_WARPS or DECODE_WARPS) if kv_fp8 else DECODE_WARPS,
            num_stages=2
            if dtype == torch.float32 and d_pad > 128
            else ((FP8_DECODE_STAGES or DECODE_STAGES) if kv_fp8 else DECODE_STAGES),
            **common,
        )
    if other_seqs:
        # fp32 tiles are twice the bytes and run on FMA units, not the tensor cores, where
        # the compiler unrolls them: their own, smaller tiles keep compile time down
        # (FP32_PREFILL_ROWS x FP32_BLOCK_N: the figures are at those constants)
        wide = dtype == torch.float32
        fp32_rows, fp32_n = (FP32_TILE_INTERPRETER,) * 2 if interpreter else (FP32_PREFILL_ROWS, FP32_BLOCK_N)
        rows = max(fp32_rows if wide else PREFILL_ROWS, group_pad, MIN_DOT)
        block_q = rows // group_pad
        max_q = max(query_lens[b] for b in other_seqs)
        block_n = fp32_n if wide else PREFILL_BLOCK_N
        stages = PREFILL_STAGES if not wide else 2
        # a deeper pipeline only where its K/V buffers fit beside the query tile (16-bit tiles;
        # head_dim 256 keeps 2 stages); the compile test checks the launch limit
        if stages > 2 and (rows + 2 * stages * block_n) * d_pad * 2 > PREFILL_SHARED_BUDGET:
            stages = 2
        q_tiles = -(-max_q // block_q)
        if q_tiles > GRID_YZ_MAX:  # CUDA's grid: 65535 programs on its second axis
            raise ProblemError(
                OWNER,
                "query_start_loc",
                f"a query of {max_q} tokens needs {q_tiles} tiles of {block_q} tokens "
                f"(GQA group {group}, {dtype}); a launch holds at most {GRID_YZ_MAX}",
            )
        other = LaunchConfig(
            grid=(len(other_seqs), q_tiles, num_kv_heads),
            GROUP_PAD=group_pad,
            BLOCK_Q=block_q,
            BLOCK_N=block_n,
            MASK_SPLIT=PREFILL_MASK_SPLIT,
            HEAVY_FIRST=PREFILL_HEAVY_FIRST,
            num_warps=PREFILL_WARPS or (8 if block_q * group_pad >= 128 and d_pad > 64 else 4),
            num_stages=stages,
            maxnreg=None if wide or d_pad > 128 else PREFILL_MAXNREG,  # wider tiles would spill
            **common,
        )
    return LaunchPlan(decode_seqs, other_seqs, decode, other, max_splits)


def decode_launch_shape(
    work: list[tuple[int, int, int]], num_kv_heads: int, kv_fp8: bool = False, cap_ok: bool = False
) -> tuple[bool, int, bool]:
    """The decode launch's shape: whether its programs walk their splits in one loop
    (``SPLIT_LOOP``), how many consecutive splits each takes, and whether the launch runs at
    ``DECODE_WHOLE_MAXNREG`` registers. A launch shape only: each split computes the same bits
    whoever runs it and however (``_decode_kernel``).

    ``work``: for each decode sequence, ``decode_work``'s (splits, first split with visible
    keys, keys a split). ``cap_ok``: the tiles are narrow enough for the register cap (over an
    fp8 cache, ``FP8_DECODE_MAXNREG``'s, which its rule needs).

    The split loop may hold more registers than a program of one split (sm_90, triton 3.6, bf16,
    D=128: 192 folding parts in its loop, 192-253 walking whole sequences, against 128 storing
    splits), and storing splits in it more shared memory: two programs an SM where one split a
    program runs three. But it keeps its K/V pipeline running across a split's end. So, in order:

    1. the fewest splits a program (up to ``DECODE_SPP_MAX``) that fit the launch in
       ``DECODE_WAVE`` programs, one wave of the split loop, where more than one split a
       program leaves the programs balanced (``_balanced``: a long history beside short ones
       would be walked by few programs while the rest of the GPU idles);
    2. else a whole sequence a program, merged in its loop (``DECODE_MERGE_IN_LOOP``), where
       its programs fill at least ``DECODE_WHOLE_FILL`` of the waves' slots (programs over whole
       waves' slots) at two programs an SM (``DECODE_WAVE``) or, with ``cap_ok``, at three
       (``DECODE_WAVE_CAPPED`` at ``DECODE_WHOLE_MAXNREG`` registers; the fuller, two on a tie),
       and the programs are balanced: launches past one wave, and launches one wave holds only
       at more than ``DECODE_SPP_MAX`` splits a program (histories of over 16 splits);
    3. else one split a program without the loop.

    An fp8 cache (``kv_fp8``) has its own rule (unless ``FP8_DECODE_SPLIT_LOOP``), with
    ``cap_ok`` only: the loop at the most splits a program, from ``FP8_DECODE_SPP`` halving
    (integer division) down to 2, at which the programs with keys to read are still at least
    ``FP8_LOOP_MIN_PROGRAMS``, fill at least ``FP8_LOOP_FILL`` of their waves' slots
    (``FP8_DECODE_WAVE`` a wave) and are balanced, and fewer than the longest history's splits
    (the launch never takes a program a sequence; under a window one program may still walk all
    of a history's visible splits); else one split a program without it (the loop
    fitted in one wave or over whole sequences was measured slower there: its programs hold
    more registers, where an fp8 program's speed is its occupancy). ``DECODE_SPLIT_LOOP`` (True
    or False) and ``DECODE_SPLITS_PER_PROGRAM`` (> 0, with the loop) force either (the
    benchmark's switches)."""
    max_splits = max((n for n, _, _ in work), default=1)
    if DECODE_SPLIT_LOOP is False:
        return False, 1, False
    if DECODE_SPLITS_PER_PROGRAM:
        return True, max(1, min(DECODE_SPLITS_PER_PROGRAM, max_splits)), False
    heads = len(work) * num_kv_heads
    kinds = collections.Counter(work)  # the balance is counted over distinct works
    if kv_fp8 and DECODE_SPLIT_LOOP is None and not FP8_DECODE_SPLIT_LOOP:
        # the waves are four programs an SM at FP8_DECODE_MAXNREG registers: uncapped (fp32
        # queries, head_dim > 128), or without a wave, one split a program
        spp = FP8_DECODE_SPP if cap_ok and FP8_DECODE_WAVE > 0 else 1
        while spp > 1:  # the most splits a program, halving, that leave enough programs
            programs = _programs(kinds, spp) * num_kv_heads
            # never a launch of one program a sequence (measured slower, FP8_DECODE_SPLIT_LOOP)
            if spp < max_splits and programs >= max(1, FP8_LOOP_MIN_PROGRAMS):
                if _fill(programs, FP8_DECODE_WAVE) >= FP8_LOOP_FILL and _balanced(kinds, spp):
                    return True, spp, False
            spp //= 2
        return False, 1, False
    for spp in range(1, max(1, min(DECODE_SPP_MAX, max_splits)) + 1):
        if heads * -(-max_splits // spp) <= DECODE_WAVE and (spp == 1 or _balanced(kinds, spp)):
            return True, spp, False
    if DECODE_WHOLE_FILL <= 1 and DECODE_MERGE_IN_LOOP and _balanced(kinds, max_splits):
        waves = [(w, c) for w, c in ((DECODE_WAVE, False), (DECODE_WAVE_CAPPED, True)) if w > 0 and (cap_ok or not c)]
        if waves:
            fill, _, capped = max((_fill(heads, w), not c, c) for w, c in waves)
            if fill >= DECODE_WHOLE_FILL:
                return True, max_splits, capped
    return bool(DECODE_SPLIT_LOOP), 1, False


def _fill(programs: int, wave: int) -> float:
    """The share of the slots of whole waves of ``wave`` programs (> 0) that ``programs``
    (> 0) fill."""
    return programs / (-(-programs // wave) * wave)


def _programs(kinds: collections.Counter[tuple[int, int, int]], spp: int) -> int:
    """Decode programs of ``spp`` consecutive splits each with keys to read, a kv head
    (``kinds``: ``decode_launch_shape``'s works, counted): those wholly before a window have
    none and end at once."""
    return sum(c * (-(-n // spp) - first // spp) for (n, first, _), c in kinds.items())


def _balanced(work: collections.Counter[tuple[int, int, int]] | list[tuple[int, int, int]], spp: int) -> bool:
    """Whether the decode programs of ``spp`` consecutive splits each (``work`` as in
    ``decode_launch_shape``, or counted: a batch holds few distinct works) are of about one
    length: their mean work, in keys, at least ``DECODE_BALANCE`` of the longest's. A program's
    work is counted in whole splits of its history's split size, visible keys or not: under a
    window narrower than a split, histories of different split tiers read as unbalanced."""
    kinds = work if isinstance(work, collections.Counter) else collections.Counter(work)
    total = sum(c * (n - first) * keys for (n, first, keys), c in kinds.items())
    longest = max((min(spp, n - first) * keys for n, first, keys in kinds), default=0)
    programs = _programs(kinds, spp)
    return programs > 0 and total >= DECODE_BALANCE * longest * programs


def decode_grid(n_decode: int, n_groups: int, num_kv_heads: int) -> tuple[int, tuple[int, int, int]]:
    """The decode launch's grid order (``DECODE_GRIDS[DECODE_GRID]``) and grid for
    ``n_decode`` sequences of ``n_groups`` programs each for each kv head (groups of
    consecutive splits, see ``decode_launch_shape``). Scheduling only: a program's work
    and its bits do not depend on it. A three-axis grid holds at most ``GRID_YZ_MAX``
    programs on its second and third axes: past that, one axis, kv heads fastest
    (``heads_fast``), the same order as ``heads_first``."""
    grids = {
        DECODE_GRIDS["sequences_first"]: (n_decode, n_groups, num_kv_heads),
        DECODE_GRIDS["heads_fast"]: (num_kv_heads * n_groups * n_decode, 1, 1),
        DECODE_GRIDS["heads_first"]: (num_kv_heads, n_groups, n_decode),
    }
    order = DECODE_GRIDS[DECODE_GRID]
    if max(grids[order][1:]) > GRID_YZ_MAX:
        order = DECODE_GRIDS["heads_fast"]
    return order, grids[order]


def decode_block_n(dtype: torch.dtype, kv_fp8: bool, interpreter: bool = False) -> int:
    """Keys per decode step: ``FP32_BLOCK_N`` for fp32 queries (sized for compile time, see
    there; ``FP32_TILE_INTERPRETER`` on the interpreter), ``FP8_DECODE_BLOCK_N`` over an fp8
    cache when set, else ``DECODE_BLOCK_N``."""
    if dtype == torch.float32:
        return FP32_TILE_INTERPRETER if interpreter else FP32_BLOCK_N
    return (FP8_DECODE_BLOCK_N or DECODE_BLOCK_N) if kv_fp8 else DECODE_BLOCK_N


def fp8_widening(kv_dtype: torch.dtype, dots_f16: bool, native: bool, even: bool) -> int:
    """The kernels' ``KV_FP8``: 0 for a cache in the query dtype; for an fp8 cache, 1 (the
    compiler widens its tiles, ``_widen_rows``), or with ``FP8_PAIRS`` 2 (e4m3) or 3 (e5m2): V
    read as pairs and widened by ``cvt`` (``_widen_pairs``), 4 or 5 with K's too
    (``FP8_PAIRS_K``). The pairs need fp16 dots (``dots_f16``), a GPU with the conversion
    (``native``: CUDA, sm_89 or later, not the interpreter) and every offset into the caches
    even (``even``: base pointers, strides, head_dim)."""
    if kv_dtype not in FP8_DTYPES:
        return 0
    if not (FP8_PAIRS and dots_f16 and native and even):
        return 1
    return (4 if FP8_PAIRS_K else 2) + int(kv_dtype == torch.float8_e5m2)


def decode_work(seq_len: int, kv_fp8: bool = False, sliding_window: int | None = None) -> tuple[int, int, int]:
    """A decode history's splits (``decode_split``), the first of them with keys the new token
    sees (under ``sliding_window``: the kernel's programs skip the splits before it), and the
    keys a split."""
    size = decode_split(seq_len, kv_fp8)
    first = max(0, seq_len - sliding_window) // size if sliding_window else 0
    return -(-seq_len // size), first, size


def decode_fold(n_splits: int) -> int:
    """Splits a part of the decode merge, for a history of ``n_splits`` splits (the kernel's
    rule): ``max(1, n_splits // DECODE_FOLD_PARTS)``, 1 with ``DECODE_FOLD_PARTS`` 0."""
    return max(1, n_splits // DECODE_FOLD_PARTS) if DECODE_FOLD_PARTS > 0 else 1


def decode_split(seq_len: int, kv_fp8: bool = False) -> int:
    """Keys per split of a decode history of ``seq_len`` keys (the kernel's rule, in
    ``_decode_kernel``: ``SPLIT_SHORT`` below ``SHORT_UNDER`` keys, ``SPLIT_LONG`` from
    ``LONG_FROM`` keys on, else ``SPLIT_SIZE``, or ``FP8_SPLIT_SIZE`` over an fp8 cache
    when set). It reads that history's length and the cache's dtype only, so a sequence
    splits alike in any batch."""
    if seq_len < SHORT_UNDER:
        return SPLIT_SHORT
    if seq_len >= LONG_FROM:
        return SPLIT_LONG
    return _split_size(kv_fp8)


def _split_size(kv_fp8: bool) -> int:
    """Keys per split of a history between the short and long tiers: ``SPLIT_SIZE``, or
    ``FP8_SPLIT_SIZE`` over an fp8 cache when set."""
    return (FP8_SPLIT_SIZE or SPLIT_SIZE) if kv_fp8 else SPLIT_SIZE


#: Tile shapes (tuned on an H200, see benchmarks/): decode reads BLOCK_N keys a step,
#: SPLIT_SIZE keys per program (SPLIT_LONG from LONG_FROM keys on); prefill tiles hold PREFILL_ROWS query rows.
DECODE_BLOCK_N = 64
DECODE_WARPS = 4
DECODE_STAGES = 3
SPLIT_SIZE = 512
SPLIT_LONG = 2048  # issue 17, second round: 0.93/0.94 of SDPA at B=8/32, L=32k (1024: 0.90/0.93; B=1: 0.89 vs 0.91)
LONG_FROM = 16384
#: Histories under SHORT_UNDER keys take SPLIT_SHORT-key splits (0: none). Issue 17, seventh round
#: (H200, one process, from CUDA graphs; results/h200-probe-issue17o4.json): B=1 at 1k / 2k / 3k
#: keys 0.64 / 0.72 / 0.78 of SDPA -> 0.82 / 0.86 / 0.87 (twice the programs of a 512-key split);
#: the cost, twice the partial states to store and merge, 0.8-3.6 points at B >= 32 under 4k keys
#: (B=128 L=2k 0.935 -> 0.906), 0.4-2 at B=8. A history's own rule: the same bits in any batch.
SPLIT_SHORT = 256
SHORT_UNDER = 4096
FP8_DECODE_BLOCK_N = 0  # decode over an fp8 cache: 0 takes DECODE_BLOCK_N ...
FP8_SPLIT_SIZE = 0  # ... and SPLIT_SIZE
FP8_DECODE_STAGES = 0  # ... and DECODE_STAGES (an fp8 tile is half the shared memory)
FP8_DECODE_WARPS = 0  # ... and DECODE_WARPS
#: Issue 17, sixth round: an fp8 cache's V tiles read as 16-bit pairs of fp8 values and widened
#: by one ``cvt`` a pair (``_widen_pairs``), where the dots run in fp16 on sm_89 or later and
#: every offset into the caches is even; ``FP8_PAIRS_K``: K's too. H200, B=32 L=4k e4m3 decode
#: (results/h200-probe-issue17h*.json, one process): 0.98x of the bf16 cache's speed without,
#: 1.10x with V's pairs (688 -> 538 instructions a step, sm_90, triton 3.6), 1.25x with K's too
#: (548 instructions, but 128 registers instead of 140: four programs an SM instead of three).
FP8_PAIRS = True
FP8_PAIRS_K = True
PREFILL_ROWS = 128
PREFILL_BLOCK_N = 64
PREFILL_STAGES = 3  # 2 where 3 would not fit (PREFILL_SHARED_BUDGET), and for fp32
#: bytes of shared memory the prefill's query and K/V buffers may take (of 227 KB on sm_90,
#: leaving room for the fp8 path's widened V tile and the layout conversions)
PREFILL_SHARED_BUDGET = 160 * 1024
PREFILL_WARPS = 0  # 0: 8 warps for tiles of >= 128 rows and head_dim > 64, else 4
PREFILL_MAXNREG: int | None = None  # half-precision prefill, head_dim <= 128 only (larger tiles would spill)
#: fp32 queries (IEEE dots on the FMA units, unrolled by the compiler): their tiles are sized
#: for compile time, which a conformance run pays once per configuration. Compiled for sm_90
#: with triton 3.9 on a CPU (2026-11-30), head_dim 128: prefill 64 rows x 64 keys took 15.3 s
#: (a 2 MB cubin), 32 x 32 took 3.2 s; decode 64 keys 2.2 s, 32 keys 1.4 s. fp32 was 60% of the
#: H200 thorough profile's compile time, and its speed is not what the kernel is tuned for.
#: Fourth round (triton 3.6, both kernels, the process's start included): head_dim 256 10.8 s
#: at 32 x 32, 4.1 s at 16 x 16 (cubins 1.16 MB -> 0.27 MB); head_dim 128 5.3 -> 3.3 s; fp32
#: still held 158 of the 450 busy seconds of the H200 thorough profile at 32 x 32.
FP32_PREFILL_ROWS = 16
FP32_BLOCK_N = 16
#: ... but on the interpreter, which compiles nothing and pays per tile step in Python, fp32
#: keeps 32 x 32 tiles: the CPU quick profile of the triton backend took 52 s at 16 x 16
#: against 38 s at 32 x 32 (2 cores). The 16 x 16 tiles are what the H200 ran (thorough
#: profile); tile widths 16 to 64 run on the interpreter in tests/test_triton.py.
FP32_TILE_INTERPRETER = 32

#: Issue 17's second round (see benchmarks/NOTES.md): the softmax in base 2 with the scale
#: folded into one multiply-add per score, no mask on key tiles every row sees wholly, and
#: prefill's longest causal tiles launched first. False gives the kernel of the first round.
EXP2_SOFTMAX = True
PREFILL_MASK_SPLIT = True
PREFILL_HEAVY_FIRST = True
#: The decode grid's orders of programs: ``sequences_first`` (sequences, splits, kv heads: the
#: first rounds'), ``heads_fast`` (one axis, kv heads fastest, then splits, then sequences: the
#: fourth round's, so the programs of one split of one sequence start together) and
#: ``heads_first`` (kv heads, splits, sequences on three axes: that order without its integer
#: division by runtime sizes).
DECODE_GRIDS = {"sequences_first": 0, "heads_fast": 1, "heads_first": 2}
#: Issue 17, fifth round (H200, one process, from a CUDA graph, results/h200-probe-issue17f.json):
#: ratio to SDPA, sequences_first / heads_fast / heads_first: B=1 2k 0.721 / 0.701 / 0.723, 4k
#: 0.829 / 0.800 / 0.817, 8k 0.891 / 0.882 / 0.881, 32k 0.825 / 0.822 / 0.825; B=8 2k 1.002 /
#: 1.030 / 1.007, 8k 0.920 / 0.914 / 0.923; B=32 2k 0.892 / 0.899 / 0.904, 8k 0.885 / 0.909 / 0.911.
#: heads_first is within 2.2% of the best order at every point (the fourth round's 3-7% loss of
#: heads_fast at B=1 is 0.3-3.5% here), so no order is chosen by batch size.
DECODE_GRID = "heads_first"
#: The decode launch's shape (``decode_launch_shape``). Issue 17, seventh round (H200, one process,
#: from a CUDA graph; results/h200-probe-issue17o.json, -17o2.json): the split loop at one split a
#: program took B=1 from 0.71 / 0.82 / 0.87 / 0.81 of SDPA (2k / 4k / 8k / 32k) to 0.72 / 0.85 /
#: 0.90 / 0.90, but lost 3-7% at B >= 32 where its launch ran several waves (its shared memory
#: holds 2 programs an SM against 3). Fitted in one wave it gains: B=8 L=4k 0.95 against 0.87,
#: B=32 L=2k 0.94 against 0.90, B=8 L=32k 0.955 against 0.942; B >= 64 keeps one split a program.
DECODE_SPLIT_LOOP: bool | None = None  # None: by the launch; True or False forces it
DECODE_SPLITS_PER_PROGRAM = 0  # 0: by the launch; > 0 fixes it (with the loop)
DECODE_WAVE = 264  # programs of the split loop in one wave: 2 an SM on the H200's 132 SMs
DECODE_SPP_MAX = 16
#: Issue 17, eighth stop (H200, one process, from graphs; results/h200-probe-issue17o7.json, -17o8):
#: where ``B x kv heads`` passes one wave, a whole sequence a program, merged in its loop: B=64 at
#: 2k / 4k / 8k / 32k keys 0.984 / 0.989 / 0.985 / 0.978 of SDPA against 0.904 / 0.935 / 0.939 /
#: 0.974 at one split a program; B=128 0.985 / 0.988 / 0.988 / 1.001 against 0.912 / 0.939 /
#: 0.941 / 0.991; B=96 0.983-0.989 against 0.907-0.977 (0.97 of the slots filled at two an SM).
#: B=48 (384 programs): 0.89-0.91 at two an SM (0.73 filled), 1.00-1.02 at three an SM under a
#: 168-register cap (one wave of 396, 0.97), against 0.93-0.97. At 2k / 8k keys, whole against one
#: split a program: B=56 (0.85 at two) 1.002 / 1.009 against 0.919 / 0.967; B=112 (0.85 at two)
#: 0.958 / 0.949 against 0.939 / 0.977; B=80 (0.81 at three) 0.983 / 0.974 against 0.930 / 0.966;
#: B=40 (0.81 at three) 1.031 / 1.020 against 0.980 / 1.032; at 0.61-0.73 filled, 0.82-0.91.
DECODE_WHOLE_FILL = 0.8  # the least share of the slots whole sequences past one wave fill (> 1: never)
DECODE_WAVE_CAPPED = 396  # programs in one wave at DECODE_WHOLE_MAXNREG registers: 3 an SM (0: never)
DECODE_WHOLE_MAXNREG = 168  # 168 x 128 threads x 3 <= 65536 registers an SM
#: the split loop's programs take more than one split only where their mean work is at least
#: this share of the longest's (``_balanced``): a batch of one long history and short ones
#: would otherwise be walked by a few long programs (not measured; the rule's guard)
DECODE_BALANCE = 0.75
#: A launch of one program a sequence and kv head (``SPLIT_GROUPS`` 1): each merges its splits in
#: its loop, in the merge's order (``_combine``: the bits of the merge over stored splits), and stores no
#: split, counts nothing and reads nothing back. False: they store and merge as other launches do.
#: H200 (results/h200-probe-issue17o5.json, one process, from graphs): B=32 at 2k / 4k / 8k / 32k
#: keys 0.990 / 0.986 / 0.982 / 0.982 of SDPA, against 0.911 / 0.926 / 0.915 / 0.957 storing them.
DECODE_MERGE_IN_LOOP = True
#: The merge's order: a history's splits in parts of max(1, splits // DECODE_FOLD_PARTS) consecutive
#: splits (so DECODE_FOLD_PARTS to twice as many parts, the last one shorter; parts of one split
#: under DECODE_FOLD_PARTS * 2 splits), each folded from the merge's identity, then the parts in
#: order (0: the splits in one fold).
#: A history's own rule, so the bits stay batch-invariant; a split-loop program whose splits are
#: whole parts folds them in its loop and stores one state a part. Issue 17, eighth stop (H200,
#: results/h200-probe-issue17o12.json, folding a program's splits): B=8 at 2k / 4k / 8k / 32k keys
#: 0.964 / 0.958 / 0.919 / 0.958 of SDPA storing every split, 0.971 / 0.971 / 0.980 / 0.976 folded.
DECODE_FOLD_PARTS = 4
DECODE_MAXNREG: int | None = None  # a register cap on decode (the compiler's choice without)
#: ... and over an fp8 cache (half-precision queries, head_dim <= 128) in a launch of more than
#: DECODE_WAVE programs: sm_90, triton 3.6, e4m3, D=128, the decode kernel took 136 registers once
#: it had the split loop's launch shapes (3 programs an SM; 128 before, 4), and 126 under this cap
#: with no spill (ptxas -v). H200 (results/h200-probe-issue17o2.json): 1.135 / 1.098 of SDPA at
#: B=8 L=8k / B=32 L=4k with the cap, 1.040 / 1.052 without; at B=1 L=4k 0.75 with, 0.81 without.
FP8_DECODE_MAXNREG: int | None = 128
#: the split loop over an fp8 cache by the bf16 cache's rule (True; False: ``FP8_DECODE_SPP``'s):
#: H200, e4m3 (h200-probe-issue17o2.json): 0.71 of SDPA at B=1 L=4k against 0.75 without, 0.92 /
#: 0.90 at B=8 L=8k / B=32 L=4k against 1.14 / 1.10; ninth stop (h200-probe-issue17-fp8.json, whole
#: sequences a program at B=32 L=4k): 0.946 of the bf16 cache's speed at 128 registers, 1.083
#: uncapped, against 1.103 without the loop
FP8_DECODE_SPLIT_LOOP = False
#: An fp8 cache's decode programs walk up to FP8_DECODE_SPP consecutive splits in the split loop
#: (the most, halving down to 2) where at least FP8_LOOP_MIN_PROGRAMS programs (a kv head each) have
#: keys to read: the loop keeps the K/V pipeline running across a split's end, while enough
#: programs remain to fill the GPU at four an SM. Issue 17, ninth stop (H200, one process, from
#: graphs; h200-probe-issue17-fp8r2.json), e4m3 over the bf16 cache's speed at 4 / 2 / 1 splits a
#: program (programs at 4 and 2): B=32 L=4k 1.239 / 1.215 / 1.103 (512, 1024), B=32 L=32k 1.264 /
#: 1.199 / 1.203 (1024, 2048), B=64 L=2k 1.207 / 1.159 / 1.029, B=128 L=4k 1.230 / 1.219 / 1.121;
#: B=16 L=4k 1.100 / 1.301 / 1.169 (256, 512), B=16 L=2k 1.162 / 1.295 / 1.101, B=8 L=8k 1.093 /
#: 1.138 / 1.125; under 512 programs at 2 the loop loses: B=8 L=4k 0.894 / 1.168 / 1.208 (128,
#: 256), B=4 L=32k 0.783 / 0.984 / 1.229, B=1 L=4k 0.349 / 0.595 / 0.946. Programs that store their
#: splits (the merge's parts not dividing theirs: B=8 L=8k and B=32 L=32k at 2, B=64 L=1k in round 3) gain as
#: those folding parts do; three splits a program (groups of 3, 3, 2 at 8 splits) 0.70-1.13, so the
#: rule halves from 4 (FP8_DECODE_SPP a power of two). Round 3 (-fp8r3.json): the programs must
#: also fill FP8_LOOP_FILL of their waves' slots (FP8_DECODE_WAVE: four programs an SM at
#: FP8_DECODE_MAXNREG registers on 132 SMs): B=48 L=4k at four, 768 programs in 1.45 waves, 1.079,
#: at two (1536, 0.97 filled) 1.230, at one 1.125.
FP8_DECODE_SPP = 4
FP8_LOOP_MIN_PROGRAMS = 512
FP8_DECODE_WAVE = 528  # 4 programs of 4 warps (DECODE_WARPS) an SM at 128 registers (0: no loop)
FP8_LOOP_FILL = 0.8
