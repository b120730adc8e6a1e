"""The fused check's small kernels: a sequence's moments, a decode's value sums, the rows' reduction.

``moments_kernel`` forms a sequence's ``[|v|, (v - c)^2, v - c]`` and key norms,
``decode_sums_kernel`` a long decode's value sums (the bound's and the expected error's) over
slices of its keys, ``reduce_kernel`` a check's row statistics into one; ``reduce_rows`` and
``slice_sums`` are their bodies, which the verdict kernel (``pagedattn.verdict_kernel.kernel``)
calls too. ``pagedattn.verdict_kernel.host`` launches them.
"""

import triton
import triton.language as tl


@triton.jit
def reduce_rows(st_ptr, N, per_row, out_ptr, NS: tl.constexpr, BLOCK: tl.constexpr, FLAGS: tl.constexpr):
    # one program walks the rows in order: the worst is the first NaN, or else the first
    # largest (torch.argmax's rule); the counts are integers below 2**53, exact in any order.
    # The error's moments (statistics 7 to 9: sums of squared errors, of expected squared errors,
    # of rows' expected squared errors squared) are summed, in float64 in another order than the
    # torch path's (policy.FUSED_RTOL). FLAGS: the rows' last statistic (flagged rows) is summed
    # into out[NS - 1]. The rows are read past L1 (.cg): in the verdict kernel's last program
    # they are other programs' stores, seen after the count's atomic
    i = tl.arange(0, BLOCK)
    best = tl.full([], float("-inf"), tl.float64)
    at = tl.full([], 0, tl.int32)
    found_nan = tl.full([], 0, tl.int32)
    over = tl.full([], 0.0, tl.float64)
    nonfinite = tl.full([], 0.0, tl.float64)
    err2 = tl.full([], 0.0, tl.float64)
    var = tl.full([], 0.0, tl.float64)
    var_rows2 = tl.full([], 0.0, tl.float64)
    flagged = tl.full([], 0.0, tl.float64)
    for i0 in range(0, N, BLOCK):
        rows = i0 + i
        m = rows < N
        row = st_ptr + rows.to(tl.int64) * NS
        x = tl.load(row, mask=m, other=float("-inf"), cache_modifier=".cg")
        over += tl.sum(tl.load(row + 1, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
        nonfinite += tl.sum(tl.load(row + 2, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
        err2 += tl.sum(tl.load(row + 7, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
        var += tl.sum(tl.load(row + 8, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
        var_rows2 += tl.sum(tl.load(row + 9, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
        if FLAGS:
            flagged += tl.sum(tl.load(row + NS - 1, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
        isnan = m & (x != x)
        first_nan = tl.min(tl.where(isnan, rows, N), axis=0)
        xf = tl.where(isnan, float("-inf"), x)
        top = tl.max(xf, axis=0)
        first_top = tl.min(tl.where(m & (xf == top), rows, N), axis=0)
        chunk_nan = first_nan < N
        higher = (found_nan == 0) & ~chunk_nan & (top > best)
        take_nan = (found_nan == 0) & chunk_nan
        at = tl.where(take_nan, first_nan, tl.where(higher, first_top, at))
        best = tl.where(take_nan, float("nan"), tl.where(higher, top, best))
        found_nan = tl.where(chunk_nan, 1, found_nan)
    worst = st_ptr + at.to(tl.int64) * NS
    tl.store(out_ptr, best)
    tl.store(out_ptr + 1, over)
    tl.store(out_ptr + 2, nonfinite)
    tl.store(out_ptr + 3, at.to(tl.float64) * per_row + tl.load(worst + 3, cache_modifier=".cg"))
    for k in tl.static_range(4, 7):
        tl.store(out_ptr + k, tl.load(worst + k, cache_modifier=".cg"))
    tl.store(out_ptr + 7, err2)
    tl.store(out_ptr + 8, var)
    tl.store(out_ptr + 9, var_rows2)
    if FLAGS:
        tl.store(out_ptr + NS - 1, flagged)


@triton.jit
def slice_sums(
    pp_ptr,
    vb_ptr,
    kb_ptr,
    o,
    q,
    lse,
    bias,
    kw_ops,
    kw_score,
    declared,
    j_lo,
    j_hi,
    D,
    BLOCK_J: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # a decode's keys j_lo .. j_hi - 1 (pp_ptr: its weights over its keys; vb_ptr, kb_ptr: its kv
    # head's values and keys, rows of D) about the row's output o, in float64
    # (sequence_stats._decode_sums: the sums of nonnegative terms in any order are within a
    # float64 rounding a key of another): the largest key norm, sum_j p_j |v_j|,
    # sum_j p_j (v_j - o)^2, sum_j p_j^2 (v_j - o)^2, sum_j p_j^2 v_j, sum_j p_j^2 and, where the
    # score's operands are declared rounded (``declared``), sum_j w_j (v_j - o)^2 with the keys'
    # weights of policy._key_score_var: p_j^2 times kw_ops sum_i q_i^2 k_ji^2 plus kw_score s_j^2,
    # s_j = |lse + log p_j| + bias (q: the row's query, lse: its reference log-sum-exp, bias: its
    # largest ALiBi bias)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    qq = q * q
    top = tl.zeros([BLOCK_J], dtype=tl.float64)
    s1 = tl.zeros([BLOCK_D], dtype=tl.float64)
    s2 = tl.zeros([BLOCK_D], dtype=tl.float64)
    q2 = tl.zeros([BLOCK_D], dtype=tl.float64)
    qv = tl.zeros([BLOCK_D], dtype=tl.float64)
    r2 = tl.zeros([BLOCK_D], dtype=tl.float64)
    p2 = tl.zeros([BLOCK_J], dtype=tl.float64)
    for j0 in range(j_lo, j_hi, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        jm = j < j_hi
        m2 = jm[:, None] & dm[None, :]
        at2 = j[:, None].to(tl.int64) * D + d[None, :]
        kk = tl.load(kb_ptr + at2, mask=m2, other=0.0)
        k2 = kk * kk
        top = tl.maximum(top, tl.sqrt(tl.sum(k2, axis=1)))
        w = tl.load(pp_ptr + j, mask=jm, other=0.0)
        vj = tl.load(vb_ptr + at2, mask=m2, other=0.0)
        s1 += tl.sum(w[:, None] * tl.abs(vj), axis=0)
        dv = tl.where(m2, vj - o[None, :], 0.0)
        dv2 = dv * dv
        s2 += tl.sum(w[:, None] * dv2, axis=0)
        ww = w * w
        q2 += tl.sum(ww[:, None] * dv2, axis=0)
        qv += tl.sum(ww[:, None] * vj, axis=0)
        p2 += ww
        if declared:
            kw = kw_ops * tl.sum(k2 * qq[None, :], axis=1)
            if kw_score != 0.0:
                # (a hidden key's log is not taken: its weight is 0, so is its term)
                sj = tl.abs(tl.log(tl.where(w > 0.0, w, 1.0)) + lse) + bias
                kw = kw + (kw_score * sj) * sj
            kw = tl.where(w == 0.0, 0.0, (kw * w) * w)
            r2 += tl.sum(kw[:, None] * dv2, axis=0)
    return tl.max(top, axis=0), s1, s2, q2, qv, tl.sum(p2, axis=0), r2


@triton.jit(
    do_not_specialize=["b_sh", "Lc", "G", "D", "CH", "S", "reach", "has_alibi", "declared"],
    do_not_specialize_on_alignment=["pp_ptr", "vb_ptr", "kb_ptr", "o_ptr", "q_ptr", "lse_ptr", "sl_ptr", "pa_ptr"],
)
def decode_sums_kernel(
    pp_ptr,  # [Hq, Lc] float64: a decode's weights over the keys it sees
    vb_ptr,  # [Hkv, Lc, D] float64, rows of D contiguous: those keys' values...
    kb_ptr,  # ...and the keys themselves...
    b_sh,  # ...heads this far apart
    o_ptr,  # [Hq, 1, D] float64: the decode's output (the oracle's)
    q_ptr,  # [Hq, 1, D] float64: its query (declared)
    lse_ptr,  # [Hq] float64: its reference log-sum-exp (declared)
    sl_ptr,  # [Hq] float64: ALiBi slopes (declared and has_alibi)
    pa_ptr,  # [Hq, S, 5D + 2] float64: each slice's sums (slice_sums': s1, s2, q2, qv, r2), largest key norm, p2
    Lc,
    G,  # the GQA ratio
    D,
    CH,  # keys a slice (a multiple of BLOCK_J)
    S,  # slices: cdiv(Lc, CH)
    reach,  # the row's reach back, min(p, W - 1): ALiBi's largest bias is |slope| reach
    has_alibi,
    declared,  # the keys' score variances (policy._key_score_var): the score's operands declared rounded
    kw_ops: tl.float64,  # their constants (UNIFORM_VAR (a_inf / C_DOT)^2, UNIFORM_VAR u_score^2)
    kw_score: tl.float64,
    BLOCK_J: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # a program a query head and slice of a long decode's keys: one program a head walking them
    # all is slow on a long history (host.INLINE_DECODE_ELEMS)
    h = tl.program_id(0)
    s = tl.program_id(1)
    kv64 = (h // G).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    o = tl.load(o_ptr + h.to(tl.int64) * D + d, mask=dm, other=0.0)
    q = tl.load(q_ptr + h.to(tl.int64) * D + d, mask=dm, other=0.0)
    lse = tl.load(lse_ptr + h)
    bias = tl.full([], 0.0, tl.float64)
    if has_alibi:
        bias = tl.abs(tl.load(sl_ptr + h)) * reach.to(tl.float64)
    j_lo = s * CH
    km, s1, s2, q2, qv, p2, r2 = slice_sums(
        pp_ptr + h.to(tl.int64) * Lc,
        vb_ptr + kv64 * b_sh,
        kb_ptr + kv64 * b_sh,
        o,
        q,
        lse,
        bias,
        kw_ops,
        kw_score,
        declared,
        j_lo,
        tl.minimum(j_lo + CH, Lc),
        D,
        BLOCK_J,
        BLOCK_D,
    )
    at = pa_ptr + (h.to(tl.int64) * S + s) * (5 * D + 2)
    tl.store(at + d, s1, mask=dm)
    tl.store(at + D + d, s2, mask=dm)
    tl.store(at + 2 * D + d, q2, mask=dm)
    tl.store(at + 3 * D + d, qv, mask=dm)
    tl.store(at + 4 * D + d, r2, mask=dm)
    tl.store(at + 5 * D, km)
    tl.store(at + 5 * D + 1, p2)


@triton.jit(do_not_specialize=["v_sh", "k_sh", "L", "D"])
def moments_kernel(
    v_ptr,  # [Hkv, L, D] float64, rows of D contiguous: a sequence's values...
    v_sh,  # ...heads this far apart
    k_ptr,  # [Hkv, L, D] float64, rows of D contiguous: its keys...
    k_sh,  # ...heads this far apart
    c_ptr,  # [Hkv, 1, D] float64: the values' mean over the keys
    vv_ptr,  # [Hkv, L, 3D] float32: |v|, (v - c)^2 and v - c
    kn_ptr,  # [Hkv, L] float64: the keys' norms
    L,
    D,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # sequence_stats._value_moments' numbers bit for bit: |fl32(v)|, fl32 of the float64 square
    # of the float64 difference (it may cancel) and fl32 of the difference, each rounded to
    # nearest once
    kv = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    m = (rows[:, None] < L) & (d[None, :] < D)
    at = kv * v_sh + rows[:, None].to(tl.int64) * D + d[None, :]
    v = tl.load(v_ptr + at, mask=m, other=0.0)
    c = tl.load(c_ptr + kv * D + d, mask=d < D, other=0.0)
    to = (kv * L + rows[:, None]) * (3 * D) + d[None, :]
    tl.store(vv_ptr + to, tl.abs(v.to(tl.float32)), mask=m)
    dv = v - c[None, :]
    tl.store(vv_ptr + to + D, (dv * dv).to(tl.float32), mask=m)
    tl.store(vv_ptr + to + 2 * D, dv.to(tl.float32), mask=m)
    # the keys' norms, here rather than a launch or two of their own a block (sequence_stats._KeyMax's
    # come from torch's norm: the same to within a float64 rounding or two, see FUSED_RTOL)
    k = tl.load(k_ptr + kv * k_sh + rows[:, None].to(tl.int64) * D + d[None, :], mask=m, other=0.0)
    tl.store(kn_ptr + kv * L + rows, tl.sqrt(tl.sum(k * k, axis=1)), mask=rows < L)


@triton.jit(do_not_specialize=["N", "per_row"])
def reduce_kernel(
    st_ptr,  # [N, NS] float64: rows' statistics (the verdict kernel's)
    N,
    per_row,  # elements a row and head (the flat index's unit)
    out_ptr,  # [NS] float64: the check's, as ``reduced`` documents
    NS: tl.constexpr,
    BLOCK: tl.constexpr,
    FLAGS: tl.constexpr,  # the rows' last statistic is the flag (host.ROW_STATS)
):
    reduce_rows(st_ptr, N, per_row, out_ptr, NS, BLOCK, FLAGS)
