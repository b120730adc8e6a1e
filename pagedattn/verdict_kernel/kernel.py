"""The verdict kernel: a block of rows' bound, the ratio of each error to it, and each row's statistics.

One launch a block of query rows, a program a row and query head: the terms of
``docs/tolerance.md`` in the torch path's order (``pagedattn.oracle.policy.chunk_bounds``), the
output's rounding, the ratios, the worst element and the counts; the last program of a check's
last launch reduces every row's statistics (``reduce_rows``). ``pagedattn.verdict_kernel.host``
launches it. A module of its own, imported only where the fused check runs: Triton is optional,
and under its interpreter ``TRITON_INTERPRET`` is read when the kernels are defined.
"""

import triton
import triton.language as tl

# Triton resolves a kernel's callees among its module's globals
from pagedattn.verdict_kernel.reductions import reduce_rows, slice_sums


# the integers and the tensors' alignment change from block to block: specialized, each
# combination would be a compile of its own. No pointer is specialized on its alignment either
# (a launch's key is then its tensors' dtypes: no address read for it, a launch a block on a
# host-bound check; the kernel's loads are a row of D elements, vectorized or not)
@triton.jit(
    do_not_specialize=(
        "row0 n p0 first W G Hq D out_st out_sh out_sd lo_st lo_sh kn_sh b_sh Lc has_extra has_sink has_alibi "
        "has_lse walk inline declared fin N sig S"
    ).split(),
    do_not_specialize_on_alignment=(
        "out_ptr o_ptr s12_ptr ex_ptr s34_ptr p2_ptr s56_ptr ws_ptr c_ptr q_ptr rm_ptr fl_ptr lse_ptr kn_ptr kr_ptr "
        "pp_ptr vb_ptr kb_ptr ps_ptr sh_ptr sk_ptr sl_ptr lo_ptr st_ptr ls_ptr rd_ptr pa_ptr"
    ).split(),
)
def verdict_kernel(
    out_ptr,  # [T, Hq, D] the backend's whole output, any float dtype, strided (rows row0 + t)
    out_st,
    out_sh,
    out_sd,
    o_ptr,  # [Hq, n, D] float64: the oracle's output (its product's own layout)
    s12_ptr,  # [Hq, n, 2D] float32: sum_j p_j |v_j|, sum_j p_j (v_j - c)^2
    ex_ptr,  # [Hq, n, D] float64: the subnormal-weight correction (has_extra)
    s34_ptr,  # [Hq, n, 2D] float32: sum_j p_j^2 (v_j - c)^2, sum_j p_j^2 (v_j - c)
    p2_ptr,  # [Hq, n] float32: sum_j p_j^2
    s56_ptr,  # [Hq, n, 2D] float32: sum_j w_j (v_j - c)^2, sum_j w_j (v_j - c), w the keys' score variances (declared)
    ws_ptr,  # [Hq, n] float32: sum_j w_j (declared)
    c_ptr,  # [Hkv, D] float64: the sequence's mean value
    q_ptr,  # [Hq, n, D] float64: the queries (their norms)
    rm_ptr,  # [Hq, n] float64: the row's max logit (the sink's included)
    fl_ptr,  # [Hq, n] float64: its smallest visible logit
    lse_ptr,  # [Hq, n] float64: the reference log-sum-exp
    kn_ptr,  # [Hkv, L - first] float64: the sequence's key norms from key ``first``, heads kn_sh apart
    kr_ptr,  # [Hkv, L - first] float64: their sliding maximum, each position's largest visible (no walk)
    kn_sh,
    pp_ptr,  # [Hq, Lc] float64: a decode's weights over the keys it sees (inline)
    vb_ptr,  # [Hkv, Lc, D] float64, rows of D contiguous: those keys' values (inline)...
    kb_ptr,  # ...and the keys themselves...
    b_sh,  # ...heads this far apart
    Lc,  # the keys a decode sees (inline)
    pa_ptr,  # [Hq, S, 5D + 2] float64: a longer decode's sums over its keys' slices (inline 2)
    S,  # its slices
    ps_ptr,  # [Hq, n] float64: the sink's share (has_sink)
    sh_ptr,  # [Hq, n] float64: the keys' share (has_sink)
    sk_ptr,  # [Hq] float64: the sinks (has_sink)
    sl_ptr,  # [Hq] float64: ALiBi slopes (has_alibi)
    lo_ptr,  # [T, Hq] float32: the backend's whole log-sum-exp, strided (has_lse; rows row0 + t; else any float32)
    lo_st,
    lo_sh,
    st_ptr,  # [T * Hq, NS] float64: the output's statistics, row (row0 + t) * Hq + h
    ls_ptr,  # [T * Hq, NS] float64: the log-sum-exp's (has_lse)
    rd_ptr,  # [2, NS] float64, zeroed: the check's reduced rows, the output's and the log-sum-exp's
    #          (fin); [1, NS - 1] counts the final launch's programs done
    row0,  # the block's first token
    n,  # its rows
    p0,  # the position of its first row in the sequence
    first,  # the first key any row of the sequence sees (kn's first)
    W,  # the sliding window (0: none)
    G,  # the GQA ratio
    Hq,  # query heads
    D,  # the head dim
    has_extra,  # the flags: branches taken at run time, so that they make no compile of their own
    has_sink,
    has_alibi,
    has_lse,
    walk,  # each row walks the key norms it sees (else reads kr)
    inline,  # a decode's key norms and value sums (kn, kr, s12, s34, p2, s56, ws, c unread): 1 from its
    #          keys and values here, 2 from its slices' (pa)
    declared,  # the score's operands declared rounded (a_inf or u_score): each key's own score variance
    fin,  # the check's final launch: its last program reduces every row's statistics
    N,  # T * Hq: the statistics' rows (fin)
    a: tl.float64,  # the model's constants (policy._terms): float64 (a float argument is float32)
    a_inf: tl.float64,
    u_score: tl.float64,
    row_const: tl.float64,
    pv: tl.float64,
    acc: tl.float64,  # C_ACC u sqrt(L), L the sequence's length
    var_pv: tl.float64,  # the expected squared error's (policy.chunk_bounds)
    var_abs_pv: tl.float64,
    acc_var: tl.float64,  # UNIFORM_VAR u^2 L
    kw_ops: tl.float64,  # policy._key_score_var's: UNIFORM_VAR (a_inf / C_DOT)^2, UNIFORM_VAR u_score^2
    kw_score: tl.float64,
    uv: tl.float64,  # error_model.UNIFORM_VAR (1/3: not a float32)
    tol: tl.float64,
    tol2: tl.float64,  # tol^2, the expected squared error's factor (verdict._scaled_var)
    xmin: tl.float64,  # the output dtype's smallest normal (2**emin)...
    sig,  # ...and its significand bits: its half ulp
    flag_below: tl.float64,  # a row whose smallest logit lies below its largest plus this is flagged (-inf: none)
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,  # key norms read at a time
    BLOCK_J: tl.constexpr,  # keys and values read at a time (inline 1)
    U: tl.constexpr,  # error_model.U_FP32, C_EXP, C_W: exact in float32, as Triton takes a float constexpr
    C_EXP: tl.constexpr,
    CW: tl.constexpr,
    NS: tl.constexpr,  # ROW_STATS: STATS, then the flag
):
    pid = tl.program_id(0)
    h = pid // n
    t = pid - h * n
    kv = h // G
    r = h.to(tl.int64) * n + t  # row of the [Hq, n] per-row tensors
    p = p0 + t
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    base = r * D
    # the row's largest ds_j (policy.chunk_bounds, same order of operations)
    q = tl.load(q_ptr + base + d, mask=dm, other=0.0)
    qn = tl.sqrt(tl.sum(q * q, axis=0))
    q_inf = tl.max(tl.abs(q), axis=0)  # max_i |q_i| (the masked lanes' 0 is never above it)
    # ALiBi's largest bias the row sees: slope * (j - p) reaches back min(p, W - 1) keys
    bias = tl.full([], 0.0, tl.float64)
    if has_alibi:
        reach = p
        if W > 0:
            reach = tl.minimum(p, W - 1)
        bias = tl.abs(tl.load(sl_ptr + h)) * reach.to(tl.float64)
    lse_ref = tl.load(lse_ptr + r)
    # the largest norm among the keys the row sees, max(0, p - W + 1) .. p (sequence_stats._KeyMax). A
    # decode whose value sums are direct (inline) takes it from its keys, below; another decode,
    # or a block of rows under a short window, walks the sequence's key norms; other blocks of several rows read
    # each row's from the sequence's sliding maximum over the same norms (sequence_stats._key_reach),
    # since a walk a row would read O(L) norms for each row and head of a long prefill. A NaN
    # norm the row sees makes its scores, reference and bound NaN whatever this maximum is (a
    # GPU's maximum, and the interpreter's, drop NaN)
    kv64 = kv.to(tl.int64)
    o = tl.load(o_ptr + base + d, mask=dm, other=0.0)
    # the squared weights' sums of the expected error about the values' centre (a decode's: about o)
    r1 = tl.zeros([BLOCK_D], dtype=tl.float64)
    w_sum = tl.full([], 0.0, tl.float64)
    if inline == 1:
        # a decode (a block of one row that sees every key of its block) over a short history
        # (host.INLINE_DECODE_ELEMS): the largest key norm and its sums (sequence_stats.DecodeSums)
        # from its keys, values and weights here, about its own output (no centre, no d terms below)
        km, s1, s2, q2, qv, p2, r2 = slice_sums(
            pp_ptr + r * Lc,
            vb_ptr + kv64 * b_sh,
            kb_ptr + kv64 * b_sh,
            o,
            q,
            lse_ref,
            bias,
            kw_ops,
            kw_score,
            declared,
            0,
            Lc,
            D,
            BLOCK_J,
            BLOCK_D,
        )
        q1 = qv - p2 * o  # sum_j p_j^2 v_j - o sum_j p_j^2, as _decode_sums forms it
        cen = o  # so that dd = 0 below (a non-finite o makes the row's ratio NaN either way)
    elif inline == 2:
        # a longer decode: the same sums over its keys' slices (decode_sums_kernel, a program a
        # slice and head), added here in the slices' order
        km = tl.full([], 0.0, tl.float64)  # norms are >= 0
        s1 = tl.zeros([BLOCK_D], dtype=tl.float64)
        s2 = tl.zeros([BLOCK_D], dtype=tl.float64)
        q2 = tl.zeros([BLOCK_D], dtype=tl.float64)
        qv = tl.zeros([BLOCK_D], dtype=tl.float64)
        r2 = tl.zeros([BLOCK_D], dtype=tl.float64)
        p2 = tl.full([], 0.0, tl.float64)
        part = pa_ptr + h.to(tl.int64) * S * (5 * D + 2)
        for i in range(0, S):
            at = part + i * (5 * D + 2)
            s1 += tl.load(at + d, mask=dm, other=0.0)
            s2 += tl.load(at + D + d, mask=dm, other=0.0)
            q2 += tl.load(at + 2 * D + d, mask=dm, other=0.0)
            qv += tl.load(at + 3 * D + d, mask=dm, other=0.0)
            r2 += tl.load(at + 4 * D + d, mask=dm, other=0.0)
            km = tl.maximum(km, tl.load(at + 5 * D))
            p2 += tl.load(at + 5 * D + 1)
        q1 = qv - p2 * o
        cen = o
    else:
        if walk:
            k_lo = 0
            if W > 0:
                k_lo = tl.maximum(p - W + 1, 0)
            k_lo = k_lo - first
            k_hi = p + 1 - first
            top = tl.zeros([BLOCK_K], dtype=tl.float64)  # norms are >= 0
            for j0 in range(k_lo, k_hi, BLOCK_K):
                j = j0 + tl.arange(0, BLOCK_K)
                top = tl.maximum(top, tl.load(kn_ptr + kv64 * kn_sh + j, mask=j < k_hi, other=0.0))
            km = tl.max(top, axis=0)
        else:
            km = tl.load(kr_ptr + kv64 * kn_sh + (p - first))
        s1 = tl.load(s12_ptr + 2 * base + d, mask=dm, other=0.0).to(tl.float64)
        s2 = tl.load(s12_ptr + 2 * base + D + d, mask=dm, other=0.0).to(tl.float64)
        q2 = tl.load(s34_ptr + 2 * base + d, mask=dm, other=0.0).to(tl.float64)
        q1 = tl.load(s34_ptr + 2 * base + D + d, mask=dm, other=0.0).to(tl.float64)
        p2 = tl.load(p2_ptr + r).to(tl.float64)
        r2 = tl.zeros([BLOCK_D], dtype=tl.float64)
        if declared:
            r2 = tl.load(s56_ptr + 2 * base + d, mask=dm, other=0.0).to(tl.float64)
            r1 = tl.load(s56_ptr + 2 * base + D + d, mask=dm, other=0.0).to(tl.float64)
            w_sum = tl.load(ws_ptr + r).to(tl.float64)
        cen = tl.load(c_ptr + kv64 * D + d, mask=dm, other=0.0)
    rm = tl.load(rm_ptr + r)
    fl = tl.load(fl_ptr + r)
    ds_dot = a * qn * km
    ds_ops = a_inf * q_inf * km
    ds_rest = U * (rm - 2.0 * tl.minimum(fl, 0.0)) + row_const
    if has_alibi:
        ds_rest = ds_rest + U * bias
    ds = ds_dot + ds_ops + ds_rest
    if u_score != 0.0:  # the score rounded once (declared): u |s_j| at the row's largest |s_j|, plus the bias
        ds = ds + u_score * (tl.maximum(tl.abs(rm), tl.abs(fl), propagate_nan=tl.PropagateNan.ALL) + bias)
    ds_var = (ds_dot * ds_dot + ds_rest * ds_rest) * uv
    seen = p + 1
    if W > 0:
        seen = tl.minimum(seen, W)
    grow = 1.0 / (1.0 - (seen.to(tl.float64) + 3.0) * U)  # sequence_stats._visible_keys_grow
    sqrt_grow = tl.sqrt(grow)
    dd = cen - o
    o_abs = tl.abs(o)
    # the expected squared error (policy.chunk_bounds, same order): the scores' from the squared
    # weights' sums about o, the weights' and values' about 0, each key's own declared score variance
    if inline:
        dev2 = q2
    else:
        dev2 = q2 + 2.0 * q1 * dd + p2 * (dd * dd)
    val2 = q2 + 2.0 * q1 * cen + p2 * (cen * cen)
    var = tl.maximum(dev2, 0.0, propagate_nan=tl.PropagateNan.ALL) * ds_var
    var = var + var_pv * tl.maximum(val2, 0.0, propagate_nan=tl.PropagateNan.ALL)
    if declared:
        if inline:
            var = var + tl.maximum(r2, 0.0, propagate_nan=tl.PropagateNan.ALL)
        else:
            own = r2 + 2.0 * r1 * dd + w_sum * (dd * dd)
            var = var + tl.maximum(own, 0.0, propagate_nan=tl.PropagateNan.ALL)
    lse_s = ds
    if has_sink:
        psk = tl.load(ps_ptr + r)
        share = tl.load(sh_ptr + r)
        spread2 = s2 + (2.0 * dd * o * psk) / grow  # (inline: dd is 0, the sums are about o)
        spread2 = spread2 - (dd * dd * share) / grow
        e = tl.sqrt(tl.maximum(spread2, 0.0, propagate_nan=tl.PropagateNan.ALL) * share) * (ds * sqrt_grow)
        lse_s = ds * share
        sink = tl.load(sk_ptr + h)
        w_sink = psk * (U * ((C_EXP + tl.abs(sink)) + tl.abs(sink - rm)))
        e = e + w_sink * o_abs
        var = var + (uv * (w_sink * w_sink)) * (o_abs * o_abs)
        lse_s = lse_s + w_sink
    else:
        spread2 = s2 - (dd * dd) / grow
        e = tl.sqrt(tl.maximum(spread2, 0.0, propagate_nan=tl.PropagateNan.ALL)) * (ds * sqrt_grow)
    if has_extra:
        e_sub = tl.load(ex_ptr + base + d, mask=dm, other=0.0)
        e = e + CW * e_sub
        var = var + ((uv * (CW * CW)) * e_sub) * e_sub  # coherent: (sum_j |a_j|)^2 / 3
    e = e + ((pv + acc) * grow) * s1
    e = e + acc * o_abs
    # the fp32 running sums' roundings, and the coherent and per-split ones (var_abs_pv)
    var = var + (acc_var * (s1 + o_abs)) * (s1 + o_abs)
    if var_abs_pv != 0.0:
        var = var + (var_abs_pv * s1) * s1
    # the output's rounding, uniform within half an ulp of |o| (policy._merged), and E_round: half
    # an ulp of |o| + e in the output dtype, each read off its float64 exponent
    x = tl.maximum(o_abs, xmin, propagate_nan=tl.PropagateNan.ALL)
    half = (((x.to(tl.int64, bitcast=True) >> 52) - sig) << 52).to(tl.float64, bitcast=True)
    var = (var + (uv * half) * half) * tol2
    x = tl.maximum(o_abs + e, xmin, propagate_nan=tl.PropagateNan.ALL)
    ex = (x.to(tl.int64, bitcast=True) >> 52) - sig
    e = (e + (ex << 52).to(tl.float64, bitcast=True)) * tol
    at = (row0 + t).to(tl.int64) * out_st + h.to(tl.int64) * out_sh + d.to(tl.int64) * out_sd
    out = tl.load(out_ptr + at, mask=dm, other=0.0)
    out = out.to(tl.float64)
    err = out - o
    ratio = tl.abs(err) / e
    fin_ref = (o - o) == 0.0
    fin_out = (out - out) == 0.0
    # a bound that is not finite where the reference is (a spread past float32's range) judges
    # nothing: NaN, which fails, as in verdict._Verdict.add
    ratio = tl.where(((e - e) == 0.0) | ~fin_ref, ratio, float("nan"))
    over = tl.sum(tl.where(dm & ~(ratio <= 1.0), 1.0, 0.0), axis=0)
    nonfinite = tl.sum(tl.where(dm & fin_ref & ~fin_out, 1.0, 0.0), axis=0)
    isnan = dm & (ratio != ratio)
    any_nan = tl.max(isnan.to(tl.int32), axis=0) > 0
    finite_r = tl.where(dm & ~isnan, ratio, -1.0)
    worst = tl.max(finite_r, axis=0)
    first_nan = tl.min(tl.where(isnan, d, BLOCK_D), axis=0)
    first_max = tl.min(tl.where(finite_r == worst, d, BLOCK_D), axis=0)
    idx = tl.where(any_nan, first_nan, first_max)
    pick = d == idx
    # the error's moments over the elements whose error and expected error are finite (verdict._moments)
    keep = dm & ((err - err) == 0.0) & ((var - var) == 0.0)
    var_row = tl.sum(tl.where(keep, var, 0.0), axis=0)
    srow = st_ptr + ((row0 + t).to(tl.int64) * Hq + h) * NS
    tl.store(srow + 0, tl.where(any_nan, float("nan"), worst))
    tl.store(srow + 1, over)
    tl.store(srow + 2, nonfinite)
    tl.store(srow + 3, idx.to(tl.float64))
    tl.store(srow + 4, tl.sum(tl.where(pick, out, 0.0), axis=0))
    tl.store(srow + 5, tl.sum(tl.where(pick, o, 0.0), axis=0))
    tl.store(srow + 6, tl.sum(tl.where(pick, e, 0.0), axis=0))
    tl.store(srow + 7, tl.sum(tl.where(keep, err * err, 0.0), axis=0))
    tl.store(srow + 8, var_row)
    tl.store(srow + 9, var_row * var_row)
    # no correction of subnormal weights was formed: whether the row may need one
    tl.store(srow + NS - 1, tl.where(fl - rm < flag_below, 1.0, 0.0))
    if has_lse:
        e_l = (lse_s + U * (C_EXP + 2.0 * tl.abs(lse_ref)) + acc) * tol
        lo = tl.load(lo_ptr + (row0 + t).to(tl.int64) * lo_st + h.to(tl.int64) * lo_sh).to(tl.float64)
        rl = tl.abs(lo - lse_ref) / e_l
        rl = tl.where(((e_l - e_l) == 0.0) | ((lse_ref - lse_ref) != 0.0), rl, float("nan"))
        exact_inf = (lse_ref - lse_ref != 0.0) & (lse_ref == lse_ref) & (lo == lse_ref)  # an infinite reference matched
        rl = tl.where(exact_inf, 0.0, rl)
        lrow = ls_ptr + ((row0 + t).to(tl.int64) * Hq + h) * NS
        tl.store(lrow + 0, rl)
        tl.store(lrow + 1, tl.where(rl <= 1.0, 0.0, 1.0))
        tl.store(lrow + 2, tl.where(((lse_ref - lse_ref) == 0.0) & ~((lo - lo) == 0.0), 1.0, 0.0))
        tl.store(lrow + 3, 0.0)
        tl.store(lrow + 4, lo)
        tl.store(lrow + 5, lse_ref)
        tl.store(lrow + 6, e_l)
        for k in tl.static_range(7, NS):  # no moments (judged by its worst element alone), no flag
            tl.store(lrow + k, 0.0)
    if fin:
        # the last program of the check's last launch reduces: every earlier launch is done
        # (the stream's order), and this launch's programs stored their rows before their count
        # (the barrier, then the atomic's release; its acquire in the last)
        tl.debug_barrier()
        done = tl.atomic_add(rd_ptr + 2 * NS - 1, 1.0)
        if done == (tl.num_programs(0) - 1).to(tl.float64):
            reduce_rows(st_ptr, N, D, rd_ptr, NS, 1024, True)
            if has_lse:  # (its rows flag nothing: [1, NS - 1] stays the count)
                reduce_rows(ls_ptr, N, 1, rd_ptr + NS, NS, 1024, False)
            tl.store(rd_ptr + 2 * NS - 1, done + 2.0)  # reduced: one past the programs' count
