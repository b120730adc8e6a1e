"""The generators: each family's cases have the property they claim."""

import pytest
import torch
from hypothesis import given, settings

from pagedattn.cases import DTYPES, FAMILIES, PROFILES, CaseSpec, grid, load_case, save_case
from pagedattn.cases.strategies import case_specs
from pagedattn.oracle import FP8_DTYPES, SHAPE_VARIANTS, bits_equal, check_attention, paged_attention_reference

QUICK = grid("quick")


def _used_blocks(case):
    return [case.block_tables[b, : case.num_blocks_used(b)].tolist() for b in range(case.num_seqs)]


def test_quick_covers_every_family_and_dtype():
    for family in FAMILIES:
        dtypes = {s.dtype for s in QUICK if s.family == family}
        assert dtypes == set(DTYPES), f"family {family}: dtypes {dtypes} in the quick profile"


def test_quick_covers_the_edges():
    assert {1, 2, 3, 13, 16, 32, 128} <= {s.block_size for s in QUICK}
    assert {48, 64, 80, 96, 112, 128, 256} <= {s.head_dim for s in QUICK}
    assert {1, 2, 4, 8} <= {s.gqa_ratio for s in QUICK}
    assert any(s.num_kv_heads == 1 for s in QUICK), "MQA missing"
    assert {"permuted", "interleaved", "shared"} <= {s.layout for s in QUICK}
    assert any(s.scale is not None for s in QUICK), "explicit scale missing"


@pytest.mark.parametrize("profile", PROFILES)
def test_profiles_nest_and_ids_are_unique(profile):
    specs = grid(profile)
    ids = [s.id for s in specs]
    assert len(ids) == len(set(ids))
    assert {s.id for s in QUICK} <= set(ids)
    if profile == "thorough":
        assert max(s.max_seq_len for s in specs) >= 32768


def test_ids_read_like_sentences():
    spec = CaseSpec(
        "decode", ((37, 1), (5, 1)), num_heads=8, num_kv_heads=2, head_dim=80, block_size=13, dtype=torch.bfloat16
    )
    assert spec.id == "decode-gqa4-bs13-d80-bf16-L37-B2"


def test_build_is_deterministic():
    for spec in QUICK[::7]:
        a, b = spec.build(), spec.build()
        for f, t in a.tensors().items():
            assert bits_equal(t, b.tensors()[f]), (spec.id, f)  # NaN poison included
        c = spec.build(seed=1)
        assert not torch.equal(a.query, c.query), "another seed must draw other data"


def test_family_claims_hold():
    for spec in QUICK:
        case = spec.build()
        used = _used_blocks(case)
        qlens, lens = case.query_lens, case.seq_lens_list
        if spec.family == "decode":
            assert all(q == 1 for q in qlens), spec.id
        if spec.family == "prefill":
            assert qlens == lens, spec.id
        if spec.family == "continuation":
            assert all(0 < q < s for q, s in zip(qlens, lens)), spec.id
        if spec.family == "mixed":
            kinds = {("d" if q == 1 else "p" if q == s else "c") for q, s in zip(qlens, lens)}
            assert kinds == {"d", "p", "c"}, spec.id
        if spec.layout == "permuted":
            flat = [x for row in used for x in row]
            assert flat != sorted(flat), f"{spec.id}: physical order equals logical order"
        if spec.layout == "shared":
            rows = [set(r) for r in used]
            assert rows[0] & rows[1], f"{spec.id}: no block id appears in two rows"
        if spec.layout == "interleaved":
            assert used[0][1] - used[0][0] > 1, f"{spec.id}: sequences do not alternate blocks"
        if spec.tag == "boundary":
            assert all(s % case.block_size == 0 for s in lens), spec.id
        if spec.tag == "boundary+1":
            assert all(s % case.block_size == 1 for s in lens), spec.id


#: the variants as kernels combine them: either fp8 format is "fp8"
_KINDS = {
    "sliding_window": "sliding_window",
    "logits_soft_cap": "logits_soft_cap",
    "alibi_slopes": "alibi_slopes",
    "sinks": "sinks",
    **{name: "fp8" for name in FP8_DTYPES.values()},
    "fp8_per_head_scales": "fp8",
}
#: the shape variants' pairs that engines run (docs/variants.md says which are not combined)
_SHAPE_PAIRS = {("mla", "fp8"), ("tree_mask", "logits_soft_cap"), ("tree_mask", "sinks"), ("tree_mask", "fp8")}


def test_quick_covers_every_pair_of_variants_alone():
    """A backend that claims exactly two variants runs at least one case of that pair
    (vLLM's prefix_prefill drops the window under ALiBi, which no single-variant case shows);
    the shape variants, with each variant engines combine them with."""
    kinds = sorted(set(_KINDS.values()))
    pairs = {frozenset({a, b}) for i, a in enumerate(kinds) for b in kinds[i + 1 :]}
    pairs |= {frozenset(p) for p in _SHAPE_PAIRS}
    kind = {**_KINDS, **{v: v for v in SHAPE_VARIANTS}}
    seen = {frozenset(kind[v] for v in s.build().variants) for s in QUICK}
    missing = sorted(sorted(p) for p in pairs - seen)
    assert not missing, f"no quick case uses exactly these variant pairs: {missing}"


def _window_dropped_under_alibi(case):
    """A planted bug (vLLM prefix_prefill's): the sliding window is ignored when ALiBi is on;
    otherwise the oracle, rounded to the output dtype."""
    run = case.replace(sliding_window=None) if case.alibi_slopes is not None else case
    return paged_attention_reference(run).to(case.dtype)


def test_alibi_with_a_window_catches_a_kernel_that_drops_the_window_under_alibi():
    """The planted backend fails the combined family's ALiBi+window case (by far) and passes
    every other case of the family: the case, not luck, catches it."""
    failed, passed = {}, []
    for spec in grid("quick", "combined"):
        case = spec.build()
        check = check_attention(_window_dropped_under_alibi(case), case)
        if check.passed:
            passed.append(spec.id)
        else:
            failed[spec.id] = check.budget_used
    want = {s.id for s in grid("quick", "combined") if s.alibi_slopes and s.sliding_window is not None}
    assert want and set(failed) == want, f"failed {failed}, expected exactly {sorted(want)}; passed {passed}"
    # far beyond the warning band: no tolerance change could hide it
    assert min(failed.values()) > 100, failed


def test_poison_is_where_nothing_may_read():
    for spec in QUICK:
        case = spec.build()
        used = {x for row in _used_blocks(case) for x in row}
        pad = {int(x) for b in range(case.num_seqs) for x in case.block_tables[b, case.num_blocks_used(b) :]}
        assert pad and not (pad & used), f"{spec.id}: padding entries must point at unused blocks"
        for blk in pad:
            assert torch.isnan(case.key_cache[blk].float()).all() and torch.isnan(case.value_cache[blk].float()).all()
        for b, s in enumerate(case.seq_lens_list):
            if s % case.block_size:
                last = int(case.block_tables[b, case.num_blocks_used(b) - 1])
                assert torch.isnan(case.key_cache[last, s % case.block_size :].float()).all(), spec.id
        assert torch.isfinite(paged_attention_reference(case)).all(), spec.id


def test_save_and_load_round_trip(tmp_path):
    spec = QUICK[0]
    case = spec.build()
    save_case(case, tmp_path / "c.pt", id=spec.id, family=spec.family)
    back, meta = load_case(tmp_path / "c.pt")
    assert meta == {"id": spec.id, "family": spec.family}
    assert back.scale == case.scale
    for f in ("query", "key_cache", "value_cache", "block_tables", "seq_lens", "query_start_loc"):
        x, y = getattr(back, f), getattr(case, f)
        assert x.dtype == y.dtype and torch.equal(x.view(-1).view(torch.uint8), y.view(-1).view(torch.uint8)), f


def test_load_rejects_other_files(tmp_path):
    torch.save({"x": 1}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="not a saved pagedattn case"):
        load_case(tmp_path / "x.pt")


@settings(max_examples=30, deadline=None, derandomize=True)
@given(case_specs("quick"))
def test_strategy_draws_valid_cases(spec):
    case = spec.build()
    assert case.num_seqs == len(spec.seqs)
    assert torch.isfinite(paged_attention_reference(case)).all()


@pytest.mark.parametrize(
    "kwargs, field, text",
    [
        (dict(kv_dtype=torch.float16), "kv_dtype", "must be an fp8 dtype or None, got torch.float16"),
        (dict(layout="zigzag"), "layout", "must be one of"),
        (dict(layout="shared"), "shared_blocks", "must be >= 1 with two sequences"),
        (
            dict(seqs=((20, 1), (9, 1)), block_size=4, layout="shared", shared_blocks=3),
            "shared_blocks",
            "must be <= the 2 full blocks both sequences have, got 3",
        ),
    ],
)
def test_a_bad_spec_names_field_and_bound(kwargs, field, text):
    """The same template as the problem's rules: ``CaseSpec.field: must ..., got ...``."""
    kwargs = {"family": "t", "seqs": ((8, 1),), **kwargs}
    with pytest.raises(ValueError) as info:
        CaseSpec(**kwargs)
    msg = str(info.value)
    assert msg.startswith(f"CaseSpec.{field}: ") and text in msg, msg
