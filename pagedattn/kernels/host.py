"""Host-side arithmetic of the Triton kernel: input checks, the launch plan, every
integer that becomes a pointer offset or a grid size. Plain Python and torch, tested
on any machine; nothing here imports triton."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pagedattn.kernels.tlsim import next_power_of_2
from pagedattn.oracle.case import FP8_DTYPES, positive_float_problem, sliding_window_problem

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: the kernel receives its scales as fp32 arguments: outside fp32's normal range a scale
#: would become inf or flush to 0 (every score 0) on the way in
FP32_MAX = float(torch.finfo(torch.float32).max)
FP32_TINY = float(torch.finfo(torch.float32).tiny)
_DIMS = {"query": ("num_tokens", "num_heads", "head_dim"),
         "key_cache": ("num_blocks", "block_size", "num_kv_heads", "head_dim")}  # fmt: skip


def fp32_scale_problem(x: float) -> str:
    """``""`` when the real number ``x > 0`` survives the conversion to an fp32 argument
    (inside ``[FP32_TINY, FP32_MAX]``); else what is wrong."""
    if not FP32_TINY <= x <= FP32_MAX:
        return f"= {x:g} is outside fp32's normal range [{FP32_TINY:.3g}, {FP32_MAX:.4g}] (the kernel's fp32 argument)"
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
    """Every check the kernel needs before a launch; raises ``ValueError`` naming the
    field and the bound. Returns ``(seq_lens, query_start_loc)`` as lists: the values
    reach the host once, in one transfer, and serve the launch plan too.

    Args:
        query: ``[num_tokens, num_heads, head_dim]`` float32/float16/bfloat16.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, the
            query dtype or float8_e4m3fn/float8_e5m2.
        block_tables: ``[num_seqs, max_blocks]`` int32; seq_lens: ``[num_seqs]`` int32;
            query_start_loc: ``[num_seqs + 1]`` int32.
        scale: a real number > 0 inside fp32's normal range, or ``None`` (the default).
        out: optional ``[num_tokens, num_heads, head_dim]`` in the query dtype.
        alibi_slopes, sinks: optional ``[num_heads]`` float32, checked for NaN and
            infinity here, in the same transfer, because a separate check would cost the
            launch a second device synchronization. Their types, shapes and devices are
            ``check_variants``' (one that is malformed is left to it). ``PagedCase``
            checks the same at construction, so the suite never hands a kernel a
            non-finite slope or sink.
    """

    def fail(field: str, msg: str) -> ValueError:
        return ValueError(f"paged_attention: {field}: {msg}")

    named = dict(query=query, key_cache=key_cache, value_cache=value_cache, block_tables=block_tables,
                 seq_lens=seq_lens, query_start_loc=query_start_loc)  # fmt: skip
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise fail(name, f"must be a torch.Tensor, got {type(t).__name__}")
    for name, t, rank in (("query", query, 3), ("key_cache", key_cache, 4), ("value_cache", value_cache, 4),
                          ("block_tables", block_tables, 2), ("seq_lens", seq_lens, 1),
                          ("query_start_loc", query_start_loc, 1)):  # fmt: skip
        if t.dim() != rank:
            raise fail(name, f"must have rank {rank}, got shape {tuple(t.shape)}")
    if query.dtype not in _FLOAT_DTYPES:
        raise fail("query", f"dtype must be float32, float16 or bfloat16, got {query.dtype}")
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        if t.dtype != query.dtype and t.dtype not in FP8_DTYPES:
            raise fail(name, f"dtype must be the query dtype {query.dtype} or float8_e4m3fn/float8_e5m2, got {t.dtype}")
    if key_cache.dtype != value_cache.dtype:
        raise fail("value_cache", f"dtype {value_cache.dtype} must equal key_cache dtype {key_cache.dtype}")
    for name in ("block_tables", "seq_lens", "query_start_loc"):
        if named[name].dtype != torch.int32:
            raise fail(name, f"must be int32, got {named[name].dtype}")
    dev = query.device
    for name, t in named.items():
        if t.device != dev:
            raise fail(name, f"is on {t.device}, query is on {dev}: one device for all")
    if dev.type == "meta":
        raise fail("query", "is on the meta device, which holds no values: nothing to compute")
    if key_cache.shape != value_cache.shape:
        raise fail("value_cache", f"shape {tuple(value_cache.shape)} != key_cache {tuple(key_cache.shape)}")
    T, Hq, D = query.shape
    N, bs, Hkv, Dk = key_cache.shape
    if Dk != D:
        raise fail("key_cache", f"head_dim {Dk} must equal query head_dim {D}")
    for name, t in (("query", query), ("key_cache", key_cache)):
        for i, axis in enumerate(_DIMS[name]):
            if t.shape[i] < 1:
                raise fail(name, f"{axis} (dimension {i}) must be >= 1, got shape {tuple(t.shape)}")
    if Hq % Hkv:
        raise fail("query", f"num_heads {Hq} must be a multiple of num_kv_heads {Hkv}")
    for name in ("query", "key_cache", "value_cache"):
        if named[name].stride(-1) != 1:
            raise fail(name, f"the last (head_dim) dimension must be contiguous (stride 1), got strides "
                             f"{named[name].stride()}")  # fmt: skip
    for name, dim in (("block_tables", 1), ("seq_lens", 0), ("query_start_loc", 0)):
        if named[name].stride(dim) != 1:
            raise fail(name, f"dimension {dim} must be contiguous (stride 1), got strides {named[name].stride()}")
    # The kernel addresses the cache with int64 block offsets but int32 everything else.
    if key_cache.stride(1) * bs > 2**31 - 1 or query.numel() > 2**31 - 1:
        raise fail("key_cache", "a block or the query exceeds 2**31 elements; int32 offsets would overflow")
    B = seq_lens.shape[0]
    if B < 1:
        raise fail("seq_lens", "must hold at least one sequence")
    if block_tables.shape[0] != B:
        raise fail("block_tables", f"has {block_tables.shape[0]} rows, seq_lens has {B}")
    if query_start_loc.shape[0] != B + 1:
        raise fail("query_start_loc", f"must have num_seqs + 1 = {B + 1} entries, got {query_start_loc.shape[0]}")
    if scale is not None:
        problem = positive_float_problem(scale) or fp32_scale_problem(float(scale))
        if problem:
            raise fail("scale", problem)
    # Every value check in one device-to-host transfer: the lengths, the offsets, per
    # sequence whether a block id it uses is out of range (computed where the table lives),
    # and whether the per-head variant tensors are finite.
    M = block_tables.shape[1]
    need = (seq_lens.long() + bs - 1) // bs  # [B]
    used = torch.arange(M, device=dev)[None, :] < need[:, None]  # [B, M]
    bad = (used & ((block_tables < 0) | (block_tables >= N))).any(dim=1)  # [B]
    heads = {name: t for name, t in (("alibi_slopes", alibi_slopes), ("sinks", sinks)) if _per_head(t, Hq, dev)}
    finite = [torch.isfinite(t).all().long().reshape(1) for t in heads.values() if t is not None]
    values = torch.cat([seq_lens.long(), query_start_loc.long(), bad.long(), *finite]).tolist()
    lens, loc, bad_rows = values[:B], values[B : 2 * B + 1], values[2 * B + 1 : 3 * B + 1]
    for name, ok in zip(heads, values[3 * B + 1 :]):
        if not ok:
            raise fail(name, "must be finite (it holds NaN or infinity)")
    if loc[0] != 0 or loc[-1] != T:
        raise fail("query_start_loc", f"must start at 0 and end at num_tokens = {T}, got {loc[0]} .. {loc[-1]}")
    for b in range(B):
        q_b = loc[b + 1] - loc[b]
        if q_b < 1:
            raise fail("query_start_loc", f"sequence {b} has {q_b} new tokens; every sequence needs >= 1")
        if not q_b <= lens[b]:
            raise fail("seq_lens", f"seq_lens[{b}]={lens[b]} is below its query length {q_b}")
        need = -(-lens[b] // bs)
        if need > M:
            raise fail("seq_lens", f"seq_lens[{b}]={lens[b]} needs {need} blocks, block_tables has {M} columns")
        if bad_rows[b]:
            raise fail("block_tables", f"row {b} holds a block id outside [0, num_blocks={N})")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.shape != query.shape or out.dtype != query.dtype:
            raise fail("out", f"must be a {query.dtype} tensor of shape {tuple(query.shape)}")
        if out.device != dev:
            raise fail("out", f"is on {out.device}, query is on {dev}")
        if out.stride(-1) != 1:
            raise fail("out", "the last dimension must be contiguous")
    return lens, loc


def _per_head(t: object, num_heads: int, dev: torch.device) -> bool:
    """Whether ``t`` is a well-formed per-head variant tensor (``[num_heads]`` float32 on ``dev``)."""
    return isinstance(t, torch.Tensor) and t.shape == (num_heads,) and t.dtype == torch.float32 and t.device == dev


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
    """The variants' arguments, checked on the host (no device transfer): ``ValueError``
    naming the field and the bound.

    ``scale`` is the softmax scale as given to ``check_paged_inputs`` (``None``: the
    default ``head_dim ** -0.5``): the kernel receives ``scale * k_scale`` as one fp32
    argument, so that product must stay inside fp32's normal range. Whether
    ``alibi_slopes`` and ``sinks`` are finite is checked by ``check_paged_inputs``, in
    its one device transfer."""

    def fail(field: str, msg: str) -> ValueError:
        return ValueError(f"paged_attention: {field}: {msg}")

    w = sliding_window
    problem = sliding_window_problem(w)
    if problem:
        raise fail("sliding_window", problem)
    if w is not None and w > 2**31 - 1:
        raise fail("sliding_window", f"must be <= 2**31 - 1 (an int32 in the kernel), got {w}")
    scalars = {"logits_soft_cap": logits_soft_cap, "k_scale": k_scale, "v_scale": v_scale}
    for name, x in scalars.items():
        problem = positive_float_problem(x) if x is not None or name != "logits_soft_cap" else ""
        if problem:
            raise fail(name, problem)
    if (k_scale != 1.0 or v_scale != 1.0) and key_cache.dtype not in FP8_DTYPES:
        raise fail("k_scale", f"k_scale/v_scale apply to fp8 caches only; the cache is {key_cache.dtype}")
    if scale is not None:
        problem = positive_float_problem(scale)
        if problem:
            raise fail("scale", problem)
    softmax_scale = float(query.shape[2]) ** -0.5 if scale is None else float(scale)
    for name, x in (("k_scale", softmax_scale * float(k_scale)), ("v_scale", float(v_scale))):
        problem = fp32_scale_problem(x)
        if problem:
            what = "scale * k_scale" if name == "k_scale" else "v_scale"
            raise fail(name, f"{what} {problem}")
    num_heads = query.shape[1]
    for name, t in (("alibi_slopes", alibi_slopes), ("sinks", sinks)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise fail(name, f"must be a torch.Tensor or None, got {type(t).__name__}")
        if tuple(t.shape) != (num_heads,) or t.dtype != torch.float32:
            raise fail(name, f"must be float32 of shape [num_heads] = ({num_heads},), got {t.dtype} {tuple(t.shape)}")
        if t.device != query.device:
            raise fail(name, f"is on {t.device}, query is on {query.device}: one device for all")
        if t.stride(0) != 1:
            raise fail(name, "must be contiguous")
    return Variants(
        sliding_window=w,
        logits_soft_cap=None if logits_soft_cap is None else float(logits_soft_cap),
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        k_scale=float(k_scale),
        v_scale=float(v_scale),
        return_lse=bool(return_lse),
    )


#: tl.dot needs every dimension >= 16 on NVIDIA GPUs (the interpreter accepts less).
MIN_DOT = 16


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
    a sequence computes the same bits alone or in any batch.
    """

    decode_seqs: list[int]
    other_seqs: list[int]
    decode: LaunchConfig | None
    other: LaunchConfig | None
    max_splits: int  # splits of the longest decode history (scratch size)


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
) -> LaunchPlan:
    """The launches of one batch, from sizes alone (``kv_dtype``: the cache's dtype,
    ``None`` for the query dtype; an fp8 cache may take its own decode tiles and splits)."""
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
        max_splits = max(-(-seq_lens[b] // decode_split(seq_lens[b], kv_fp8)) for b in decode_seqs)
        decode = LaunchConfig(
            grid=(len(decode_seqs), max_splits, num_kv_heads),
            GROUP_PAD=max(MIN_DOT, group_pad),
            BLOCK_Q=1,
            BLOCK_N=(FP8_DECODE_BLOCK_N or DECODE_BLOCK_N) if kv_fp8 else DECODE_BLOCK_N,
            SPLIT_SIZE=(FP8_SPLIT_SIZE or SPLIT_SIZE) if kv_fp8 else SPLIT_SIZE,
            SPLIT_LONG=SPLIT_LONG,
            LONG_FROM=LONG_FROM,
            SPLIT_SHORT=SPLIT_SHORT,
            SHORT_UNDER=SHORT_UNDER,
            MASK_SPLIT=DECODE_MASK_SPLIT,
            num_warps=DECODE_WARPS,
            num_stages=2 if dtype == torch.float32 and d_pad > 128 else DECODE_STAGES,
            **common,
        )
    if other_seqs:
        # fp32 tiles are twice the bytes and run on FMA units, not the tensor cores:
        # smaller tiles keep them inside the 227 KB of shared memory of a Hopper SM
        wide = dtype == torch.float32
        rows = max(PREFILL_ROWS // (2 if wide else 1) // (2 if wide and d_pad > 128 else 1), group_pad, MIN_DOT)
        block_q = rows // group_pad
        max_q = max(query_lens[b] for b in other_seqs)
        block_n = PREFILL_BLOCK_N // (2 if wide and d_pad > 128 else 1)
        stages = PREFILL_STAGES if not wide else 2
        # a deeper pipeline only where its K/V buffers fit beside the query tile (16-bit tiles;
        # head_dim 256 keeps 2 stages); the compile test checks the launch limit
        if stages > 2 and (rows + 2 * stages * block_n) * d_pad * 2 > PREFILL_SHARED_BUDGET:
            stages = 2
        other = LaunchConfig(
            grid=(len(other_seqs), -(-max_q // block_q), num_kv_heads),
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
    return (FP8_SPLIT_SIZE or SPLIT_SIZE) if kv_fp8 else SPLIT_SIZE


#: Tile shapes (tuned on an H200, see benchmarks/): decode reads BLOCK_N keys a step,
#: SPLIT_SIZE keys per program (SPLIT_LONG from LONG_FROM keys on); prefill tiles hold PREFILL_ROWS query rows.
DECODE_BLOCK_N = 64
DECODE_WARPS = 4
DECODE_STAGES = 3
SPLIT_SIZE = 512
SPLIT_LONG = 2048  # issue 17, second round: 0.93/0.94 of SDPA at B=8/32, L=32k (1024: 0.90/0.93; B=1: 0.89 vs 0.91)
LONG_FROM = 16384
SPLIT_SHORT = 256  # unused while SHORT_UNDER is 0
SHORT_UNDER = 0
FP8_DECODE_BLOCK_N = 0  # decode over an fp8 cache: 0 takes DECODE_BLOCK_N ...
FP8_SPLIT_SIZE = 0  # ... and SPLIT_SIZE
PREFILL_ROWS = 128
PREFILL_BLOCK_N = 64
PREFILL_STAGES = 3  # 2 where 3 would not fit (PREFILL_SHARED_BUDGET), and for fp32
#: bytes of shared memory the prefill's query and K/V buffers may take (of 227 KB on sm_90,
#: leaving room for the fp8 path's widened V tile and the layout conversions)
PREFILL_SHARED_BUDGET = 160 * 1024
PREFILL_WARPS = 0  # 0: 8 warps for tiles of >= 128 rows and head_dim > 64, else 4
PREFILL_MAXNREG: int | None = None  # half-precision prefill, head_dim <= 128 only (larger tiles would spill)

#: Issue 17's second round (see benchmarks/NOTES.md): the softmax in base 2 with the scale
#: folded into one multiply-add per score, no mask on key tiles every row sees wholly, and
#: prefill's longest causal tiles launched first. False gives the kernel of the first round.
EXP2_SOFTMAX = True
DECODE_MASK_SPLIT = False
PREFILL_MASK_SPLIT = True
PREFILL_HEAVY_FIRST = True
