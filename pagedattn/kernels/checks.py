"""The Triton kernel's input checks: the problem's rules and the kernel's own (contiguous
last dimensions, int32 offsets, fp32 scales, ``out``). Plain Python and torch, tested on
any machine; nothing here imports triton."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedattn.validation import (
    ProblemError,
    check_kv_scale,
    check_options,
    check_per_head,
    check_tensors,
    check_tree_combination,
    default_scale,
    is_leading_view,
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
#: too where every offset fits, else int64: the kernels' ``OFF_I32``)
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


def shared_latent(key_cache: torch.Tensor, value_cache: torch.Tensor) -> int | None:
    """The value width ``head_dim_v`` where ``value_cache`` is a view of ``key_cache``'s first
    ``head_dim_v < head_dim`` columns (MLA's latent cache, ``PagedCase.shared_kv``); ``None``
    for separate caches."""
    if value_cache.shape[3] < key_cache.shape[3] and is_leading_view(key_cache, value_cache):
        return int(value_cache.shape[3])
    return None


#: the variants the MLA kernel has none of (``check_mla_variants``)
MLA_ABSENT = ("sliding_window", "logits_soft_cap", "alibi_slopes")


def check_mla_variants(variants: Variants) -> None:
    """``ProblemError`` naming the first variant the MLA kernel (a shared latent cache)
    does not compute: a window, soft-cap, ALiBi."""
    for name in MLA_ABSENT:
        if getattr(variants, name) is not None:
            raise ProblemError(OWNER, name, "must be None over a shared latent cache (the MLA kernel has none)")


def check_tree_mask(tree_mask: torch.Tensor | None, variants: Variants) -> None:
    """The kernel's rules of a tree mask beyond the problem's (``check_paged_inputs`` checks
    those): contiguous, and, as the problem says, without a window or ALiBi."""
    if tree_mask is None:
        return
    if tree_mask.stride(0) != 1:
        raise ProblemError(OWNER, "tree_mask", f"must be contiguous, got stride {tree_mask.stride(0)}")
    check_tree_combination(OWNER, tree_mask, sliding_window=variants.sliding_window, alibi_slopes=variants.alibi_slopes)


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
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    tree_mask: torch.Tensor | None = None,
) -> tuple[list[int], list[int]]:
    """Every check of the tensors the kernel needs before a launch: the problem's rules
    (``pagedattn.validation.check_tensors``, as ``PagedCase`` applies them) and the kernel's
    own (a contiguous last dimension, int32 offsets, fp32 scales, ``out``). Raises
    ``ProblemError`` (a ``ValueError``) naming the field and the bound. Returns
    ``(seq_lens, query_start_loc)`` as lists: the values reach the host once, in one
    transfer, and serve the launch plan too.

    Args:
        query: ``[num_tokens, num_heads, head_dim]`` float32/float16/bfloat16.
        key_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, the query dtype or
            float8_e4m3fn/float8_e5m2; value_cache: ``[..., head_dim_v]``, its dtype (a view of
            its leading columns for MLA's latent cache).
        block_tables: ``[num_seqs, max_blocks]`` int32; seq_lens: ``[num_seqs]`` int32;
            query_start_loc: ``[num_seqs + 1]`` int32.
        scale: a real number > 0 inside fp32's normal range, or ``None`` (the default).
        out: optional ``[num_tokens, num_heads, head_dim]`` in the query dtype.
        alibi_slopes, sinks: optional ``[num_heads]`` float32, finite: checked here
            because their finiteness rides on the same transfer (a separate check would
            cost the launch a second device synchronization).
        k_scale, v_scale: a float (``check_variants`` judges it) or ``[num_kv_heads]`` float32
            (per kv head): whether every entry is finite and > 0 rides on the same transfer.
        tree_mask: optional ``[sum_b q_b * q_b]`` bool, each sequence's mask with a True
            diagonal and nothing above it: its entries ride on the same transfer.
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
        k_scale=k_scale,
        v_scale=v_scale,
        tree_mask=tree_mask,
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
        shape = (*query.shape[:2], value_cache.shape[3])  # [num_tokens, num_heads, head_dim_v]
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != query.dtype:
            got = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise ProblemError(OWNER, "out", f"must be a {query.dtype} tensor of shape {shape}, got {got}")
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
    k_scale: float | torch.Tensor = 1.0  # a float, or [num_kv_heads] float32 (per kv head)
    v_scale: float | torch.Tensor = 1.0
    return_lse: bool = False

    @property
    def per_head_scales(self) -> bool:
        """True when ``k_scale`` or ``v_scale`` is a per-kv-head tensor (the kernels' ``PER_HEAD_SCALES``)."""
        return isinstance(self.k_scale, torch.Tensor) or isinstance(self.v_scale, torch.Tensor)


def check_variants(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    *,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    return_lse: bool = False,
    scale: float | None = None,
) -> Variants:
    """The variants' arguments, checked on the host (no device transfer): the problem's
    rules (``pagedattn.validation.check_options``/``check_per_head``) and the kernel's own
    (an int32 window, fp32 scales, contiguous per-head tensors). Raises
    ``ProblemError`` (a ``ValueError``) naming the field and the bound.

    ``scale`` is the softmax scale as given to ``check_paged_inputs`` (``None``: the
    default ``head_dim ** -0.5``): the kernel receives ``scale * k_scale`` as one fp32
    argument, so that product must stay inside fp32's normal range. A ``k_scale``/``v_scale``
    tensor (per kv head) is checked here for its shape, dtype and device (the problem's
    ``check_kv_scale``); its values' range is ``check_head_scale_range``'s.
    Whether ``alibi_slopes``, ``sinks`` and the scale tensors hold finite values is checked
    by ``check_paged_inputs``, in its one device transfer."""
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
    softmax_scale = default_scale(query.shape[2]) if scale is None else float(scale)
    for name, x in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(x, torch.Tensor):
            check_kv_scale(OWNER, name, x, key_cache.shape[2], query.device)
            continue
        problem = fp32_scale_problem(softmax_scale * float(x) if name == "k_scale" else float(x))
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
        k_scale=k_scale if isinstance(k_scale, torch.Tensor) else float(k_scale),
        v_scale=v_scale if isinstance(v_scale, torch.Tensor) else float(v_scale),
        return_lse=bool(return_lse),
    )


def head_scales(variants: Variants, softmax_scale: float, num_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-kv-head scales the kernels load with ``PER_HEAD_SCALES``: ``(qk_scales, v_scales)``,
    each ``[num_kv_heads]`` float32, contiguous, new (a float repeated where its field is one).
    ``qk_scales[g]`` is ``softmax_scale * k_scale[g]`` formed in float64 and rounded to fp32
    once, as the per-tensor path's host product becomes its fp32 argument: heads that share
    one scale compute the per-tensor bits. No device read; on the scales' device (the query's)."""
    device = next(x.device for x in (variants.k_scale, variants.v_scale) if isinstance(x, torch.Tensor))
    k, v = (
        x.to(torch.float64)
        if isinstance(x, torch.Tensor)
        else torch.full((num_kv_heads,), x, dtype=torch.float64, device=device)
        for x in (variants.k_scale, variants.v_scale)
    )
    return (k * softmax_scale).to(torch.float32).contiguous(), v.to(torch.float32).contiguous()


def check_head_scale_range(qk_scales: torch.Tensor, v_scales: torch.Tensor) -> None:
    """``ProblemError`` naming ``k_scale`` or ``v_scale`` when a kv head's fp32 scale (``head_scales``:
    ``scale * k_scale[g]``, ``v_scale[g]``) left fp32's normal range: the per-tensor rule of
    ``check_variants``, per kv head. One small device read (the extremes of both)."""
    lo_k, hi_k, lo_v, hi_v = torch.stack([qk_scales.min(), qk_scales.max(), v_scales.min(), v_scales.max()]).tolist()
    for name, lo, hi in (("k_scale", lo_k, hi_k), ("v_scale", lo_v, hi_v)):
        problem = fp32_scale_problem(lo) or fp32_scale_problem(hi)
        if problem:
            what = "scale * k_scale" if name == "k_scale" else "v_scale"
            raise ProblemError(OWNER, name, f"{what} of every kv head {problem}")
