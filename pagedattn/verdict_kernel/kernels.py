"""The fused check's Triton kernels (``pagedattn.verdict_kernel.host``, which documents them), in a module
of their own: Triton resolves a kernel's callees (``reduce_rows``) among its module's globals, and
this module is imported only where the fused check runs (Triton is optional; under its
interpreter, ``TRITON_INTERPRET`` is read when the kernels are defined).
"""

import triton
import triton.language as tl


@triton.jit
def reduce_rows(st_ptr, N, per_row, out_ptr, NS: tl.constexpr, BLOCK: tl.constexpr, FLAGS: tl.constexpr):
    # one program walks the rows in order: the worst is the first NaN, or else the first
    # largest (torch.argmax's rule); the counts are integers below 2**53, exact in any order.
    # FLAGS: the rows' 8th statistic (flagged rows) is summed into out[7]
    # The rows are read past L1 (.cg): in the verdict kernel's last program they are other
    # programs' stores, seen after the count's atomic
    i = tl.arange(0, BLOCK)
    best = tl.full([], float("-inf"), tl.float64)
    at = tl.full([], 0, tl.int32)
    found_nan = tl.full([], 0, tl.int32)
    over = tl.full([], 0.0, tl.float64)
    nonfinite = tl.full([], 0.0, tl.float64)
    flagged = tl.full([], 0.0, tl.float64)
    for i0 in range(0, N, BLOCK):
        rows = i0 + i
        m = rows < N
        row = st_ptr + rows.to(tl.int64) * NS
        x = tl.load(row, mask=m, other=float("-inf"), cache_modifier=".cg")
        over += tl.sum(tl.load(row + 1, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
        nonfinite += tl.sum(tl.load(row + 2, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
        if FLAGS:
            flagged += tl.sum(tl.load(row + 7, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
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
    if FLAGS:
        tl.store(out_ptr + 7, flagged)


@triton.jit
def slice_sums(pp_ptr, vb_ptr, kb_ptr, o, j_lo, j_hi, D, BLOCK_J: tl.constexpr, BLOCK_D: tl.constexpr):
    # a decode's keys j_lo .. j_hi - 1 (pp_ptr: its weights over its keys; vb_ptr, kb_ptr: its kv
    # head's values and keys, rows of D): the largest key norm, sum_j p_j |v_j| and
    # sum_j p_j (v_j - o)^2 in float64 about the row's output o (policy._decode_sums: every term
    # nonnegative, so any order of summation is within a float64 rounding a key of another)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    top = tl.zeros([BLOCK_J], dtype=tl.float64)
    s1 = tl.zeros([BLOCK_D], dtype=tl.float64)
    s2 = tl.zeros([BLOCK_D], dtype=tl.float64)
    for j0 in range(j_lo, j_hi, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        jm = j < j_hi
        m2 = jm[:, None] & dm[None, :]
        at2 = j[:, None].to(tl.int64) * D + d[None, :]
        kk = tl.load(kb_ptr + at2, mask=m2, other=0.0)
        top = tl.maximum(top, tl.sqrt(tl.sum(kk * kk, axis=1)))
        w = tl.load(pp_ptr + j, mask=jm, other=0.0)
        vj = tl.load(vb_ptr + at2, mask=m2, other=0.0)
        s1 += tl.sum(w[:, None] * tl.abs(vj), axis=0)
        dv = tl.where(m2, vj - o[None, :], 0.0)
        s2 += tl.sum(w[:, None] * (dv * dv), axis=0)
    return tl.max(top, axis=0), s1, s2


# the integers and the tensors' alignment change from block to block: specialized, each
# combination would be a compile of its own. No pointer is specialized on its alignment either
# (a launch's key is then its tensors' dtypes: no address read for it, a launch a block on a
# host-bound check; the kernel's loads are a row of D elements, vectorized or not)
@triton.jit(
    do_not_specialize=(
        "row0 n p0 first W G Hq D out_st out_sh out_sd lo_st lo_sh kn_sh b_sh Lc has_extra has_sink has_alibi "
        "has_lse walk inline fin N sig S"
    ).split(),
    do_not_specialize_on_alignment=(
        "out_ptr o_ptr s12_ptr ex_ptr c_ptr q_ptr rm_ptr fl_ptr lse_ptr kn_ptr kr_ptr pp_ptr vb_ptr kb_ptr ps_ptr "
        "sh_ptr sk_ptr sl_ptr lo_ptr st_ptr ls_ptr rd_ptr pa_ptr"
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
    pa_ptr,  # [Hq, S, 2D + 1] float64: a longer decode's sums over its keys' slices (inline 2)
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
    rd_ptr,  # [2, 8] float64, zeroed: the check's reduced rows, the output's and the log-sum-exp's
    #          (fin); [1, 7] counts the final launch's programs done
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
    inline,  # a decode's key norms and value sums (kn, kr, s12, c unread): 1 from its keys and values
    #          here, 2 from its slices' (pa)
    fin,  # the check's final launch: its last program reduces every row's statistics
    N,  # T * Hq: the statistics' rows (fin)
    a: tl.float64,  # the model's constants (policy._terms): float64 (a float argument is float32)
    row_const: tl.float64,
    pv: tl.float64,
    acc: tl.float64,  # C_ACC u sqrt(L), L the sequence's length
    tol: tl.float64,
    xmin: tl.float64,  # the output dtype's smallest normal (2**emin)...
    sig,  # ...and its significand bits: its half ulp
    flag_below: tl.float64,  # a row whose smallest logit lies below its largest plus this is flagged (-inf: none)
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,  # key norms read at a time
    BLOCK_J: tl.constexpr,  # keys and values read at a time (inline 1)
    U: tl.constexpr,  # policy.U_FP32, C_EXP, C_W: exact in float32, as Triton takes a float constexpr
    C_EXP: tl.constexpr,
    CW: tl.constexpr,
    NS: tl.constexpr,  # ROW_STATS
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
    # the largest norm among the keys the row sees, max(0, p - W + 1) .. p (policy._KeyMax). A
    # decode whose value sums are direct (inline) takes it from its keys, below; another decode,
    # or a block of rows under a short window, walks the sequence's key norms; other blocks of several rows read
    # each row's from the sequence's sliding maximum over the same norms (policy._key_reach),
    # since a walk a row would read O(L) norms for each row and head of a long prefill. A NaN
    # norm the row sees makes its scores, reference and bound NaN whatever this maximum is (a
    # GPU's maximum, and the interpreter's, drop NaN)
    kv64 = kv.to(tl.int64)
    o = tl.load(o_ptr + base + d, mask=dm, other=0.0)
    if inline == 1:
        # a decode (a block of one row that sees every key of its block) over a short history
        # (gpu_check.INLINE_DECODE_ELEMS): the largest key norm, sum_j p_j |v_j| and
        # sum_j p_j (v_j - o)^2 from its keys, values and weights here, about its own output
        # (policy._decode_sums: no centre, no d terms below)
        km, s1, s2 = slice_sums(
            pp_ptr + r * Lc, vb_ptr + kv64 * b_sh, kb_ptr + kv64 * b_sh, o, 0, Lc, D, BLOCK_J, BLOCK_D
        )
        cen = o  # so that dd = 0 below (a non-finite o makes the row's ratio NaN either way)
    elif inline == 2:
        # a longer decode: the same sums over its keys' slices (decode_sums_kernel, a program a
        # slice and head), added here in the slices' order
        km = tl.full([], 0.0, tl.float64)  # norms are >= 0
        s1 = tl.zeros([BLOCK_D], dtype=tl.float64)
        s2 = tl.zeros([BLOCK_D], dtype=tl.float64)
        part = pa_ptr + h.to(tl.int64) * S * (2 * D + 1)
        for i in range(0, S):
            at = part + i * (2 * D + 1)
            s1 += tl.load(at + d, mask=dm, other=0.0)
            s2 += tl.load(at + D + d, mask=dm, other=0.0)
            km = tl.maximum(km, tl.load(at + 2 * D))
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
        cen = tl.load(c_ptr + kv64 * D + d, mask=dm, other=0.0)
    rm = tl.load(rm_ptr + r)
    fl = tl.load(fl_ptr + r)
    ds = a * qn * km + U * (rm - 2.0 * tl.minimum(fl, 0.0)) + row_const
    if has_alibi:
        reach = p
        if W > 0:
            reach = tl.minimum(p, W - 1)
        ds = ds + U * tl.abs(tl.load(sl_ptr + h)) * reach.to(tl.float64)
    seen = p + 1
    if W > 0:
        seen = tl.minimum(seen, W)
    grow = 1.0 / (1.0 - (seen.to(tl.float64) + 3.0) * U)  # policy._visible_keys_grow
    sqrt_grow = tl.sqrt(grow)
    dd = cen - o
    o_abs = tl.abs(o)
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
        lse_s = lse_s + w_sink
    else:
        spread2 = s2 - (dd * dd) / grow
        e = tl.sqrt(tl.maximum(spread2, 0.0, propagate_nan=tl.PropagateNan.ALL)) * (ds * sqrt_grow)
    if has_extra:
        e = e + CW * tl.load(ex_ptr + base + d, mask=dm, other=0.0)
    e = e + ((pv + acc) * grow) * s1
    e = e + acc * o_abs
    # E_round: half an ulp of |o| + e in the output dtype, read off its float64 exponent
    x = tl.maximum(o_abs + e, xmin, propagate_nan=tl.PropagateNan.ALL)
    ex = (x.to(tl.int64, bitcast=True) >> 52) - sig
    e = (e + (ex << 52).to(tl.float64, bitcast=True)) * tol
    at = (row0 + t).to(tl.int64) * out_st + h.to(tl.int64) * out_sh + d.to(tl.int64) * out_sd
    out = tl.load(out_ptr + at, mask=dm, other=0.0)
    out = out.to(tl.float64)
    ratio = tl.abs(out - o) / e
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
    srow = st_ptr + ((row0 + t).to(tl.int64) * Hq + h) * NS
    tl.store(srow + 0, tl.where(any_nan, float("nan"), worst))
    tl.store(srow + 1, over)
    tl.store(srow + 2, nonfinite)
    tl.store(srow + 3, idx.to(tl.float64))
    tl.store(srow + 4, tl.sum(tl.where(pick, out, 0.0), axis=0))
    tl.store(srow + 5, tl.sum(tl.where(pick, o, 0.0), axis=0))
    tl.store(srow + 6, tl.sum(tl.where(pick, e, 0.0), axis=0))
    # no correction of subnormal weights was formed: whether the row may need one
    tl.store(srow + 7, tl.where(fl - rm < flag_below, 1.0, 0.0))
    if has_lse:
        ref = tl.load(lse_ptr + r)
        e_l = (lse_s + U * (C_EXP + 2.0 * tl.abs(ref)) + acc) * tol
        lo = tl.load(lo_ptr + (row0 + t).to(tl.int64) * lo_st + h.to(tl.int64) * lo_sh).to(tl.float64)
        rl = tl.abs(lo - ref) / e_l
        rl = tl.where(((e_l - e_l) == 0.0) | ((ref - ref) != 0.0), rl, float("nan"))
        exact_inf = (ref - ref != 0.0) & (ref == ref) & (lo == ref)  # an infinite reference matched
        rl = tl.where(exact_inf, 0.0, rl)
        lrow = ls_ptr + ((row0 + t).to(tl.int64) * Hq + h) * NS
        tl.store(lrow + 0, rl)
        tl.store(lrow + 1, tl.where(rl <= 1.0, 0.0, 1.0))
        tl.store(lrow + 2, tl.where(((ref - ref) == 0.0) & ~((lo - lo) == 0.0), 1.0, 0.0))
        tl.store(lrow + 3, 0.0)
        tl.store(lrow + 4, lo)
        tl.store(lrow + 5, ref)
        tl.store(lrow + 6, e_l)
        tl.store(lrow + 7, 0.0)
    if fin:
        # the last program of the check's last launch reduces: every earlier launch is done
        # (the stream's order), and this launch's programs stored their rows before their count
        # (the barrier, then the atomic's release; its acquire in the last)
        tl.debug_barrier()
        done = tl.atomic_add(rd_ptr + 15, 1.0)
        if done == (tl.num_programs(0) - 1).to(tl.float64):
            reduce_rows(st_ptr, N, D, rd_ptr, NS, 1024, True)
            if has_lse:  # (its rows flag nothing: [1, 7] stays the count)
                reduce_rows(ls_ptr, N, 1, rd_ptr + 8, NS, 1024, False)
            tl.store(rd_ptr + 15, done + 2.0)  # reduced: one past the programs' count


@triton.jit(
    do_not_specialize=["b_sh", "Lc", "G", "D", "CH", "S"],
    do_not_specialize_on_alignment=["pp_ptr", "vb_ptr", "kb_ptr", "o_ptr", "pa_ptr"],
)
def decode_sums_kernel(
    pp_ptr,  # [Hq, Lc] float64: a decode's weights over the keys it sees
    vb_ptr,  # [Hkv, Lc, D] float64, rows of D contiguous: those keys' values...
    kb_ptr,  # ...and the keys themselves...
    b_sh,  # ...heads this far apart
    o_ptr,  # [Hq, 1, D] float64: the decode's output (the oracle's)
    pa_ptr,  # [Hq, S, 2D + 1] float64: each slice's sum_j p_j |v_j|, sum_j p_j (v_j - o)^2, largest key norm
    Lc,
    G,  # the GQA ratio
    D,
    CH,  # keys a slice (a multiple of BLOCK_J)
    S,  # slices: cdiv(Lc, CH)
    BLOCK_J: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # a program a query head and slice of a long decode's keys: one program a head walking them
    # all reads ~8 GB/s on the H200 (gpu_check.INLINE_DECODE_ELEMS)
    h = tl.program_id(0)
    s = tl.program_id(1)
    kv64 = (h // G).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    o = tl.load(o_ptr + h.to(tl.int64) * D + d, mask=dm, other=0.0)
    j_lo = s * CH
    km, s1, s2 = slice_sums(
        pp_ptr + h.to(tl.int64) * Lc,
        vb_ptr + kv64 * b_sh,
        kb_ptr + kv64 * b_sh,
        o,
        j_lo,
        tl.minimum(j_lo + CH, Lc),
        D,
        BLOCK_J,
        BLOCK_D,
    )
    at = pa_ptr + (h.to(tl.int64) * S + s) * (2 * D + 1)
    tl.store(at + d, s1, mask=dm)
    tl.store(at + D + d, s2, mask=dm)
    tl.store(at + 2 * D, km)


@triton.jit(do_not_specialize=["v_sh", "k_sh", "L", "D"])
def moments_kernel(
    v_ptr,  # [Hkv, L, D] float64, rows of D contiguous: a sequence's values...
    v_sh,  # ...heads this far apart
    k_ptr,  # [Hkv, L, D] float64, rows of D contiguous: its keys...
    k_sh,  # ...heads this far apart
    c_ptr,  # [Hkv, 1, D] float64: the values' mean over the keys
    vv_ptr,  # [Hkv, L, 2D] float32: |v| and (v - c)^2
    kn_ptr,  # [Hkv, L] float64: the keys' norms
    L,
    D,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # policy._value_moments' numbers bit for bit: |fl32(v)|, and fl32 of the float64 square
    # of the float64 difference (it may cancel), each rounded to nearest once
    kv = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    m = (rows[:, None] < L) & (d[None, :] < D)
    at = kv * v_sh + rows[:, None].to(tl.int64) * D + d[None, :]
    v = tl.load(v_ptr + at, mask=m, other=0.0)
    c = tl.load(c_ptr + kv * D + d, mask=d < D, other=0.0)
    to = (kv * L + rows[:, None]) * (2 * D) + d[None, :]
    tl.store(vv_ptr + to, tl.abs(v.to(tl.float32)), mask=m)
    dv = v - c[None, :]
    tl.store(vv_ptr + to + D, (dv * dv).to(tl.float32), mask=m)
    # the keys' norms, here rather than a launch or two of their own a block (policy._KeyMax's
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
):
    reduce_rows(st_ptr, N, per_row, out_ptr, NS, BLOCK, NS > 7)
