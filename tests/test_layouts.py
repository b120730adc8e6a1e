"""Layout converters: convert, read back, bit-equal."""

import pytest
import torch

from pagedattn.adapters import layouts
from pagedattn.cases import CaseSpec
from pagedattn.oracle import bits_equal, gather_history, paged_attention_reference

SPECS = [
    CaseSpec("t", ((37, 1), (20, 20), (33, 5)), head_dim=64, block_size=16, layout="permuted", dtype=dt)
    for dt in (torch.float32, torch.float16, torch.bfloat16)
] + [CaseSpec("t", ((9, 2), (12, 1)), head_dim=80, block_size=3, num_heads=8, num_kv_heads=1, layout="shared",
              shared_blocks=2, dtype=torch.bfloat16)]  # fmt: skip


def _same_problem(a, b):
    """Same queries, lengths, scale, and bit-identical histories of every sequence."""
    assert bits_equal(a.query, b.query)
    assert a.seq_lens_list == b.seq_lens_list and a.query_lens == b.query_lens and a.scale == b.scale
    for s in range(a.num_seqs):
        for x, y in zip(gather_history(a, s), gather_history(b, s)):
            assert bits_equal(x, y), f"sequence {s}: history differs"
    assert torch.equal(paged_attention_reference(a), paged_attention_reference(b))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_vllm_split_round_trip(spec):
    case = spec.build()
    k, v = layouts.to_vllm_split(case.key_cache, case.value_cache)
    x = 16 // case.key_cache.element_size()
    assert k.shape == (case.num_blocks, case.num_kv_heads, case.head_dim // x, case.block_size, x)
    assert v.shape == (case.num_blocks, case.num_kv_heads, case.head_dim, case.block_size)
    # one element by hand: the last token of block 2, kv head 0, channel 9
    t = case.block_size - 1
    assert bits_equal(k[2, 0, 9 // x, t, 9 % x], case.key_cache[2, t, 0, 9])
    assert bits_equal(v[2, 0, 9, t], case.value_cache[2, t, 0, 9])
    kc, vc = layouts.from_vllm_split(k, v)
    assert bits_equal(kc, case.key_cache) and bits_equal(vc, case.value_cache)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_flashinfer_round_trip(spec, layout):
    case = spec.build()
    args = layouts.to_flashinfer(case, layout)
    assert args["kv_last_page_len"].min() >= 1 and args["kv_last_page_len"].max() <= case.block_size
    assert int(args["kv_indptr"][-1]) == sum(case.num_blocks_used(b) for b in range(case.num_seqs))
    back = layouts.from_flashinfer(args)
    assert bits_equal(back.key_cache, case.key_cache) and bits_equal(back.value_cache, case.value_cache)
    _same_problem(back, case)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_flash_attn_round_trip(spec):
    case = spec.build()
    args = layouts.to_flash_attn(case)
    assert args["max_seqlen_q"] == max(case.query_lens) and args["causal"]
    _same_problem(layouts.from_flash_attn(args), case)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_sglang_round_trip(spec):
    case = spec.build()
    args = layouts.to_sglang(case)
    indptr = args["kv_indptr"].tolist()
    for b in range(case.num_seqs):
        assert torch.equal(args["kv_indices"][indptr[b] : indptr[b + 1]], case.slot_mapping(b))
        assert torch.equal(args["req_to_token"][b, : case.seq_lens_list[b]].long(), case.slot_mapping(b))
    back = layouts.from_sglang(args)
    assert back.block_size == 1
    _same_problem(back, case)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_flex_round_trip(spec):
    case = spec.build()
    args = layouts.to_flex(case)
    assert args["k_cache"].shape == (1, case.num_kv_heads, case.num_blocks * case.block_size, case.head_dim)
    back = layouts.from_flex(args)
    assert bits_equal(back.key_cache, case.key_cache) and bits_equal(back.value_cache, case.value_cache)
    _same_problem(back, case)


def test_bad_arguments():
    case = SPECS[0].build()
    with pytest.raises(ValueError, match="layout"):
        layouts.to_flashinfer(case, "XYZ")
    with pytest.raises(ValueError, match="multiple of x"):
        layouts.to_vllm_split(case.key_cache[..., :62], case.value_cache[..., :62])
