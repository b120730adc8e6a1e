"""The search family: a time budget over finding and shrinking, the smallest failing case
saved at once with its replay, items that xdist spreads, draws on the grid's configurations
first, and a failure message in the suite's shape."""

import importlib
import importlib.util
import json
import math
import os
import re
import sys
import time
import types
import warnings

import hypothesis
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pagedattn.runner.search as search
import pagedattn.runner.search_plan as search_plan
from pagedattn import Capabilities
from pagedattn.cases import CaseSpec, load_case, strategies
from pagedattn.cases.configuration import Configuration
from pagedattn.cases.strategies import case_specs
from pagedattn.runner.case_record import noted
from pagedattn.runner.options import positive_seconds
from pagedattn.runner.search import SearchRun, spec_size
from pagedattn.runner.search_plan import SearchItem, grid_configurations, search_items
from pagedattn.runner.session import SUITE_DIR
from pagedattn.runner.suite import Suite
from tests.helpers import run_inprocess, searched

#: how the runs below name the suite: by its directory (``conformance/`` in a checkout, the installed
#: package's in a wheel: ``session.SUITE_DIR``), not ``--pyargs pagedattn.conformance``, and with the
#: plugin by its module's name, which its entry point shares (never registered twice), so that they
#: run in a checkout that is not installed too (``PYTHONPATH=.``, as the GPU machine runs the tree)
SUITE_RUN = ("-p", "pagedattn.plugin")
SEARCH_MODULE = os.path.join(SUITE_DIR, "test_search.py")
#: the reference backend by its path, not its name: the names are entry points, which a tree that
#: is not installed lacks
REFERENCE = "--backend=pagedattn.adapters.reference:ReferenceBackend"

# Planted backends, written into each pytester directory (tests/planted/bad_backends.py is another helper's).
PLANTED = '''
import time

from pagedattn import Capabilities, paged_attention_reference


class Correct:
    name = "correct"
    capabilities = Capabilities()

    def paged_attention(self, case):
        return paged_attention_reference(case).to(case.dtype)


class OffForWideGroups(Correct):
    """Wrong only when the GQA group is 4 or more and a history spans more than 30 tokens."""

    def paged_attention(self, case):
        scale = case.scale * (1.02 if case.gqa_ratio >= 4 and case.max_seq_len > 30 else 1.0)
        return paged_attention_reference(case.replace(scale=scale)).to(case.dtype)


class RaisesOnLongHistories(Correct):
    def paged_attention(self, case):
        if case.max_seq_len > 40:
            raise RuntimeError("kernel launch failed: too many resources requested")
        return super().paged_attention(case)


class ExitsOnLongHistories(Correct):
    def paged_attention(self, case):
        if case.max_seq_len > 40:
            raise SystemExit(3)
        return super().paged_attention(case)


class Slow(Correct):
    def paged_attention(self, case):
        time.sleep(0.2)
        return super().paged_attention(case)


class SlowOnLargeCases(Correct):
    """Takes time in proportion to the query-key pairs: up to seconds on the largest draws."""

    sleep = staticmethod(time.sleep)  # a test may spend the time on a clock of its own

    def paged_attention(self, case):
        self.sleep(1e-5 * sum(q * s for q, s in zip(case.query_lens, case.seq_lens_list)) * case.num_heads)
        return super().paged_attention(case)
'''


def _planted():
    return types.SimpleNamespace(**{k: v for k, v in _exec(PLANTED).items() if isinstance(v, type)})


def _exec(source):
    namespace: dict = {}
    exec(compile(source, "planted.py", "exec"), namespace)
    return namespace


def _suite(backend, tmp_path, profile="quick"):
    return Suite(
        backend=backend,
        backend_spec="planted.py:X",
        device="cpu",
        profile=profile,
        replay_dir=str(tmp_path / "failures"),
    )


def _node():
    return types.SimpleNamespace(user_properties=[])


def _fake_clock(monkeypatch, tick: float = 0.0) -> list[float]:
    """The search's clock in the test's hands: ``[seconds]``, which moves by ``tick`` each time the
    search reads it and by whatever the test adds to it, so that no machine's speed changes what
    the search does."""
    clock = [0.0]

    def monotonic():
        clock[0] += tick
        return clock[0]

    monkeypatch.setattr(search, "time", types.SimpleNamespace(monotonic=monotonic))
    return clock


# ---------------------------------------------------------------- in process
def test_items_split_the_draws_and_half_stay_on_the_grid():
    for profile, count in search_plan.ITEMS.items():
        items = search_items(profile, 100)
        assert [i.index for i in items] == list(range(count)) and sum(i.max_examples for i in items) >= 100
        assert [i.id for i in items][:2] == ["search-seed0", "search-seed1"]
        fresh = [i.fresh_shapes for i in items]
        assert fresh == sorted(fresh) and 0 < sum(fresh) < count + (count == 1), f"{profile}: {fresh}"


def test_budget_option_accepts_positive_finite_seconds_or_none():
    assert positive_seconds("2.5") == 2.5
    assert positive_seconds("none") == positive_seconds("None") == math.inf
    for bad in ("0", "-1", "inf", "nan", "ten"):
        with pytest.raises(ValueError, match="positive, finite seconds"):
            positive_seconds(bad)
    assert search_plan.budget_seconds(None, "cuda:1") == 60.0 and search_plan.budget_seconds(None, "cpu") == 30.0
    assert search_plan.budget_seconds(4.0, "cpu") == 4.0


def test_grid_configurations_are_the_claimed_ones_simplest_first():
    every = grid_configurations("quick", Capabilities(variants=frozenset({"sinks", "fp8_e4m3"})))
    assert every == sorted(every, key=Configuration.sort_key) and len(every) == len(set(every))
    assert any(c.variants == {"sinks"} for c in every) and any(c.kv_dtype == torch.float8_e4m3fn for c in every)
    assert not any("sliding_window" in c.variants for c in every), "an unclaimed variant's configuration was kept"
    narrow = Capabilities(dtypes=frozenset({torch.float32}), block_sizes={16}, max_gqa_ratio=2)
    configs = grid_configurations("quick", narrow)
    assert configs and all(
        c.dtype == torch.float32 and c.block_size == 16 and c.num_heads // c.num_kv_heads <= 2 and not c.all_variants
        for c in configs
    )


CONFIGS = grid_configurations("quick", Capabilities(variants=frozenset({"sliding_window", "fp8_e5m2"})))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.data())
def test_draws_on_configurations_stay_on_them(data):
    spec = data.draw(case_specs("quick", configurations=CONFIGS))
    assert Configuration.of_spec(spec) in CONFIGS
    assert spec.build().num_seqs == len(spec.seqs)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(case_specs("quick", decode_only=True, default_scale_only=True, max_seq_len=20))
def test_draws_honour_decode_only_default_scale_and_max_seq_len(spec):
    assert all(q == 1 and s <= 20 for s, q in spec.seqs) and spec.scale is None


def test_size_orders_by_tokens_then_shape():
    small = CaseSpec("search", ((31, 1),), num_heads=4, num_kv_heads=1)
    assert spec_size(small) < spec_size(CaseSpec("search", ((32, 1),), num_heads=4, num_kv_heads=1))
    assert spec_size(small) < spec_size(CaseSpec("search", ((31, 1),), num_heads=8, num_kv_heads=1))
    assert spec_size(small) < spec_size(CaseSpec("search", ((31, 1),), num_heads=4, num_kv_heads=1, sinks=True))


def test_every_smaller_failure_is_saved_at_once_and_the_smallest_reported(tmp_path, monkeypatch):
    saved = []  # the size of every case saved, as spec_size measures it
    real_save = search.save_case

    def save(case, path, **meta):
        saved.append(
            (
                sum(case.seq_lens_list),
                sum(case.query_lens),
                case.num_seqs,
                case.num_heads,
                case.head_dim,
                len(case.variants),
                case.block_size,
            )
        )
        real_save(case, path, **meta)

    monkeypatch.setattr(search, "save_case", save)
    monkeypatch.setitem(strategies.BOUNDS, "quick", (48, 2, 8))  # smaller draws, a faster test
    node = _node()
    run = SearchRun(_suite(_planted().OffForWideGroups(), tmp_path), node, SearchItem(1, 2, 300), budget_s=60.0)
    with pytest.raises(pytest.fail.Exception) as info:
        searched(run)
    assert run.smallest is not None
    spec = run.smallest[0]
    rec = noted(node)
    assert rec["status"] == "failed" and rec["worst_case"] == repr(spec) and rec["examples"] >= 1
    assert saved and saved[-1] == spec_size(spec) and saved == sorted(set(saved), reverse=True), saved
    # shrunk to the bug's edge: one decode sequence of 31 tokens in a group of 4 or more
    assert spec.seqs == ((31, 1),) and spec.num_heads // spec.num_kv_heads >= 4, spec
    case, meta = load_case(tmp_path / "failures" / "search-seed1.pt")
    assert meta["family"] == "search-replay" and torch.equal(case.query, spec.build().query)
    message = str(info.value)
    # failed by either criterion: its worst element, or its error's distribution
    heads = ("attention outside the error bound", "attention's error distribution outside the model")
    assert any(message.startswith(f"{spec.id} [attention]: {head}") for head in heads), message
    assert message.splitlines()[-1] == f"  replay: {rec['replay']}" and "--replay" in rec["replay"]


def test_budget_bounds_the_search(tmp_path):
    node = _node()
    start = time.monotonic()
    searched(SearchRun(_suite(_planted().Slow(), tmp_path), node, SearchItem(0, 2, 1000), budget_s=2.0))
    elapsed = time.monotonic() - start
    rec = noted(node)
    assert rec["status"] == "passed" and rec["budget_s"] == 1.0 and rec["examples"] >= 1, rec
    # one draw (0.2 s of sleep plus the oracle) may start just before the budget ends
    assert elapsed < 5 * 1.0, f"a 1 s share of the budget took {elapsed:.1f} s"
    assert rec["examples"] < 1000


def test_pace_estimates_from_the_large_draws():
    pace = search_plan.Pace()
    assert pace.estimate(10**9) == 0.0  # nothing known yet: any draw may run
    pace.add(100, 0.1)
    pace.add(1000, 1.0)
    assert pace.estimate(10_000) == pytest.approx(0.1 + 0.9 / 1100 * 10_000)


@pytest.mark.parametrize("late, status", [(1.5, "passed"), (2.5, "warned")])
def test_an_items_first_claimed_draw_runs_late_but_not_past_twice_its_share(tmp_path, monkeypatch, late, status):
    """On a loaded machine hypothesis' own start can take an item's share: its first claimed draw
    still runs (every item judges a case) until twice the share has passed; past that the item is
    starved: warned (a slow machine fails no run), ``starved`` in its record, and it says why."""
    reads = [0]

    def monotonic():  # the item's start, then every read `late` shares (seconds) on
        reads[0] += 1
        return 0.0 if reads[0] == 1 else late

    monkeypatch.setattr(search, "time", types.SimpleNamespace(monotonic=monotonic))
    node = _node()
    run = SearchRun(_suite(_planted().Correct(), tmp_path), node, SearchItem(1, 2, 50), budget_s=2.0)
    if status == "passed":
        searched(run)
    else:
        with pytest.warns(search.PagedAttnWarning, match=r"search-seed1: starved: no draw was judged within 2 s"):
            searched(run)
    rec = noted(node)
    assert rec["status"] == status and rec["examples"] == (1 if status == "passed" else 0), rec
    assert rec.get("starved", False) == (status == "warned"), rec
    if status == "warned":
        assert re.match(r"starved: no draw was judged within 2 s, twice .*\(1 s\)", rec["message"]), rec


@pytest.mark.parametrize(
    "how, ends",
    [
        ("skip", "budget"),
        ("capabilities", "budget"),
        ("capabilities", "hypothesis"),  # hypothesis draws until it gives up: 2-5 s
        pytest.param("skip", "hypothesis", marks=pytest.mark.slow),
    ],
)
def test_a_backend_that_declines_every_draw(tmp_path, monkeypatch, how, ends):
    """A backend that declines every draw (a skip at run time, or its capabilities) is unsupported
    when hypothesis ends the item; when the budget does, the item is starved (warned), and says how
    many draws were declined (no budget would mend a backend that takes none, but none can tell)."""
    # "budget": every read 0.1 s on, so the item's two shares (2 s) pass within 20 reads
    _fake_clock(monkeypatch, tick=0.1 if ends == "budget" else 0.0)
    backend = _planted().Correct()
    if how == "skip":

        def declines(case):
            pytest.skip("this kernel runs no case drawn here")

        backend.paged_attention = declines
    else:
        backend.capabilities = Capabilities(case_filter=lambda case, op: "no case drawn here")
    node = _node()
    run = SearchRun(_suite(backend, tmp_path), node, SearchItem(1, 2, 5), budget_s=2.0)
    if ends == "hypothesis":
        with pytest.raises(pytest.skip.Exception, match="^unsupported: no drawn case was claimed by the backend$"):
            run.run()
    else:
        with pytest.warns(search.PagedAttnWarning, match=r"starved: no draw was judged .*; the backend declined"):
            searched(run)
    rec = noted(node)
    assert rec["status"] == ("warned" if ends == "budget" else "unsupported"), rec
    if ends == "budget":
        assert rec["starved"] is True
        assert re.search(r"; the backend declined the \d+ drawn before: raise it$", rec["message"]), rec


def test_without_a_time_limit_the_draws_alone_bound_the_search(tmp_path, monkeypatch):
    """``--search-budget=none``: a machine however slow (each clock read 100 s on) judges the same
    cases as any other, as many as ``--search-examples`` gives; the same clock with a time limit
    starves the item."""

    def judged(budget_s):
        _fake_clock(monkeypatch, tick=100.0)
        node = _node()
        run = SearchRun(_suite(_planted().Correct(), tmp_path), node, SearchItem(1, 2, 6), budget_s=budget_s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", search.PagedAttnWarning)
            searched(run)
        return noted(node), [spec for spec, verdict in run.seen.items() if verdict is not None]

    rec, first = judged(math.inf)
    assert rec["status"] == "passed" and rec["examples"] == 6 and rec["budget_s"] is None, rec
    assert rec["skipped_too_large"] == 0, rec
    _, second = judged(math.inf)
    assert first == second, "two runs without a time limit judged different cases"
    starved, none = judged(2.0)
    assert starved["status"] == "warned" and starved["starved"] is True and not none, starved


def test_draws_too_large_for_the_budget_left_are_not_run(tmp_path, monkeypatch):
    # the search's clock counts the backend's time (its sleeps) and 0.1 ms each time it is read,
    # so that the check and hypothesis, and the machine's load, change nothing: the same draws on
    # any machine. The reads' ticks stand for the host's time between draws, which ends a real
    # search whose budget is nearly spent; a clock that stood still would leave hypothesis drawing
    # (and the search rejecting) thousands of draws too large for the little budget left.
    clock = _fake_clock(monkeypatch, tick=1e-4)
    backend = _planted().SlowOnLargeCases()
    backend.sleep = lambda seconds: clock.__setitem__(0, clock[0] + seconds)
    node = _node()
    searched(SearchRun(_suite(backend, tmp_path), node, SearchItem(1, 2, 1000), budget_s=1.0))
    rec = noted(node)
    assert rec["status"] == "passed" and rec["skipped_too_large"] >= 1, rec
    assert rec["examples"] >= 5, rec  # the share was spent on draws, not given up at once
    # no noise on this clock: the share is kept to the draws' estimate (a draw run although
    # estimated too large took it to 0.77 s)
    assert clock[0] <= 1.2 * 0.5, f"a 0.5 s share took {clock[0]:.2f} s: a large draw overran it"


def test_a_seeds_draws_do_not_depend_on_the_modules_loaded(tmp_path, monkeypatch):
    """Hypothesis draws now and then a constant of the "local" modules loaded (a backend's adapter,
    say); a seed's draws stay the same after a new module with constants of its own comes in."""

    class Recorded(SearchRun):
        def _draw(self, spec):  # every draw rejected: hypothesis draws until it gives up, ~1 ms each
            drawn.append(spec)
            hypothesis.reject()

    def draws():
        drawn.clear()
        with pytest.raises(pytest.skip.Exception, match="no drawn case was claimed"):
            Recorded(_suite(_planted().Correct(), tmp_path), _node(), SearchItem(1, 2, 100), budget_s=1e9).run()
        return list(drawn)

    drawn: list = []
    before = draws()
    path = tmp_path / "kernel_constants.py"
    ints = "\n".join(f"C{i} = {i}" for i in range(1001, 4000, 7))
    path.write_text(ints + "\nF = (0.371, 0.813, 1.73, 2.31, 7.3e-3)\n")
    # hypothesis reads the constants of modules it takes for the project's own: not a test file's,
    # nor any under a folder named test or tests (a --basetemp there would leave nothing to test)
    local = getattr(importlib.import_module("hypothesis.internal.constants_ast"), "is_local_module_file", None)
    assert local is None or local(str(path)), f"{path} is not a local module to hypothesis"
    spec = importlib.util.spec_from_file_location("kernel_constants", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "kernel_constants", module)  # and out again at teardown
    after = draws()
    assert len(before) >= 100, len(before)  # enough for a constant to be drawn (unmended, index 27 was)
    diff = next(((i, a, b) for i, (a, b) in enumerate(zip(before, after)) if a != b), None)
    assert diff is None and len(after) == len(before), (diff, len(before), len(after))


@pytest.mark.filterwarnings("ignore:Using `reject` outside a property-based test")  # _draw, called directly
def test_a_draw_rejected_as_too_large_stays_rejected_when_replayed(tmp_path):
    """Hypothesis replays draws (its target phase): a draw rejected for the budget left must be
    rejected again, not run (nor stop the search) on a later replay, when the pace or the budget
    says otherwise, or hypothesis raises FlakyReplay (seen on the H200, 18d: a correct kernel's
    search item failed so)."""
    from hypothesis.errors import UnsatisfiedAssumption

    backend = _planted().Correct()
    run = SearchRun(_suite(backend, tmp_path), _node(), SearchItem(1, 2, 10), budget_s=100.0)
    run._deadline, run.examples = time.monotonic() + 10.0, 1  # an item under way: its first case judged
    spec = CaseSpec("search", ((30, 1),))
    run.pace.add(1, 0.1)  # the smallest draws fit, this one's estimate does not
    run.pace.add(2, 5.0)
    assert run.pace.estimate(0) < 10.0 < run.pace.estimate(search_plan.spec_work(spec))
    with pytest.raises(UnsatisfiedAssumption):
        run._draw(spec)
    run.pace = search_plan.Pace()  # the replay: the pace now says it fits
    with pytest.raises(UnsatisfiedAssumption):
        run._draw(spec)
    run._deadline = time.monotonic() - 1.0  # ... or the budget is spent: still the same rejection
    with pytest.raises(UnsatisfiedAssumption):
        run._draw(spec)
    assert run.examples == 1 and run.too_large == 1  # none run


def test_a_fault_of_the_search_itself_is_raised_even_when_the_budget_ends_the_search(tmp_path, monkeypatch):
    """An error in a draw that is not the backend's (here the check's) is the search's own fault:
    raised, not reported as a pass, even when hypothesis' replay of that draw meets the end of the
    budget (which stops the search quietly)."""
    clock = _fake_clock(monkeypatch)

    def broken_check(out, case, **kw):
        clock[0] += 0.2  # the draw's time: past the 0.15 s share below
        raise RuntimeError("a bug in the check")

    monkeypatch.setattr(search, "check_attention", broken_check)
    run = SearchRun(_suite(_planted().Correct(), tmp_path), _node(), SearchItem(1, 2, 50), budget_s=0.3)
    with pytest.raises(RuntimeError, match="a bug in the check"):
        searched(run)


def test_a_raising_backend_is_a_failure_with_a_replay(tmp_path):
    node = _node()
    run = SearchRun(_suite(_planted().RaisesOnLongHistories(), tmp_path), node, SearchItem(1, 2, 200), budget_s=30.0)
    with pytest.raises(pytest.fail.Exception, match=r"the backend raised RuntimeError: kernel launch failed"):
        searched(run)
    assert run.smallest is not None and run.smallest[0].seqs == ((41, 1),), run.smallest[0]
    assert "--replay" in noted(node)["replay"]


def test_a_kernel_that_exits_fails_its_draw_with_a_replay(tmp_path):
    """``SystemExit`` from a kernel inside the search is a failed draw, shrunk and saved, not
    the end of the run."""
    node = _node()
    run = SearchRun(_suite(_planted().ExitsOnLongHistories(), tmp_path), node, SearchItem(1, 2, 200), budget_s=30.0)
    with pytest.raises(pytest.fail.Exception, match=r"the backend raised SystemExit: 3"):
        searched(run)
    assert run.smallest is not None and run.smallest[0].seqs == ((41, 1),), run.smallest[0]
    assert "--replay" in noted(node)["replay"]


def test_unclaimed_everything_is_unsupported(tmp_path):
    backend = _planted().Correct()
    backend.capabilities = Capabilities(dtypes=frozenset({torch.float64}))
    node = _node()
    with pytest.raises(pytest.skip.Exception, match="claims none of fp32/fp16/bf16"):
        SearchRun(_suite(backend, tmp_path), node, SearchItem(0, 2, 10), budget_s=5.0).run()
    assert noted(node)["status"] == "unsupported"


# --------------------------------------------------------------- end to end
def test_search_items_find_save_and_replay(pytester):
    """Through pytest: the items, their records in the JSON report, the failure message in
    the suite's shape (no test source, no Suite repr, no hypothesis banner), no hypothesis
    warning, and a replay that fails again."""
    pytester.makepyfile(planted=PLANTED)
    args = [
        *SUITE_RUN,
        "-p",
        "no:cacheprovider",
        "-W",
        "error::hypothesis.errors.HypothesisWarning",
        SEARCH_MODULE,
        "--report-json=report.json",
        "--search-budget=10",
    ]
    result = run_inprocess(pytester, *args, "--backend=planted.py:RaisesOnLongHistories", "-k", "seed1")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    for noise in ("def test_search", "Suite(", "Failing test case", "Falsifying example", "Traceback", "Warning"):
        assert noise not in out, f"{noise!r} in the output:\n{out[-3000:]}"
    want = r"^search-\S+-L41 \[attention\]: the backend raised RuntimeError: kernel launch failed.*\n  replay: pytest "
    assert re.search(want, out, re.M), out[-3000:]
    cases = json.loads((pytester.path / "report.json").read_text())["cases"]
    (rec,) = [c for c in cases if c["family"] == "search"]
    assert rec["id"] == "search-seed1" and rec["status"] == "failed" and rec["shapes"] == "new", rec
    assert rec["budget_s"] == 5.0 and rec["elapsed_s"] < 5 * 5.0, rec
    assert "seqs=((41, 1),)" in rec["worst_case"], rec["worst_case"]
    replay = re.search(r"replay: (pytest .*)", out).group(1)
    assert replay == rec["replay"]
    again = run_inprocess(pytester, *SUITE_RUN, "-p", "no:cacheprovider", *replay.split()[1:])
    again.assert_outcomes(failed=1)

    passing = run_inprocess(pytester, *args, "--backend=planted.py:Correct", "--search-budget=2", "-v")
    passing.assert_outcomes(passed=2)
    passing.stdout.fnmatch_lines(["*test_search?seed0? PASSED*", "*test_search?seed1? PASSED*"])


def test_a_starved_search_warns_and_fails_no_run(pytester):
    """A search whose budget a slow machine spends before any draw is judged: the run passes,
    its items are warned with ``starved`` in the report, and the summary says so and what to do."""
    pytester.makepyfile(planted=PLANTED)
    args = [*SUITE_RUN, "-p", "no:cacheprovider", SEARCH_MODULE, "--report-json=report.json"]
    result = run_inprocess(pytester, *args, "--backend=planted.py:Slow", "--search-budget=1e-6", "-k", "seed1")
    assert result.ret == 0, result.stdout.str()[-3000:]
    (rec,) = [c for c in json.loads((pytester.path / "report.json").read_text())["cases"] if c["family"] == "search"]
    assert rec["status"] == "warned" and rec["starved"] is True and rec["examples"] == 0, rec
    result.stdout.fnmatch_lines(["*search: 1 item starved: it judged no case within --search-budget*"])


def test_fresh_draws_take_only_claimed_axes(tmp_path):
    """A kernel built for head_dim 128 and block size 16 only (none of the small free draws)
    still gets fresh draws, all claimed."""
    backend = _planted().Correct()
    backend.capabilities = Capabilities(head_dims={128}, block_sizes={16}, max_gqa_ratio=2)
    axes, why = search_plan.free_axes(backend.capabilities)
    assert why is None and axes == {"head_dims": [128], "block_sizes": [16], "gqa_ratios": [1, 2]}
    warmed = []
    backend.warmup = lambda c: warmed.append((c.dtype, c.head_dim, c.block_size, c.num_heads, c.num_kv_heads))
    node = _node()
    searched(SearchRun(_suite(backend, tmp_path), node, SearchItem(1, 2, 6), budget_s=60.0))
    assert noted(node)["status"] == "passed" and noted(node)["examples"] == 6, noted(node)
    # the optional warmup: once per configuration, so a JIT compiles outside --case-timeout
    assert warmed and len(warmed) == len(set(warmed)) and all(w[1:3] == (128, 16) for w in warmed), warmed
    assert search_plan.free_axes(Capabilities(block_sizes={7}))[1] == (
        "the backend claims none of the block sizes [1, 2, 3, 4, 8, 13, 16, 32, 128]"
    )


def test_items_per_profile_each_in_its_own_xdist_group(pytester):
    items, _ = pytester.inline_genitems(
        *SUITE_RUN,
        SEARCH_MODULE,
        REFERENCE,
        "--profile=standard",
        "--search-examples=10",
    )
    assert [i.name for i in items] == [f"test_search[seed{k}]" for k in range(search_plan.ITEMS["standard"])]
    groups = [m.args[0] for i in items for m in i.iter_markers("xdist_group")]
    assert groups == [f"search-seed{k}" for k in range(len(items))]
    assert [i.callspec.params["search_item"].max_examples for i in items] == [3] * len(items)  # 10 shared by 4


def test_items_run_among_the_last_cases_a_stride_apart(pytester):
    """xdist's ``load`` keeps each worker two items ahead: the search's items, each seconds
    long, go among the last cases (``collection.spread_search``) so that no worker queues two."""
    from pagedattn.runner.case_record import noted as facts
    from pagedattn.runner.collection import SEARCH_STRIDE

    for select in ([], ["-k", "search or decode"]):  # spread among what is left after -k
        args = (*SUITE_RUN, SUITE_DIR, REFERENCE, "--profile=standard", "--co", *select)
        rec = pytester.inline_run(*args)
        items = rec.getcalls("pytest_collection_finish")[0].session.items  # in the run's order
        where = [n for n, i in enumerate(items) if i.name.startswith("test_search[")]
        count = search_plan.ITEMS["standard"]
        assert [items[n].name for n in where] == [f"test_search[seed{k}]" for k in range(count)]
        assert where == [len(items) - (count - k) * (SEARCH_STRIDE + 1) for k in range(count)], (select, where)
        # the other items keep the order by configuration (compile key)
        keys = [facts(i).get("configuration", "") for n, i in enumerate(items) if n not in where]
        assert keys == sorted(keys) and len(keys) >= count * SEARCH_STRIDE, (select, len(keys))


@pytest.mark.parametrize(
    "rest, search, expected", [(7, 2, "cccSccScc"), (2, 3, "SSScc"), (3, 3, "SScScc"), (0, 2, "SS"), (4, 0, "cccc")]
)
def test_spread_search_places_each_item_a_stride_before_the_end(rest, search, expected, monkeypatch):
    from pagedattn.runner import collection

    monkeypatch.setattr(collection, "SEARCH_STRIDE", 2)
    cases, found = [f"c{k}" for k in range(rest)], [f"S{k}" for k in range(search)]
    items = cases + found
    collection.spread_search(items, found)  # type: ignore[arg-type]
    assert "".join(i[0] for i in items) == expected
    assert [i for i in items if i[0] == "c"] == cases and [i for i in items if i[0] == "S"] == found
