"""``Capabilities`` as data: every limit makes exactly the cases it names unsupported,
with its reason, and the report (``describe``, ``limit_lines``) says so."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pagedattn import INVARIANCES, Capabilities, Exclusion
from pagedattn.adapters import protocol
from pagedattn.cases.spec import CaseSpec
from pagedattn.oracle import VARIANTS, PagedCase, ProblemError

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
ALL = frozenset(VARIANTS)

# A small pool that varies every axis a limit can name: query lengths (decode, prefill,
# mixed), scale, dtype, fp8 cache, each variant and pairs of them, block size, head dim,
# GQA ratio. Tiny shapes: building all of them takes milliseconds.
_SPECS = [
    CaseSpec("p", ((5, 1),)),
    CaseSpec("p", ((5, 1), (9, 1)), dtype=torch.float16, block_size=4),
    CaseSpec("p", ((6, 6),), dtype=torch.bfloat16, head_dim=32),
    CaseSpec("p", ((7, 3), (4, 1)), num_heads=8, num_kv_heads=1),
    CaseSpec("p", ((9, 1),), num_heads=8, num_kv_heads=1, block_size=4),
    CaseSpec("p", ((5, 1),), scale=1.0),
    CaseSpec("p", ((5, 2),), scale=0.5, block_size=1),
    CaseSpec("p", ((5, 1),), head_dim=16, scale=1 / math.sqrt(16), tag="explicit"),
    CaseSpec("p", ((8, 1),), sliding_window=3),
    CaseSpec("p", ((8, 8),), logits_soft_cap=5.0, dtype=torch.bfloat16),
    CaseSpec("p", ((8, 1),), alibi_slopes=True, sliding_window=4),
    CaseSpec("p", ((8, 2),), alibi_slopes=True, sinks=True, dtype=torch.float16),
    CaseSpec("p", ((8, 1),), sinks=True, logits_soft_cap=5.0),
    CaseSpec("p", ((8, 1),), sinks=True, sliding_window=2, block_size=4),
    CaseSpec("p", ((8, 1),), kv_dtype=E4M3, dtype=torch.bfloat16, k_scale=0.5),
    CaseSpec("p", ((8, 4),), kv_dtype=E5M2, dtype=torch.float16, alibi_slopes=True),
    CaseSpec("p", ((8, 1),), kv_dtype=E4M3, sliding_window=3, num_heads=4, num_kv_heads=4),
]
POOL: dict[str, PagedCase] = {s.id: s.build() for s in _SPECS}
assert len(POOL) == len(_SPECS), "pool ids must be unique"


def unsupported(caps: Capabilities, operation: str = "attention") -> dict[str, str]:
    """``{case id: reason}`` of every pool case ``caps`` does not claim."""
    return {i: r for i, c in POOL.items() if (r := caps.case_reason(c, operation)) is not None}


def ids_where(pred) -> set[str]:
    return {i for i, c in POOL.items() if pred(c)}


def test_pool_spans_the_axes():
    """The pool must hold both sides of every limit tested here, or a test proves nothing."""
    for name, pred in {
        "multi-token": lambda c: max(c.query_lens) > 1,
        "non-default scale": lambda c: abs(c.scale * math.sqrt(c.head_dim) - 1) > 1e-9,
        "fp8": lambda c: c.kv_dtype != c.dtype,
        "alibi+window": lambda c: {"alibi_slopes", "sliding_window"} <= c.variants,
        "gqa 8": lambda c: c.gqa_ratio == 8,
    }.items():
        hit = ids_where(pred)
        assert hit and hit != set(POOL), f"the pool has no case on one side of '{name}': {sorted(hit)}"


def test_the_default_claims_every_core_case():
    caps = Capabilities(variants=ALL)
    assert unsupported(caps) == {}, "Capabilities(variants=all) must claim every valid attention case"
    assert caps.invariances == INVARIANCES
    assert all(caps.invariance_reason(n) is None for n in INVARIANCES)
    assert caps.limit_lines() == [], f"the default has no limits, got {caps.limit_lines()}"
    assert caps.qk_precision == "fp32" and not caps.decode_only and not caps.default_scale_only
    assert caps.tanh_precision == "ieee"


# ------------------------------------------------------------------ decode-only, scale
def test_decode_only_makes_exactly_the_multi_token_cases_unsupported():
    caps = Capabilities(variants=ALL, decode_only=True, notes={"decode_only": "split-K decode kernel"})
    got = unsupported(caps)
    assert set(got) == ids_where(lambda c: max(c.query_lens) > 1)
    for i, reason in got.items():
        q = max(POOL[i].query_lens)
        assert reason.startswith("decode-only: ") and f"has {q} query tokens" in reason, f"{i}: {reason}"
        assert reason.endswith("(split-K decode kernel)"), f"{i}: the note is missing from {reason!r}"


def test_decode_only_narrows_only_the_operations_that_read_the_query():
    operations = frozenset({"attention", "lse", "gather", "write_cache"})
    caps = Capabilities(operations=operations, variants=ALL, decode_only=True)
    multi = ids_where(lambda c: max(c.query_lens) > 1)
    assert set(unsupported(caps, "lse")) == multi, "lse reads the query: decode-only narrows it"
    for operation in ("gather", "write_cache"):  # they read the cache alone
        assert not unsupported(caps, operation), f"decode_only narrows {operation}: {unsupported(caps, operation)}"


def test_default_scale_only_makes_exactly_the_other_scales_unsupported():
    caps = Capabilities(variants=ALL, default_scale_only=True)
    got = unsupported(caps)
    # 1/sqrt(16) written explicitly is the default scale; 1.0 and 0.5 are not
    assert set(got) == ids_where(lambda c: c.scale in (1.0, 0.5))
    assert all(r.startswith("default scale only: scale ") and "head_dim ** -0.5" in r for r in got.values()), got


# ------------------------------------------------------------------------ exclusions
EXCLUSION_CASES = {
    "variant pair": (
        Exclusion("ALiBi path has no window", variants=frozenset({"alibi_slopes", "sliding_window"})),
        lambda c: {"alibi_slopes", "sliding_window"} <= c.variants,
    ),
    "one variant": (Exclusion("no sinks", variants=frozenset({"sinks"})), lambda c: "sinks" in c.variants),
    "dtype": (Exclusion("no fp16", dtypes=frozenset({torch.float16})), lambda c: c.dtype == torch.float16),
    "fp8 only with bf16": (
        Exclusion(
            "fp8 KV only with bf16 queries",
            kv_dtypes=frozenset({E4M3, E5M2}),
            dtypes=frozenset({torch.float32, torch.float16}),
        ),
        lambda c: c.kv_dtype in (E4M3, E5M2) and c.dtype != torch.bfloat16,
    ),
    "block size set": (Exclusion("no bs 1", block_sizes=frozenset({1})), lambda c: c.block_size == 1),
    "block size rule under GQA": (
        Exclusion("block_size >= 16 under GQA 8", gqa_ratios={8}, block_sizes=lambda b: b < 16),
        lambda c: c.gqa_ratio == 8 and c.block_size < 16,
    ),
    "head dim": (Exclusion("no d32", head_dims=(32,)), lambda c: c.head_dim == 32),
    "gqa ratio predicate": (Exclusion("MHA only", gqa_ratios=lambda r: r > 1), lambda c: c.gqa_ratio > 1),
    "multi-token": (Exclusion("no prefill", multi_token=True), lambda c: max(c.query_lens) > 1),
    "pure decode with soft-cap": (
        Exclusion("soft-cap on the prefill path only", multi_token=False, variants=frozenset({"logits_soft_cap"})),
        lambda c: max(c.query_lens) == 1 and "logits_soft_cap" in c.variants,
    ),
}


@pytest.mark.parametrize("name", EXCLUSION_CASES)
def test_an_exclusion_makes_exactly_the_matching_cases_unsupported(name):
    ex, pred = EXCLUSION_CASES[name]
    caps = Capabilities(variants=ALL, exclusions=(ex,))
    got = unsupported(caps)
    want = ids_where(pred)
    assert want, f"{name}: no pool case matches, the test would prove nothing"
    assert set(got) == want, f"{name}: excluded {sorted(got)}, expected {sorted(want)}"
    assert all(r.startswith("excluded (") and r.endswith(f"): {ex.reason}") for r in got.values()), got
    assert any(f"excludes {ex.match_text()}: {ex.reason}" == line for line in caps.limit_lines())


def test_an_exclusion_matches_its_operations_only():
    ex = Exclusion("lse not with sinks", variants=frozenset({"sinks"}), operations=frozenset({"lse"}))
    caps = Capabilities(variants=ALL, operations=frozenset({"attention", "lse"}), exclusions=(ex,))
    assert unsupported(caps, "attention") == {}
    assert set(unsupported(caps, "lse")) == ids_where(lambda c: "sinks" in c.variants)


def test_exclusions_apply_after_the_per_field_claims_and_the_first_match_wins():
    first = Exclusion("first", variants=frozenset({"alibi_slopes"}))
    second = Exclusion("second", variants=frozenset({"alibi_slopes", "sliding_window"}))
    caps = Capabilities(variants=ALL - {"sinks"}, exclusions=(first, second))
    got = unsupported(caps)
    for i, reason in got.items():
        if "sinks" in POOL[i].variants:
            assert reason.startswith("variant sinks not claimed"), f"{i}: {reason}"
        else:
            assert reason.endswith(": first"), f"{i}: {reason}"


# ------------------------------------------------------------------------ case filter
def test_the_case_filter_sees_case_and_operation_and_decides_exactly():
    seen = []

    def two_sequences(case: PagedCase, operation: str) -> str | None:
        """no batches of two"""
        seen.append(operation)
        return "two sequences" if case.num_seqs == 2 else None

    caps = Capabilities(variants=ALL, case_filter=two_sequences, notes={"case_filter": "launch grid rule"})
    got = unsupported(caps)
    assert set(got) == ids_where(lambda c: c.num_seqs == 2)
    assert all(r == "case_filter: two sequences (launch grid rule)" for r in got.values()), got
    assert seen == ["attention"] * len(POOL)
    assert "case filter: no batches of two (launch grid rule)" in caps.limit_lines()
    assert caps.describe()["case_filter"] == "no batches of two"


def test_the_case_filter_runs_only_for_otherwise_claimed_cases():
    calls = []
    caps = Capabilities(decode_only=True, case_filter=lambda c, op: calls.append(c) or None)
    unsupported(caps)
    assert len(calls) == len(ids_where(lambda c: not c.variants and max(c.query_lens) == 1))


def test_a_case_filter_returning_a_non_string_is_an_error():
    caps = Capabilities(case_filter=lambda c, op: True)
    with pytest.raises(TypeError, match=r"Capabilities\.case_filter: must return a reason \(str\) or None, got bool"):
        caps.case_reason(next(iter(POOL.values())))


# ------------------------------------------------------------------------ invariances
def test_an_unclaimed_invariance_carries_its_note():
    caps = Capabilities(
        invariances=INVARIANCES - {"batch_invariance"},
        notes={"batch_invariance": "the launch depends on the batch"},
    )
    assert caps.invariance_reason("batch_invariance") == (
        "invariance 'batch_invariance' not claimed (the launch depends on the batch)"
    )
    assert caps.invariance_reason("determinism") is None and caps.invariance_reason("placement_invariance") is None
    assert caps.limit_lines() == ["invariance 'batch_invariance' not claimed (the launch depends on the batch)"]
    assert caps.describe()["invariances"] == ["determinism", "placement_invariance"]
    # an invariance is a property of the backend, not of a case: every family case still runs
    assert unsupported(Capabilities(variants=ALL, invariances=caps.invariances, notes=caps.notes)) == {}


def test_invariances_accept_any_set_and_freeze_it():
    caps = Capabilities(invariances={"determinism"}, notes={"batch_invariance": "a", "placement_invariance": "b"})
    assert caps.invariances == frozenset({"determinism"}) and isinstance(caps.invariances, frozenset)


def test_an_unknown_invariance_name_is_an_error():
    with pytest.raises(ValueError, match=r"invariance_reason\.name: must be one of .*, got 'immutability'"):
        Capabilities().invariance_reason("immutability")


# ------------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(invariances=frozenset({"immutability"})),
            r"Capabilities\.invariances: must be among .*, got unknown \['immutability'\]",
        ),
        (dict(invariances="determinism"), r"Capabilities\.invariances: must be a set"),
        (
            dict(invariances=frozenset()),
            r"Capabilities\.notes: must say why each unclaimed invariance is not, got no notes\['batch_invariance'\]",
        ),
        (dict(decode_only=1), r"Capabilities\.decode_only: must be True or False, got 1"),
        (dict(default_scale_only="yes"), r"Capabilities\.default_scale_only: must be True or False"),
        (
            dict(qk_precision="bf16"),
            r"Capabilities\.qk_precision: must be 'fp32', 'scaled_query' or 'input', got 'bf16'",
        ),
        (dict(tanh_precision="fast"), r"Capabilities\.tanh_precision: must be 'ieee' or 'approx', got 'fast'"),
        (
            dict(exclusions=Exclusion("x", dtypes=frozenset({torch.float16}))),
            r"Capabilities\.exclusions: must be a tuple of Exclusion",
        ),
        (dict(exclusions=({"variants": {"sinks"}},)), r"Capabilities\.exclusions\[0\]: must be an Exclusion, got dict"),
        (dict(case_filter="sinks"), r"Capabilities\.case_filter: must be None or a callable"),
        (dict(block_sizes=[16, "32"]), r"Capabilities\.block_sizes: must hold ints only, got \[\'32\'\]"),
        (dict(head_dims=64), r"Capabilities\.head_dims: must be None, a collection of ints or a predicate"),
    ],
)
def test_capabilities_reject_a_bad_field_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Capabilities(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(reason="", variants={"sinks"}), r"Exclusion\.reason: must be a non-empty string"),
        (dict(reason="x"), r"Exclusion\('x'\): must give at least one field to match"),
        (dict(reason="x", variants={"paged"}), r"Exclusion\.variants: must be among .*, got unknown \['paged'\]"),
        (dict(reason="x", operations={"decode"}), r"Exclusion\.operations: must be among .*, got unknown \['decode'\]"),
        (dict(reason="x", dtypes={"bf16"}), r"Exclusion\.dtypes: must hold torch\.dtype entries only"),
        (
            dict(reason="x", block_sizes=()),
            r"Exclusion\.block_sizes: must be None or non-empty.*got an empty collection",
        ),
        (dict(reason="x", gqa_ratios=[1.5]), r"Exclusion\.gqa_ratios: must hold ints only, got \[1\.5\]"),
        (dict(reason="x", multi_token=1), r"Exclusion\.multi_token: must be True, False or None"),
        (dict(reason="x", variants="sinks"), r"Exclusion\.variants: must be a set"),
    ],
)
def test_exclusions_reject_a_bad_field_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Exclusion(**kwargs)


def test_a_range_is_a_spec_and_is_not_walked():
    caps = Capabilities(block_sizes=range(16, 2**40, 16), exclusions=(Exclusion("x", head_dims=range(1, 2**40)),))
    case = POOL[_SPECS[0].id]  # block_size 16, head_dim 64
    assert caps.case_reason(case) == "excluded (head_dims range(1, 1099511627776)): x"
    assert caps.describe()["block_sizes"] == "range(16, 1099511627776, 16)"
    assert caps.limit_lines()[0] == "block_sizes: range(16, 1099511627776, 16) only"


def test_an_exclusion_freezes_its_sets():
    ex = Exclusion("x", variants=["sinks", "alibi_slopes"], dtypes={torch.float16})
    assert ex.variants == frozenset({"sinks", "alibi_slopes"}) and isinstance(ex.dtypes, frozenset)


# ---------------------------------------------------------------------------- report
def test_describe_and_limit_lines_report_every_limit():
    def even(r: int) -> bool:
        """even GQA ratios"""
        return r % 2 == 0

    caps = Capabilities(
        dtypes=frozenset({torch.bfloat16}),
        block_sizes=frozenset({16, 32}),
        devices=frozenset({"cuda"}),
        invariances=frozenset({"determinism"}),
        decode_only=True,
        default_scale_only=True,
        exclusions=(
            Exclusion("sinks only on the plain path", variants=frozenset({"sinks", "logits_soft_cap"})),
            Exclusion(
                "needs bs 16 under even GQA",
                gqa_ratios=even,
                block_sizes=lambda b: b < 16,
                kv_dtypes=frozenset({E4M3}),
                multi_token=False,
            ),
        ),
        case_filter=lambda c, op: None,
        qk_precision="input",
        tanh_precision="approx",
        notes={
            "batch_invariance": "routing by batch",
            "placement_invariance": "reduction in slot order",
            "decode_only": "one token per row",
            "default_scale_only": "fixed 1/sqrt(D)",
            "qk_precision": "bf16 products",
            "tanh_precision": "tanh.approx.f32",
        },
    )
    lines = caps.limit_lines()
    assert lines == [
        "dtypes: bfloat16 only",
        "block_sizes: 16, 32 only",
        "devices: cuda only",
        "invariance 'batch_invariance' not claimed (routing by batch)",
        "invariance 'placement_invariance' not claimed (reduction in slot order)",
        "decode-only: one query token per sequence (one token per row)",
        "default scale only: scale = head_dim ** -0.5 (fixed 1/sqrt(D))",
        "excludes variants logits_soft_cap+sinks: sinks only on the plain path",
        "excludes kv_dtypes float8_e4m3fn, block_sizes <lambda>, gqa_ratios even GQA ratios, pure decode batches: "
        "needs bs 16 under even GQA",
        "case filter: <lambda>",
        "q·k precision: products rounded to the input dtype, summed in fp32, the score rounded once "
        "(qk_precision 'input') (bf16 products)",
        "soft-cap tanh: approximate, tanh.approx.f32 and an approximate 1/cap (tanh_precision 'approx') "
        "(tanh.approx.f32)",
    ], lines
    d = caps.describe()
    json.dumps(d)  # JSON-ready
    assert d["qk_precision"] == "input" and d["decode_only"] and d["default_scale_only"]
    assert d["tanh_precision"] == "approx", d
    assert d["invariances"] == ["determinism"]
    assert d["exclusions"][0] == {"reason": "sinks only on the plain path", "variants": ["logits_soft_cap", "sinks"]}
    assert d["exclusions"][1]["gqa_ratios"] == "even GQA ratios" and d["exclusions"][1]["multi_token"] is False
    assert d["case_filter"] == "<lambda>"


def test_exports():
    import pagedattn

    assert pagedattn.Exclusion is protocol.Exclusion and pagedattn.INVARIANCES is protocol.INVARIANCES
    assert {"Exclusion", "INVARIANCES"} <= set(pagedattn.__all__)


@pytest.mark.parametrize("factor", [0.0, -1.0, float("inf"), float("nan")])
def test_a_tolerance_factor_must_be_positive_and_finite(factor):
    """An infinite factor makes every bound infinite, which judges nothing (the check fails such
    elements): refused when the claims are made, naming the field and the bound."""
    with pytest.raises(ProblemError, match=r"tolerance_factor.*> 0 and finite"):
        Capabilities(tolerance_factor=factor)
