"""The error model's constants: unit roundoffs, the per-dtype table and the growth factors.

``docs/tolerance.md`` derives every term. In short, for output element
``o[t, h, d]`` with softmax weights ``p_j`` over keys ``j`` and float64
reference ``o``, a correct streamed online-softmax kernel with fp32
accumulation stays within

    bound = E_scores + E_weights + E_values + E_accum + E_round

    E_scores  = Delta sqrt(P sum_j p_j (v_j - o)^2)       P = sum_j p_j (the sink's share excluded)
                Delta = max_j ds_j, bounded per row:
                ds_j <= (C_DOT u_acc sqrt(D) + 2 u_op) scale |q| max_j |k_j|
                        + C_DOT u_prod scale max_i |q_i| max_j |k_j| + u_score max |s|
                        + u_acc (C_EXP + m - 2 min(s_min, 0))   (+ soft-cap, ALiBi terms)
    E_weights = C_W u_w sum_j p_j |v_j|
    E_values  = (u_kv + u_op) sum_j p_j |v_j|
    E_accum   = C_ACC u_acc sqrt(L) (sum_j p_j |v_j| + |o|)
    E_round   = ulp_out(|o| + E) / 2        (ulp floored at the smallest subnormal)

``u_acc`` is fp32's unit roundoff; ``u_op`` the rounding of each operand of both
dots (0 for IEEE fp32 or half-precision inputs; ``2**-10`` for fp32 inputs when a
backend declares TF32: tensor cores truncate); ``u_w`` the precision in which the
weights meet V (the input dtype's: flash-style kernels round ``p`` before the
product); ``u_kv`` an fp8 cache dequantized into the query dtype; ``u_prod`` a rounding of
each product's operand (``u_kv``, a declared folded scale or input-dtype product, in the
square-root form of independent roundings) and ``u_score`` a declared input-dtype score
(``qk_precision``); a declared approximate
soft-cap (``tanh_precision="approx"``) adds ``(U_TANH_APPROX + U_RCP_APPROX) c`` to
every row's ``ds``.

``E_scores`` is Cauchy-Schwarz on the first-order softmax perturbation
``sum_j p_j ds_j (v_j - o)`` with every ``ds_j`` bounded by the row's largest, so it
scales with how far the values spread around the output, not with their magnitude.
``pagedattn.oracle.policy`` forms the bound from these constants, and beside it each element's
expected squared rounding error, the second criterion's (``RMS_LIMIT``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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

# The statistical criterion (docs/tolerance.md, "The error's distribution"): the measured
# errors' energy against the model's expected rounding error, whose every variance is an upper
# bound, so that a correct kernel's expected ratio is at most 1.
#: fail where the error's RMS exceeds this many times the model's: twice its expected energy
RMS_LIMIT = 2.0**0.5
#: the statistic judges an output of at least this many effective elements, where the energy
#: ratio's own spread (about sqrt(2 / n)) is an eighth of the way to the limit's squared margin
RMS_MIN_ELEMENTS = 128
#: variance of a rounding error uniform within +-u (round to nearest, relative or absolute)
UNIFORM_VAR = 1.0 / 3.0

#: tanh.approx.f32's largest relative error, 2**-11 (PTX ISA 9.1), rounded up to 2**-10.9 as a
#: margin; that also covers 2**-10.987, a figure quoted for it (the ISA's, for the f16 variant)
U_TANH_APPROX = 2.0**-10.9
#: rcp.approx.f32, the 1/cap of an approximate soft-cap's pre-tanh scale: within 1 ulp (PTX
#: ISA), a relative error of at most 2**-23
U_RCP_APPROX = 2.0**-23


def _u(dtype: torch.dtype) -> float:
    """Unit roundoff of ``dtype``."""
    return 2.0 ** -DTYPE_TABLE[dtype].significand


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
