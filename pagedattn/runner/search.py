"""The search family: hypothesis draws whole cases within a time budget.

The search is split into items (``test_search[seed0]`` ... one per seed; how many
depends on the profile) so that pytest-xdist spreads them; each item gets its share
of ``--search-budget`` and its own fixed seed, so every run makes the same draws in
the same order (how far it gets depends on the budget and the machine). The first
half of the items draws within the configurations the profile's grid has already
run (dtypes, head dims, block sizes, heads, variants: what a kernel compiles per
shape), the second half draws new shapes too. A decode-only backend is judged on each
draw's decode form (``pagedattn.cases.decode_forms``), as in the grid.

Within an item, the budget covers finding and shrinking alike: a draw that would
start after it stops the item, and a draw whose time, estimated from the draws so
far, exceeds what is left is not run (a smaller one may still fit). An item that has
judged no case yet keeps drawing until twice its share has passed, so that an item whose
share went before its first draw (hypothesis' own start, on a slow or loaded machine) still
judges one: the family may then take up to a share more per such item. An item the budget
stops with no case judged is starved: reported warned (``starved`` in its record, a line in
the summary), with that reason and how many draws the backend declined, and it fails no run
(a slow or loaded machine is not a kernel's fault); one that hypothesis ends with none
claimed is unsupported. ``--search-budget=none`` leaves the draws (``--search-examples``) as
the only bound: every run then judges the same cases, whatever the machine. Every failing
draw smaller than the smallest so far is saved at once, with its replay command, so
whatever stops the item, the smallest failing case found is on disk and in the report.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, Verbosity, example, given, reject, seed, settings, target
from hypothesis.errors import Unsatisfiable

from pagedattn.adapters.protocol import SupportsWarmup
from pagedattn.cases import CaseSpec, save_case
from pagedattn.cases.configuration import Configuration
from pagedattn.cases.decode_forms import DecodeFormSpec
from pagedattn.cases.strategies import case_specs
from pagedattn.oracle import PagedCase, check_attention
from pagedattn.oracle.verdict import AttentionCheck
from pagedattn.runner.case_record import note
from pagedattn.runner.faults import BackendFault
from pagedattn.runner.search_plan import Pace, SearchItem, free_axes, grid_configurations, spec_work
from pagedattn.runner.suite import PagedAttnWarning, Suite

FAMILY = "search"
# Cases that once exposed a bug in a kernel under test, kept forever (run first, by item 0).
PINNED = [
    # a single-token history at block size 1 (empty tiles after the first)
    CaseSpec("search", ((1, 1), (2, 2)), num_heads=2, num_kv_heads=1, head_dim=48, block_size=1, tag="pinned1"),
    # MQA, odd head_dim and block size, continuation ending one past a block boundary
    CaseSpec(
        "search",
        ((27, 5),),
        num_heads=8,
        num_kv_heads=1,
        head_dim=80,
        block_size=13,
        dtype=torch.bfloat16,
        layout="permuted",
        tag="pinned2",
    ),
]


def spec_size(spec: CaseSpec) -> tuple:
    """How large a case is, for "the smallest failing case so far": history and query
    tokens first, then sequences, heads, head_dim, variants, block size."""
    return (
        sum(s for s, _ in spec.seqs),
        sum(q for _, q in spec.seqs),
        len(spec.seqs),
        spec.num_heads,
        spec.head_dim,
        len(spec.variants),
        spec.block_size,
    )


@contextlib.contextmanager
def _no_module_constants() -> Iterator[None]:
    """Hypothesis (recent versions: 6.155 here) now and then draws a constant found in the source
    of the "local" modules loaded, any module outside the standard library, site-packages and test
    files: a backend's adapter, this package installed in place, whatever else the process has
    imported. A seed's draws would then depend on the process's history (two runs of one item drew
    apart at the 38th case judged, one of them after a pytest run in the same process) and change
    with any edit of the kernel's source, where an author comparing before and after an edit wants
    the same cases: so none is drawn while an item searches (hypothesis' own constants still are).
    The patch is process-wide, and a search runs on the pytest session's thread, one item at a
    time. Hypothesis' cache of the permitted constants is cleared on the way in and out, so that no
    pool leaks into another's draws. A hypothesis without the feature is left as it is."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants

        get, cache, none = providers._get_local_constants, providers.CONSTANTS_CACHE.cache, Constants()
    except (ImportError, AttributeError):  # a hypothesis without the feature
        yield
        return
    try:
        providers._get_local_constants = lambda: none
        cache.clear()
        yield
    finally:
        providers._get_local_constants = get
        cache.clear()


class _BudgetSpent(BaseException):
    """Raised by a draw that would start after the budget: hypothesis lets a
    ``BaseException`` through at once, ending generation or shrinking alike."""


class _Failed(AssertionError):
    """A failing draw (hypothesis shrinks on it)."""


@dataclass
class _Verdict:
    """What one draw gave: ``None`` message = passed."""

    message: str | None
    check: AttentionCheck | None = None


@dataclass
class SearchRun:
    """One item's search over ``suite``'s backend, reported on the test item ``node``;
    ``budget_s`` is the whole search's budget (the item takes its share)."""

    suite: Suite
    node: pytest.Item
    item: SearchItem
    budget_s: float
    seen: dict[CaseSpec, _Verdict | None] = field(default_factory=dict)  # None: not claimed
    smallest: tuple[CaseSpec, str, str, AttentionCheck | None] | None = None  # (spec, message, replay, check)
    worst: tuple[float, CaseSpec, AttentionCheck] | None = None  # the passing draw nearest its bound
    examples: int = 0
    too_large: int = 0  # draws not run: their estimated time exceeded the budget left
    pace: Pace = field(default_factory=Pace)
    warmed: set[Configuration] = field(default_factory=set)  # configurations the backend's warmup has seen
    fault: Exception | None = None  # the first error of the search itself (not a backend's), if any
    starved: bool = False  # stopped by the budget before any claimed draw was judged
    declined: int = 0  # draws the backend did not claim (its capabilities, or a skip at run time)
    _deadline: float = 0.0

    @property
    def _share(self) -> float:
        """This item's share of the search's budget, in seconds."""
        return self.budget_s / self.item.count

    def run(self) -> None:
        """Search until the draws or the budget are spent; fail with the smallest failing case."""
        start = time.monotonic()
        self._deadline = start + self._share
        # in the record from the start, so that a fault of the search itself is reported too
        note(self.node, id=self.item.id, family=FAMILY, dtype="mixed", operation="attention", status="error")
        caps, dtypes = self.suite.caps, self._dtypes()
        reason = caps.unsupported_reason(device=self.suite.device) or (
            None if dtypes else "the backend claims none of fp32/fp16/bf16"
        )
        configs = [] if self.item.fresh_shapes or reason else grid_configurations(self.suite.profile, caps)
        axes, why = free_axes(caps)
        reason = reason or (None if configs else why)
        if not reason:
            try:
                with _no_module_constants():
                    self._hypothesis(dtypes, configs, axes)()
            except _BudgetSpent:
                pass
            except Unsatisfiable:
                pass  # judged below: no claimed draw at all is unsupported
            except Exception:
                if self.smallest is None:
                    raise  # not a backend's failure: a fault of the search itself
            if self.fault is not None and self.smallest is None:
                raise self.fault  # met in a draw, then swallowed by the search's stop
            if not self.examples and self.smallest is None:
                reason = "no drawn case was claimed by the backend"
                if self.starved:  # the budget ended the item, not hypothesis: no verdict either way
                    declined = f"; the backend declined the {self.declined} drawn before" if self.declined else ""
                    reason = (
                        f"no draw was judged within {2 * self._share:g} s, twice the item's share"
                        f" ({self._share:g} s) of --search-budget{declined}: raise it"
                    )
        self._report(reason, time.monotonic() - start, configs)

    # ----------------------------------------------------------- hypothesis
    def _dtypes(self) -> list[torch.dtype]:
        return sorted(self.suite.caps.dtypes & {torch.float32, torch.float16, torch.bfloat16}, key=str)

    def _hypothesis(
        self, dtypes: list[torch.dtype], configs: list[Configuration], axes: dict[str, list[int]]
    ) -> Callable[[], None]:
        caps = self.suite.caps
        strategy = case_specs(
            self.suite.profile,
            family=FAMILY,
            dtypes=dtypes,
            variants=caps.variants,
            configurations=configs,
            **axes,
            # a decode-only backend is judged on the decode forms of whole draws (``_offered``)
            decode_only=False,
            default_scale_only=caps.default_scale_only,
            max_seq_len=caps.max_seq_len,
        )

        @seed(self.item.index)
        @settings(
            max_examples=self.item.max_examples,
            deadline=None,
            database=None,  # the replay file is the record; a database would make seeds non-reproducible
            derandomize=False,  # @seed fixes the draws
            phases=[Phase.explicit, Phase.generate, Phase.target, Phase.shrink],
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.filter_too_much,
                HealthCheck.data_too_large,
                HealthCheck.large_base_example,
            ],
            verbosity=Verbosity.quiet,  # the failure is reported by the suite, in its own shape
            print_blob=False,
            report_multiple_bugs=False,
        )
        @given(spec=strategy)
        def search(spec: CaseSpec) -> None:
            self._draw(spec)

        if self.item.index == 0:
            for pinned in reversed(PINNED):
                search = example(spec=pinned)(search)
        return search

    def _draw(self, spec: CaseSpec) -> None:
        if spec not in self.seen:
            # the time left; until a case is judged, a second share (an item whose share went
            # before its first draw still judges one)
            left = self._deadline - time.monotonic() + (0.0 if self.examples else self._share)
            if left <= 0 or self.pace.estimate(0) > left:  # not even the smallest draw would fit
                self.starved = not self.examples  # read only then: no case judged
                raise _BudgetSpent
            work = spec_work(spec)
            if self.pace.estimate(work) > left:
                self.too_large += 1  # would overrun the budget: a smaller draw may still fit
                # and it stays rejected: hypothesis replays draws (its target phase), and a draw
                # rejected once and then run (or stopping the search) when replayed is a
                # FlakyReplay, which failed a correct kernel's search on the H200
                self.seen[spec] = None
                reject()
            start = time.monotonic()
            try:
                self.seen[spec] = self._judge(spec)
            except Exception as exc:  # not the backend's (that is a verdict): a fault of the search
                # kept, and raised once hypothesis is done: its replay of this draw may stop the
                # search (_BudgetSpent), which would otherwise leave the fault unreported
                self.fault = self.fault or exc
                raise
            self.pace.add(work, time.monotonic() - start)
        verdict = self.seen[spec]
        if verdict is None:
            reject()
        if verdict.message is not None:
            raise _Failed(verdict.message)
        if verdict.check is not None:
            target(min(verdict.check.budget_used, 1e9), label="budget_used")
            if verdict.check.rms_judged:  # the second criterion: the error's distribution
                target(min(verdict.check.rms_ratio, 1e9), label="rms_ratio")

    def _offered(self, spec: CaseSpec) -> CaseSpec | DecodeFormSpec:
        """What a draw is judged as: itself, or for a decode-only backend, where a sequence has
        several query tokens, its decode form (the decodes it implies, as the grid's cases offer)."""
        if self.suite.caps.decode_only and any(q > 1 for _, q in spec.seqs):
            return DecodeFormSpec(spec)
        return spec

    def _judge(self, spec: CaseSpec) -> _Verdict | None:
        """Run one draw: ``None`` when the backend does not claim it."""
        case = self._offered(spec).build().to(self.suite.device)
        if self.suite.caps.case_reason(case, "attention"):
            self.declined += 1
            return None
        self.examples += 1
        pristine = case.clone()
        backend = self.suite.backend
        try:
            if isinstance(backend, SupportsWarmup) and Configuration.of_spec(spec) not in self.warmed:
                # a JIT backend compiles a new configuration here, outside any --case-timeout
                self.warmed.add(Configuration.of_spec(spec))
                backend.warmup(case.clone())
            out = backend.paged_attention(case)
        except pytest.skip.Exception:  # the backend declined this case at run time
            self.examples -= 1
            self.declined += 1
            return None
        except BackendFault as exc:
            return self._failed(spec, pristine, f"backend fault: {exc}")
        except KeyboardInterrupt:
            raise  # the user stops the run
        except BaseException as exc:  # SystemExit and the like from a kernel: a failed draw, as in a case
            first = str(exc).splitlines()[0] if str(exc) else ""
            return self._failed(spec, pristine, f"the backend raised {type(exc).__name__}: {first}")
        check = check_attention(out, pristine, **self.suite.policy(pristine))
        if not check.passed:
            return self._failed(spec, pristine, str(check), check)
        if self.worst is None or check.budget_used > self.worst[0]:
            self.worst = (check.budget_used, spec, check)
        return _Verdict(None, check)

    def _failed(self, spec: CaseSpec, case: PagedCase, message: str, check: AttentionCheck | None = None) -> _Verdict:
        """A failing draw; saved (replacing the saved one) when it is the smallest so far."""
        if self.smallest is None or spec_size(spec) < spec_size(self.smallest[0]):
            replays = self.suite.replays
            path = replays.path(self.item.id)
            case_id = self._offered(spec).id
            save_case(case.to("cpu"), path, id=case_id, family="search-replay", operation="attention")
            rel = os.path.relpath(path)
            self.smallest = (spec, message, replays.command(path if rel.startswith("..") else rel), check)
        return _Verdict(message, check)

    # --------------------------------------------------------------- report
    def _report(self, reason: str | None, elapsed: float, configs: list[Configuration]) -> None:
        """The item's record (the one place it is written, for the report) and its outcome."""
        fields: dict[str, Any] = dict(
            seed=self.item.index,
            examples=self.examples,
            skipped_too_large=self.too_large,
            budget_s=round(self._share, 3) if self._share < math.inf else None,  # None: --search-budget=none
            elapsed_s=round(elapsed, 3),
            shapes=f"grid ({len(configs)} configurations)" if configs else "new",
        )
        check: AttentionCheck | None = None
        if reason and self.starved:
            # the machine's pace, not the kernel: a warning that shows in the summary, not a
            # failure (a loaded CI runner does not turn a run red); ``starved`` marks it
            fields.update(status="warned", warned=True, starved=True, message=f"starved: {reason}")
        elif reason:
            fields.update(status="unsupported", reason=reason)
        elif self.smallest is not None:
            spec, message, replay, check = self.smallest
            fields.update(status="failed", replay=replay, worst_case=repr(spec))
        elif self.worst is not None:
            _, spec, check = self.worst
            fields.update(status=check.status, worst_case=repr(spec))
        else:
            fields.update(status="passed")
        note(self.node, **fields, **({"metrics": check.metrics()} if check is not None else {}))
        if reason and self.starved:
            warnings.warn(PagedAttnWarning(f"{self.item.id}: starved: {reason}"), stacklevel=2)
            return
        if reason:
            pytest.skip(f"unsupported: {reason}")
        if self.smallest is not None:
            pytest.fail(f"{self._offered(spec).id} [attention]: {message}\n  replay: {replay}", pytrace=False)
        if check is not None and check.status == "warned":
            warnings.warn(PagedAttnWarning(f"{spec.id}: {check}"), stacklevel=2)
