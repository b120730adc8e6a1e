"""Decode forms: a multi-token case offered to a decode-only backend as the decodes it implies.

The projection (each query row a decode over its own history, the rows kept, the spec), the
oracle's agreement row for row, and the suite: a decode-only backend is judged on every
attention case, directly or through its decode form, and a decode-only bug that every
pure-decode case misses fails on a decode form."""

import json
import os

import pytest
import torch

from pagedattn import Capabilities
from pagedattn.adapters.capabilities import QUERY_OPERATIONS
from pagedattn.cases import CaseSpec, grid
from pagedattn.cases.configuration import Configuration
from pagedattn.cases.decode_forms import MAX_DECODES, DecodeFormSpec, decode_form, decode_rows, with_decode_forms
from pagedattn.oracle import paged_attention_reference_lse
from pagedattn.oracle.reference import iter_chunks
from pagedattn.runner.case_record import OPERATIONS
from pagedattn.runner.session import SUITE_DIR
from pagedattn.validation import ProblemError
from tests.asserts import assert_close, assert_equal
from tests.helpers import import_session_modules, run_inprocess

import_session_modules()  # before the in-process runs below (see its docstring)

#: the relative agreement tests/test_oracle.py holds the oracle to across evaluation orders: the
#: oracle's blocks of rows (``iter_chunks``) sum a row's keys in another order than one row alone
ORACLE_AGREEMENT = 1e-12

QUICK = grid("quick")
#: the quick grid's attention cases with a sequence of several query tokens
MULTI = [
    s for s in QUICK if OPERATIONS.get(s.family, "attention") in QUERY_OPERATIONS and max(q for _, q in s.seqs) > 1
]


def _pick(label, keep):
    return pytest.param(next(s for s in MULTI if keep(s)), id=label)


#: grid cases whose decode forms carry every feature that must survive the projection
PICKS = [
    _pick("window-bs4", lambda s: s.sliding_window is not None and s.block_size == 4),
    _pick("window-mqa-bs13-permuted", lambda s: s.sliding_window is not None and s.block_size == 13),
    _pick("alibi-gqa4", lambda s: s.family == "alibi_slopes" and s.gqa_ratio == 4),
    _pick("alibi-mqa-bs3", lambda s: s.alibi_slopes and s.block_size == 3),
    _pick("sinks", lambda s: s.family == "sinks"),
    _pick("soft-cap-bs8", lambda s: s.logits_soft_cap is not None and s.block_size == 8),
    _pick("fp8-bs13-permuted", lambda s: s.kv_dtype is not None and s.block_size == 13),
    _pick("gqa8", lambda s: s.family == "gqa" and s.gqa_ratio == 8),
    _pick("shared-blocks", lambda s: s.layout == "shared" and s.family == "layout"),
    _pick("interleaved", lambda s: s.layout == "interleaved"),
    _pick("capped-window-sinks", lambda s: sum(q for _, q in s.seqs) > MAX_DECODES and s.sinks),
]


def _oracle_row_by_row(case):
    """The oracle's output and log-sum-exp, one query row per block of rows (a budget too small
    for two): the order in which the oracle evaluates a decode's one row."""
    out = torch.empty(case.num_tokens, case.num_heads, case.head_dim, dtype=torch.float64)
    lse = torch.empty(case.num_tokens, case.num_heads, dtype=torch.float64)
    for c in iter_chunks(case, budget=1):
        assert c.tokens.stop - c.tokens.start == 1, f"a block of {c.tokens} rows, expected one"
        out[c.tokens], lse[c.tokens] = c.output(), c.rows(c.lse)
    return out, lse


# ------------------------------------------------------------------ the rows kept
@pytest.mark.parametrize("query_lens", [[1], [5, 1, 3], [MAX_DECODES], [MAX_DECODES - 1, 1]])
def test_every_row_is_kept_up_to_the_cap(query_lens):
    assert decode_rows(query_lens) == list(range(sum(query_lens)))


@pytest.mark.parametrize("query_lens", [[300], [1, 2000, 7], [65], [40, 40, 1]])
def test_a_long_case_keeps_each_sequences_ends_and_rows_evenly_spaced_up_to_the_cap(query_lens):
    rows = decode_rows(query_lens)
    assert len(rows) == MAX_DECODES and rows == sorted(set(rows)), f"{query_lens}: {rows}"
    start = 0
    for q in query_lens:  # each sequence's shortest and longest history
        assert {start, start + q - 1} <= set(rows), f"sequence rows {start}..{start + q - 1} lost an end: {rows}"
        start += q
    total = sum(query_lens)
    gaps = [b - a for a, b in zip(rows, rows[1:])]
    assert max(gaps) <= 2 * total // MAX_DECODES + 2, f"{query_lens}: rows not evenly spaced, gaps {gaps}"
    assert decode_rows(query_lens) == rows, "the rows must be the same every time"


def test_every_sequence_keeps_its_ends_past_the_cap():
    rows = decode_rows([2] * 40, max_decodes=8)
    assert rows == list(range(80)), f"40 sequences of two rows keep both of each, got {len(rows)} rows"
    with pytest.raises(ProblemError, match=r"decode_rows\.max_decodes: must be >= 1, got 0"):
        decode_rows([3], max_decodes=0)


# ------------------------------------------------------------------ the projection
@pytest.mark.parametrize("spec", PICKS)
def test_a_decode_form_is_each_row_over_its_own_history(spec):
    case = spec.build()
    before = case.clone()
    form = DecodeFormSpec(spec)
    rows = form.rows
    dec = decode_form(case, rows)
    assert dec.query_lens == [1] * len(rows), f"{form.id}: query lens {dec.query_lens}"
    loc = case.query_start_loc_list
    for i, t in enumerate(rows):
        b = max(s for s in range(case.num_seqs) if loc[s] <= t)
        position = case.context_lens[b] + t - loc[b]
        assert dec.seq_lens_list[i] == position + 1, (
            f"{form.id}: decode {i} (row {t}) has {dec.seq_lens_list[i]} tokens"
        )
        assert_equal(dec.block_tables[i], case.block_tables[b], f"{form.id}: decode {i}'s block-table row")
    assert_equal(dec.query, case.query[rows], f"{form.id}: the decodes' queries")
    # the pool, the scales and the variants are the case's own: nothing copied, nothing lost
    assert dec.key_cache is case.key_cache and dec.value_cache is case.value_cache
    assert dec.options() == case.options() and dec.variants == case.variants
    assert dec.alibi_slopes is case.alibi_slopes and dec.sinks is case.sinks
    for name, t in case.tensors().items():
        assert_equal(t, getattr(before, name), f"{form.id}: the case's {name} after its projection", nan_equal=True)


def test_every_row_keeps_the_query_tensor_and_bad_rows_are_refused():
    case = CaseSpec("t", ((20, 20), (9, 3)), block_size=4).build()
    assert decode_form(case).query is case.query and decode_form(case).num_seqs == case.num_tokens
    with pytest.raises(ProblemError, match=r"decode_form\.rows: must be query rows in \[0, 23\)"):
        decode_form(case, [0, 23])
    with pytest.raises(ProblemError, match=r"decode_form\.rows: must be query rows"):
        decode_form(case, [])


@pytest.mark.parametrize("spec", PICKS)
def test_the_oracle_gives_the_decode_form_the_cases_rows(spec):
    form = DecodeFormSpec(spec)
    case, dec = spec.build(), form.build()
    out, lse = paged_attention_reference_lse(dec)
    # bit for bit: the same rows, evaluated one row at a time as a decode's row is (ALiBi's
    # j - p, the window and the causal limit all at the row's absolute position)
    one_out, one_lse = _oracle_row_by_row(case)
    assert_equal(out, one_out[form.rows], f"{form.id}: oracle output against the case's rows")
    assert_equal(lse, one_lse[form.rows], f"{form.id}: oracle lse against the case's rows")
    # and the oracle's own blocked evaluation of the case, up to its summation order
    full_out, full_lse = paged_attention_reference_lse(case)
    scale = float(full_out.abs().max())
    assert_close(out, full_out[form.rows], 0.0, f"{form.id}: output (blocked rows)", atol=ORACLE_AGREEMENT * scale)
    assert_close(lse, full_lse[form.rows], ORACLE_AGREEMENT, f"{form.id}: lse (blocked rows)")


def test_a_slip_in_the_positions_is_not_the_same_problem():
    spec = next(s for s in MULTI if s.alibi_slopes)
    dec, case = DecodeFormSpec(spec).build(), spec.build()
    short = dec.replace(seq_lens=(dec.seq_lens - 1).clamp_min(1))  # each decode one token short (but one)
    rows = DecodeFormSpec(spec).rows
    want = paged_attention_reference_lse(case)[0][rows]
    err = float((paged_attention_reference_lse(short)[0] - want).abs().max() / want.abs().max())
    assert err > 1e-3, f"{spec.id}: decodes one token short agree with the case to {err:.3g}"


# ------------------------------------------------------------------ the spec
def test_a_decode_form_spec_names_its_case_and_says_what_it_kept():
    spec = next(s for s in MULTI if sum(q for _, q in s.seqs) > MAX_DECODES)
    form = DecodeFormSpec(spec)
    assert form.id == f"{spec.id}-as-decode" and form.family == spec.family
    assert Configuration.of_spec(form) == Configuration.of_case(form.build()), "a decode form's compile key"
    built = form.build()
    assert [(s, 1) for s in built.seq_lens_list] == list(form.seqs) and form.max_seq_len == spec.max_seq_len
    assert form.description.startswith(f"the decodes of {spec.id}: {MAX_DECODES} of its ")
    assert "evenly spaced" in form.description and f"at most {MAX_DECODES}" in form.description
    whole = DecodeFormSpec(next(s for s in MULTI if sum(q for _, q in s.seqs) <= MAX_DECODES))
    assert "(every row)" in whole.description, whole.description
    assert_equal(form.build().query, built.query, f"{form.id}: built twice")  # the source's data, seeded by its id
    decode = next(s for s in QUICK if s.family == "decode")
    with pytest.raises(ProblemError, match=r"DecodeFormSpec\.source: must have a sequence of several query tokens"):
        DecodeFormSpec(decode)


def test_each_multi_token_case_is_followed_by_its_decode_form():
    specs = grid("quick", "layout")
    offered = with_decode_forms(specs)
    originals = [s for s in offered if isinstance(s, CaseSpec)]
    assert originals == specs, "every case stays, in its order"
    for i, s in enumerate(offered):
        multi = isinstance(s, CaseSpec) and any(q > 1 for _, q in s.seqs)
        if multi:
            assert offered[i + 1] == DecodeFormSpec(s), f"{s.id} is not followed by its decode form"
    assert len(offered) == len(specs) + sum(any(q > 1 for _, q in s.seqs) for s in specs)


# ------------------------------------------------------------------ the suite
DECODE_ONLY_REFERENCE = """
import dataclasses

from pagedattn.adapters.reference import ReferenceBackend


class DecodeOnlyReference(ReferenceBackend):
    name = "reference-decode-only"
    capabilities = dataclasses.replace(ReferenceBackend.capabilities, decode_only=True)
"""
#: the core attention families: their cases against a decode-only backend, in one run
CORE = ("decode", "prefill", "continuation", "gqa", "layout", "mixed")
STREAMED = os.path.join(os.path.dirname(__file__), "planted", "streamed.py")


def _suite_run(pytester, backend, modules, *args):
    """A quick-profile run in this process over ``modules`` of the suite, with its JSON report."""
    paths = [os.path.join(SUITE_DIR, f"test_{m}.py") for m in modules]
    result = run_inprocess(
        pytester, "-p", "pagedattn.plugin", "-p", "no:cacheprovider", *paths, f"--backend={backend}",
        "--report-json=r.json", *args,
    )  # fmt: skip
    report = json.loads((pytester.path / "r.json").read_text())
    return result, report


def test_a_decode_only_backend_is_judged_on_every_attention_case(pytester):
    pytester.makepyfile(decode_only=DECODE_ONLY_REFERENCE)
    result, report = _suite_run(pytester, "decode_only.py:DecodeOnlyReference", CORE)
    cases = {c["id"]: c for c in report["cases"]}
    specs = [s for f in CORE for s in grid("quick", f)]
    multi = [s for s in specs if any(q > 1 for _, q in s.seqs)]
    assert result.ret == 0 and len(cases) == len(specs) + len(multi), result.stdout.str()[-3000:]
    for s in specs:  # every case judged: itself where it is decodes, its decode form where not
        judged = f"{s.id}-as-decode" if s in multi else s.id
        assert cases[judged]["status"] == "passed", f"{judged}: {cases[judged]['status']} {cases[judged]['reason']}"
        assert cases[judged]["family"] == s.family
    for s in multi:  # and the case itself, still accounted for, is not claimed as such
        assert cases[s.id]["status"] == "unsupported" and cases[s.id]["reason"].startswith("decode-only: ")
        form = cases[f"{s.id}-as-decode"]
        assert form["decode_form_of"] == s.id and form["description"] == DecodeFormSpec(s).description
    judged_before = sum(1 for s in specs if s not in multi)
    assert sum(c["status"] == "passed" for c in cases.values()) == len(specs) > 2 * judged_before
    result.stdout.fnmatch_lines([f"decode forms: {len(multi)} cases of several query tokens per sequence offered as*"])


def test_a_full_backend_is_offered_no_decode_form(pytester):
    _, report = _suite_run(pytester, "pagedattn.adapters.reference:ReferenceBackend", ("layout",), "--collect-only")
    ids = [c["id"] for c in report["cases"]]
    assert ids and not [i for i in ids if i.endswith("-as-decode")], ids


def test_a_decode_only_bug_no_pure_decode_case_shows_fails_on_decode_forms_and_replays(pytester):
    result, report = _suite_run(pytester, f"{STREAMED}:decode_only_contiguous_blocks", ("decode", "layout"))
    failed = [c for c in report["cases"] if c["status"] == "failed"]
    assert result.ret == 1 and failed, "blocks taken as contiguous must fail the layout family's decode forms"
    assert all(c["id"].endswith("-as-decode") for c in failed), [c["id"] for c in failed]
    judged = [c for c in report["cases"] if not c["id"].endswith("-as-decode") and c["status"] != "unsupported"]
    assert judged and all(c["status"] == "passed" for c in judged), "the pure-decode cases miss the bug"
    replay = failed[0]["replay"].split("--replay ")[1].split()[0]
    again, _ = _suite_run(pytester, f"{STREAMED}:decode_only_contiguous_blocks", ("layout",), "--replay", replay)
    again.assert_outcomes(failed=1)


def test_the_properties_reach_a_decode_only_backend_through_decode_forms(pytester):
    pytester.makepyfile(decode_only=DECODE_ONLY_REFERENCE)
    _, report = _suite_run(pytester, "decode_only.py:DecodeOnlyReference", ("properties",), "-k", "mixed")
    forms = [c for c in report["cases"] if c["id"].endswith("-as-decode")]
    props = {c["property"] for c in forms if c["status"] == "passed"}
    assert props >= {"determinism", "batch_invariance", "placement_invariance", "immutability", "poisoned_padding"}
    assert all(c["family"] == "properties" for c in forms)


def test_the_search_judges_a_decode_only_backend_on_decode_forms(tmp_path):
    from pagedattn.adapters.reference import ReferenceBackend
    from pagedattn.runner.search import SearchRun
    from pagedattn.runner.search_plan import SearchItem
    from pagedattn.runner.suite import Suite
    from tests.helpers import searched

    seen = []

    class DecodeOnly(ReferenceBackend):
        capabilities = Capabilities(variants=ReferenceBackend.capabilities.variants, decode_only=True)

        def paged_attention(self, case):
            seen.append(case)
            return super().paged_attention(case)

    suite = Suite(DecodeOnly(), "decode-only", "cpu", "quick", str(tmp_path / "failures"))
    node = type("Node", (), {"user_properties": []})()
    run = SearchRun(suite, node, SearchItem(1, 2, 12), budget_s=float("inf"))
    searched(run)
    assert run.declined == 0 and seen and all(max(c.query_lens) == 1 for c in seen)

    def shares_a_history(case):  # two decodes over one sequence's blocks: a decode form's rows
        rows = [tuple(r) for r in case.block_tables.tolist()]
        return len(set(rows)) < len(rows)

    assert any(shares_a_history(c) for c in seen), "no draw reached the backend as its decode form"
