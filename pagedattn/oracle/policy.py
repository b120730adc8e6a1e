"""The tolerance policy's error model: the per-element bound a correct kernel stays within.

Its verdicts live beside it: ``pagedattn.oracle.verdict`` judges an attention output
against this bound (``check_attention``, ``AttentionCheck``), ``pagedattn.oracle.bitexact``
judges data movement bit for bit (``check_bitexact``, ``BitCheck``).

``docs/tolerance.md`` derives every term. In short, for output element
``o[t, h, d]`` with softmax weights ``p_j`` over keys ``j`` and float64
reference ``o``, a correct streamed online-softmax kernel with fp32
accumulation stays within

    bound = E_scores + E_weights + E_values + E_accum + E_round

    E_scores  = Delta sqrt(P sum_j p_j (v_j - o)^2)       P = sum_j p_j (the sink's share excluded)
                Delta = max_j ds_j, bounded per row:
                ds_j <= (C_DOT u_acc sqrt(D) + 2 u_op + u_kv + u_qk) scale |q| max_j |k_j|
                        + u_acc (C_EXP + m - 2 min(s_min, 0))   (+ soft-cap, ALiBi terms)
    E_weights = C_W u_w sum_j p_j |v_j|
    E_values  = (u_kv + u_op) sum_j p_j |v_j|
    E_accum   = C_ACC u_acc sqrt(L) (sum_j p_j |v_j| + |o|)
    E_round   = ulp_out(|o| + E) / 2        (ulp floored at the smallest subnormal)

``u_acc`` is fp32's unit roundoff; ``u_op`` the rounding of each operand of both
dots (0 for IEEE fp32 or half-precision inputs; ``2**-10`` for fp32 inputs when a
backend declares TF32: tensor cores truncate); ``u_w`` the precision in which the
weights meet V (the input dtype's: flash-style kernels round ``p`` before the
product); ``u_kv`` an fp8 cache dequantized into the query dtype; ``u_qk`` a
declared input-dtype score (``qk_precision="input"``); a declared approximate
soft-cap (``tanh_precision="approx"``) adds ``(U_TANH_APPROX + U_RCP_APPROX) c`` to
every row's ``ds``. ``E_scores`` is
Cauchy-Schwarz on the first-order softmax perturbation ``sum_j p_j ds_j (v_j - o)``
with every ``ds_j`` bounded by the row's largest, so it scales with how far the
values spread around the output, not with their magnitude, and costs one float32
product beyond the oracle's pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from pagedattn.oracle.case import PagedCase
from pagedattn.oracle.reference import Chunk, iter_chunks
from pagedattn.problem import ProblemError

# --------------------------------------------------------------------- constants
U_FP32 = 2.0**-24
U_TF32 = 2.0**-11  # TF32 keeps 10 explicit significand bits: rounding to nearest errs by 2**-11
#: An fp32 operand of a TF32 tensor-core product: NVIDIA's mma reads the top 19 bits of the
#: register (truncation, 2**-10) unless the kernel rounds first, and Triton does not by default.
U_TF32_OPERAND = 2.0**-10
#: TF32 operands of the weighted-V product that round: the weights and the values
TF32_PV_OPERANDS = 2


@dataclass(frozen=True)
class DtypeModel:
    """Per-dtype constants of the model. ``significand`` counts the implicit bit."""

    significand: int  # rounding of the output: ulp = 2**(e - significand + 1)
    emin: int  # smallest normal exponent: below it ulp stays at the subnormal spacing
    weights_u: float  # unit roundoff of the weights where they meet V
    weights_min_normal: float = 2.0**-126  # below it a rounded weight keeps an absolute error...
    weights_spacing: float = 2.0**-149  # ...of half this subnormal spacing, not a relative one


#: One row per output dtype, each with its reason.
DTYPE_TABLE: dict[torch.dtype, DtypeModel] = {
    # fp32 kernels keep p in fp32 for the weighted-V product.
    torch.float32: DtypeModel(significand=24, emin=-126, weights_u=U_FP32),
    # fp16/bf16 kernels (FlashAttention, vLLM, Triton tutorials) round p to the input dtype
    # so the weighted-V product runs on the tensor cores; that rounding is legitimate.
    # fp16's narrow exponent range makes small weights subnormal (below 2**-14 of the running
    # max): a sink that dominates a row, or a long flat softmax, shows it
    torch.float16: DtypeModel(
        significand=11, emin=-14, weights_u=2.0**-11, weights_min_normal=2.0**-14, weights_spacing=2.0**-24
    ),
    torch.bfloat16: DtypeModel(significand=8, emin=-126, weights_u=2.0**-8, weights_spacing=2.0**-133),
    # float64 inputs: a kernel is still expected to accumulate in at least fp32.
    torch.float64: DtypeModel(significand=53, emin=-1022, weights_u=U_FP32),
}

#: Score dot products: probabilistic sqrt(D) growth of fp32 accumulation error
#: (Higham & Mary 2019); 2 covers tensor-core accumulation, which truncates.
C_DOT = 2.0
#: exp/exp2 in fp32: ex2.approx is within 2 ulp, plus the log2(e) multiply and the
#: subtraction of the running max, each one more rounding.
C_EXP = 4.0
#: rounding of each weight to the weights precision, first order.
C_W = 1.0
#: fp32 running sums (weighted V, denominator, per-tile rescales): sqrt(L) growth.
C_ACC = 2.0
#: errors between bound and WARN_FACTOR * bound warn instead of failing: a correct
#: kernel can land there on exotic hardware rounding; a real bug lands far beyond.
WARN_FACTOR = 2.0

#: how fp32 dot products round their operands (``Capabilities.fp32_precision``):
#: ``ieee`` (exact fp32 products) or ``tf32`` (operands rounded to TF32 first)
PRECISIONS = ("ieee", "tf32")
#: how q·k is formed (``Capabilities.qk_precision``): ``fp32`` products and sum (or TF32
#: per ``fp32_precision``), or ``input``: each product rounded to the input dtype, the sum in fp32
QK_PRECISIONS = ("fp32", "input")
#: how the soft-cap's tanh is evaluated (``Capabilities.tanh_precision``): ``ieee`` (within a
#: few fp32 ulps, as libm's tanhf) or ``approx`` (PTX ``tanh.approx.f32``, FlashInfer's soft-cap)
TANH_PRECISIONS = ("ieee", "approx")
#: tanh.approx.f32's largest relative error, 2**-11 (PTX ISA 9.1), rounded up to 2**-10.9 as a
#: margin; that also covers 2**-10.987, a figure quoted for it (the ISA's, for the f16 variant)
U_TANH_APPROX = 2.0**-10.9
#: rcp.approx.f32, the 1/cap of an approximate soft-cap's pre-tanh scale: within 1 ulp (PTX
#: ISA), a relative error of at most 2**-23
U_RCP_APPROX = 2.0**-23
#: float64 score-sized tensors of one block alive at once while the bound is formed, as the
#: check sizes its blocks: on a device, the oracle's scores and weights, as in the oracle (the
#: weights in float32 and a correction of subnormal weights take the spent scores' storage,
#: ``_spent``), so the check walks the oracle's blocks, in as few launches as the oracle; on the
#: CPU, where the check's boolean masks and per-row tensors beside them would raise its peak
#: above the oracle's, blocks of half the rows. The bound's terms are the row's own (its visible
#: keys' largest norm and smallest logit, their count), so the blocks change no bound beyond
#: float32's rounding of the one product (``BLOCK_RTOL``).
_LIVE = 2
_LIVE_CPU = 4


def _live(case: PagedCase) -> int:
    """``live`` for ``iter_chunks``: the check's blocks of rows for ``case``'s device."""
    return _LIVE_CPU if case.device.type == "cpu" else _LIVE


#: how far an element's bound may move with the blocks of rows the oracle walks: every term is
#: the row's own, only the float32 product's rounding differs, and where ``sum_j p_j (v_j - o)^2``
#: cancels to its rounding allowance a few parts in 10^4 show (``tests/test_policy.py``); and, on
#: the tests' cases, how far a decode's bound on the device path (``direct_decode``: no float32
#: product, no allowance for it) lies from the CPU path's either way (over the standard profile's
#: decodes it lay up to 1.3% below, never more than 2e-6 above: ``benchmarks/NOTES.md``)
BLOCK_RTOL = 1e-2
#: how far the fused check (``pagedattn.verdict_kernel.host``, one Triton kernel a block) may put a
#: bound or a ratio from the torch path's: the same float64 formulas in the same order, but a
#: compiler may contract a multiply and an add into one rounding, and the keys' norms and a
#: decode's direct sums (``_decode_sums``) are summed in another order than torch's: nonnegative
#: terms, a float64 rounding a key at worst (2 Lc u, past 1e-12 only beyond ~4500 keys, where the
#: errors' typical size, sqrt(Lc) u, is ~1e-14; ``tests/test_policy.py``, ``tests/test_verdict_kernel.py``)
FUSED_RTOL = 1e-12
#: take the device path on the CPU too (tests and the op counter compare the two paths):
#: no host read per block (``chunk_bounds``) nor per verdict block (``verdict._Verdict``)
DEVICE_PATH_ON_CPU = False
#: elements of the key pool whose norms are taken at once (``_weights_stay_normal``): bounded temporaries
_POOL_SLICE = 1 << 22
#: elements of a sequence's values whose deviations from their mean are squared at once
#: (``_value_moments``, the torch path): a float64 temporary of 1 MiB
_MOMENTS_SLICE = 1 << 17
#: on the device path, a decode (a sequence with one new token) has its value sums formed directly
#: (``_decode_sums``): in float64, about the row's own output, from its weights, values and keys,
#: rather than from the float32 product with the sequence's moments. On a GPU that is the verdict
#: kernel's own work, or for a long decode a launch's over slices of its keys
#: (``pagedattn.verdict_kernel.host``, ``INLINE_DECODE_ELEMS``: 4 or 5 launches a decode fewer on a
#: host-bound check); the torch path forms the same sums, so that the two paths agree within
#: ``FUSED_RTOL`` (on a device without the fused check, about 2G launches a decode where the
#: moments took five). False: every decode takes the moments, as a block of several rows does (tests)
DIRECT_DECODES = True


def _half_ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Half the ulp in ``dtype`` of the float64 values ``x >= 0``, floored at half its
    subnormal spacing: ``2**(floor(log2 max(x, 2**emin)) - significand)``, read off and
    written into the float64 exponent field. Overwrites ``x``."""
    m = DTYPE_TABLE[dtype]
    if m.emin - m.significand < -1022:  # the result itself is no normal float64
        exp = torch.floor(torch.log2(x.clamp_min(2.0**m.emin)))
        return torch.exp2(exp - m.significand)
    biased = x.clamp_min_(2.0**m.emin).view(torch.int64).bitwise_right_shift_(52).sub_(m.significand)
    return biased.bitwise_left_shift_(52).view(torch.float64)


# ------------------------------------------------------------------------ bounds
def _u(dtype: torch.dtype) -> float:
    """Unit roundoff of ``dtype``."""
    return 2.0 ** -DTYPE_TABLE[dtype].significand


def validate_precisions(
    precision: str, qk_precision: str, owner: str = "attention_error_bound", tanh_precision: str = "ieee"
) -> None:
    """Raises ``ProblemError`` (``{owner}.precision: must be one of ...``) for an unknown name."""
    if precision not in PRECISIONS:
        raise ProblemError(owner, "precision", f"must be one of {PRECISIONS}, got {precision!r}")
    if qk_precision not in QK_PRECISIONS:
        raise ProblemError(owner, "qk_precision", f"must be one of {QK_PRECISIONS}, got {qk_precision!r}")
    if tanh_precision not in TANH_PRECISIONS:
        raise ProblemError(owner, "tanh_precision", f"must be one of {TANH_PRECISIONS}, got {tanh_precision!r}")


def _centre(v: torch.Tensor, by_product: bool | None = None) -> torch.Tensor:
    """The mean over the keys of ``v`` ``[Hkv, L, D]`` float64: ``[Hkv, 1, D]`` float64. On a GPU (or
    with ``by_product``) as a product with ones: CUDA's ``mean`` over a middle dimension holds a
    temporary twice ``v``'s size while it reduces (32 MB for 4000 keys of 4 heads of 128, which put
    the check's peak over the oracle's: ``benchmarks/NOTES.md``, twelfth stop of the suite's figures)."""
    if not (v.device.type != "cpu" if by_product is None else by_product):
        return v.mean(dim=1, keepdim=True)
    # kept (a fill is a launch a sequence, on a host-bound check), per stream: another stream's
    # read of them would not be ordered after their fill, nor their release after its read
    stream = torch._C._cuda_getCurrentRawStream(v.device.index) if v.device.type == "cuda" else 0
    ones = _ONES.get((v.device, v.dtype, stream))
    if ones is None or ones.numel() < v.shape[1]:
        ones = torch.ones(max(v.shape[1], 2 * (0 if ones is None else ones.numel())), dtype=v.dtype, device=v.device)
        _ONES[(v.device, v.dtype, stream)] = ones
    return torch.bmm(ones[: v.shape[1]].expand(v.shape[0], 1, v.shape[1]), v).div_(v.shape[1])


#: ones by device, dtype and stream, at least as many as the longest history yet (``_centre``)
_ONES: dict[tuple[torch.device, torch.dtype, int], torch.Tensor] = {}


def _value_moments(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``v`` ``[Hkv, L, D]`` float64 (a sequence's values from the first its rows see; rows of D
    contiguous): its mean over the keys ``c`` ``[Hkv, 1, D]`` and ``[|v|, (v - c)^2]``
    ``[Hkv, L, 2D]`` in float32, the right factor of the bound's product. Only the values the
    rows see: a decode under a window of W holds W of them, not the whole history (on the device
    path a decode has none: ``direct_decode``)."""
    centre = _centre(v)
    vv = torch.empty(*v.shape[:2], 2 * v.shape[2], dtype=torch.float32, device=v.device)
    D = v.shape[2]
    vv[..., :D].copy_(v).abs_()  # |fl32(v)| = fl32(|v|): no float64 temporary
    # the difference in float64 (it may cancel), on the CPU a slice of keys at a time: a
    # history-sized float64 temporary would be fresh pages at every check (16 MB at 4000 keys);
    # on a device, where each slice is launches, in one pass
    step = max(1, _MOMENTS_SLICE // max(1, v.shape[0] * D)) if v.device.type == "cpu" else v.shape[1]
    for k0 in range(0, v.shape[1], step):
        vv[:, k0 : k0 + step, D:] = (v[:, k0 : k0 + step] - centre).square_()
    return centre, vv


def _spent(scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``scores``' shape in ``dtype`` (float32 or float64) in the storage of the block's
    float64 scores, spent once the oracle has its weights and smallest logits (a new one where the
    scores are not a contiguous float64 tensor at the start of their storage): the check's
    score-sized work then costs no memory beyond the oracle's."""
    if scores.dtype != torch.float64 or scores.storage_offset() != 0 or not scores.is_contiguous():
        return torch.empty(scores.shape, dtype=dtype, device=scores.device)
    return torch.empty(0, dtype=dtype, device=scores.device).set_(
        scores.untyped_storage(), 0, scores.shape, scores.stride()
    )


def direct_decode(c: Chunk, query_lens: list[int], device_path: bool) -> bool:
    """Whether block ``c`` is a decode whose value sums are formed directly (``DIRECT_DECODES``):
    on the device path, its sequence's one block of one row (``query_lens``: the case's, read once
    a check)."""
    return DIRECT_DECODES and device_path and query_lens[c.seq] == 1


def _decode_sums(c: Chunk, o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode's ``sum_j p_j |v_j|`` and ``sum_j p_j (v_j - o)^2``, each ``[1, Hq, D]`` float64, from
    its weights and values in float64, about its own output ``o`` ``[1, Hq, D]`` float64: every term
    is nonnegative, so the sums are their values to within a float64 rounding a key, in any order
    (the verdict kernel's, ``pagedattn.verdict_kernel.host``, and torch's). The squared deviations are
    formed a slice of keys at a time, each at most the size of the values (the float32 moments
    this replaces were as large), or of one key a query head where the keys are fewer than the
    GQA group (a window under G keys: the size of the output)."""
    Hkv, G, n, Lc = c.probs.shape
    D = c.v.shape[2]
    p = c.probs.view(Hkv, G, Lc)
    s1 = torch.bmm(p, c.v.abs())  # [Hkv, G, D]
    ov = o.view(Hkv, G, 1, D)
    step = max(1, Lc // G)
    s2 = torch.zeros(Hkv * G, 1, D, dtype=torch.float64, device=o.device)
    for k0 in range(0, Lc, step):
        dv = (c.v[:, None, k0 : k0 + step] - ov).square_()  # [Hkv, G, s, D]
        s2.baddbmm_(p[:, :, k0 : k0 + step].reshape(Hkv * G, 1, -1), dv.view(Hkv * G, -1, D))
        del dv
    return s1.view(1, Hkv * G, D), s2.view(1, Hkv * G, D)


def _weights_stay_normal(case: PagedCase, min_normal: float) -> bool:
    """Whether no softmax weight of ``case`` can fall below ``min_normal`` relative to its row's
    largest, read once on the host: every logit lies within ``S`` of 0, ``S`` from the largest
    norms of the queries and of every key in the pool (Cauchy-Schwarz; the soft-cap, ALiBi's
    largest bias), so a row spans at most ``2 S`` (``S + max |sink|`` with a sink, which joins
    the maximum). A margin of 1 covers rounding. The maxima are read in one transfer and
    combined in Python's float64 (on a GPU each tensor operation is a launch)."""
    wide = torch.float64 if case.dtype == torch.float64 else torch.float32  # the norm may not narrow
    maxima = [torch.linalg.vector_norm(case.query, dim=-1, dtype=wide).amax()]
    pool = case.key_cache
    step = max(1, _POOL_SLICE // max(1, pool[0].numel()))  # blocks of the pool at a time
    for b0 in range(0, pool.shape[0], step):
        keys = pool[b0 : b0 + step]
        keys = keys if case.kv_dtype == case.dtype else keys.to(case.dtype)  # fp8: no norm of its own
        # the pool's unused slots may hold NaN (poisoned padding): a NaN key's logits are NaN, and
        # the guards never fire on NaN either, so a NaN norm is left out (an infinite one is not)
        maxima.append(torch.linalg.vector_norm(keys, dim=-1, dtype=wide).nan_to_num_(nan=0.0, posinf=math.inf).amax())
    extras = [t.abs().amax() for t in (case.alibi_slopes, case.sinks) if t is not None]
    q, *ks = torch.stack(maxima + extras).tolist()  # one read: float32 maxima are exact in float64
    ks, rest = ks[: len(ks) - len(extras)], ks[len(ks) - len(extras) :]
    s = (q * max(ks)) * (case.scale * case.k_scale)
    if case.logits_soft_cap is not None:
        s = min(s, case.logits_soft_cap)
    if case.alibi_slopes is not None:
        s = s + rest.pop(0) * max(case.max_seq_len - 1, 0)
    span = 2.0 * s if case.sinks is None else s + max(s, rest.pop(0))
    return span < -math.log(min_normal) - 1.0


def _key_reach(norms: torch.Tensor, window: int | None) -> torch.Tensor:
    """The largest key norm each position of a sequence sees: ``[Hkv, L]`` float64 from its keys'
    norms ``[Hkv, L]`` float64 (``k_all.norm(dim=-1)``), position ``p`` seeing keys
    ``max(0, p - W + 1) .. p`` (``window`` ``W``; all up to ``p`` without one). Positions count from
    the norms' first key: from a later key ``f`` (``norms[:, f:]``), position ``p - f`` sees from
    ``f`` on, right for every row whose window starts at ``f`` or later. A sliding maximum in O(L)
    whatever ``W`` (van Herk / Gil-Werman): prefix and suffix maxima within segments of ``W`` keys,
    a window ending at ``p`` being a suffix of one segment and a prefix of the next."""
    L = norms.shape[1]
    if window is None or window >= L:
        return norms.cummax(dim=-1).values
    W = window
    segs = -(-L // W)
    x = torch.nn.functional.pad(norms, (0, segs * W - L)).view(-1, segs, W)  # norms >= 0: a 0 pad is never a max
    pre = x.cummax(dim=-1).values.view(-1, segs * W)[:, :L]
    suf = x.flip(-1).cummax(dim=-1).values.flip(-1).view(-1, segs * W)
    reach = pre.clone()  # positions below W - 1 see keys 0 .. p: a prefix of the first segment
    torch.maximum(suf[:, : L - W + 1], pre[:, W - 1 :], out=reach[:, W - 1 :])
    return reach


class _Bound(NamedTuple):
    """One block of query rows: the reference and the bound of its output and lse."""

    tokens: slice  # rows of the packed output
    o: torch.Tensor  # [n, Hq, D] float64
    e: torch.Tensor  # [n, Hq, D] float64
    lse: torch.Tensor | None  # [n, Hq] float64 (None: not asked for)
    e_lse: torch.Tensor | None  # [n, Hq] float64


class _Terms(NamedTuple):
    """The model's constants for one case and declared precisions (``docs/tolerance.md``)."""

    model: DtypeModel
    a: float  # coefficient of |q| max_j |k_j| in a row's largest ds_j
    row_const: float  # the rest of it that does not depend on the row: exp, the soft-cap's tanh
    u_w: float  # the weights' rounding where they meet V
    pv: float  # coefficient of sum_j p_j |v_j| (before the product's allowance), less E_accum's
    sinks: torch.Tensor | None  # [Hkv, G, 1] float64
    sink_const: torch.Tensor | None  # [Hkv, G, 1] float64: C_EXP + |sink|
    device_path: bool  # no host read per block (a device, or DEVICE_PATH_ON_CPU)
    subnormal_free: bool  # (device path) no weight of the case can fall below the weights' min normal (False: unread)


def _terms(case: PagedCase, precision: str, qk_precision: str, tanh_precision: str, guard: bool = True) -> _Terms:
    """The model's constants for ``case``. ``guard=False``: the case's subnormal guard is not
    read (``subnormal_free`` False, undecided): the fused check flags the rows that need the
    correction instead (``pagedattn.verdict_kernel.host``)."""
    validate_precisions(precision, qk_precision, tanh_precision=tanh_precision)
    model = DTYPE_TABLE[case.dtype]
    tf32 = precision == "tf32" and case.dtype == torch.float32
    u_op = U_TF32_OPERAND if tf32 else 0.0  # each operand of both dots, when TF32
    u_w = max(model.weights_u, u_op)  # the weights, one operand of P.V
    u_v = (TF32_PV_OPERANDS - 1) * u_op  # the values, the other one
    # an fp8 cache may be dequantized into the query dtype before the products (vLLM does):
    # one rounding of every K and V element, legitimate, so part of the bound
    u_kv = _u(case.dtype) if case.kv_dtype != case.dtype else 0.0
    # q.k from products rounded to the input dtype, and the sum rounded to it once
    half = case.dtype in (torch.float16, torch.bfloat16)
    u_qk = 2.0 * _u(case.dtype) if qk_precision == "input" and half else 0.0
    a = (C_DOT * U_FP32 * math.sqrt(case.head_dim) + 2.0 * u_op + u_kv + u_qk) * case.scale
    row_const = U_FP32 * (C_EXP + (C_EXP * case.logits_soft_cap if case.logits_soft_cap is not None else 0.0))
    if tanh_precision == "approx" and case.logits_soft_cap is not None:
        # a declared approximate soft-cap (docs/tolerance.md): c tanh(y) off by u_tanh c |tanh y|,
        # and by c |y| sech(y)^2 u_rcp < c u_rcp from the approximate 1/c in y's scale
        row_const += (U_TANH_APPROX + U_RCP_APPROX) * case.logits_soft_cap
    sinks = case.sinks.to(torch.float64).view(case.num_kv_heads, case.gqa_ratio, 1) if case.sinks is not None else None
    device_path = case.device.type != "cpu" or DEVICE_PATH_ON_CPU
    # on a device, whether a block may need the subnormal correction is read once, for the case
    subnormal_free = device_path and guard and _weights_stay_normal(case, model.weights_min_normal)
    return _Terms(
        model,
        a,
        row_const,
        u_w,
        C_W * u_w + u_kv + u_v,
        sinks,
        C_EXP + sinks.abs() if sinks is not None else None,
        device_path,
        subnormal_free,
    )


class _KeyMax:
    """The largest norm among the keys each row of a block sees, ``[Hkv, 1, n]`` float64 (``n``
    1: ``[Hkv, 1, 1]``): a single row sees its block's keys; a block of rows, each its own range of
    them, from a sliding maximum of the sequence's key norms formed once a sequence."""

    def __init__(self, window: int | None) -> None:
        self.window, self.seq, self.reach = window, -1, torch.empty(0)

    def __call__(self, c: Chunk) -> torch.Tensor:
        Hkv, _, n, _ = c.probs.shape
        if n == 1:
            return c.k.norm(dim=-1).amax(dim=-1).view(Hkv, 1, 1)
        if self.seq != c.seq:
            self.seq, self.reach = c.seq, _key_reach(c.k_all.norm(dim=-1), self.window)
        return self.reach[:, c.keys.stop - n : c.keys.stop].view(Hkv, 1, n)  # rows p0 .. p1


def _visible_keys_grow(c: Chunk, window: int | None) -> float | torch.Tensor:
    """``1 / (1 - (k + 3) u_fp32)`` (``1 + gamma_{k+3}``) for each row of the block, ``k`` the keys
    it sees (a float for a single row, ``[n, 1, 1]`` float64 otherwise): a float32 sum of
    nonnegative float32 products of float32-rounded factors, ``k`` of them nonzero, is within
    ``gamma_{k+3}`` of its value relatively (a hidden key's weight is 0: its product is 0 and adds
    exactly, whatever the order of the sum). A single row sees its block's Lc keys; row p,
    min(p + 1, W)."""
    _, _, n, Lc = c.probs.shape
    if n == 1:
        return 1.0 / (1.0 - (Lc + 3) * U_FP32)
    seen = torch.arange(c.keys.stop - n + 1, c.keys.stop + 1, dtype=torch.float64, device=c.probs.device)
    if window is not None:
        seen.clamp_(max=window)
    return seen.add_(3.0).mul_(-U_FP32).add_(1.0).reciprocal_().view(n, 1, 1)


def _subnormal_weights(c: Chunk, terms: _Terms) -> torch.Tensor | None:
    """The correction of weights rounded below the normal range where they meet V, as weights
    ``[Hkv, G, n, Lc]`` float64 (in the spent scores' storage) to multiply ``|v|`` with, or
    ``None`` where no weight of the block needs it. Weights round relative to the final max
    (each is largest there): relatively while normal, by at most half the subnormal spacing
    below. On the CPU two cheap guards skip it where no p_rel can be subnormal; on a device
    each guard is a read that stalls the host until the device catches up, so there the case is
    judged once (``subnormal_free``: then the guards would all say no) and otherwise the
    correction is formed unconditionally: where no weight is small it adds exactly 0."""
    model = terms.model
    if terms.subnormal_free:
        return None
    assert c.score_floor is not None
    if not terms.device_path and not bool((c.score_floor - c.row_max < math.log(model.weights_min_normal)).any()):
        return None
    l_rel = torch.exp(c.lse - c.row_max)[..., None]  # the denominator in units of the max
    small = c.probs < model.weights_min_normal / l_rel  # [Hkv, G, n, Lc] bool, in place below
    small &= c.probs > 0.0
    if not terms.device_path and not bool(small.any()):
        return None
    extra = torch.mul(c.probs, l_rel, out=_spent(c.scores, torch.float64))
    extra.clamp_(max=model.weights_spacing / 2).div_(l_rel).sub_(c.probs, alpha=terms.u_w)
    return extra.masked_fill_(small.logical_not_(), 0.0)


def chunk_bounds(
    case: PagedCase, precision: str, qk_precision: str = "fp32", tanh_precision: str = "ieee", with_lse: bool = True
) -> Iterator[_Bound]:
    """The model's terms per block of query rows (consecutive small blocks merged, see
    ``_merged``), in token order, from the oracle's own pass (its weights, maxima,
    denominators and smallest logits). The score term is
    formed per row (``docs/tolerance.md``: the largest ``ds_j`` of the row bounds every
    key's), so the only work of the scores' size beyond the oracle's is one product of
    the weights with ``|v|`` and ``(v - c)^2``, in float32 (a bound needs no float64); a decode
    on the device path forms its two sums directly instead (``direct_decode``).
    ``with_lse=False``: the log-sum-exp's fields are ``None`` (not formed: on a device every
    operation is a launch, and a check of the output alone has no use for them).
    ``pagedattn.verdict_kernel.host`` forms the same numbers in one kernel a block, on a GPU."""
    terms = _terms(case, precision, qk_precision, tanh_precision)
    D = case.head_dim
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
        ds_max = (
            terms.a * c.q.norm(dim=-1) * k_max
            + U_FP32 * (c.row_max - 2.0 * c.score_floor.clamp(max=0.0))
            + terms.row_const
        )
        if c.alibi is not None:  # slope * (j - p) rounded once in fp32; |j - p| <= p - the row's first key
            slopes, rel = c.alibi
            reach_j = (-rel[:, 0]).add_(c.keys.start)  # the row's position p: p - first key = min(p, W - 1)
            if case.sliding_window is not None:
                reach_j.clamp_(max=case.sliding_window - 1)
            ds_max = ds_max + U_FP32 * slopes.abs()[..., 0] * reach_j
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
        if direct:
            abs_pv, s2 = _decode_sums(c, o)  # [1, Hq, D] float64 each
            d = None
        else:
            seen = vv[:, c.keys.start - first : c.keys.stop - first]
            s12 = c.output(seen, probs=_spent(c.scores, torch.float32).copy_(c.probs))  # [n, Hq, 2D] float32
            abs_pv, s2 = s12[..., :D], s12[..., D:]
            del seen, s12
            # sum_j p_j (v_j - o)^2 = S2 + 2 d o p_sink - d^2 (1 - p_sink), d = c - o; formed as
            # grow (S2 - ...) / grow, so that the float32 S2 is promoted in the one subtraction
            d = centre - o  # [n, Hq, D]
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
            lse_scores = lse_scores + w_sink
        # E_weights = C_W u_w sum_j p_j |v_j|, plus the below-normal correction
        extra = _subnormal_weights(c, terms)
        if extra is not None:
            e_scores.add_(c.output(c.v.abs(), probs=extra), alpha=C_W)
            del extra
        # E_weights, the V operand's rounding (fp8 dequantized to the input dtype, TF32) and E_accum
        acc = C_ACC * U_FP32 * math.sqrt(L)
        pv_coef = (terms.pv + acc) * grow
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
        pending.append(_Bound(c.tokens, o, e, lse, e_lse))
        pending_elems += o.numel()
        # its score-sized tensors, and the product and spread of its rows, go before the next
        # block's come (a name left bound would hold them through the next block's pass)
        if c.last:  # the sequence's last block: its moments and key reach go
            centre = vv = key_max.reach = torch.empty(0)  # before the next one's history comes
            key_max.seq = -1
        del c, abs_pv, s2, d, spread2, k_max  # k_max: a view of the reach
        if pending_elems >= merge_elems:
            yield _merged(pending, case.dtype)
            pending, pending_elems = [], 0
    if pending:
        yield _merged(pending, case.dtype)


def _merged(blocks: list[_Bound], dtype: torch.dtype) -> _Bound:
    """Consecutive blocks as one, their output bounds finished with ``E_round`` (element by
    element, so the same numbers as block by block): the rounding and the verdict then run once
    for many small blocks (a batch of decodes), where on a device each op is a launch."""
    assert all(a.tokens.stop == b.tokens.start for a, b in zip(blocks, blocks[1:])), [b.tokens for b in blocks]
    tokens = slice(blocks[0].tokens.start, blocks[-1].tokens.stop)

    def cat(ts: list[torch.Tensor | None]) -> torch.Tensor | None:
        if ts[0] is None:
            return None
        return ts[0] if len(ts) == 1 else torch.cat(ts)  # type: ignore[arg-type]

    o, e = cat([b.o for b in blocks]), cat([b.e for b in blocks])
    assert o is not None and e is not None
    lse, e_lse = cat([b.lse for b in blocks]), cat([b.e_lse for b in blocks])
    blocks.clear()  # the pieces go before the rounding's temporary comes
    e.add_(_half_ulp(o.abs().add_(e), dtype))
    return _Bound(tokens, o, e, lse, e_lse)


def attention_error_bound(
    case: PagedCase,
    precision: str = "ieee",
    qk_precision: str = "fp32",
    tanh_precision: str = "ieee",
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

    Returns:
        ``(reference, bound)``: two ``[T, Hq, D]`` float64 tensors on the case's device.
    """
    ref, bound, _, _ = attention_lse_error_bounds(case, precision, qk_precision, tanh_precision)
    return ref, bound


def attention_lse_error_bounds(
    case: PagedCase, precision: str = "ieee", qk_precision: str = "fp32", tanh_precision: str = "ieee"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Output and log-sum-exp references and bounds in one pass over the oracle:
    ``(ref [T, Hq, D], bound [T, Hq, D], ref_lse [T, Hq], bound_lse [T, Hq])``, float64
    on the case's device (natural log; see ``PagedCase`` for the definition)."""
    T, H, D = case.num_tokens, case.num_heads, case.head_dim
    kw: dict[str, Any] = dict(dtype=torch.float64, device=case.device)
    ref, bound, ref_lse, bound_lse = (
        torch.empty(T, H, D, **kw),
        torch.empty(T, H, D, **kw),
        torch.empty(T, H, **kw),
        torch.empty(T, H, **kw),
    )
    for blk in chunk_bounds(case, precision, qk_precision, tanh_precision):
        assert blk.lse is not None and blk.e_lse is not None
        ref[blk.tokens], bound[blk.tokens], ref_lse[blk.tokens], bound_lse[blk.tokens] = (
            blk.o,
            blk.e,
            blk.lse,
            blk.e_lse,
        )
    return ref, bound, ref_lse, bound_lse
