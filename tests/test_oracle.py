"""The float64 oracle against an independent naive loop, closed forms and SDPA."""

import math

import pytest
import torch
import torch.nn.functional as F

from pagedattn import PagedCase, paged_attention_reference, paged_gather
from pagedattn.cases import CaseSpec, grid
from pagedattn.cases.grid import VARIANT_FAMILIES
from pagedattn.oracle import VARIANTS, paged_attention_reference_lse
from tests.asserts import assert_differs, assert_equal
from tests.helpers import make_case, naive_attention


def _rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


MIXED = [
    # decode + continuation + full prefill in one batch, MQA, block size 1 and 3, d80, shared
    CaseSpec("t", ((9, 1), (12, 5), (7, 7)), num_heads=4, num_kv_heads=1, head_dim=80, block_size=3),
    CaseSpec("t", ((5, 1), (6, 6), (11, 4)), num_heads=6, num_kv_heads=2, head_dim=16, block_size=1),
    CaseSpec("t", ((13, 2), (10, 10)), num_heads=4, num_kv_heads=4, head_dim=8, block_size=3, layout="permuted"),
    CaseSpec(
        "t", ((16, 1), (13, 3)), num_heads=2, num_kv_heads=2, head_dim=8, block_size=4, layout="shared", shared_blocks=3
    ),
    CaseSpec(
        "t",
        ((14, 3), (9, 9), (3, 1)),
        num_heads=8,
        num_kv_heads=2,
        head_dim=80,
        block_size=3,
        layout="interleaved",
        scale=0.37,
    ),
]


@pytest.mark.parametrize("spec", MIXED, ids=lambda s: s.id)
def test_oracle_matches_naive_loop(spec):
    case = spec.build()
    case = case.replace(
        query=case.query.double(), key_cache=case.key_cache.double(), value_cache=case.value_cache.double()
    )
    ref = paged_attention_reference(case)
    assert ref.dtype == torch.float64 and ref.shape == (case.num_tokens, case.num_heads, case.head_dim)
    err = _rel_err(ref, naive_attention(case))
    assert err < 1e-12, f"{spec.id}: oracle and naive loop differ by {err:.3g} relative (bound 1e-12)"


def test_two_equal_scores_give_mean_of_values():
    case = make_case([(2, 1)], num_heads=1, num_kv_heads=1, head_dim=2, block_size=2)
    k = case.key_cache.clone()
    k[0, 0, 0] = torch.tensor([1.0, 2.0], dtype=torch.float64)
    k[0, 1, 0] = torch.tensor([1.0, 2.0], dtype=torch.float64)
    v = case.value_cache.clone()
    v[0, 0, 0] = torch.tensor([3.0, -1.0], dtype=torch.float64)
    v[0, 1, 0] = torch.tensor([5.0, 7.0], dtype=torch.float64)
    out = paged_attention_reference(case.replace(key_cache=k, value_cache=v))
    assert out[0, 0].tolist() == pytest.approx([4.0, 3.0], rel=1e-15)


def test_known_two_key_softmax():
    # scores 0 and log(3) (after scale): weights 1/4, 3/4
    case = make_case([(2, 1)], num_heads=1, num_kv_heads=1, head_dim=1, block_size=1, scale=1.0)
    q = torch.ones_like(case.query)
    k = case.key_cache.clone()
    k[0, 0, 0, 0], k[1, 0, 0, 0] = 0.0, math.log(3.0)
    v = case.value_cache.clone()
    v[0, 0, 0, 0], v[1, 0, 0, 0] = 8.0, 4.0
    out = paged_attention_reference(case.replace(query=q, key_cache=k, value_cache=v))
    assert float(out[0, 0, 0]) == pytest.approx(0.25 * 8 + 0.75 * 4, rel=1e-15)


def test_first_prefill_token_sees_only_itself():
    case = make_case([(4, 4)], num_heads=1, num_kv_heads=1, head_dim=3, block_size=2)
    out = paged_attention_reference(case)
    assert_equal(out[0, 0], case.value_cache[0, 0, 0], "the output of the one visible key")


def test_matches_sdpa_float64_on_contiguous_history():
    case = make_case([(11, 11), (9, 4), (6, 1)], num_heads=4, num_kv_heads=2, head_dim=8, block_size=3, scale=0.4)
    ref = paged_attention_reference(case)
    loc = case.query_start_loc.tolist()
    for b, L in enumerate(case.seq_lens.tolist()):
        slots = case.slot_mapping(b)
        k = paged_gather(case.key_cache, slots).repeat_interleave(2, 1).transpose(0, 1)
        v = paged_gather(case.value_cache, slots).repeat_interleave(2, 1).transpose(0, 1)
        q = case.query[loc[b] : loc[b + 1]].transpose(0, 1)
        qn = q.shape[1]
        mask = torch.arange(L)[None, :] <= torch.arange(L - qn, L)[:, None]
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.4).transpose(0, 1)
        err = _rel_err(ref[loc[b] : loc[b + 1]], want)
        assert err < 1e-12, f"sequence {b}: oracle vs float64 SDPA differ by {err:.3g}"


def test_block_permutation_changes_nothing():
    spec = CaseSpec("t", ((20, 3), (13, 13)), head_dim=8, block_size=3, poison=False)
    case = spec.build()
    perm = torch.randperm(case.num_blocks, generator=torch.Generator().manual_seed(1))
    inv = torch.argsort(perm)
    moved = case.replace(
        key_cache=case.key_cache[perm],
        value_cache=case.value_cache[perm],
        block_tables=inv[case.block_tables.long()].to(torch.int32),
    )
    assert_equal(paged_attention_reference(case), paged_attention_reference(moved), "the reference after the move")


def test_poison_in_padding_and_tail_is_never_read():
    spec = CaseSpec("t", ((7, 2), (5, 1)), head_dim=8, block_size=3, layout="permuted", poison=True)
    case = spec.build()
    assert torch.isnan(case.key_cache).any(), "the spec must poison something"
    out = paged_attention_reference(case)
    assert torch.isfinite(out).all(), "oracle read a poisoned slot"


def test_inputs_are_not_modified():
    case = CaseSpec("t", ((9, 3),), head_dim=8, block_size=4).build()
    before = case.clone()
    paged_attention_reference(case)
    for f in ("query", "key_cache", "value_cache", "block_tables", "seq_lens", "query_start_loc"):
        assert torch.equal(getattr(case, f).nan_to_num(7.0), getattr(before, f).nan_to_num(7.0)), f


def test_gather_is_pool_indexing():
    pool = torch.randn(5, 3, 2, 4)
    slots = torch.tensor([14, 0, 7, 7, 3])
    assert_equal(paged_gather(pool, slots), pool.reshape(15, 2, 4)[slots], "paged_gather")


def test_long_prefill_is_chunked_and_agrees(monkeypatch):
    # a 1 MiB cap splits 300 rows x 300 keys x 2 heads into many blocks of rows, each over
    # only the keys its rows see: the chunking must not change the answer
    from pagedattn.oracle import reference

    case = CaseSpec("t", ((300, 300),), num_heads=2, num_kv_heads=1, head_dim=8, block_size=16).build()
    whole = paged_attention_reference(case)
    monkeypatch.setenv(reference.MAX_BYTES_ENV, str(1 << 20))
    assert len(list(reference.iter_chunks(case, live=300))) > 1
    chunked = torch.cat([c.output() for c in reference.iter_chunks(case, live=300)])
    assert _rel_err(chunked, whole) < 1e-14
    assert _rel_err(paged_attention_reference(case), whole) < 1e-14


def test_memory_cap_is_validated(monkeypatch):
    from pagedattn.oracle import reference

    monkeypatch.setenv(reference.MAX_BYTES_ENV, "lots")
    with pytest.raises(ValueError, match="os.environ.PAGEDATTN_ORACLE_MAX_BYTES: must be a number of bytes"):
        reference.max_bytes()
    monkeypatch.setenv(reference.MAX_BYTES_ENV, "1000")
    with pytest.raises(ValueError, match="at least 1 MiB"):
        reference.max_bytes()


def test_a_window_computes_only_the_keys_it_sees():
    # 600 rows of a prefill under a 16-key window: each block of rows spans at most
    # its rows plus the window, never the whole history
    from pagedattn.oracle import reference

    case = CaseSpec("t", ((600, 600),), num_heads=2, num_kv_heads=1, head_dim=8, block_size=16).build()
    case = case.replace(sliding_window=16)
    chunks = list(reference.iter_chunks(case))
    assert [c.tokens.start for c in chunks][0] == 0 and chunks[-1].tokens.stop == 600
    for c in chunks:
        rows = c.tokens.stop - c.tokens.start
        span = c.keys.stop - c.keys.start
        assert span <= 16 + rows - 1 and c.keys.stop == c.tokens.stop, (
            f"rows {c.tokens} computed keys {c.keys}: more than the window of 16 plus the rows"
        )
    f64 = _f64(case)
    err = _rel_err(paged_attention_reference(f64), naive_attention(f64))
    assert err < 1e-12, f"windowed oracle and naive loop differ by {err:.3g} relative (bound 1e-12)"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_oracle_on_cuda_matches_cpu():
    case = MIXED[0].build()
    assert _rel_err(paged_attention_reference(case.to("cuda")).cpu(), paged_attention_reference(case)) < 1e-12


def test_case_type_is_exported():
    assert PagedCase.__module__ == "pagedattn.oracle.case"


# --------------------------------------------------------------------- variants
def _cost(spec):
    return spec.num_heads * sum(q * s for s, q in spec.seqs)


#: every quick variant case the naive loop gets through in about a second
VARIANT_SPECS = [s for s in grid("quick") if (s.family in VARIANT_FAMILIES or s.variants) and _cost(s) < 40_000]


def test_variant_specs_cover_every_variant():
    seen = set().union(*(s.build().variants for s in VARIANT_SPECS))
    assert seen == set(VARIANTS)


@pytest.mark.parametrize("spec", VARIANT_SPECS, ids=lambda s: s.id)
def test_variant_oracle_matches_naive_loop(spec):
    case = spec.build()
    out, lse = paged_attention_reference_lse(case)
    naive_out, naive_lse = naive_attention(case, return_lse=True)
    err = _rel_err(out, naive_out)
    assert err < 1e-12, f"{spec.id}: oracle and naive loop differ by {err:.3g} relative (bound 1e-12)"
    lse_err = float(((lse - naive_lse).abs() / naive_lse.abs().clamp_min(1.0)).max())
    assert lse_err < 1e-12, f"{spec.id}: log-sum-exp differs by {lse_err:.3g} (bound 1e-12)"


def _f64(case):
    return case.replace(
        query=case.query.double(), key_cache=case.key_cache.double(), value_cache=case.value_cache.double()
    )


def test_window_of_one_returns_the_own_value():
    case = _f64(make_case([(9, 1), (7, 7)], num_heads=2, num_kv_heads=1, block_size=3)).replace(sliding_window=1)
    out = paged_attention_reference(case)
    for b, (L, n) in enumerate(zip(case.seq_lens_list, case.query_lens)):
        hist = case.value_cache.reshape(-1, 1, 4)[case.slot_mapping(b)]  # [L, 1, D]
        rows = out[case.query_start_loc_list[b] : case.query_start_loc_list[b + 1]]
        assert torch.equal(rows, hist[L - n :].expand(-1, 2, -1)), f"sequence {b}"


def test_window_covering_the_history_changes_nothing():
    case = _f64(make_case([(9, 1), (7, 7), (12, 5)], num_heads=2, num_kv_heads=1, block_size=3))
    assert_equal(
        paged_attention_reference(case),
        paged_attention_reference(case.replace(sliding_window=12)),
        "a window as long as the history",
    )
    assert_differs(
        paged_attention_reference(case),
        paged_attention_reference(case.replace(sliding_window=11)),
        "a window one key short of the history",
    )


def test_window_equals_a_shorter_history():
    # the last W keys alone: the same as attending to a history that starts at p - W + 1
    case = _f64(make_case([(10, 1)], num_heads=2, num_kv_heads=1, block_size=2))
    out = paged_attention_reference(case.replace(sliding_window=4))
    k, v = case.key_cache.reshape(-1, 1, 4)[6:10], case.value_cache.reshape(-1, 1, 4)[6:10]
    s = torch.einsum("hd,kd->hk", case.query[0], k[:, 0]) * case.scale
    want = torch.softmax(s, -1) @ v[:, 0]
    assert _rel_err(out[0], want) < 1e-14


def test_sink_scales_the_output_by_its_share():
    case = _f64(make_case([(6, 1), (5, 5)], num_heads=2, num_kv_heads=1))
    sinks = torch.tensor([0.5, -2.0])
    plain, plain_lse = paged_attention_reference_lse(case)
    out, lse = paged_attention_reference_lse(case.replace(sinks=sinks))
    share = torch.exp(plain_lse) / (torch.exp(plain_lse) + torch.exp(sinks.double()))  # keys' share
    assert _rel_err(out, plain * share[..., None]) < 1e-14
    assert float((lse - torch.logaddexp(plain_lse, sinks.double())).abs().max()) < 1e-14


def test_huge_cap_and_zero_slopes_change_nothing_but_a_small_cap_does():
    case = _f64(make_case([(6, 1), (5, 5)], num_heads=2, num_kv_heads=1))
    ref = paged_attention_reference(case)
    assert _rel_err(paged_attention_reference(case.replace(logits_soft_cap=1e9)), ref) < 1e-12
    assert_equal(paged_attention_reference(case.replace(alibi_slopes=torch.zeros(2))), ref, "zero ALiBi slopes")
    assert _rel_err(paged_attention_reference(case.replace(logits_soft_cap=0.5)), ref) > 1e-3


def test_alibi_is_a_per_key_bias_the_lse_sees_from_the_query_position():
    # softmax is shift invariant per row: slope * (j - p) and slope * j give the same output,
    # and log-sum-exps that differ by exactly slope * p
    case = _f64(make_case([(8, 3)], num_heads=2, num_kv_heads=1))
    slopes = torch.tensor([0.5, 0.125])
    out, lse = paged_attention_reference_lse(case.replace(alibi_slopes=slopes))
    k = case.key_cache.reshape(-1, 1, 4)[:8, 0]
    v = case.value_cache.reshape(-1, 1, 4)[:8, 0]
    for i, p in enumerate(range(5, 8)):
        s = torch.einsum("hd,kd->hk", case.query[i], k) * case.scale + slopes.double()[:, None] * torch.arange(8)
        s[:, p + 1 :] = float("-inf")
        assert _rel_err(out[i], torch.softmax(s, -1) @ v) < 1e-14
        assert float((lse[i] + slopes.double() * p - torch.logsumexp(s, -1)).abs().max()) < 1e-13


@pytest.mark.parametrize("kv", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_reads_the_stored_bytes_times_the_scales(kv):
    case = make_case([(9, 1), (7, 7)], num_heads=2, num_kv_heads=1, dtype=torch.float32)
    q8 = case.replace(key_cache=case.key_cache.to(kv), value_cache=case.value_cache.to(kv), k_scale=0.3, v_scale=2.5)
    # the same bytes, dequantized by hand into a float64 cache
    dq = q8.replace(
        query=case.query.double(),
        key_cache=q8.key_cache.double() * 0.3,
        value_cache=q8.value_cache.double() * 2.5,
        k_scale=1.0,
        v_scale=1.0,
    )
    assert_equal(
        paged_attention_reference(q8), paged_attention_reference(dq), "the fp8 cache against its dequantized copy"
    )
    assert _rel_err(paged_attention_reference(q8), paged_attention_reference(case)) > 1e-3  # quantized != original
