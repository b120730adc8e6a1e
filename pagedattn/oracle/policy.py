"""The tolerance policy: the per-element bound a correct kernel stays within.

``chunk_bounds`` forms the bound of the error model (``pagedattn.oracle.error_model``, derived
in ``docs/tolerance.md``) a block of query rows at a time, from the oracle's own pass: its
weights, maxima, denominators and smallest logits. The only work of the scores' size beyond
the oracle's is one float32 product of the weights with the sequence's value moments
(``pagedattn.oracle.sequence_stats``).

Its verdicts live beside it: ``pagedattn.oracle.verdict`` judges an attention output
against this bound (``check_attention``, ``AttentionCheck``), ``pagedattn.oracle.bitexact``
judges data movement bit for bit (``check_bitexact``, ``BitCheck``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from pagedattn.oracle.case import PagedCase
from pagedattn.oracle.error_model import (
    C_ACC,
    C_DOT,
    C_EXP,
    C_W,
    DTYPE_TABLE,
    TF32_PV_OPERANDS,
    U_FP32,
    U_RCP_APPROX,
    U_TANH_APPROX,
    U_TF32_OPERAND,
    UNIFORM_VAR,
    DtypeModel,
    _half_ulp,
    _u,
)
from pagedattn.oracle.reference import Chunk, iter_chunks
from pagedattn.oracle.sequence_stats import _decode_sums, _KeyMax, _spent, _value_moments, _visible_keys_grow
from pagedattn.oracle.subnormal import _subnormal_weights, _weights_stay_normal
from pagedattn.validation import ProblemError

#: how fp32 dot products round their operands (``Capabilities.fp32_precision``):
#: ``ieee`` (exact fp32 products) or ``tf32`` (operands rounded to TF32 first)
PRECISIONS = ("ieee", "tf32")
#: how q·k is formed (``Capabilities.qk_precision``): ``fp32`` products and sum (or TF32 per
#: ``fp32_precision``); ``scaled_query``: the scale (times log2 e) folded into the query, rounded
#: to the input dtype; ``input``: each product rounded to the input dtype, the sum in fp32, and
#: the score rounded to the input dtype once
QK_PRECISIONS = ("fp32", "scaled_query", "input")
#: how a split history's partial outputs are kept before their merge
#: (``Capabilities.partials_precision``): ``fp32``, or ``input``: rounded to the input dtype
PARTIALS_PRECISIONS = ("fp32", "input")
#: how the soft-cap's tanh is evaluated (``Capabilities.tanh_precision``): ``ieee`` (within a
#: few fp32 ulps, as libm's tanhf) or ``approx`` (PTX ``tanh.approx.f32``, FlashInfer's soft-cap)
TANH_PRECISIONS = ("ieee", "approx")
#: float64 score-sized tensors of one block alive at once while the bound is formed: on a device
#: the oracle's two (the check's own take the spent scores' storage, ``_spent``), so the check
#: walks the oracle's blocks; on the CPU, where the check's masks and per-row tensors would
#: raise its peak above the oracle's, blocks of half the rows. The bound's terms are the row's
#: own, so the blocks change no bound beyond float32's rounding of the one product (``BLOCK_RTOL``).
_LIVE = 2
_LIVE_CPU = 4


def _live(case: PagedCase) -> int:
    """``live`` for ``iter_chunks``: the check's blocks of rows for ``case``'s device."""
    return _LIVE_CPU if case.device.type == "cpu" else _LIVE


#: how far an element's bound may move with the blocks of rows the oracle walks: every term is
#: the row's own, only the float32 product's rounding differs, and where ``sum_j p_j (v_j - o)^2``
#: cancels to its rounding allowance a few parts in 10^4 show; and how far a decode's bound on the
#: device path (``direct_decode``: no float32 product, no allowance for it) may lie from the CPU
#: path's either way (up to 1.3% below over the standard profile's decodes)
BLOCK_RTOL = 1e-2
#: how far the fused check (``pagedattn.verdict_kernel.host``, one Triton kernel a block) may put a
#: bound or a ratio from the torch path's: the same float64 formulas in the same order, but a
#: compiler may contract a multiply and an add into one rounding, and the keys' norms and a
#: decode's direct sums (``_decode_sums``) are summed in another order than torch's: nonnegative
#: terms, a float64 rounding a key at worst (2 Lc u, past 1e-12 only beyond ~4500 keys, where the
#: errors' typical size, sqrt(Lc) u, is ~1e-14)
FUSED_RTOL = 1e-12
#: take the device path on the CPU too (tests and the op counter compare the two paths):
#: no host read per block (``chunk_bounds``) nor per verdict block (``verdict._Verdict``)
DEVICE_PATH_ON_CPU = False
#: on the device path, a decode (a sequence with one new token) has its value sums formed directly
#: (``_decode_sums``): in float64, about the row's own output, from its weights, values and keys,
#: rather than from the float32 product with the sequence's moments. On a GPU that is the verdict
#: kernel's own work (``pagedattn.verdict_kernel.host``), which saves a host-bound check 4 or 5
#: launches a decode; the torch path forms the same sums, so that the two paths agree within
#: ``FUSED_RTOL``. False: every decode takes the moments, as a block of several rows does (tests)
DIRECT_DECODES = True


def validate_precisions(
    precision: str,
    qk_precision: str,
    owner: str = "attention_error_bound",
    tanh_precision: str = "ieee",
    partials_precision: str = "fp32",
) -> None:
    """Raises ``ProblemError`` (``{owner}.precision: must be one of ...``) for an unknown name."""
    if precision not in PRECISIONS:
        raise ProblemError(owner, "precision", f"must be one of {PRECISIONS}, got {precision!r}")
    if qk_precision not in QK_PRECISIONS:
        raise ProblemError(owner, "qk_precision", f"must be one of {QK_PRECISIONS}, got {qk_precision!r}")
    if tanh_precision not in TANH_PRECISIONS:
        raise ProblemError(owner, "tanh_precision", f"must be one of {TANH_PRECISIONS}, got {tanh_precision!r}")
    if partials_precision not in PARTIALS_PRECISIONS:
        raise ProblemError(
            owner, "partials_precision", f"must be one of {PARTIALS_PRECISIONS}, got {partials_precision!r}"
        )


def direct_decode(c: Chunk, query_lens: list[int], device_path: bool) -> bool:
    """Whether block ``c`` is a decode whose value sums are formed directly (``DIRECT_DECODES``):
    on the device path, its sequence's one block of one row (``query_lens``: the case's, read once
    a check)."""
    return DIRECT_DECODES and device_path and query_lens[c.seq] == 1


class _Bound(NamedTuple):
    """One block of query rows: the reference, the bound of its output and lse, and the model's
    expected squared error of its output."""

    tokens: slice  # rows of the packed output
    o: torch.Tensor  # [n, Hq, D] float64
    e: torch.Tensor  # [n, Hq, D] float64
    lse: torch.Tensor | None  # [n, Hq] float64 (None: not asked for)
    e_lse: torch.Tensor | None  # [n, Hq] float64
    var: torch.Tensor  # [n, Hq, D] float64: the expected squared rounding error (docs/tolerance.md)


class _Terms(NamedTuple):
    """The model's constants for one case and declared precisions (``docs/tolerance.md``)."""

    model: DtypeModel
    a: float  # coefficient of |q| max_j |k_j| in a row's largest ds_j
    a_inf: float  # coefficient of max_i |q_i| max_j |k_j|: operands rounded before the products
    u_score: float  # the score's own rounding, relative (qk_precision "input")
    row_const: float  # the rest of it that does not depend on the row: exp, the soft-cap's tanh
    u_w: float  # the weights' rounding where they meet V
    pv: float  # coefficient of sum_j p_j |v_j| (before the product's allowance), less E_accum's
    var_pv: float  # coefficient of sum_j p_j^2 v_j^2 in the expected squared error
    var_abs_pv: float  # coefficient of (sum_j p_j |v_j|)^2 in it: coherent and per-split roundings
    sinks: torch.Tensor | None  # [Hkv, G, 1] float64
    sink_const: torch.Tensor | None  # [Hkv, G, 1] float64: C_EXP + |sink|
    device_path: bool  # no host read per block (a device, or DEVICE_PATH_ON_CPU)
    subnormal_free: bool  # (device path) no weight of the case can fall below the weights' min normal (False: unread)
    # 2 where one dequantization rounding of a shared latent cache enters both the score and the
    # value (their contributions correlate: var(a + b) <= 2 var(a) + 2 var(b)); else 1
    kv_corr: float = 1.0


def _terms(
    case: PagedCase,
    precision: str,
    qk_precision: str,
    tanh_precision: str,
    guard: bool = True,
    partials_precision: str = "fp32",
) -> _Terms:
    """The model's constants for ``case``. ``guard=False``: the case's subnormal guard is not
    read (``subnormal_free`` False, undecided): the fused check flags the rows that need the
    correction instead (``pagedattn.verdict_kernel.host``)."""
    validate_precisions(precision, qk_precision, tanh_precision=tanh_precision, partials_precision=partials_precision)
    model = DTYPE_TABLE[case.dtype]
    tf32 = precision == "tf32" and case.dtype == torch.float32
    u_op = U_TF32_OPERAND if tf32 else 0.0  # each operand of both dots, when TF32
    u_w = max(model.weights_u, u_op)  # the weights, one operand of P.V
    u_v = (TF32_PV_OPERANDS - 1) * u_op  # the values, the other one
    # an fp8 cache may be dequantized into the query dtype before the products (vLLM does):
    # one rounding of every K and V element, legitimate, so part of the bound
    u_kv = _u(case.dtype) if case.kv_dtype != case.dtype else 0.0
    half = case.dtype in (torch.float16, torch.bfloat16)
    u_in = _u(case.dtype) if half else 0.0  # float32 inputs: the declared roundings are fp32's own
    # one rounding of each product's operand or of the product itself (fp8 keys dequantized to the
    # input dtype, a declared input-dtype product or folded scale): sum_i q_i k_ji delta_i over the
    # head dim, independent roundings, so C_DOT sqrt(sum_i (q_i k_ji)^2) <= C_DOT max|q_i| |k_j|
    u_prod = u_kv + (u_in if qk_precision != "fp32" else 0.0)
    kv_corr = 2.0 if case.shared_kv and u_kv else 1.0
    a = (C_DOT * U_FP32 * math.sqrt(case.head_dim) + 2.0 * u_op) * case.scale
    row_const = U_FP32 * (C_EXP + (C_EXP * case.logits_soft_cap if case.logits_soft_cap is not None else 0.0))
    if tanh_precision == "approx" and case.logits_soft_cap is not None:
        # a declared approximate soft-cap (docs/tolerance.md): c tanh(y) off by u_tanh c |tanh y|,
        # and by c |y| sech(y)^2 u_rcp < c u_rcp from the approximate 1/c in y's scale
        row_const += (U_TANH_APPROX + U_RCP_APPROX) * case.logits_soft_cap
    # split-K partials kept in the input dtype: one rounding of each split's output, a weighted
    # sum of at most sum_j p_j |v_j|
    u_part = u_in if partials_precision == "input" else 0.0
    sinks = case.sinks.to(torch.float64).view(case.num_kv_heads, case.gqa_ratio, 1) if case.sinks is not None else None
    device_path = case.device.type != "cpu" or DEVICE_PATH_ON_CPU
    # on a device, whether a block may need the subnormal correction is read once, for the case
    subnormal_free = device_path and guard and _weights_stay_normal(case, model.weights_min_normal)
    return _Terms(
        model,
        a,
        C_DOT * u_prod * case.scale,
        u_in if qk_precision == "input" else 0.0,
        row_const,
        u_w,
        C_W * u_w + u_kv + u_v + u_part,
        UNIFORM_VAR * (u_w**2 + kv_corr * u_kv**2 + u_v**2),
        # TF32 truncates: its mean error, u_op / 2 of each of two operands, adds coherently
        (u_op**2 if tf32 else 0.0) + UNIFORM_VAR * u_part**2,
        sinks,
        C_EXP + sinks.abs() if sinks is not None else None,
        device_path,
        subnormal_free,
        kv_corr,
    )


def chunk_bounds(
    case: PagedCase,
    precision: str,
    qk_precision: str = "fp32",
    tanh_precision: str = "ieee",
    with_lse: bool = True,
    partials_precision: str = "fp32",
) -> Iterator[_Bound]:
    """The model's terms per block of query rows (consecutive small blocks merged, see
    ``_merged``), in token order, from the oracle's own pass (its weights, maxima,
    denominators and smallest logits). The score term is
    formed per row (``docs/tolerance.md``: the largest ``ds_j`` of the row bounds every
    key's), so the only work of the scores' size beyond the oracle's is two products, of the
    weights with ``|v|`` and ``(v - c)^2`` and of their squares with ``(v - c)^2`` and ``v - c``,
    in float32 (a bound needs no float64); a decode on the device path forms its sums directly
    instead (``direct_decode``).
    ``with_lse=False``: the log-sum-exp's fields are ``None`` (not formed: on a device every
    operation is a launch, and a check of the output alone has no use for them).
    ``pagedattn.verdict_kernel.host`` forms the same numbers in one kernel a block, on a GPU."""
    terms = _terms(case, precision, qk_precision, tanh_precision, partials_precision=partials_precision)
    D = case.head_dim_v  # the values' width, the output's
    seq_lens, query_lens = case.seq_lens_list, case.query_lens
    seq, first, centre, vv = -1, 0, torch.empty(0), torch.empty(0)
    # blocks of rows are yielded together up to this many output elements: an eighth of the
    # output (the oracle holds all of it; the check never does), and at least 64k
    merge_elems = max(case.num_tokens * case.num_heads * D // 8, 1 << 16)
    pending: list[_Bound] = []
    pending_elems = 0
    key_max = _KeyMax(case.sliding_window)
    for c in iter_chunks(case, live=_live(case), score_floor=True):
        assert c.score_floor is not None
        Hkv, G, n, Lc = c.probs.shape
        L = seq_lens[c.seq]  # the accumulation term counts the whole history, as a kernel may
        o = c.output()  # [n, Hq, D]
        # the row's largest ds_j: sum_i |q_i||k_ji| <= |q| |k_j|, the largest norm among the keys
        # the row sees; |s| + m - s = m - 2 min(s, 0), at the row's smallest visible logit
        k_max = key_max(c)
        ds_dot = terms.a * c.q.norm(dim=-1) * k_max  # [Hkv, G, n]
        ds_ops = terms.a_inf * c.q.abs().amax(dim=-1) * k_max
        ds_rest = U_FP32 * (c.row_max - 2.0 * c.score_floor.clamp(max=0.0)) + terms.row_const
        bias = None  # the row's largest ALiBi bias, [Hkv, G, n]
        if c.alibi is not None:  # slope * (j - p) rounded once in fp32; |j - p| <= p - the row's first key
            slopes, rel = c.alibi
            reach_j = (-rel[:, 0]).add_(c.keys.start)  # the row's position p: p - first key = min(p, W - 1)
            if case.sliding_window is not None:
                reach_j.clamp_(max=case.sliding_window - 1)
            bias = slopes.abs()[..., 0] * reach_j
            ds_rest = ds_rest + U_FP32 * bias
        ds_max = ds_dot + ds_ops + ds_rest
        # the score rounded to the input dtype once (declared): u |s_j|, the score before the cap
        # and the bias, which a cap only shrinks (|y sech(y)^2| <= |tanh y|)
        ds_score = None
        if terms.u_score:
            s_abs = torch.maximum(c.row_max.abs(), c.score_floor.abs())
            if bias is not None:
                s_abs = s_abs + bias
            ds_score = terms.u_score * s_abs
            ds_max = ds_max + ds_score
        # the expected squared score error of a key (its terms independent, each at most uniform
        # within its bound; the operands' term at C_DOT = 1)
        ds_var = (ds_dot.square() + ds_rest.square()).mul_(UNIFORM_VAR)
        declared_keys = bool(terms.a_inf or terms.u_score)  # rounded score operands: a variance a key
        # sum_j p_j |v_j| and sum_j p_j (v_j - c)^2, c the mean of the values the sequence's rows
        # see (against cancellation): from its first block's first key, the smallest. A decode on
        # the device path: both directly, in float64, about its output (c = o, d = 0 below)
        direct = direct_decode(c, query_lens, terms.device_path)
        if c.seq != seq:
            seq, first = c.seq, c.keys.start
            if not direct:
                centre, vv = _value_moments(c.v_all[:, first:])
                centre = centre.repeat_interleave(G, dim=0).transpose(0, 1)  # [1, Hq, D]
        # both sums raised by their own float32 rounding allowance, so that they bound their values
        # (the direct sums' float64 roundings are far inside it)
        grow = _visible_keys_grow(c, case.sliding_window)
        sqrt_grow = grow**0.5
        key_w = w_sum = r2 = r1 = None
        if direct:
            key_w = _key_score_var(c, terms, bias, c.probs) if declared_keys else None
            abs_pv, s2, q2, q1, p2, r2 = _decode_sums(c, o, key_w)
            c_v = o
            d = None
        else:
            seen = vv[:, c.keys.start - first : c.keys.stop - first]
            p32 = _spent(c.scores, torch.float32).copy_(c.probs)
            s12 = c.output(seen[..., : 2 * D], probs=p32)  # [n, Hq, 2D] float32
            abs_pv, s2 = s12[..., :D], s12[..., D:]
            if declared_keys:
                key_w = _key_score_var(c, terms, bias, p32)
            # the squared weights' sums: sum_j p_j^2 (v_j - c)^2 and sum_j p_j^2 (v_j - c)
            p2 = c.rows(p32.square_().sum(dim=-1))[..., None]  # [n, Hq, 1] float32
            s34 = c.output(seen[..., D:], probs=p32)
            q2, q1 = s34[..., :D], s34[..., D:]
            if key_w is not None:  # the same about each key's own score variance
                w_sum = c.rows(key_w.sum(dim=-1))[..., None]
                s56 = c.output(seen[..., D:], probs=key_w)
                r2, r1 = s56[..., :D], s56[..., D:]
                del s56
            del seen, s12, p32, s34, key_w
            # sum_j p_j (v_j - o)^2 = S2 + 2 d o p_sink - d^2 (1 - p_sink), d = c - o; formed as
            # grow (S2 - ...) / grow, so that the float32 S2 is promoted in the one subtraction
            c_v = centre
            d = centre - o  # [n, Hq, D]
        # the expected squared error (docs/tolerance.md): sum_j p_j^2 (v_j - o)^2 for the scores,
        # sum_j p_j^2 v_j^2 for the weights' and values' roundings, from the squared weights' sums
        # about c (a statistic's terms: float32's rounding needs no allowance)
        if d is None:
            dev2 = q2.to(torch.float64)
        else:
            dev2 = torch.addcmul(q2, q1, d, value=2.0).addcmul_(p2, d.square())
        val2 = torch.addcmul(q2, q1, c_v, value=2.0).addcmul_(p2, c_v.square())
        var = dev2.clamp_min_(0.0).mul_(c.rows(ds_var)[..., None])
        var.add_(val2.clamp_min_(0.0), alpha=terms.var_pv)
        if r2 is not None:  # sum_j p_j^2 var(ds_j) (v_j - o)^2, each key's own
            if d is None:
                var.add_(r2.clamp_min(0.0))
            else:
                assert r1 is not None and w_sum is not None
                var.add_(torch.addcmul(r2, r1, d, value=2.0).addcmul_(w_sum, d.square()).clamp_min_(0.0))
        del dev2, val2, q2, q1, p2, r2, r1, w_sum
        lse_scores = c.rows(ds_max)  # [n, Hq]
        ds_rows = lse_scores[..., None]  # [n, Hq, 1]
        o_abs = o.abs()
        if c.sink_probs is None:
            spread2 = s2 if d is None else torch.sub(s2, d.square_().div_(grow))
            e_scores = spread2.clamp_min_(0.0).sqrt_().mul_(ds_rows * sqrt_grow)
        else:
            assert c.key_share is not None
            p_sink = c.rows(c.sink_probs)[..., None]  # [n, Hq, 1]
            share = c.rows(c.key_share)[..., None]  # P = sum_j p_j, not 1 - p_sink: that cancels
            if d is None:
                spread2 = s2
            else:
                spread2 = torch.add(s2, (2.0 * d * o * p_sink).div_(grow))
                spread2.sub_(d.square_().mul_(share).div_(grow))
            e_scores = spread2.clamp_min_(0.0).mul_(share).sqrt_().mul_(ds_rows * sqrt_grow)
            lse_scores = lse_scores * share[..., 0]
            # the sink's logit is exact; its exp and the max subtraction round like a key's,
            # and a perturbed sink weight moves the output towards 0 (its value)
            assert terms.sinks is not None and terms.sink_const is not None
            ds_sink = U_FP32 * (terms.sink_const + (terms.sinks - c.row_max).abs())  # [Hkv, G, n]
            w_sink = c.rows(c.sink_probs * ds_sink)  # [n, Hq]
            e_scores.addcmul_(w_sink[..., None], o_abs)
            var.addcmul_(w_sink.square()[..., None], o_abs.square(), value=UNIFORM_VAR)
            lse_scores = lse_scores + w_sink
        # E_weights = C_W u_w sum_j p_j |v_j|, plus the below-normal correction
        extra = _subnormal_weights(c, terms)
        if extra is not None:
            e_sub = c.output(c.v.abs(), probs=extra)
            e_scores.add_(e_sub, alpha=C_W)
            var.addcmul_(e_sub, e_sub, value=UNIFORM_VAR * C_W**2)  # coherent: (sum_j |a_j|)^2 / 3
            del extra, e_sub
        # E_weights, the V operand's rounding (fp8 dequantized to the input dtype, TF32) and E_accum
        acc = C_ACC * U_FP32 * math.sqrt(L)
        pv_coef = (terms.pv + acc) * grow
        # the fp32 running sums: L roundings of partial sums at most sum_j p_j |v_j| + |o|
        acc_var = UNIFORM_VAR * U_FP32**2 * L
        var.addcmul_(abs_pv + o_abs, abs_pv + o_abs, value=acc_var)
        if terms.var_abs_pv:
            var.addcmul_(abs_pv, abs_pv, value=terms.var_abs_pv)
        if isinstance(pv_coef, float):
            e = e_scores.add_(abs_pv, alpha=pv_coef)
        else:
            e = e_scores.addcmul_(abs_pv, pv_coef)
        e.add_(o_abs, alpha=acc)
        del o_abs  # E_round is formed for several blocks at once, in _merged
        lse = e_lse = None
        if with_lse:
            lse = c.rows(c.lse)  # [n, Hq]
            # lse = m + log(l): the score errors (first order: sum_j p_j ds_j), the log and the
            # sum rounded, a base change (log2 kernels) rounded, the denominator's sqrt(L) growth
            e_lse = lse_scores + U_FP32 * (C_EXP + 2.0 * lse.abs()) + C_ACC * U_FP32 * math.sqrt(L)
        pending.append(_Bound(c.tokens, o, e, lse, e_lse, var))
        pending_elems += o.numel()
        # its score-sized tensors, and the product and spread of its rows, go before the next
        # block's come (a name left bound would hold them through the next block's pass)
        if c.last:  # the sequence's last block: its moments and key reach go
            centre = vv = key_max.reach = torch.empty(0)  # before the next one's history comes
            key_max.seq = -1
        del c, abs_pv, s2, d, spread2, k_max, c_v  # k_max: a view of the reach
        if pending_elems >= merge_elems:
            yield _merged(pending, case.dtype)
            pending, pending_elems = [], 0
    if pending:
        yield _merged(pending, case.dtype)


def _key_score_var(c: Chunk, terms: _Terms, bias: torch.Tensor | None, p: torch.Tensor) -> torch.Tensor:
    """``p_j^2`` times the expected squared error of key ``j``'s score from its declared
    roundings: the operands' (``sum_i (q_i k_ji)^2`` times ``(a_inf / C_DOT)^2``, a rounding each)
    and the score's own (``u_score |s_j|``, ``|s_j| = |lse + log p_j|``, plus the row's largest
    ALiBi ``bias`` ``[Hkv, G, n]``), each uniform within its bound: ``[Hkv, G, n, Lc]`` in ``p``'s
    dtype (``p``: the block's weights ``[Hkv, G, n, Lc]``), 0 where ``p_j`` is."""
    Hkv, G, n, Lc = c.probs.shape
    D = c.q.shape[-1]
    q2 = c.q.square().to(p.dtype).view(Hkv, G * n, D)
    w = torch.bmm(q2, c.k.square().to(p.dtype).transpose(1, 2)).view(Hkv, G, n, Lc)
    w.mul_(UNIFORM_VAR * terms.kv_corr * (terms.a_inf / C_DOT) ** 2)
    if terms.u_score:
        s = torch.log(p).add_(c.lse.to(p.dtype)[..., None]).abs_()
        if bias is not None:
            s.add_(bias.to(p.dtype)[..., None])
        w.addcmul_(s, s, value=UNIFORM_VAR * terms.u_score**2)
        del s
    return w.mul_(p).mul_(p).masked_fill_(p == 0.0, 0.0)


def _merged(blocks: list[_Bound], dtype: torch.dtype) -> _Bound:
    """Consecutive blocks as one, their output bounds finished with ``E_round`` (element by
    element, so the same numbers as block by block), and their expected squared errors with the
    output's rounding, uniform within half an ulp of ``|o|``: the rounding and the verdict then
    run once for many small blocks (a batch of decodes), where on a device each op is a launch."""
    assert all(a.tokens.stop == b.tokens.start for a, b in zip(blocks, blocks[1:])), [b.tokens for b in blocks]
    tokens = slice(blocks[0].tokens.start, blocks[-1].tokens.stop)

    def cat(ts: list[torch.Tensor | None]) -> torch.Tensor | None:
        if ts[0] is None:
            return None
        return ts[0] if len(ts) == 1 else torch.cat(ts)  # type: ignore[arg-type]

    o, e, var = cat([b.o for b in blocks]), cat([b.e for b in blocks]), cat([b.var for b in blocks])
    assert o is not None and e is not None and var is not None
    lse, e_lse = cat([b.lse for b in blocks]), cat([b.e_lse for b in blocks])
    blocks.clear()  # the pieces go before the rounding's temporary comes
    var.addcmul_(half := _half_ulp(o.abs(), dtype), half, value=UNIFORM_VAR)
    del half
    e.add_(_half_ulp(o.abs().add_(e), dtype))
    return _Bound(tokens, o, e, lse, e_lse, var)


def attention_error_bound(
    case: PagedCase,
    precision: str = "ieee",
    qk_precision: str = "fp32",
    tanh_precision: str = "ieee",
    partials_precision: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-element acceptance bound of the error model.

    Args:
        case: the problem.
        precision: ``"ieee"`` (default) or ``"tf32"``: how the backend's fp32 dot
            products round their operands.
        qk_precision: ``"fp32"`` (default) or ``"input"``: the backend forms q.k from
            products rounded to the input dtype.
        tanh_precision: ``"ieee"`` (default) or ``"approx"``: the backend's soft-cap uses an
            approximate tanh (``tanh.approx.f32``); only soft-capped cases change.
        partials_precision: ``"fp32"`` (default) or ``"input"``: the backend keeps a split
            history's partial outputs in the input dtype before merging them.

    Returns:
        ``(reference, bound)``: two ``[T, Hq, D]`` float64 tensors on the case's device.
    """
    ref, bound, _, _ = attention_lse_error_bounds(case, precision, qk_precision, tanh_precision, partials_precision)
    return ref, bound


def attention_lse_error_bounds(
    case: PagedCase,
    precision: str = "ieee",
    qk_precision: str = "fp32",
    tanh_precision: str = "ieee",
    partials_precision: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Output and log-sum-exp references and bounds in one pass over the oracle:
    ``(ref [T, Hq, D], bound [T, Hq, D], ref_lse [T, Hq], bound_lse [T, Hq])``, float64
    on the case's device (natural log; see ``PagedCase`` for the definition)."""
    T, H, D = case.num_tokens, case.num_heads, case.head_dim_v
    kw: dict[str, Any] = dict(dtype=torch.float64, device=case.device)
    ref, bound, ref_lse, bound_lse = (
        torch.empty(T, H, D, **kw),
        torch.empty(T, H, D, **kw),
        torch.empty(T, H, **kw),
        torch.empty(T, H, **kw),
    )
    for blk in chunk_bounds(case, precision, qk_precision, tanh_precision, partials_precision=partials_precision):
        assert blk.lse is not None and blk.e_lse is not None
        ref[blk.tokens], bound[blk.tokens], ref_lse[blk.tokens], bound_lse[blk.tokens] = (
            blk.o,
            blk.e,
            blk.lse,
            blk.e_lse,
        )
    return ref, bound, ref_lse, bound_lse
