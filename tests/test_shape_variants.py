"""The shape variants: a value head dim of its own, MLA's shared latent cache, tree masks.

The case's rules and what keeps MLA's view a view (copies, moves, files, the suite's own
rebuilt cases); the oracle against closed forms; decode forms; the strategies; the policy
on the planted MLA and tree bugs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from pagedattn import PagedCase
from pagedattn.cases import CaseSpec, load_case, save_case
from pagedattn.cases.configuration import Configuration
from pagedattn.cases.decode_forms import DecodeFormSpec, decode_form, with_decode_forms
from pagedattn.cases.grid import grid
from pagedattn.cases.spec import random_tree_mask
from pagedattn.cases.strategies import case_specs
from pagedattn.oracle import HEAD_DIM_V, MLA, TREE_MASK, bits_equal, check_attention, paged_attention_reference_lse
from pagedattn.runner.properties import permute_blocks, single_sequence
from pagedattn.validation import ProblemError
from tests.asserts import assert_close
from tests.planted.streamed import streamed_attention

BF16 = torch.bfloat16
MLA_SPEC = CaseSpec(
    "t", ((70, 1), (40, 3)), num_heads=8, num_kv_heads=1, head_dim=40, head_dim_v=32, mla=True, block_size=16
)
TREE_SPEC = CaseSpec("t", ((30, 7), (12, 1), (20, 5)), tree_mask=True)


def _shares_storage(case: PagedCase) -> bool:
    return case.value_cache.untyped_storage().data_ptr() == case.key_cache.untyped_storage().data_ptr()


# ------------------------------------------------------------------ the case
def test_an_mla_case_is_a_view_and_says_so():
    case = MLA_SPEC.build()
    assert case.shared_kv and case.variants == {MLA}, (case.shared_kv, case.variants)
    assert case.head_dim == 40 and case.head_dim_v == 32, (case.head_dim, case.head_dim_v)
    copy = case.replace(value_cache=case.value_cache.clone())  # the same values, not a view
    assert not copy.shared_kv and copy.variants == {HEAD_DIM_V}, copy.variants


@pytest.mark.parametrize(
    "make",
    [
        lambda c: c.clone(),
        lambda c: c.to("cpu"),
        lambda c: c.replace(key_cache=c.key_cache.clone()),
        lambda c: c.with_caches(c.key_cache.clone()),
        lambda c: permute_blocks(c),
        lambda c: single_sequence(c, 1),
    ],
    ids=["clone", "to", "replace", "with_caches", "permute_blocks", "single_sequence"],
)
def test_every_copy_of_an_mla_case_keeps_its_values_a_view_of_its_keys(make):
    case = MLA_SPEC.build()
    new = make(case)
    assert new.shared_kv and _shares_storage(new), f"the copy's values are no longer a view of its keys: {new!r}"


def test_an_mla_case_saved_and_loaded_is_still_a_view(tmp_path):
    case = MLA_SPEC.build()
    save_case(case, tmp_path / "c.pt")
    back, _ = load_case(tmp_path / "c.pt")
    assert back.shared_kv and _shares_storage(back), repr(back)
    assert bits_equal(back.key_cache, case.key_cache), "the latent cache changed on its way through the file"


def test_with_caches_needs_values_unless_they_are_a_view():
    case = TREE_SPEC.build()
    with pytest.raises(ProblemError, match="with_caches.value_cache"):
        case.with_caches(case.key_cache.clone())


def _tree_case(mask: torch.Tensor, **changes) -> PagedCase:
    case = CaseSpec("t", ((10, 4),)).build()
    return case.replace(tree_mask=mask, **changes)


@pytest.mark.parametrize(
    "mask, says",
    [
        (torch.ones(15, dtype=torch.bool), "sum_b q_b * q_b = 16 entries"),
        (torch.eye(4, dtype=torch.bool).reshape(-1).int(), "must be [sum_b q_b * q_b] bool"),
        (torch.eye(4, dtype=torch.bool).reshape(-1).fill_(False), "must have a True diagonal"),
        (torch.ones(4, 4, dtype=torch.bool).reshape(-1), "must be False above the diagonal"),
        (torch.eye(4, dtype=torch.bool), "must be [sum_b q_b * q_b] bool"),
    ],
    ids=["length", "dtype", "diagonal", "above", "rank"],
)
def test_a_tree_mask_breaking_a_rule_is_named_with_its_bound(mask, says):
    with pytest.raises(ProblemError, match="PagedCase.tree_mask") as err:
        _tree_case(mask)
    assert says in str(err.value), f"the message {str(err.value)!r} lacks {says!r}"


@pytest.mark.parametrize("field, value", [("sliding_window", 3), ("alibi_slopes", torch.ones(4))])
def test_a_tree_mask_with_a_window_or_alibi_is_refused(field, value):
    with pytest.raises(ProblemError, match=f"PagedCase.{field}: must be None with a tree_mask"):
        _tree_case(torch.tril(torch.ones(4, 4, dtype=torch.bool)).reshape(-1), **{field: value})


def test_a_value_cache_of_another_block_shape_is_refused():
    case = MLA_SPEC.build()
    with pytest.raises(ProblemError, match=r"PagedCase.value_cache: must have the key_cache's \[num_blocks"):
        case.replace(value_cache=torch.zeros(case.num_blocks, 3, 1, 32, dtype=case.dtype))


def test_random_trees_branch_and_stay_in_topological_order():
    gen = torch.Generator().manual_seed(0)
    masks = [random_tree_mask(8, gen) for _ in range(20)]
    for m in masks:
        assert bool(m.diagonal().all()) and not bool(m.triu(1).any()), m
    chains = sum(bool(torch.equal(m, torch.tril(torch.ones(8, 8, dtype=torch.bool)))) for m in masks)
    assert chains < len(masks) // 2, f"{chains} of {len(masks)} trees are chains: the family would not test trees"


# ---------------------------------------------------------------- the oracle
def test_a_chain_tree_equals_causal_and_a_flat_tree_equals_decodes():
    case = CaseSpec("t", ((30, 6),)).build()
    causal, _ = paged_attention_reference_lse(case)
    chain, _ = paged_attention_reference_lse(case.replace(tree_mask=torch.tril(torch.ones(6, 6)).bool().reshape(-1)))
    assert_close(chain, causal, 0.0, "a chain tree against causal")
    flat, _ = paged_attention_reference_lse(case.replace(tree_mask=torch.eye(6, dtype=torch.bool).reshape(-1)))
    # a token that sees only itself among the new tokens: a decode over the history plus itself
    for i in range(6):
        rows = torch.tensor([i])
        alone = case.replace(
            query=case.query[rows],
            seq_lens=torch.tensor([24 + 1], dtype=torch.int32),
            query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
            key_cache=_moved_key(case, i),
            value_cache=_moved_value(case, i),
        )
        want, _ = paged_attention_reference_lse(alone)
        assert_close(flat[i], want[0], 1e-12, f"flat tree row {i} against its decode")


def _moved(cache: torch.Tensor, case: PagedCase, i: int) -> torch.Tensor:
    """``cache`` with new token ``i``'s row copied to position 24 (the first new token's slot)."""
    out = cache.clone()
    slots = case.slot_mapping(0)
    flat = out.view(-1, *out.shape[2:])
    flat[slots[24]] = cache.reshape(-1, *cache.shape[2:])[slots[24 + i]]
    return out


def _moved_key(case: PagedCase, i: int) -> torch.Tensor:
    return _moved(case.key_cache, case, i)


def _moved_value(case: PagedCase, i: int) -> torch.Tensor:
    return _moved(case.value_cache, case, i)


def test_mla_equals_the_same_problem_over_a_copied_value_cache():
    case = MLA_SPEC.build()
    shared, lse = paged_attention_reference_lse(case)
    copied, lse2 = paged_attention_reference_lse(case.replace(value_cache=case.value_cache.clone()))
    assert_close(shared, copied, 0.0, "MLA's view against a copy of its columns")
    assert shared.shape == (case.num_tokens, 8, 32), shared.shape


# ------------------------------------------------------------- decode forms
def test_tree_cases_have_no_decode_form_and_mla_cases_keep_their_view():
    with pytest.raises(ProblemError, match="DecodeFormSpec.source: must have no tree mask"):
        DecodeFormSpec(TREE_SPEC)
    with pytest.raises(ProblemError, match="decode_form.case: must have no tree_mask"):
        decode_form(TREE_SPEC.build())
    assert [type(s).__name__ for s in with_decode_forms([TREE_SPEC])] == ["CaseSpec"]
    form = DecodeFormSpec(MLA_SPEC).build()
    assert form.shared_kv and max(form.query_lens) == 1, repr(form)


# --------------------------------------------------------------- strategies
MLA_CONFIG = Configuration.of_spec(grid("quick", "mla")[0])


def test_a_configuration_names_the_value_width():
    assert MLA_CONFIG.head_dim_v == 512 and MLA in MLA_CONFIG.variants, MLA_CONFIG
    assert "d576/512" in MLA_CONFIG.key("attention"), MLA_CONFIG.key("attention")


@settings(max_examples=15, deadline=None, database=None)
@given(case_specs("quick", configurations=[MLA_CONFIG]))
def test_a_drawn_case_of_an_mla_configuration_is_mla(spec):
    assert spec.mla and spec.value_width == 512 and spec.variants >= {MLA}, spec.id


@settings(max_examples=25, deadline=None, database=None)
@given(case_specs("quick", variants={TREE_MASK, "sliding_window", "alibi_slopes", "sinks"}))
def test_drawn_tree_masks_build_valid_cases(spec):
    case = spec.build()
    assert (case.tree_mask is not None) == spec.tree_mask, spec.id


# -------------------------------------------------------------- the policy
@pytest.mark.parametrize(
    "spec, bug",
    [
        (grid("quick", "mla")[0], "mla_value_columns"),
        (grid("quick", "mla")[0], "mla_rope_dropped"),
        (grid("quick", "tree_mask")[1], "tree_as_causal"),
    ],
    ids=["mla_value_columns", "mla_rope_dropped", "tree_as_causal"],
)
def test_the_planted_shape_bugs_fail_and_the_correct_kernel_passes(spec, bug):
    case = spec.build()
    good = check_attention(streamed_attention(case, 16), case)
    bad = check_attention(streamed_attention(case, 16, bug=bug), case)
    assert good.passed, f"{spec.id}: the correct streamed kernel fails: {good}"
    assert not bad.passed, f"{spec.id}: the planted {bug} passes: {bad}"
