"""The tolerance policy: bit-exact data movement, an error model for attention.

``docs/tolerance.md`` derives every term. In short, for output element
``o[t, h, d]`` with softmax weights ``p_j`` over keys ``j`` and float64
reference ``o``, a correct streamed online-softmax kernel with fp32
accumulation stays within

    bound = E_scores + E_weights + E_accum + E_round

    E_scores  = sqrt(sum_j p_j ds_j) * sqrt(sum_j p_j ds_j (v_j - o)^2)
                ds_j = C_DOT u_acc sqrt(D) A_j + 2 u_dot A_j + u_acc (C_EXP + |s_j| + |s_j - m|)
                A_j  = scale * sum_i |q_i| |k_ji|
    E_weights = C_W u_w sum_j p_j |v_j|
    E_accum   = C_ACC u_acc sqrt(L) (sum_j p_j |v_j| + |o|)
    E_round   = ulp_out(|o| + E) / 2        (ulp floored at the smallest subnormal)

``u_acc`` is fp32's unit roundoff, ``u_dot`` the operand rounding of the score
and weighted-V products (0 for IEEE fp32 or half-precision inputs, TF32's for
fp32 inputs when a backend declares TF32), ``u_w`` the precision in which the
weights meet V (the input dtype's: flash-style kernels round ``p`` before the
product). ``E_scores`` is Cauchy-Schwarz on the first-order softmax perturbation
``sum_j p_j ds_j (v_j - o)``, so it scales with how far the values spread around
the output, not with their magnitude.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from pagedattn.oracle.case import PagedCase
from pagedattn.oracle.reference import iter_chunks

# --------------------------------------------------------------------- constants
U_FP32 = 2.0**-24
U_TF32 = 2.0**-11  # TF32 keeps 10 explicit significand bits


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

PRECISIONS = ("ieee", "tf32")


def _ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 ulp of the values ``|x|`` in ``dtype``, floored at its subnormal spacing."""
    m = DTYPE_TABLE[dtype]
    exp = torch.floor(torch.log2(x.abs().clamp_min(2.0 ** (m.emin))))
    return torch.exp2(exp - (m.significand - 1))


# ------------------------------------------------------------------------ bounds
def _u(dtype: torch.dtype) -> float:
    """Unit roundoff of ``dtype``."""
    return 2.0 ** -DTYPE_TABLE[dtype].significand


def _chunk_bounds(case: PagedCase, precision: str):
    """Per chunk of query rows, in token order: ``(o, e_out, lse, e_lse)``, ``o``/``e_out``
    ``[n, Hq, D]`` and ``lse``/``e_lse`` ``[n, Hq]`` float64."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    model = DTYPE_TABLE[case.dtype]
    u_dot = U_TF32 if (precision == "tf32" and case.dtype == torch.float32) else 0.0
    u_w = model.weights_u
    if precision == "tf32" and case.dtype == torch.float32:
        u_w = max(u_w, U_TF32)
    # an fp8 cache may be dequantized into the query dtype before the products (vLLM does):
    # one rounding of every K and V element, legitimate, so part of the bound
    u_kv = _u(case.dtype) if case.kv_dtype != case.dtype else 0.0
    D = case.head_dim
    cap = case.logits_soft_cap
    sinks = case.sinks.to(torch.float64) if case.sinks is not None else None
    for c in iter_chunks(case):
        o = torch.einsum("hqk,khd->qhd", c.probs, c.v)  # [n, Hq, D]
        A = torch.einsum("qhd,khd->hqk", c.q.abs(), c.k.abs()) * case.scale  # [Hq, n, L]
        finite = torch.isfinite(c.scores)
        s = torch.where(finite, c.scores, torch.zeros_like(c.scores))
        m = s.masked_fill(~finite, float("-inf")).amax(dim=-1, keepdim=True)  # [Hq, n, 1]
        if sinks is not None:
            m = torch.maximum(m, sinks[:, None, None])
        ds = (C_DOT * U_FP32 * math.sqrt(D) + 2.0 * u_dot + u_kv) * A + U_FP32 * (C_EXP + s.abs() + (s - m).abs())
        if cap is not None:  # tanh in fp32: a few ulps of the capped range
            ds = ds + U_FP32 * C_EXP * cap
        if c.bias is not None:  # slope * (j - p) rounded once in fp32
            ds = ds + U_FP32 * torch.where(finite, c.bias, torch.zeros_like(c.bias)).abs()
        w = c.probs * ds  # zero where masked
        W0 = w.sum(-1).transpose(0, 1)  # [n, Hq]
        W1 = torch.einsum("hqk,khd->qhd", w, c.v)
        W2 = torch.einsum("hqk,khd->qhd", w, c.v * c.v)
        spread2 = (W2 - 2.0 * o * W1 + o * o * W0[..., None]).clamp_min(0.0)
        e_scores = torch.sqrt(W0[..., None] * spread2)
        lse_scores = W0
        if sinks is not None and c.sink_probs is not None:
            # the sink's logit is exact; its exp and the max subtraction round like a key's,
            # and a perturbed sink weight moves the output towards 0 (its value)
            ds_sink = U_FP32 * (C_EXP + sinks[:, None].abs() + (sinks[:, None] - m[..., 0]).abs())  # [Hq, n]
            w_sink = (c.sink_probs * ds_sink).transpose(0, 1)  # [n, Hq]
            e_scores = e_scores + w_sink[..., None] * o.abs()
            lse_scores = lse_scores + w_sink
        abs_pv = torch.einsum("hqk,khd->qhd", c.probs, c.v.abs())
        # weights rounded where they meet V, relative to the final max (each is largest
        # there): relatively while normal, by at most half the subnormal spacing below
        l_rel = torch.exp(c.lse[..., None] - m)  # the denominator in units of the max
        p_rel = c.probs * l_rel
        w_err = torch.where(p_rel < model.weights_min_normal, torch.clamp(p_rel, max=model.weights_spacing / 2),
                            u_w * p_rel) / l_rel  # fmt: skip
        e_weights = torch.einsum("hqk,khd->qhd", w_err, c.v.abs())
        L = c.k.shape[0]
        e = e_scores + C_W * e_weights + u_kv * abs_pv + C_ACC * U_FP32 * math.sqrt(L) * (abs_pv + o.abs())
        e = e + 0.5 * _ulp(o.abs() + e, case.dtype)
        lse = c.lse.transpose(0, 1)  # [n, Hq]
        # lse = m + log(l): the score errors (first order: sum_j p_j ds_j), the log and the
        # sum rounded, a base change (log2 kernels) rounded, the denominator's sqrt(L) growth
        e_lse = lse_scores + U_FP32 * (C_EXP + 2.0 * lse.abs()) + C_ACC * U_FP32 * math.sqrt(L)
        yield o, e, lse, e_lse


def attention_error_bound(
    case: PagedCase,
    reference: torch.Tensor | None = None,
    precision: str = "ieee",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-element acceptance bound of the error model.

    Args:
        case: the problem.
        reference: ``[T, Hq, D]`` float64 oracle output (computed if None).
        precision: ``"ieee"`` (default) or ``"tf32"``: how the backend's fp32 dot
            products round their operands.

    Returns:
        ``(reference, bound)``: two ``[T, Hq, D]`` float64 tensors on the case's device.
    """
    ref_chunks, bounds = [], []
    for o, e, _, _ in _chunk_bounds(case, precision):
        ref_chunks.append(o)
        bounds.append(e)
    ref = torch.cat(ref_chunks) if reference is None else reference
    return ref, torch.cat(bounds)


def attention_lse_error_bounds(
    case: PagedCase, precision: str = "ieee"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Output and log-sum-exp references and bounds in one pass over the oracle:
    ``(ref [T, Hq, D], bound [T, Hq, D], ref_lse [T, Hq], bound_lse [T, Hq])``, float64
    on the case's device (natural log; see ``PagedCase`` for the definition)."""
    parts: list[list[torch.Tensor]] = [[], [], [], []]
    for tensors in _chunk_bounds(case, precision):
        for acc, t in zip(parts, tensors):
            acc.append(t)
    ref, bound, ref_lse, bound_lse = (torch.cat(p) for p in parts)
    return ref, bound, ref_lse, bound_lse


# ------------------------------------------------------------------------ checks
@dataclass
class AttentionCheck:
    """The verdict on one attention output.

    ``budget_used`` is ``max |out - ref| / bound`` over all elements; ``passed``
    means no element beyond ``WARN_FACTOR * bound`` and nothing non-finite;
    ``warning`` means some element in ``(bound, WARN_FACTOR * bound]``.
    """

    passed: bool
    warning: bool
    budget_used: float
    num_over: int = 0  # elements over the bound (warning or failure)
    num_elements: int = 0
    num_nonfinite: int = 0
    worst_seq: int = -1
    worst_token: int = -1  # row of the packed query/output
    worst_position: int = -1  # absolute position of that token in its sequence
    worst_head: int = -1
    worst_channel: int = -1
    value: float = float("nan")
    reference: float = float("nan")
    bound: float = float("nan")
    problem: str = ""  # a structural failure (shape, dtype, device), if any
    precision: str = "ieee"
    tolerance_factor: float = 1.0
    case_summary: str = ""
    what: str = "attention"  # or "log-sum-exp" (then worst_channel is -1)
    extra: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "failed" if not self.passed else ("warned" if self.warning else "passed")

    def metrics(self) -> dict:
        """A JSON-ready summary."""
        return {
            "status": self.status,
            "budget_used": self.budget_used,
            "num_over": self.num_over,
            "num_elements": self.num_elements,
            "num_nonfinite": self.num_nonfinite,
            "worst": {
                "seq": self.worst_seq,
                "token": self.worst_token,
                "position": self.worst_position,
                "head": self.worst_head,
                "channel": self.worst_channel,
                "value": self.value,
                "reference": self.reference,
                "bound": self.bound,
            },
            "problem": self.problem,
            "precision": self.precision,
            "tolerance_factor": self.tolerance_factor,
            "what": self.what,
        }

    def __str__(self) -> str:
        if self.problem:
            return f"{self.what} output rejected: {self.problem}\n  case: {self.case_summary}"
        head = {
            "passed": f"{self.what} within the error bound",
            "warned": f"{self.what} in the warning band (above the bound, within {WARN_FACTOR:g}x of it)",
            "failed": f"{self.what} outside the error bound",
        }[self.status]
        lines = [
            f"{head}: budget used {self.budget_used:.3g} "
            f"({self.num_over} of {self.num_elements} elements over the bound"
            + (f", {self.num_nonfinite} non-finite where the reference is finite" if self.num_nonfinite else "")
            + ")",
            f"  worst element: seq {self.worst_seq}, token {self.worst_token} "
            f"(position {self.worst_position} in its sequence), head {self.worst_head}"
            + (f", channel {self.worst_channel}" if self.worst_channel >= 0 else ""),
            f"  got {self.value!r}, reference {self.reference!r}, "
            f"|error| {abs(self.value - self.reference):.3g}, bound {self.bound:.3g}",
            f"  policy: fp32 dot precision {self.precision}"
            + (f", tolerance x{self.tolerance_factor:g} (backend override)" if self.tolerance_factor != 1.0 else ""),
            f"  case: {self.case_summary}",
        ]
        return "\n".join(lines)


def _token_coords(case: PagedCase, token: int) -> tuple[int, int]:
    loc = case.query_start_loc_list
    for b in range(case.num_seqs):
        if loc[b] <= token < loc[b + 1]:
            return b, case.context_lens[b] + token - loc[b]
    return -1, -1


def check_attention(
    output: torch.Tensor,
    case: PagedCase,
    *,
    precision: str = "ieee",
    tolerance_factor: float = 1.0,
    reference: torch.Tensor | None = None,
) -> AttentionCheck:
    """Judge ``output`` against the float64 oracle with the per-element bound.

    Args:
        output: ``[num_tokens, num_heads, head_dim]`` in the query dtype, on the case's
            device: what the backend returned.
        case: the problem it was asked.
        precision: ``"ieee"`` or ``"tf32"`` (the backend's declared fp32 dot precision).
        tolerance_factor: an explicit loosening (> 1) or tightening, shown in the report.
        reference: the oracle output if already computed.
    """
    common: dict[str, Any] = dict(precision=precision, tolerance_factor=tolerance_factor, case_summary=repr(case))
    problem = _output_problem(output, case)
    if problem:
        return AttentionCheck(passed=False, warning=False, budget_used=float("inf"), problem=problem, **common)
    ref, bound = attention_error_bound(case, reference, precision)
    return _judge(output, ref, bound * tolerance_factor, case, common)


def check_attention_lse(
    output: torch.Tensor,
    lse: torch.Tensor,
    case: PagedCase,
    *,
    precision: str = "ieee",
    tolerance_factor: float = 1.0,
) -> tuple[AttentionCheck, AttentionCheck]:
    """Judge an output and its log-sum-exp (one pass over the oracle).

    Args:
        output: ``[num_tokens, num_heads, head_dim]`` in the query dtype.
        lse: ``[num_tokens, num_heads]`` float32, natural log of each row's softmax
            denominator (sink included).
        case, precision, tolerance_factor: as for ``check_attention``.

    Returns:
        ``(output_check, lse_check)``.
    """
    common: dict[str, Any] = dict(precision=precision, tolerance_factor=tolerance_factor, case_summary=repr(case))
    p_out = _output_problem(output, case)
    p_lse = _structural(lse, case, (case.num_tokens, case.num_heads), torch.float32, "[num_tokens, num_heads]",
                        "float32")  # fmt: skip
    if p_out or p_lse:
        out_check = AttentionCheck(False, False, float("inf"), problem=p_out or "not judged: the log-sum-exp "
                                   "was rejected", **common)  # fmt: skip
        lse_check = AttentionCheck(False, False, float("inf"), problem=p_lse or "not judged: the output was "
                                   "rejected", what="log-sum-exp", **common)  # fmt: skip
        return out_check, lse_check
    ref, bound, ref_lse, bound_lse = attention_lse_error_bounds(case, precision)
    return (
        _judge(output, ref, bound * tolerance_factor, case, common),
        _judge(lse, ref_lse, bound_lse * tolerance_factor, case, dict(common, what="log-sum-exp")),
    )


def _output_problem(output: Any, case: PagedCase) -> str:
    return _structural(output, case, (case.num_tokens, case.num_heads, case.head_dim), case.dtype,
                       "[num_tokens, num_heads, head_dim]", "the query dtype")  # fmt: skip


def _structural(t: Any, case: PagedCase, shape: tuple, dtype: torch.dtype, shape_doc: str, dtype_doc: str) -> str:
    if not isinstance(t, torch.Tensor):
        return f"expected a torch.Tensor, got {type(t).__name__}"
    if tuple(t.shape) != shape:
        return f"shape {tuple(t.shape)}, expected {shape} {shape_doc}"
    if t.dtype != dtype:
        return f"dtype {t.dtype}, expected {dtype_doc} {dtype}"
    if t.device != case.device:
        return f"device {t.device}, expected the case's device {case.device}"
    return ""


def _judge(
    output: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, case: PagedCase, common: dict
) -> AttentionCheck:
    """The verdict on ``output`` ``[T, Hq(, D)]`` against ``ref`` and its per-element bound."""
    out = output.to(torch.float64)
    same_inf = torch.isinf(ref) & (out == ref)  # an lse of -inf where the reference is -inf
    err = torch.where(same_inf, torch.zeros_like(ref), (out - ref).abs())
    nonfinite = ~torch.isfinite(out) & torch.isfinite(ref)
    ratio = torch.where(nonfinite, torch.full_like(err, float("inf")), err / bound)
    ratio = torch.where(same_inf, torch.zeros_like(ratio), torch.nan_to_num(ratio, nan=float("inf")))
    flat = int(torch.argmax(ratio))
    idx = [int(i) for i in torch.unravel_index(torch.tensor(flat), ratio.shape)]
    t, h = idx[0], idx[1]
    budget = float(ratio.reshape(-1)[flat])
    n_nonfinite = int(nonfinite.sum())
    seq, pos = _token_coords(case, t)
    return AttentionCheck(
        passed=bool(budget <= WARN_FACTOR) and n_nonfinite == 0,
        warning=bool(1.0 < budget <= WARN_FACTOR),
        budget_used=budget,
        num_over=int((ratio > 1.0).sum()),
        num_elements=ratio.numel(),
        num_nonfinite=n_nonfinite,
        worst_seq=seq,
        worst_token=t,
        worst_position=pos,
        worst_head=h,
        worst_channel=idx[2] if len(idx) > 2 else -1,
        value=float(out[tuple(idx)]),
        reference=float(ref[tuple(idx)]),
        bound=float(bound[tuple(idx)]),
        **common,
    )


# --------------------------------------------------------------- bit-exact checks
_BITS = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_BITS[t.element_size() * 8])


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bit pattern (NaN payloads and signed zeros included)."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(_bits(a), _bits(b.to(a.device))))


@dataclass
class BitCheck:
    """The verdict on a gather or cache write: bit patterns, NaN payloads included."""

    passed: bool
    what: str
    num_different: int = 0
    first_index: tuple[int, ...] = ()
    value: str = ""
    expected: str = ""
    problem: str = ""

    @property
    def status(self) -> str:
        return "passed" if self.passed else "failed"

    def metrics(self) -> dict:
        return {
            "status": self.status,
            "num_different": self.num_different,
            "first_index": list(self.first_index),
            "value": self.value,
            "expected": self.expected,
            "problem": self.problem,
        }

    def __str__(self) -> str:
        if self.problem:
            return f"{self.what} rejected: {self.problem}"
        if self.passed:
            return f"{self.what}: bit-exact"
        return (
            f"{self.what} is not bit-exact: {self.num_different} elements differ; first at index "
            f"{self.first_index} (slot {self.first_index[0] if self.first_index else '?'}): "
            f"got {self.value}, expected {self.expected}"
        )


def _fmt(t: torch.Tensor) -> str:
    width = t.element_size()
    bits = int(_bits(t.reshape(1))[0]) & ((1 << (8 * width)) - 1)
    return f"{float(t)!r} (bits 0x{bits:0{2 * width}x})"


def check_bitexact(output: torch.Tensor, expected: torch.Tensor, what: str = "gather") -> BitCheck:
    """Compare bit patterns of ``output`` and ``expected`` (same shape and dtype);
    the first index is that of the first differing element in row-major order, so for
    a gather ``[n, Hkv, D]`` its first coordinate is the slot position."""
    if not isinstance(output, torch.Tensor):
        return BitCheck(False, what, problem=f"expected a torch.Tensor, got {type(output).__name__}")
    if tuple(output.shape) != tuple(expected.shape):
        return BitCheck(False, what, problem=f"shape {tuple(output.shape)}, expected {tuple(expected.shape)}")
    if output.dtype != expected.dtype:
        return BitCheck(False, what, problem=f"dtype {output.dtype}, expected {expected.dtype}")
    if output.device != expected.device:
        return BitCheck(False, what, problem=f"device {output.device}, expected {expected.device}")
    diff = _bits(output) != _bits(expected)
    n = int(diff.sum())
    if n == 0:
        return BitCheck(True, what)
    idx = tuple(int(i) for i in diff.nonzero()[0])
    return BitCheck(False, what, n, idx, _fmt(output[idx]), _fmt(expected[idx]))
