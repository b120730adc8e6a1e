"""The check's bound and verdict in one Triton kernel per block of rows, on a GPU.

``policy.chunk_bounds`` forms the bound with a few dozen torch operations a block of rows and
``verdict._Verdict`` judges it with a few dozen more; on a GPU each is a launch and a host's
dispatch. Here the oracle's pass is the same (``iter_chunks``, the same blocks), the
score-sized work is the same float32 products (``_weighted_moments``; none for a decode), and
everything after them (the terms of ``docs/tolerance.md``, the output's rounding, the expected
squared error, the ratios, the worst element, the counts and the error's moments) is one kernel
launch a block, which writes a few statistics per row and head; the last program of the last
launch reduces them, and one read per check follows.

The host's other costs are cut too, as a check of milliseconds on a GPU is bound by its host:
a sequence's value moments and key norms are one kernel (``sequence_moments``); a decode needs
neither (``policy.direct_decode``: the verdict kernel sums over its keys itself, or a launch
before it over slices of them, ``INLINE_DECODE_ELEMS``); a row's largest visible key norm comes
from a walk over the sequence's norms or their sliding maximum (``KEY_WALK``); the correction of
subnormal weights is formed only where a row needs it (``verdict_rows``); and every launch after
a kernel's first is the compiled kernel's own (``launcher._launch``).

The numbers are the torch path's: the same formulas in the same order, in float64, within
``policy.FUSED_RTOL`` (a compiler may contract a multiply and an add; the keys' norms, a
decode's direct sums and the error's moments are summed in another order than torch's). Used
where it can run (``usable``): a CUDA tensor, Triton 3.6 or later importable, its interpreter
off, a half or single precision case, and not turned off with ``PAGEDATTN_FUSED_CHECK=0`` (for a
GPU Triton cannot compile for, or to rule the kernel out). Otherwise, and for the bound tensors
themselves (``attention_error_bound``), the torch path runs, with the same verdicts.
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

import torch

from pagedattn.oracle import policy, sequence_stats
from pagedattn.oracle.case import PagedCase
from pagedattn.oracle.error_model import C_ACC, C_DOT, C_EXP, C_W, DTYPE_TABLE, U_FP32, UNIFORM_VAR
from pagedattn.oracle.reference import Chunk, iter_chunks
from pagedattn.oracle.sequence_stats import _centre, _spent
from pagedattn.oracle.subnormal import _subnormal_weights
from pagedattn.verdict_kernel.launcher import _cdiv, _compiled, _launch, _pow2, triton_problem

#: ``0`` turns the fused path off (the torch path judges alone)
ENV = "PAGEDATTN_FUSED_CHECK"
#: run the fused path on CPU tensors too (tests: the kernel under the Triton interpreter)
ON_CPU = False
#: the statistics a row and head leaves, float64: the worst ratio (NaN where any is NaN), the
#: elements over the bound (NaN ratios included), the non-finite outputs where the reference is
#: finite, the worst element's channel, its output, reference and bound; then the error's
#: moments over the elements whose error and expected error are finite (``verdict._moments``):
#: the sum of squared errors, of expected squared errors, and that second sum squared (reduced:
#: the rows' squares summed). The log-sum-exp's moments are 0 (it is judged by its worst alone)
STATS = 10
#: a row's statistics as the verdict kernel writes them: ``STATS``, then whether the row's
#: weights may fall below the normal range where the pass formed no correction for them (1.0;
#: ``_rows`` then judges the case again with it)
ROW_STATS = STATS + 1
#: a row is flagged where its smallest visible logit lies more than ``-log(min normal) - FLAG_MARGIN``
#: below its largest: there a weight may need the correction (``subnormal._subnormal_weights`` marks
#: ``p_j l < min normal``, whose float64 roundings move that edge by ~1e-15, far less)
FLAG_MARGIN = 2.0**-20
#: where the weights' smallest normal (``DTYPE_TABLE``) is at or above this, a case's first pass
#: forms the correction from the guard, as the torch path does, rather than flag rows and judge
#: again: fp16's 2**-14 is ~9.7 in logits, which most fp16 cases span, where float32's and
#: bfloat16's 2**-126 (~87) is spanned by few
NARROW_MIN_NORMAL = 2.0**-60
#: key norms the verdict kernel reads at a time (a row's largest visible one)
KEY_BLOCK = 512


def usable(case: PagedCase, tolerance_factor: float = 1.0) -> bool:
    """Whether the fused path runs for ``case`` judged with ``tolerance_factor``: see the module's
    docstring. Only the policy as written: compiled for an H100, the kernel judged a tolerance
    factor of 1.5 wrongly (bounds not 1.5 times the policy's; 1 and 2 right), which the
    interpreter does not reproduce, so a loosened or tightened policy takes the torch path."""
    if tolerance_factor != 1.0:
        return False
    # the kernel forms causal and windowed masks itself, over one head dim for keys and values
    if case.tree_mask is not None or case.head_dim_v != case.head_dim:
        return False
    if case.dtype == torch.float64 or os.environ.get(ENV, "1") == "0" or triton_problem():
        return False
    if case.device.type == "cpu":
        return ON_CPU
    if case.device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    try:
        _compiled()
    except ImportError:
        return False
    return True


def _verdict_key(output: torch.Tensor, lse: torch.Tensor | None, case: PagedCase) -> Any:
    """The verdict kernel's launches' key for ``_launch`` in one check, or ``None``
    (``launcher._key``'s): the kernel specializes none of its pointers on alignment nor any integer on
    its value (``kernel.verdict_kernel``), its other tensors are float64 or float32 by
    construction (``_stats``; the log-sum-exp float32, checked by the caller, or the float32
    product in its place; a decode's float32 placeholder for the products), so what the JIT
    specializes on is the output's dtype and whether an integer needs 64 bits. Every integer is
    below the largest of the output's and the log-sum-exp's strides, the statistics' rows, the
    longest history times the head dim (a history's head stride) and the window: where that is
    below 2**31 the key is the output's dtype (``tests/test_verdict_kernel.py`` checks it against
    ``_key``)."""
    strides = list(output.stride()) + (list(lse.stride()) if lse is not None else [])
    history = case.max_seq_len * case.head_dim
    if max(*strides, case.num_tokens * case.num_heads * ROW_STATS, history, case.sliding_window or 0) >= 2**31:
        return None
    return ("verdict", output.dtype)


def verdict_rows(
    output: torch.Tensor,
    lse: torch.Tensor | None,
    case: PagedCase,
    precision: str,
    qk_precision: str,
    tanh_precision: str,
    tolerance_factor: float,
    partials_precision: str,
) -> list[list[float]]:
    """The check of ``output`` (and of ``lse``) against the oracle, the bound of
    ``policy.chunk_bounds`` scaled by ``tolerance_factor`` and its expected squared error scaled
    by ``tolerance_factor**2``, as ``reduced``'s rows (one, or two with ``lse``: the output's, the
    log-sum-exp's; ``STATS`` each, as ``verdict._Verdict.of`` folds them), read to the host in one
    transfer. The precisions are the backend's declared ones, as ``verdict.check_attention``
    takes them.

    The correction of weights below the normal range (``subnormal._subnormal_weights``) is formed
    only where a row needs it. For an output dtype whose weights keep float32's range the pass
    forms none and flags the rows whose logits span past it; the case is judged again, with the
    correction, where any row was flagged (few cases). The torch path reads a guard over the
    whole key pool first (``subnormal._weights_stay_normal``), a few dozen launches and a read
    that are much of a short check's time; fp16, whose weights leave their normal range within
    ~9.7 in logits, keeps that guard.

    Args:
        output: ``[T, Hq, D]`` in the query dtype, on the case's device (checked by the caller).
        lse: ``[T, Hq]`` float32, or ``None``.
    """
    min_normal = DTYPE_TABLE[case.dtype].weights_min_normal
    flag = min_normal < NARROW_MIN_NORMAL
    terms = policy._terms(
        case, precision, qk_precision, tanh_precision, guard=not flag, partials_precision=partials_precision
    )
    if case.device.type != "cuda":
        return _rows(output, lse, case, terms, tolerance_factor, flag)
    # Triton launches on the current device, not the tensors': a case on another GPU (a worker's)
    with torch.cuda.device(case.device):
        return _rows(output, lse, case, terms, tolerance_factor, flag)


def _rows(
    output: torch.Tensor,
    lse: torch.Tensor | None,
    case: PagedCase,
    terms: policy._Terms,
    tolerance_factor: float,
    flag: bool,
) -> list[list[float]]:
    """``verdict_rows``' rows: one pass that flags rows (``flag``) or forms the correction
    where ``terms`` say, then, where a row was flagged, one that forms it."""
    below = math.log(terms.model.weights_min_normal) + FLAG_MARGIN if flag else -math.inf
    rows = _read(_stats(output, lse, case, terms, tolerance_factor, correct=not flag, flag_below=below))
    if rows[0][STATS] > 0:  # rows whose weights may need the correction: the case again, with it
        rows = _read(_stats(output, lse, case, terms, tolerance_factor, correct=True, flag_below=-math.inf))
    return [row[:STATS] for row in rows[: 1 if lse is None else 2]]


def _read(p: _Pass) -> list[list[float]]:
    """A pass's reduced rows on the host (one transfer), after its count is checked: the final
    launch's programs count themselves and its last, having reduced, one more. A reduction that
    did not run leaves zeros, which would read as a pass."""
    rows = p.reduced.tolist()
    if rows[1][STATS] != p.programs + 1:
        raise RuntimeError(
            f"the fused check's reduction: a count of {rows[1][STATS]:g}, not the final launch's {p.programs} programs"
            " and its reduction's 1"
        )
    return rows


def sequence_moments(v: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sequence's terms of the bound in one kernel and the mean's launches (``sequence_stats._centre``):
    ``sequence_stats._value_moments``' numbers, bit for bit, and the keys' norms.

    Args:
        v: ``[Hkv, L, D]`` float64, rows of D contiguous (a slice of a sequence's values is read
            in place).
        k: ``[Hkv, L, D]`` float64, rows of D contiguous: the keys at the same positions.

    Returns:
        ``(c, vv, kn)``: the values' mean over the keys ``[Hkv, 1, D]`` float64,
        ``[|v|, (v - c)^2, v - c]`` ``[Hkv, L, 3D]`` float32 and each key's norm ``[Hkv, L]`` float64
        (torch's ``norm`` to within a float64 rounding or two: another order of the sum), on
        ``v``'s device.
    """
    Hkv, L, D = v.shape
    if v.stride(2) != 1 or v.stride(1) != D:
        v = v.contiguous()
    if k.stride(2) != 1 or k.stride(1) != D:
        k = k.contiguous()
    centre = _centre(v)
    vv = torch.empty(Hkv, L, 3 * D, dtype=torch.float32, device=v.device)
    kn = torch.empty(Hkv, L, dtype=torch.float64, device=v.device)
    block_d = _pow2(D)
    block_r = max(1, 4096 // block_d)
    _launch(
        _compiled().moments,
        (_cdiv(L, block_r), Hkv),
        (v, v.stride(0), k, k.stride(0), centre, vv, kn, L, D),
        {"BLOCK_R": block_r, "BLOCK_D": block_d},
    )
    return centre, vv, kn


class _Pass(NamedTuple):
    """One pass of the fused check over a case (``_stats``), on the case's device."""

    stats: torch.Tensor  # [T * Hq, ROW_STATS] float64: each row and head's, the output's
    lstats: torch.Tensor | None  # [T * Hq, ROW_STATS] float64: the log-sum-exp's (None without lse)
    # [2, ROW_STATS] float64: ``reduced``'s rows of both; [0, STATS] the rows flagged, [1, STATS] the count
    reduced: torch.Tensor
    programs: int  # the final launch's programs: [1, STATS] is one more once its last has reduced


#: a decode's direct sums (``policy.direct_decode``) in the verdict kernel: keys at a time times the
#: head dim's tile. They replace the moments kernel, the mean's two launches, the float32 weights
#: and their product: 5 launches a decode on a host-bound check
INLINE_TILE = 2048

#: a decode whose keys times D are at most this many has its direct sums formed in the verdict
#: kernel itself, a program a head reading its ``Lc D`` keys and values (2 MB here). One program
#: reading a long history is slow, so a longer decode's sums are a launch of their own
#: (``decode_sums_kernel``, a program a head and slice of ``SLICE_DECODE_ELEMS``), which the
#: verdict kernel adds in order: one launch in place of five, the device's time spread over the keys
INLINE_DECODE_ELEMS = 1 << 17
#: keys times D a program of ``decode_sums_kernel`` reads (512 KB of keys and values at D=128)
SLICE_DECODE_ELEMS = 1 << 15

#: a windowed block of several rows walks the key norms where the window is at most this many
#: keys (a few of the kernel's KEY_BLOCK reads a row), in place of the sequence's sliding
#: maximum: that is 8 torch operations a sequence (``sequence_stats._key_reach``), on a host-bound check
KEY_WALK = 2048


def _stats(
    output: torch.Tensor,
    lse: torch.Tensor | None,
    case: PagedCase,
    terms: policy._Terms,
    tolerance_factor: float,
    correct: bool = True,
    flag_below: float = -math.inf,
) -> _Pass:
    """Every row and head's statistics, the output's and the log-sum-exp's, reduced by the last
    launch. ``correct``: the correction of subnormal weights is formed where ``terms`` say
    (``subnormal._subnormal_weights``); else none is, and a row is flagged where its smallest
    visible logit lies below its largest plus ``flag_below``."""
    kernel = _compiled().verdict
    T, Hq, D = case.num_tokens, case.num_heads, case.head_dim
    kw: dict[str, Any] = dict(dtype=torch.float64, device=case.device)
    both = torch.empty(1 if lse is None else 2, T * Hq, ROW_STATS, **kw)
    stats, lstats = both[0], both[1] if lse is not None else None
    rd = torch.zeros(2, ROW_STATS, **kw)
    programs = 0
    key = _verdict_key(output, lse, case)
    model = terms.model
    W = case.sliding_window or 0
    block_j = max(1, INLINE_TILE // _pow2(D))  # keys a decode's sums read at a time
    consts = {
        "BLOCK_D": _pow2(D),
        "BLOCK_K": KEY_BLOCK,
        "BLOCK_J": block_j,
        "U": U_FP32,
        "C_EXP": C_EXP,
        "CW": C_W,
        "NS": ROW_STATS,
    }
    tol, xmin = float(tolerance_factor), 2.0**model.emin
    # the keys' own score variances (policy._key_score_var), where the score's operands are declared rounded
    declared = bool(terms.a_inf or terms.u_score)
    kw_ops, kw_score = UNIFORM_VAR * (terms.a_inf / C_DOT) ** 2, UNIFORM_VAR * terms.u_score**2
    # the log-sum-exp's strides, where there is none: never read (has_lse 0)
    lse_strides = lse.stride() if lse is not None else (0, 0)
    seq, first, centre, vv, kn = -1, 0, torch.empty(0), torch.empty(0), torch.empty(0)
    query_lens = case.query_lens
    reach: torch.Tensor | None = None  # the sequence's sliding maximum of kn, at its first block of rows
    placeholder32 = torch.empty(1, dtype=torch.float32, device=case.device)  # a float32 pointer never read
    for c in iter_chunks(case, live=policy._live(case), score_floor=True):
        Hkv, G, n, Lc = c.probs.shape
        # a decode (policy.direct_decode): its sums over its keys and values, as the torch path's
        # ``_decode_sums`` (no moments, no float32 product), in the verdict kernel (inline 1) or,
        # past INLINE_DECODE_ELEMS, over slices of its keys in a launch before it (inline 2)
        inline = int(policy.direct_decode(c, query_lens, terms.device_path))
        if c.seq != seq:  # the values and keys the sequence's rows see (policy.chunk_bounds)
            seq, first = c.seq, c.keys.start
            if not inline:  # [Hkv, 1, D], [Hkv, L - first, 3D], [Hkv, L - first]
                centre, vv, kn = sequence_moments(c.v_all[:, first:], c.k_all[:, first:])
            reach = None
        walk = n == 1 or 0 < W <= KEY_WALK
        if not walk and reach is None:  # positions from ``first``: every row's window starts there or later
            reach = sequence_stats._key_reach(kn, case.sliding_window)  # [Hkv, L - first]
        assert c.q.is_contiguous()  # the kernel reads its rows as o's: [Hq, n, D], rows of D
        o = torch.bmm(c.probs.view(Hkv, G * n, Lc), c.v)  # [Hkv, G * n, D]: [Hq, n, D]
        parts, slices = o, 0  # (a placeholder: not read)
        alibi = c.alibi is not None
        if inline:
            # the kernels read the weights [Hq, Lc] and the keys' and values' rows of D in place
            assert c.probs.is_contiguous() and c.v.stride()[1:] == (D, 1) and c.k.stride() == c.v.stride()
            s12 = s34 = p2 = s56 = w_sum = placeholder32
            centre = kn = o  # (placeholders: not read)
            if Lc * D > INLINE_DECODE_ELEMS:
                inline = 2
                chunk = max(1, SLICE_DECODE_ELEMS // (D * block_j)) * block_j  # keys a slice
                slices = _cdiv(Lc, chunk)
                parts = torch.empty(Hq, slices, 5 * D + 2, **kw)
                p = c.keys.stop - 1  # the decode's position: ALiBi's bias reaches min(p, W - 1) back
                _launch(
                    _compiled().decode_sums,
                    (Hq, slices),
                    (
                        c.probs,
                        c.v,
                        c.k,
                        c.v.stride(0),
                        o,
                        c.q,
                        c.lse,
                        c.alibi[0] if alibi else o,  # type: ignore[index]
                        parts,
                        Lc,
                        G,
                        D,
                        chunk,
                        slices,
                        min(p, W - 1) if W else p,
                        int(alibi),
                        int(declared),
                        kw_ops,
                        kw_score,
                    ),
                    {"BLOCK_J": block_j, "BLOCK_D": consts["BLOCK_D"]},
                )
        else:
            seen = vv[:, c.keys.start - first : c.keys.stop - first]
            s12, s34, p2, own = _weighted_moments(c, seen, terms, case.sliding_window)
            s56, w_sum = own if own is not None else (placeholder32, placeholder32)
            del seen, own
        # in the spent scores' storage: after the product
        extra = _subnormal_weights(c, terms) if correct else None
        # [Hq, n, D] float64 (``o`` stands in where there is none: has_extra 0)
        ex = torch.bmm(extra.view(Hkv, G * n, Lc), c.v.abs()) if extra is not None else o
        del extra
        L = case.seq_lens_list[c.seq]
        acc = C_ACC * U_FP32 * math.sqrt(L)
        acc_var = UNIFORM_VAR * U_FP32**2 * L  # (policy.chunk_bounds's expression: the same float)
        sink = c.sink_probs is not None
        args = (
            output,
            *output.stride(),
            o,
            s12,
            ex,
            s34,
            p2,
            s56,
            w_sum,
            centre,
            c.q,
            c.row_max,
            c.score_floor,
            c.lse,
            kn,
            reach if reach is not None else kn,  # (``kn`` stands in where a block walks)
            kn.stride(0),
            c.probs,
            c.v,
            c.k,
            c.v.stride(0),
            Lc,
            parts,
            slices,
            c.sink_probs if sink else o,
            c.key_share if sink else o,
            terms.sinks if sink else o,
            c.alibi[0] if alibi else o,  # type: ignore[index]
            lse if lse is not None else s12,  # (a float32 as a log-sum-exp: one compile for both checks)
            *lse_strides,
            stats,
            lstats if lstats is not None else stats,
            rd,
            c.tokens.start,
            n,
            c.keys.stop - n,
            first,
            W,
            G,
            Hq,
            D,
            int(ex is not o),
            int(sink),
            int(alibi),
            int(lse is not None),
            int(walk),
            inline,
            int(declared),
            int(c.last and c.seq == case.num_seqs - 1),  # (every sequence has a new token: PagedCase)
            T * Hq,
            terms.a,
            terms.a_inf,
            terms.u_score,
            terms.row_const,
            terms.pv,
            acc,
            terms.var_pv,
            terms.var_abs_pv,
            acc_var,
            kw_ops,
            kw_score,
            UNIFORM_VAR,
            tol,
            tol**2,
            xmin,
            model.significand,
            flag_below,
        )
        _launch(kernel, (Hq * n,), args, consts, key)
        programs = Hq * n
        if c.last:  # the sequence's last block: its moments and key norms go before the next
            centre = vv = kn = torch.empty(0)  # one's history comes (the oracle holds none of them)
            reach = None
        # the block's tensors go before the next block's (args holds them too)
        del c, o, s12, ex, s34, p2, s56, w_sum, parts, args
    return _Pass(stats, lstats, rd, programs)


def _weighted_moments(
    c: Chunk, seen: torch.Tensor, terms: policy._Terms, window: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """A block's float32 products with its sequence's moments (``seen``: ``[Hkv, Lc, 3D]``, the
    keys it sees), with the torch operations of ``policy.chunk_bounds``, so the same bits:
    ``s12`` ``[Hq, n, 2D]`` (the weights with ``[|v|, (v - c)^2]``), ``s34`` ``[Hq, n, 2D]`` (their
    squares with ``[(v - c)^2, v - c]``) and ``p2`` ``[Hq, n]`` (the squares' sum), and where the
    score's operands are declared rounded, ``(s56 [Hq, n, 2D], w_sum [Hq, n])``, the same with the
    keys' own score variances (``policy._key_score_var``; else ``None``). The weights
    take the spent scores' storage (``_spent``); ``window``: the case's sliding window."""
    Hkv, G, n, Lc = c.probs.shape
    D = c.v.shape[2]
    p32 = _spent(c.scores, torch.float32).copy_(c.probs)
    s12 = torch.bmm(p32.view(Hkv, G * n, Lc), seen[..., : 2 * D])
    key_w = None
    if terms.a_inf or terms.u_score:
        key_w = policy._key_score_var(c, terms, _alibi_bias(c, window) if c.alibi is not None else None, p32)
    p2 = p32.square_().sum(dim=-1)  # [Hkv, G, n]: [Hq, n]
    s34 = torch.bmm(p32.view(Hkv, G * n, Lc), seen[..., D:])
    if key_w is None:
        return s12, s34, p2, None
    return s12, s34, p2, (torch.bmm(key_w.view(Hkv, G * n, Lc), seen[..., D:]), key_w.sum(dim=-1))


def _alibi_bias(c: Chunk, window: int | None) -> torch.Tensor:
    """Each row's largest ALiBi bias, ``|slope| min(p, W - 1)``, ``[Hkv, G, n]`` float64, as
    ``policy.chunk_bounds`` forms it (the verdict kernel forms each row's own, the same float)."""
    assert c.alibi is not None
    slopes, rel = c.alibi
    reach_j = (-rel[:, 0]).add_(c.keys.start)  # the row's position p
    if window is not None:
        reach_j.clamp_(max=window - 1)
    return slopes.abs()[..., 0] * reach_j


def reduced(stats: torch.Tensor, per_row: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """One check's statistics from its rows' ``[T * Hq, NS]`` (``STATS`` or ``ROW_STATS``): ``[worst
    ratio (NaN where any is NaN), elements over, non-finite, flat index of the worst element
    (``per_row`` elements a row and head), its output, reference, bound, and the sums of the
    rows' three moments]`` and, from ``ROW_STATS``, the rows flagged: float64 ``[NS]``, on the
    device (into ``out`` if given), in one launch. The worst is the first NaN ratio, or else the
    first largest, in (token, head, channel) order. ``stats`` has at least one row (a case has a
    token). The check itself reduces in its final verdict launch, with the same code
    (``reduce_rows``)."""
    NS = stats.shape[1]
    assert NS in (STATS, ROW_STATS), NS
    out = torch.empty(NS, dtype=torch.float64, device=stats.device) if out is None else out
    consts = {"NS": NS, "BLOCK": 1024, "FLAGS": NS == ROW_STATS}
    _launch(_compiled().reduce, (1,), (stats, stats.shape[0], per_row, out), consts)
    return out
