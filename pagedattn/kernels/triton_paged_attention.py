"""Paged attention as a Triton kernel: the host API that checks, plans, allocates and
launches (``prepare``, ``run``, ``paged_attention``).

Decode, causal prefill, partial continuation, GQA/MQA and scattered or shared blocks,
for a ragged batch, with a value width of its own where asked. Sequences with one new
token go to the decode kernel (``triton_decode``), the others to the prefill kernel
(``triton_prefill``, which also takes speculative decoding's tree masks); both walk the
history through the block table with the online softmax of ``triton_tiles``. A batch over
MLA's shared latent cache goes to its own kernel (``triton_mla_decode``), in two launches:
its decodes, and its sequences of several new tokens (causal or tree-masked). Every integer
that becomes a pointer offset or a grid size is computed on the host by plain functions
(``checks``, ``launch_plan``, ``decode_splits``), which never import triton and are tested
anywhere; the tuning they read is ``tuning.TUNING``.

Without a GPU, Triton runs the kernels under its interpreter, which must be switched on
with ``TRITON_INTERPRET=1`` *before* this module (and triton) is imported: the
``triton`` backend arranges that. The interpreter computes bf16 wrongly
(triton-lang/triton#11584: bf16 is kept as raw 16-bit integers, so ``tl.dot`` on bf16
returns garbage and fp32->bf16 casts truncate); on the interpreter, bf16 inputs
therefore run with ``UPCAST=True``: every bf16 tile is converted to fp32 right after its
load (exact), the dots run in fp32, and the result is written to an fp32 buffer that
torch rounds to bf16 on the host.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch

from pagedattn.kernels.checks import (
    Variants,
    check_head_scale_range,
    check_mla_variants,
    check_paged_inputs,
    check_tree_mask,
    check_variants,
    fits_int32,
    head_scales,
    shared_latent,
)
from pagedattn.kernels.launch_plan import (
    MIN_DOT,
    TREE_TILE_KEYS,
    LaunchConfig,
    LaunchPlan,
    fp8_widening,
    plan_launch,
)
from pagedattn.kernels.triton_decode import _decode_kernel
from pagedattn.kernels.triton_mla_decode import _mla_decode_kernel
from pagedattn.kernels.triton_prefill import _prefill_kernel
from pagedattn.kernels.tuning import TUNING, KernelTuning
from pagedattn.validation import default_scale

__all__ = [
    "MIN_DOT",
    "TUNING",
    "KernelTuning",
    "LaunchConfig",
    "LaunchPlan",
    "PreparedBatch",
    "Variants",
    "check_paged_inputs",
    "check_variants",
    "fits_int32",
    "fp8_widening",
    "interpreter_active",
    "paged_attention",
    "plan_launch",
    "prepare",
    "run",
]


def interpreter_active() -> bool:
    """True when Triton kernels run under the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass
class PreparedBatch:
    """A validated, planned batch: what ``run`` needs besides the tensors it reads.

    Build it once per batch with ``prepare`` (the checks and the one device-to-host
    transfer happen there) and ``run`` it for every layer, as serving engines build
    their attention metadata once per step. Everything ``run`` needs beyond its
    arguments is allocated here, so ``run`` can be captured in a CUDA graph.
    """

    plan: LaunchPlan
    # the softmax scale times k_scale (an fp8 cache's dequantization); with per-kv-head scales the
    # softmax scale alone, which the kernels leave unread (qk_scales holds each kv head's product)
    scale: float
    query_shape: tuple[int, ...]
    cache_shape: tuple[int, ...]
    value_shape: tuple[int, ...]  # the value cache's: a latent cache's first head_dim_v columns (MLA)
    dtype: torch.dtype
    kv_dtype: torch.dtype
    device: torch.device
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    decode_ids: torch.Tensor | None
    other_ids: torch.Tensor | None
    part_acc: torch.Tensor | None  # [n_decode, plan.scratch_splits, num_heads, HEAD_DIM_V_PAD] fp32
    part_ml: torch.Tensor | None  # [n_decode, plan.scratch_splits, num_heads, 2] fp32
    done: torch.Tensor | None  # [n_decode, decode programs a split] int32, zero between launches
    upcast_out: torch.Tensor | None  # [num_tokens, num_heads, head_dim_v] fp32 (interpreter, bf16 only)
    # MLA's launch of multi-token sequences: its scratch (a row per new token), counters, and
    # each launch's first scratch row a sequence (``[n + 1]`` int32; the decode launch's: 0 .. n)
    other_acc: torch.Tensor | None = None  # [new tokens, plan.other_splits, num_heads, head_dim_v] fp32
    other_ml: torch.Tensor | None = None  # [new tokens, plan.other_splits, num_heads, 2] fp32
    other_done: torch.Tensor | None = None  # [n_other, other launch's axis-0 programs] int32
    decode_rows: torch.Tensor | None = None
    other_rows: torch.Tensor | None = None
    tree_words: torch.Tensor | None = None  # [num_tokens, words a row] int64: each token's tree row as bits
    variants: Variants = Variants()
    fp8_native: bool = False  # the device converts fp8 pairs to fp16 in one instruction (sm_89+, CUDA, compiled)
    # per-kv-head fp8 scales (``PER_HEAD_SCALES``), copied here: a prepared batch keeps the scales it was
    # prepared with
    qk_scales: torch.Tensor | None = None  # [num_kv_heads] fp32: the softmax scale times each kv head's k_scale
    v_scales: torch.Tensor | None = None  # [num_kv_heads] fp32


def prepare(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    *,
    tuning: KernelTuning = TUNING,
    tree_mask: torch.Tensor | None = None,
    **variants,
) -> PreparedBatch:
    """Check every input (``ValueError`` naming the field), plan the launches and
    allocate their scratch. Arguments as for ``paged_attention``; ``tuning``: the tile and
    split sizes the plan takes (``pagedattn.kernels.tuning``)."""
    # the slopes' and sinks' finiteness, the per-head scales' and the tree mask's entries ride
    # on the one device-to-host transfer of the core checks
    lens, loc = check_paged_inputs(
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        out,
        alibi_slopes=variants.get("alibi_slopes"),
        sinks=variants.get("sinks"),
        k_scale=variants.get("k_scale", 1.0),
        v_scale=variants.get("v_scale", 1.0),
        tree_mask=tree_mask,
    )
    var = check_variants(query, key_cache, scale=scale, **variants)
    check_tree_mask(tree_mask, var)
    query_lens = [loc[i + 1] - loc[i] for i in range(len(lens))]
    latent = shared_latent(key_cache, value_cache)  # MLA: the value is the key row's first columns
    if latent is not None:
        check_mla_variants(var)
    interp = interpreter_active()
    if query.device.type != "cuda" and not interp:
        raise RuntimeError(
            "paged_attention: tensors are on the CPU but the Triton interpreter is off; set TRITON_INTERPRET=1 "
            "before importing triton (the `triton` backend does this) or move the tensors to a GPU"
        )
    T, Hq, D = query.shape
    Hkv = key_cache.shape[2]
    softmax_scale = default_scale(D) if scale is None else float(scale)
    scale_tensors: dict[str, torch.Tensor] = {}
    if var.per_head_scales:
        # a kv head's scales in the kernel: its fp32 product as the per-tensor path's argument is
        # (``head_scales``); their range costs per-head batches a second small read
        qk_scales, v_scales = head_scales(var, softmax_scale, Hkv)
        check_head_scale_range(qk_scales, v_scales)
        scale_tensors.update(qk_scales=qk_scales, v_scales=v_scales)
    plan = plan_launch(
        lens,
        query_lens,
        Hq,
        Hkv,
        D,
        key_cache.shape[1],
        query.dtype,
        interp,
        key_cache.dtype,
        var.sliding_window,
        tuning=tuning,
        head_dim_v=value_cache.shape[3],
        shared_kv=latent is not None,
    )
    if tree_mask is not None and plan.other is not None and plan.other.BLOCK_N > TREE_TILE_KEYS:
        raise ValueError(
            f"tuning: a tree-masked launch takes key tiles of at most {TREE_TILE_KEYS} keys (two 64-bit words "
            f"of a row), got BLOCK_N {plan.other.BLOCK_N}"
        )
    dev = query.device
    n_dec = len(plan.decode_seqs)
    d_pad = plan.decode.HEAD_DIM_V_PAD if plan.decode is not None else 0
    # the decode programs a split of a sequence: one a kv head, or MLA's head blocks of each
    counters = Hkv * plan.decode.HEAD_BLOCKS if plan.mla and plan.decode is not None else Hkv
    mla_other: dict[str, Any] = {}
    if plan.mla:
        if n_dec:
            mla_other["decode_rows"] = torch.arange(n_dec + 1, dtype=torch.int32, device=dev)
        if plan.other is not None:
            qs = [query_lens[b] for b in plan.other_seqs]
            rows = [0]
            for q in qs:
                rows.append(rows[-1] + q)
            mla_other.update(
                other_acc=torch.empty(
                    rows[-1], plan.other_splits, Hq, plan.other.HEAD_DIM_V, dtype=torch.float32, device=dev
                ),
                other_ml=torch.empty(rows[-1], plan.other_splits, Hq, 2, dtype=torch.float32, device=dev),
                other_done=torch.zeros(len(qs), plan.other.grid[0], dtype=torch.int32, device=dev),
                other_rows=torch.tensor(rows, dtype=torch.int32, device=dev),
            )
    upcast = any(cfg.UPCAST for cfg in (plan.decode, plan.other) if cfg is not None)
    Dv = value_cache.shape[3]
    return PreparedBatch(
        plan=plan,
        scale=softmax_scale * (1.0 if var.per_head_scales else float(var.k_scale)),
        query_shape=tuple(query.shape),
        cache_shape=tuple(key_cache.shape),
        value_shape=tuple(value_cache.shape),
        dtype=query.dtype,
        kv_dtype=key_cache.dtype,
        device=dev,
        block_tables=block_tables,
        seq_lens=seq_lens,
        query_start_loc=query_start_loc,
        decode_ids=torch.tensor(plan.decode_seqs, dtype=torch.int32, device=dev) if n_dec else None,
        other_ids=torch.tensor(plan.other_seqs, dtype=torch.int32, device=dev) if plan.other_seqs else None,
        part_acc=torch.empty(n_dec, plan.scratch_splits, Hq, d_pad, dtype=torch.float32, device=dev) if n_dec else None,
        part_ml=torch.empty(n_dec, plan.scratch_splits, Hq, 2, dtype=torch.float32, device=dev) if n_dec else None,
        done=torch.zeros(n_dec, counters, dtype=torch.int32, device=dev) if n_dec else None,
        upcast_out=torch.empty(T, Hq, Dv, dtype=torch.float32, device=dev) if upcast else None,
        variants=var,
        # only multi-token sequences read their masks (a decode's is [True]), as bits: the kernels
        # test a bit a score and load two words a row a masked tile, whatever the tree's length
        tree_words=tree_words(tree_mask, query_lens, loc, dev) if tree_mask is not None and plan.other_seqs else None,
        fp8_native=_fp8_native(dev, interp),
        **mla_other,
        **scale_tensors,
    )


def tree_words(tree_mask: torch.Tensor, query_lens: list[int], loc: list[int], device: torch.device) -> torch.Tensor:
    """``[num_tokens, W]`` int64, ``W = ceil(max(query_lens) / 64)``: bit ``c % 64`` of word ``c // 64``
    of token ``t``'s row set where ``t`` (new token ``i`` of sequence ``b``) sees new token ``c`` of
    ``b`` (``tree_mask``'s ``[i, c]``), for the kernels, which test a bit a score instead of loading
    the mask in their loops. The mask's values are read here, at ``prepare``: a prepared batch
    keeps the tree it was prepared with."""
    width = -(-max(query_lens) // 64)
    # on the mask's device: one small transfer (the lengths), the rest computed where the mask is
    q = torch.tensor(query_lens, dtype=torch.int64, device=device)
    entries = q * q  # [B] the mask's entries a sequence
    seq = torch.repeat_interleave(torch.arange(len(query_lens), device=device), entries)  # [sum q_b^2]
    local = torch.arange(tree_mask.shape[0], device=device) - (torch.cumsum(entries, 0) - entries)[seq]
    row = torch.tensor(loc[:-1], dtype=torch.int64, device=device)[seq] + local // q[seq]  # the entry's token
    col = local % q[seq]  # the new token it sees
    bits = tree_mask.to(torch.int64) << (col % 64)
    # distinct bits a word: their sum is their or (bit 63 too, in two's complement)
    words = torch.zeros(loc[-1] * width, dtype=torch.int64, device=device)
    return words.index_add_(0, row * width + col // 64, bits).view(loc[-1], width)


def _fp8_native(device: torch.device, interpreter: bool) -> bool:
    """Whether ``device`` runs ``cvt.rn.f16x2.e4m3x2`` (``_widen_pairs``): CUDA, sm_89 or later,
    compiled (the interpreter runs no inline assembly)."""
    if interpreter or device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def run(
    prep: PreparedBatch,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    *,
    compile_only: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The launches of a prepared batch, over tensors of the prepared shapes (checked
    here without touching the device: shapes, dtypes, devices, last-dim strides).

    ``out`` [num_tokens, num_heads, head_dim_v] (query dtype) and, with ``return_lse``,
    ``lse`` [num_tokens, num_heads] float32 are written when given, else allocated.
    Given both, ``run`` allocates nothing and never waits for the device, so it can be
    captured in a CUDA graph and replayed (one prepared batch per graph: the batch's
    block tables, lengths and scratch are read where ``prepare`` found or made them, so
    keep the prepared batch alive as long as the graph: freed, its scratch would be
    reused by other tensors, and a replay would count splits in their memory).
    ``compile_only``: compile the batch's kernels (Triton's ``warmup``: into its in-memory
    and on-disk caches) and launch nothing; ``out`` is returned unwritten. Safe from a
    second thread while other batches run (the conformance suite's warm-up ahead); on the
    interpreter, which compiles nothing, it does nothing.
    Returns ``out``, or ``(out, lse)`` when prepared with ``return_lse=True``."""
    for name, t, shape, dtype in (
        ("query", query, prep.query_shape, prep.dtype),
        ("key_cache", key_cache, prep.cache_shape, prep.kv_dtype),
        ("value_cache", value_cache, prep.value_shape, prep.kv_dtype),
    ):
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != prep.device or t.stride(-1) != 1:
            raise ValueError(
                f"paged_attention.run: {name} must match the prepared batch: shape {shape}, {dtype}, "
                f"{prep.device}, contiguous last dimension; got {tuple(t.shape)}, {t.dtype}, {t.device}"
            )
    out_shape = (*prep.query_shape[:2], prep.value_shape[3])  # [num_tokens, num_heads, head_dim_v]
    if out is None:
        out = torch.empty(out_shape, dtype=prep.dtype, device=prep.device)
    elif (
        tuple(out.shape) != out_shape
        or out.dtype != prep.dtype
        or out.device != prep.device
        or out.stride(-1) != 1
        or not fits_int32(out)
    ):
        raise ValueError(
            f"paged_attention.run: out must be {prep.dtype} of shape {out_shape} on {prep.device}, with a "
            "contiguous last dimension and every element offset <= 2**31 - 1"
        )
    plan, var = prep.plan, prep.variants
    T, Hq = prep.query_shape[:2]
    if lse is not None and not var.return_lse:
        raise ValueError("paged_attention.run: lse given, but the batch was prepared without return_lse=True")
    if lse is None and var.return_lse:
        lse = torch.empty(T, Hq, dtype=torch.float32, device=prep.device)
    elif lse is not None and (tuple(lse.shape) != (T, Hq) or lse.dtype != torch.float32 or lse.device != prep.device):
        raise ValueError(f"paged_attention.run: lse must be float32 of shape {(T, Hq)} on {prep.device}")
    # bf16 on the interpreter: write fp32, round with torch (the interpreter truncates)
    target = prep.upcast_out if prep.upcast_out is not None else out
    lse_buf = lse if lse is not None else target  # an unused pointer still needs a tensor of the device
    alibi = var.alibi_slopes if var.alibi_slopes is not None else target
    sinks = var.sinks if var.sinks is not None else target
    # per kv head (``PER_HEAD_SCALES``), the kernels load these and leave the scalars unread
    qk_scales = prep.qk_scales if prep.qk_scales is not None else target
    v_scales = prep.v_scales if prep.v_scales is not None else target
    v_scale = 1.0 if var.per_head_scales else float(var.v_scale)
    window = var.sliding_window or 0
    cap = var.logits_soft_cap or 1.0
    kv_fp8 = prep.kv_dtype != prep.dtype
    f16_dots = kv_fp8 and prep.dtype == torch.bfloat16  # bf16 queries over an fp8 cache (``_query_rows``)
    strides_kv = (
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
    )
    # the pairs' 16-bit loads: every offset into both caches even
    even = (
        kv_fp8
        and prep.fp8_native
        and prep.cache_shape[3] % 2 == 0
        and prep.value_shape[3] % 2 == 0
        and key_cache.data_ptr() % 2 == 0
        and value_cache.data_ptr() % 2 == 0
        and all(s % 2 == 0 for s in strides_kv)
    )
    flags = dict(
        USE_WINDOW=var.sliding_window is not None,
        USE_SOFTCAP=var.logits_soft_cap is not None,
        USE_ALIBI=var.alibi_slopes is not None,
        USE_SINKS=var.sinks is not None,
        KV_FP8=fp8_widening(prep.kv_dtype, prep.dtype == torch.float16 or f16_dots, prep.fp8_native, even),
        F16_DOTS=f16_dots,
        # int32 cache offsets where every offset fits: a 64-bit multiply is three instructions a key
        OFF_I32=fits_int32(key_cache) and fits_int32(value_cache),
        WRITE_LSE=var.return_lse,
        PER_HEAD_SCALES=var.per_head_scales,
    )
    tables, seq_lens, loc = prep.block_tables, prep.seq_lens, prep.query_start_loc
    if plan.mla:
        _run_mla(prep, query, key_cache, target, lse_buf, qk_scales, v_scales, v_scale, compile_only)
    elif plan.decode is not None:
        cfg, part_acc, part_ml = plan.decode, prep.part_acc, prep.part_ml
        assert part_acc is not None and part_ml is not None  # prepared with the decode launch
        _launcher(_decode_kernel, cfg.grid, compile_only)(
            query,
            key_cache,
            value_cache,
            tables,
            seq_lens,
            loc,
            prep.decode_ids,
            alibi,
            sinks,
            qk_scales,
            v_scales,
            part_acc,
            part_ml,
            prep.done,
            target,
            lse_buf,
            prep.scale,
            v_scale,
            window,
            cap,
            prep.cache_shape[2],
            cfg.SPLIT_GROUPS,
            cfg.SPLITS_PER_PROGRAM,
            query.stride(0),
            query.stride(1),
            *strides_kv,
            tables.stride(0),
            part_acc.stride(0),
            part_acc.stride(1),
            part_ml.stride(0),
            part_ml.stride(1),
            target.stride(0),
            target.stride(1),
            lse_buf.stride(0),
            GROUP=cfg.GROUP,
            GROUP_PAD=cfg.GROUP_PAD,
            BLOCK_N=cfg.BLOCK_N,
            HEAD_DIM=cfg.HEAD_DIM,
            HEAD_DIM_PAD=cfg.HEAD_DIM_PAD,
            HEAD_DIM_V=cfg.HEAD_DIM_V,
            HEAD_DIM_V_PAD=cfg.HEAD_DIM_V_PAD,
            BLOCK_SIZE=cfg.BLOCK_SIZE,
            SPLIT_SIZE=cfg.SPLIT_SIZE,
            SPLIT_LONG=cfg.SPLIT_LONG,
            LONG_FROM=cfg.LONG_FROM,
            SPLIT_SHORT=cfg.SPLIT_SHORT,
            SHORT_UNDER=cfg.SHORT_UNDER,
            UPCAST=cfg.UPCAST,
            FLAT_GRID=cfg.FLAT_GRID,
            SPLIT_LOOP=cfg.SPLIT_LOOP,
            SPLIT_WHOLE=cfg.SPLIT_WHOLE,
            FOLD_PARTS=cfg.FOLD_PARTS,
            LOOP_PARTS=cfg.LOOP_PARTS,
            **flags,
            **cfg.launch_options,
        )
    if plan.other is not None and not plan.mla:
        cfg = plan.other
        _launcher(_prefill_kernel, cfg.grid, compile_only)(
            query,
            key_cache,
            value_cache,
            tables,
            seq_lens,
            loc,
            prep.other_ids,
            alibi,
            sinks,
            qk_scales,
            v_scales,
            prep.tree_words if prep.tree_words is not None else target,
            target,
            lse_buf,
            prep.scale,
            v_scale,
            window,
            cap,
            prep.tree_words.shape[1] if prep.tree_words is not None else 0,
            query.stride(0),
            query.stride(1),
            *strides_kv,
            tables.stride(0),
            target.stride(0),
            target.stride(1),
            lse_buf.stride(0),
            GROUP=cfg.GROUP,
            GROUP_PAD=cfg.GROUP_PAD,
            BLOCK_Q=cfg.BLOCK_Q,
            BLOCK_N=cfg.BLOCK_N,
            HEAD_DIM=cfg.HEAD_DIM,
            HEAD_DIM_PAD=cfg.HEAD_DIM_PAD,
            HEAD_DIM_V=cfg.HEAD_DIM_V,
            HEAD_DIM_V_PAD=cfg.HEAD_DIM_V_PAD,
            BLOCK_SIZE=cfg.BLOCK_SIZE,
            UPCAST=cfg.UPCAST,
            USE_TREE=prep.tree_words is not None,
            **flags,
            **cfg.launch_options,
        )
    if target is not out and not compile_only:
        out.copy_(target)
    return (out, lse) if lse is not None and var.return_lse else out


def _run_mla(
    prep: PreparedBatch,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    target: torch.Tensor,
    lse_buf: torch.Tensor,
    qk_scales: torch.Tensor,
    v_scales: torch.Tensor,
    v_scale: float,
    compile_only: bool,
) -> None:
    """The MLA launches of a prepared batch over the latent cache ``key_cache`` (the value is
    its first ``head_dim_v`` columns, read from there): decode sequences, then the multi-token
    ones. ``target`` [num_tokens, num_heads, head_dim_v] and, with ``return_lse``, ``lse_buf``
    [num_tokens, num_heads] fp32 are written. ``qk_scales``/``v_scales`` [num_kv_heads] fp32: the
    per-kv-head scales (``PER_HEAD_SCALES``; any tensor without it), ``v_scale`` the per-tensor one."""
    plan = prep.plan
    launches = (
        (plan.decode, prep.decode_ids, prep.decode_rows, prep.part_acc, prep.part_ml, prep.done, False),
        (plan.other, prep.other_ids, prep.other_rows, prep.other_acc, prep.other_ml, prep.other_done, True),
    )
    tables = prep.block_tables
    tree = prep.tree_words
    for cfg, ids, rows, part_acc, part_ml, done, multi in launches:
        if cfg is None:
            continue
        assert part_acc is not None and part_ml is not None  # prepared with the launch
        _launcher(_mla_decode_kernel, cfg.grid, compile_only)(
            query,
            key_cache,
            tables,
            prep.seq_lens,
            prep.query_start_loc,
            ids,
            rows,
            tree if tree is not None else target,
            part_acc,
            part_ml,
            done,
            prep.variants.sinks if prep.variants.sinks is not None else target,
            qk_scales,
            v_scales,
            target,
            lse_buf,
            prep.scale,
            v_scale,
            cfg.HEAD_BLOCKS,
            prep.cache_shape[2] * cfg.HEAD_BLOCKS,  # the head programs of a token tile
            tree.shape[1] if tree is not None else 0,
            query.stride(0),
            query.stride(1),
            key_cache.stride(0),
            key_cache.stride(1),
            key_cache.stride(2),
            tables.stride(0),
            part_acc.stride(0),
            part_acc.stride(1),
            part_ml.stride(0),
            part_ml.stride(1),
            target.stride(0),
            target.stride(1),
            lse_buf.stride(0),
            GROUP=cfg.GROUP,
            BLOCK_H=cfg.GROUP_PAD,
            BLOCK_Q=cfg.BLOCK_Q,
            BLOCK_N=cfg.BLOCK_N,
            HEAD_DIM=cfg.HEAD_DIM,
            HEAD_DIM_V=cfg.HEAD_DIM_V,
            ROPE_PAD=cfg.ROPE_PAD,
            BLOCK_SIZE=cfg.BLOCK_SIZE,
            SPLIT_SIZE=cfg.SPLIT_SIZE,
            SPLIT_LONG=cfg.SPLIT_LONG,
            LONG_FROM=cfg.LONG_FROM,
            SPLIT_SHORT=cfg.SPLIT_SHORT,
            SHORT_UNDER=cfg.SHORT_UNDER,
            UPCAST=cfg.UPCAST,
            KV_FP8=prep.kv_dtype != prep.dtype,  # widened by the compiler after the load
            OFF_I32=fits_int32(key_cache),
            WRITE_LSE=prep.variants.return_lse,
            USE_SINKS=prep.variants.sinks is not None,
            PER_HEAD_SCALES=prep.variants.per_head_scales,
            MULTI=multi,
            USE_TREE=multi and tree is not None,
            **cfg.launch_options,
        )


def _launcher(kernel: Any, grid: tuple[int, int, int], compile_only: bool) -> Any:
    """``kernel[grid]``, or with ``compile_only`` its compile without a launch (``warmup``;
    a no-op on the interpreter)."""
    if not compile_only:
        return kernel[grid]
    if interpreter_active():
        return lambda *args, **kwargs: None
    return functools.partial(kernel.warmup, grid=grid)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    *,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    return_lse: bool = False,
    tree_mask: torch.Tensor | None = None,
    compile_only: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Paged attention over a ragged batch: ``run(prepare(...), ...)``.

    Args:
        query: ``[num_tokens, num_heads, head_dim]`` float32/float16/bfloat16.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``,
            the query dtype or float8_e4m3fn/float8_e5m2; any strides with a contiguous
            last dimension. Or MLA's latent cache: ``value_cache`` a view of ``key_cache``'s
            first ``head_dim_v`` columns (``key_cache[..., :head_dim_v]``, a power of two),
            read from the key cache (no window, soft-cap or ALiBi).
        block_tables: ``[num_seqs, max_blocks]`` int32 (entries past a sequence's last
            block are never read).
        seq_lens: ``[num_seqs]`` int32, new tokens included.
        query_start_loc: ``[num_seqs + 1]`` int32.
        scale: softmax scale, default ``head_dim ** -0.5``.
        out: optional ``[num_tokens, num_heads, head_dim_v]`` query-dtype tensor to write.
        sliding_window: ``W >= 1``: the query at position ``p`` sees keys ``p-W+1 .. p``.
        logits_soft_cap: ``c > 0``: scores become ``c * tanh(s / c)`` before masking.
        alibi_slopes: ``[num_heads]`` float32: score ``+= slope[h] * (j - p)``.
        sinks: ``[num_heads]`` float32: a logit per head that joins the denominator.
        k_scale, v_scale: dequantization scales of an fp8 cache (1.0 otherwise): floats, or
            ``[num_kv_heads]`` float32 tensors (one may be a float), kv head ``g``'s keys
            ``float(key_cache[..., g, :]) * k_scale[g]`` (values likewise). ``prepare`` copies
            them: a prepared batch keeps the scales it was prepared with.
        return_lse: also return the log-sum-exp.
        tree_mask: ``[sum_b q_b * q_b]`` bool: sequence ``b``'s ``[q_b, q_b]`` mask, row-major,
            after those of the sequences before it; new token ``i`` sees new token ``j``
            where ``[i, j]`` is set (lower-triangular), and the whole history. Not with
            ``sliding_window`` or ``alibi_slopes``.
        compile_only: compile this batch's kernels and launch nothing (``run``).

    Returns:
        ``[num_tokens, num_heads, head_dim_v]`` in the query dtype (``out`` if given);
        with ``return_lse``, also ``[num_tokens, num_heads]`` float32, the natural log of
        each row's softmax denominator (the sink included).
    """
    prep = prepare(
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        out,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        k_scale=k_scale,
        v_scale=v_scale,
        return_lse=return_lse,
        tree_mask=tree_mask,
    )
    return run(prep, query, key_cache, value_cache, out, compile_only=compile_only)
