"""The verdict on an attention output, element by element against the oracle and the bound.

``check_attention`` judges it against the float64 oracle and the error model's bound
(``pagedattn.oracle.policy``) and returns an ``AttentionCheck``: passed, warned or failed, how
much of the bound it used, and the worst element (sequence, token, position, head, channel,
value, reference, bound)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from pagedattn.oracle import policy
from pagedattn.oracle.case import PagedCase
from pagedattn.oracle.error_model import RMS_LIMIT, RMS_MIN_ELEMENTS, WARN_FACTOR
from pagedattn.oracle.policy import chunk_bounds, validate_precisions
from pagedattn.verdict_kernel import host as gpu_check


@dataclass
class AttentionCheck:
    """The verdict on one attention output.

    Two criteria from one error model (``docs/tolerance.md``). The worst element:
    ``budget_used`` is ``max |out - ref| / bound`` over all elements; beyond ``WARN_FACTOR``
    fails, in ``(1, WARN_FACTOR]`` warns. The error's distribution: ``rms_ratio`` is
    ``sqrt(sum (out - ref)^2 / sum var)`` over the finite elements, ``var`` the model's
    expected squared rounding error of each; beyond ``RMS_LIMIT`` fails, where the output has
    at least ``RMS_MIN_ELEMENTS`` effective elements (``rms_elements``; fewer: not judged by
    it). ``passed`` means neither criterion fails and nothing is non-finite.
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
    qk_precision: str = "fp32"
    tanh_precision: str = "ieee"
    tolerance_factor: float = 1.0
    case_summary: str = ""
    what: str = "attention"  # or "log-sum-exp" (then worst_channel is -1)
    rms_ratio: float = float("nan")  # the error's RMS over the model's expected (NaN: not formed)
    rms_elements: float = 0.0  # the effective number of elements behind it
    partials_precision: str = "fp32"

    @property
    def status(self) -> str:
        return "failed" if not self.passed else ("warned" if self.warning else "passed")

    @property
    def rms_judged(self) -> bool:
        """Whether the error's distribution is judged: enough effective elements."""
        return self.rms_elements >= RMS_MIN_ELEMENTS and self.rms_ratio == self.rms_ratio

    @property
    def rms_failed(self) -> bool:
        return self.rms_judged and not self.rms_ratio <= RMS_LIMIT

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
            "qk_precision": self.qk_precision,
            "tanh_precision": self.tanh_precision,
            "partials_precision": self.partials_precision,
            "tolerance_factor": self.tolerance_factor,
            "what": self.what,
            "rms": {
                "ratio": self.rms_ratio,
                "limit": RMS_LIMIT,
                "effective_elements": self.rms_elements,
                "judged": self.rms_judged,
            },
        }

    def __str__(self) -> str:
        if self.problem:
            return f"{self.what} output rejected: {self.problem}\n  case: {self.case_summary}"
        head = {
            "passed": f"{self.what} within the error bound",
            "warned": f"{self.what} in the warning band (above the bound, within {WARN_FACTOR:g}x of it)",
            "failed": f"{self.what} outside the error bound",
        }[self.status]
        if self.rms_failed and self.budget_used <= WARN_FACTOR and not self.num_nonfinite:
            head = f"{self.what}'s error distribution outside the model"
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
            + (", q.k from input-dtype products (declared)" if self.qk_precision == "input" else "")
            + (", scale folded into the query (declared)" if self.qk_precision == "scaled_query" else "")
            + (", approximate soft-cap tanh (declared)" if self.tanh_precision == "approx" else "")
            + (", split-K partials in the input dtype (declared)" if self.partials_precision == "input" else "")
            + (f", tolerance x{self.tolerance_factor:g} (backend override)" if self.tolerance_factor != 1.0 else ""),
            f"  case: {self.case_summary}",
        ]
        if self.what == "attention":
            lines.insert(3, "  " + self.rms_line())
        return "\n".join(lines)

    def rms_line(self) -> str:
        """The statistical criterion in words."""
        if self.rms_ratio != self.rms_ratio:
            return "error distribution: not formed"
        text = (
            f"error distribution: RMS {self.rms_ratio:.3g}x the model's expected rounding error "
            f"(limit {RMS_LIMIT:.3g}, {self.rms_elements:.0f} effective elements)"
        )
        if not self.rms_judged:
            return text + f": too few to judge (under {RMS_MIN_ELEMENTS}), the worst element alone decides"
        return text + (": beyond the limit" if self.rms_failed else "")


def _token_coords(case: PagedCase, token: int) -> tuple[int, int]:
    loc = case.query_start_loc_list
    for b in range(case.num_seqs):
        if loc[b] <= token < loc[b + 1]:
            return b, case.context_lens[b] + token - loc[b]
    return -1, -1


def _judged_by(
    owner: str,
    case: PagedCase,
    precision: str,
    qk_precision: str,
    tanh_precision: str,
    tolerance_factor: float,
    partials_precision: str,
) -> dict[str, Any]:
    """The policy a check judges by, validated (``ProblemError`` naming ``owner``), as the
    fields every ``AttentionCheck`` of that check carries."""
    validate_precisions(precision, qk_precision, owner, tanh_precision, partials_precision)
    return dict(
        precision=precision,
        qk_precision=qk_precision,
        tanh_precision=tanh_precision,
        partials_precision=partials_precision,
        tolerance_factor=tolerance_factor,
        case_summary=repr(case),
    )


def check_attention(
    output: torch.Tensor,
    case: PagedCase,
    *,
    precision: str = "ieee",
    qk_precision: str = "fp32",
    tanh_precision: str = "ieee",
    tolerance_factor: float = 1.0,
    partials_precision: str = "fp32",
) -> AttentionCheck:
    """Judge ``output`` against the float64 oracle with the per-element bound, block of
    rows by block of rows, in the oracle's own pass.

    Args:
        output: ``[num_tokens, num_heads, head_dim_v]`` in the query dtype, on the case's
            device: what the backend returned.
        case: the problem it was asked.
        precision: ``"ieee"`` or ``"tf32"`` (the backend's declared fp32 dot precision).
        qk_precision: ``"fp32"``, ``"scaled_query"`` or ``"input"`` (the backend's declared
            score precision: the scale folded into the query in the input dtype; q.k from
            products rounded to the input dtype and the score rounded once).
        tanh_precision: ``"ieee"`` or ``"approx"`` (the backend's declared soft-cap tanh:
            ``tanh.approx.f32``; changes soft-capped cases only).
        tolerance_factor: an explicit loosening (> 1) or tightening of both criteria, shown in
            the report.
        partials_precision: ``"fp32"`` or ``"input"`` (the backend's declared split-K
            partial outputs, kept in the input dtype before their merge).
    """
    common = _judged_by(
        "check_attention", case, precision, qk_precision, tanh_precision, tolerance_factor, partials_precision
    )
    problem = _output_problem(output, case)
    if problem:
        return AttentionCheck(passed=False, warning=False, budget_used=float("inf"), problem=problem, **common)
    if gpu_check.usable(case, tolerance_factor):  # on a GPU: one kernel a block for the bound and the verdict
        (row,) = gpu_check.verdict_rows(
            output, None, case, precision, qk_precision, tanh_precision, tolerance_factor, partials_precision
        )
        return _Verdict.of(row, (case.num_tokens, case.num_heads, case.head_dim_v)).check(case, common)
    verdict = _Verdict()
    for blk in chunk_bounds(
        case, precision, qk_precision, tanh_precision, with_lse=False, partials_precision=partials_precision
    ):
        verdict.add_output(blk, output, tolerance_factor)
        del blk  # its rows go before the next block's are formed (a bound name would hold them)
    return verdict.check(case, common)


def check_attention_lse(
    output: torch.Tensor,
    lse: torch.Tensor,
    case: PagedCase,
    *,
    precision: str = "ieee",
    qk_precision: str = "fp32",
    tanh_precision: str = "ieee",
    tolerance_factor: float = 1.0,
    partials_precision: str = "fp32",
) -> tuple[AttentionCheck, AttentionCheck]:
    """Judge an output and its log-sum-exp (one pass over the oracle).

    Args:
        output: ``[num_tokens, num_heads, head_dim_v]`` in the query dtype.
        lse: ``[num_tokens, num_heads]`` float32, natural log of each row's softmax
            denominator (sink included).
        case, precision, qk_precision, tanh_precision, tolerance_factor, partials_precision: as for
            ``check_attention`` (the log-sum-exp is judged by its worst element alone).

    Returns:
        ``(output_check, lse_check)``.
    """
    common = _judged_by(
        "check_attention_lse", case, precision, qk_precision, tanh_precision, tolerance_factor, partials_precision
    )
    p_out = _output_problem(output, case)
    p_lse = _structural(
        lse, case, (case.num_tokens, case.num_heads), torch.float32, "[num_tokens, num_heads]", "float32"
    )
    if p_out or p_lse:
        out_check = AttentionCheck(
            False, False, float("inf"), problem=p_out or "not judged: the log-sum-exp was rejected", **common
        )
        lse_check = AttentionCheck(
            False,
            False,
            float("inf"),
            problem=p_lse or "not judged: the output was rejected",
            what="log-sum-exp",
            **common,
        )
        return out_check, lse_check
    if gpu_check.usable(case, tolerance_factor):  # on a GPU: one kernel a block for the bounds and the verdicts
        policy_args = (precision, qk_precision, tanh_precision, tolerance_factor, partials_precision)
        row, lrow = gpu_check.verdict_rows(output, lse, case, *policy_args)
        v_out = _Verdict.of(row, (case.num_tokens, case.num_heads, case.head_dim_v))
        v_lse = _Verdict.of(lrow, (case.num_tokens, case.num_heads))
        return v_out.check(case, common), v_lse.check(case, dict(common, what="log-sum-exp"))
    v_out, v_lse = _Verdict(), _Verdict()
    for blk in chunk_bounds(case, precision, qk_precision, tanh_precision, partials_precision=partials_precision):
        v_out.add_output(blk, output, tolerance_factor)
        assert blk.lse is not None and blk.e_lse is not None
        v_lse.add(blk.tokens, lse[blk.tokens], blk.lse, _scaled(blk.e_lse, tolerance_factor), exact_inf=True)
        del blk  # its rows go before the next block's are formed
    v_out._settle(v_lse)  # both verdicts' statistics in one transfer
    return v_out.check(case, common), v_lse.check(case, dict(common, what="log-sum-exp"))


def _moments(err: torch.Tensor, var: torch.Tensor | None) -> torch.Tensor:
    """``[sum err^2, sum var, sum over rows of (the row's sum of var)^2]`` float64 ``[3]`` over the
    elements whose error and expected error are finite (zeros without ``var``)."""
    if var is None:
        return torch.zeros(3, dtype=torch.float64, device=err.device)
    keep = torch.sub(err, err).eq(0.0).logical_and_(torch.sub(var, var).eq(0.0))
    v = torch.where(keep, var, 0.0)
    rows = v.sum(dim=-1)
    return torch.stack([torch.where(keep, err.square(), 0.0).sum(), rows.sum(), rows.square().sum()])


def _read(*rows: torch.Tensor) -> list[list[float]]:
    """Device rows of statistics, read in one transfer."""
    return torch.stack(rows).tolist()


def _scaled(bound: torch.Tensor, tolerance_factor: float) -> torch.Tensor:
    return bound if tolerance_factor == 1.0 else bound.mul_(tolerance_factor)


def _scaled_var(var: torch.Tensor, tolerance_factor: float) -> torch.Tensor:
    """The expected squared error under ``tolerance_factor``: the expected error scales with it."""
    return var if tolerance_factor == 1.0 else var.mul_(tolerance_factor**2)


def _output_problem(output: Any, case: PagedCase) -> str:
    return _structural(
        output,
        case,
        (case.num_tokens, case.num_heads, case.head_dim_v),
        case.dtype,
        "[num_tokens, num_heads, head_dim_v]",
        "the query dtype",
    )


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


class _Verdict:
    """The verdict on an output ``[T, Hq(, D)]`` gathered block of rows by block of rows:
    counts, and the worst element so far.

    On a device, each block leaves a few scalars there and ``check`` reads them all in one
    transfer, so a check synchronizes once, not several times per block."""

    def __init__(self) -> None:
        self.budget = -1.0
        self.num_over = self.num_elements = self.num_nonfinite = 0
        self.worst: tuple[int, ...] = ()
        self.value = self.reference = self.bound = float("nan")
        self.worst_nan = False  # the worst element's ratio is NaN: it stays the worst
        # the error's distribution: sum of squared errors, of expected squared errors, and of the
        # rows' expected squared errors squared (the effective number of elements), finite elements only
        self.err2 = self.var = self.var_rows2 = 0.0
        #: per device block: its first token, its ratio's shape, its statistics (float64 [STATS])
        self._blocks: list[tuple[int, tuple[int, ...], torch.Tensor]] = []

    def add(
        self,
        tokens: slice,
        output: torch.Tensor,
        ref: torch.Tensor,
        bound: torch.Tensor,
        exact_inf: bool = False,
        var: torch.Tensor | None = None,
    ) -> None:
        """Judge rows ``tokens`` of the output (``output``, in its dtype) against ``ref`` and ``bound``;
        ``exact_inf``: an infinite reference matched exactly is no error (a log-sum-exp's ``-inf``);
        ``var``: each element's expected squared error (the error's distribution is judged
        against it; ``None``: not judged, its sums stay 0)."""
        out = output.to(torch.float64)
        err = torch.sub(out, ref)
        moments = _moments(err, var)
        ratio = err.abs_().div_(bound)
        ref_finite = torch.sub(ref, ref).eq(0.0)  # x - x is 0 where x is finite, NaN elsewhere
        # a bound that is not finite where the reference is (a spread past float32's range, say)
        # judges nothing: its ratio is NaN, which fails
        ratio.masked_fill_(torch.sub(bound, bound).ne(0.0).logical_and_(ref_finite), float("nan"))
        if exact_inf:  # an lse of -inf where the reference is -inf is exact
            ratio.masked_fill_(torch.isinf(ref) & (out == ref), 0.0)
        self.num_elements += ratio.numel()
        shape = tuple(ratio.shape)
        flat = torch.argmax(ratio).view(1)  # a NaN ratio is the largest
        # indexing by a tensor (``t[flat]``) would read ``flat`` on the host: ``index_select`` does not
        picked = [t.reshape(-1).index_select(0, flat) for t in (ratio, out, ref, bound)]
        if ratio.device.type == "cpu" and not policy.DEVICE_PATH_ON_CPU:
            # on the CPU a read costs nothing: count the non-finite elements only when there are some
            budget, value, reference, bound_at = (float(t) for t in picked)
            over = int((ratio > 1.0).sum())
            num_nonfinite = 0
            if not budget < float("inf"):
                over += int(torch.isnan(ratio).sum())
                num_nonfinite = int((ref_finite > torch.isfinite(out)).sum())
            row = [budget, over, num_nonfinite, int(flat), value, reference, bound_at]
            self._fold(tokens.start, shape, row + moments.tolist())
            return
        # on a device, every read is a synchronization: keep a few scalars there, read them all
        # in check(); counts and indices below 2**53 are exact in float64. The over count takes
        # the NaN ratios in, and the non-finite outputs where the reference is finite are
        # counted always: both are 0 unless the block's worst ratio is NaN or infinite, where
        # the CPU path counts them (x - x again: fewer ops than isfinite).
        finite_only_ref = ref_finite.logical_and_(torch.sub(out, out).ne(0.0))
        counts = torch.stack([ratio.le(1.0).logical_not_().sum(), finite_only_ref.sum(), flat[0]])
        stats = torch.cat([picked[0], counts.to(torch.float64), *picked[1:], moments])
        self._blocks.append((tokens.start, shape, stats))

    def add_output(self, blk: Any, output: torch.Tensor, tolerance_factor: float) -> None:
        """Judge a block of rows of ``output`` against its bound and expected error
        (``policy._Bound``), both under ``tolerance_factor``."""
        bound, var = _scaled(blk.e, tolerance_factor), _scaled_var(blk.var, tolerance_factor)
        self.add(blk.tokens, output[blk.tokens], blk.o, bound, var=var)

    @classmethod
    def of(cls, row: list[float], shape: tuple[int, ...]) -> _Verdict:
        """The verdict on a whole output ``shape`` from its statistics (``_fold``'s ``row``)."""
        verdict = cls()
        verdict.num_elements = math.prod(shape)
        verdict._fold(0, shape, row)
        return verdict

    def _fold(self, start: int, shape: tuple[int, ...], row: list[float]) -> None:
        """Fold one block's statistics in: ``[worst ratio, #over (NaN ratios included), #non-finite
        outputs where the reference is finite, flat index of the worst, its output, reference, bound,
        sum of squared errors, of expected squared errors, of rows' expected squared errors squared]``.
        The worst element is the first with a NaN ratio, or else the first largest, in
        (token, head, channel) order, however the blocks fall."""
        budget, over, nonfinite, flat, value, reference, bound, err2, var, var_rows2 = row
        self.err2 += err2
        self.var += var
        self.var_rows2 += var_rows2
        self.num_over += int(over)
        nan = budget != budget
        if not budget < float("inf"):  # a NaN or infinite output: infinitely over
            budget = float("inf")
            self.num_nonfinite += int(nonfinite)
        if budget > self.budget or (nan and not self.worst_nan):
            self.worst_nan = nan
            idx, rest = [], int(flat)  # unravelled on the host: no tensor, no device
            for size in reversed(shape):
                rest, i = divmod(rest, size)
                idx.append(i)
            idx.reverse()
            self.budget, self.worst = budget, (idx[0] + start, *idx[1:])
            self.value, self.reference, self.bound = value, reference, bound

    def _settle(self, *others: _Verdict) -> None:
        """Fold the device blocks' statistics in, in block order, this verdict's and ``others``'
        (one device-to-host transfer for all of them)."""
        verdicts = [v for v in (self, *others) if v._blocks]
        if verdicts:
            rows = _read(*[b[2] for v in verdicts for b in v._blocks])
            for v in verdicts:
                for (start, shape, _), row in zip(v._blocks, rows):
                    v._fold(start, shape, row)
                rows = rows[len(v._blocks) :]
                v._blocks = []

    def check(self, case: PagedCase, common: dict) -> AttentionCheck:
        self._settle()
        t, h = self.worst[0], self.worst[1]
        seq, pos = _token_coords(case, t)
        rms, n_eff = self.rms(case.head_dim_v if len(self.worst) > 2 else 1)
        check = AttentionCheck(
            passed=bool(self.budget <= WARN_FACTOR) and self.num_nonfinite == 0,
            warning=bool(1.0 < self.budget <= WARN_FACTOR),
            rms_ratio=rms,
            rms_elements=n_eff,
            budget_used=self.budget,
            num_over=self.num_over,
            num_elements=self.num_elements,
            num_nonfinite=self.num_nonfinite,
            worst_seq=seq,
            worst_token=t,
            worst_position=pos,
            worst_head=h,
            worst_channel=self.worst[2] if len(self.worst) > 2 else -1,
            value=self.value,
            reference=self.reference,
            bound=self.bound,
            **common,
        )
        check.passed = check.passed and not check.rms_failed
        return check

    def rms(self, per_row: int) -> tuple[float, float]:
        """The error's RMS over the model's expected, and the effective number of elements behind
        it: ``per_row`` elements a row times the rows' effective number,
        ``(sum var)^2 / sum (row's var)^2`` (NaN, 0: nothing expected, as for a log-sum-exp)."""
        if not self.var > 0.0:
            return float("nan"), 0.0
        return math.sqrt(self.err2 / self.var), per_row * self.var**2 / self.var_rows2
