"""Layout converters: convert, read back, bit-equal."""

import dataclasses

import pytest
import torch

from pagedattn.adapters import layouts
from pagedattn.cases import CaseSpec
from pagedattn.oracle import bits_equal, gather_history, paged_attention_reference
from tests.asserts import assert_equal

SPECS = [
    CaseSpec("t", ((37, 1), (20, 20), (33, 5)), head_dim=64, block_size=16, layout="permuted", dtype=dt)
    for dt in (torch.float32, torch.float16, torch.bfloat16)
] + [
    CaseSpec(
        "t",
        ((9, 2), (12, 1)),
        head_dim=80,
        block_size=3,
        num_heads=8,
        num_kv_heads=1,
        layout="shared",
        shared_blocks=2,
        dtype=torch.bfloat16,
    )
]


def _same_problem(a, b):
    """Same queries, lengths, scale, and bit-identical histories of every sequence."""
    assert bits_equal(a.query, b.query)
    assert a.seq_lens_list == b.seq_lens_list and a.query_lens == b.query_lens and a.scale == b.scale
    for s in range(a.num_seqs):
        for x, y in zip(gather_history(a, s), gather_history(b, s)):
            assert bits_equal(x, y), f"sequence {s}: history differs"
    assert_equal(paged_attention_reference(a), paged_attention_reference(b), "the reference over both layouts")


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
        assert_equal(args["kv_indices"][indptr[b] : indptr[b + 1]], case.slot_mapping(b), f"kv_indices of sequence {b}")
        assert_equal(
            args["req_to_token"][b, : case.seq_lens_list[b]].long(),
            case.slot_mapping(b),
            f"req_to_token of sequence {b}",
        )
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
    with pytest.raises(ValueError, match="to_vllm_split.x: must divide head_dim"):
        layouts.to_vllm_split(case.key_cache[..., :62], case.value_cache[..., :62])


# ------------------------------------------------- building blocks for split-step kernels
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_hnd_cache_round_trip(spec):
    case = spec.build()
    k = layouts.to_hnd_cache(case.key_cache)
    assert k.shape == (case.num_blocks, case.num_kv_heads, case.block_size, case.head_dim) and k.is_contiguous()
    t = case.block_size - 1  # one element by hand: the last token of block 2, kv head 0, channel 9
    assert bits_equal(k[2, 0, t, 9], case.key_cache[2, t, 0, 9])
    assert bits_equal(layouts.from_hnd_cache(k), case.key_cache)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_token_kv_indices_prefix_plus_new_tokens_is_the_history(spec):
    case = spec.build()
    indptr, indices = layouts.token_kv_indices(case)
    p_indptr, p_indices = layouts.token_kv_indices(case, "prefix")
    assert indptr.dtype == torch.int32 and indices.dtype == torch.int64
    table = layouts.req_to_token(case)
    k_new, v_new = layouts.new_tokens_kv(case)
    assert k_new.shape == (case.num_tokens, case.num_kv_heads, case.head_dim) and k_new.is_contiguous()
    flat_k = case.key_cache.reshape(-1, case.num_kv_heads, case.head_dim)
    loc = case.query_start_loc_list
    for b in range(case.num_seqs):
        full = indices[indptr[b] : indptr[b + 1]]
        prefix = p_indices[p_indptr[b] : p_indptr[b + 1]]
        assert_equal(full, case.slot_mapping(b), f"the slots of sequence {b}")
        assert len(prefix) == case.context_lens[b], (
            f"sequence {b}: {len(prefix)} prefix slots, not {case.context_lens[b]}"
        )
        assert_equal(prefix, full[: len(prefix)], f"the prefix slots of sequence {b}")
        assert_equal(table[b, : case.seq_lens_list[b]].long(), full, f"the table row of sequence {b}")
        assert not table[b, case.seq_lens_list[b] :].any()
        # the new tokens' keys are the pool's, at the slots after the prefix, in query order
        assert bits_equal(k_new[loc[b] : loc[b + 1]], flat_k[full[len(prefix) :]])
        history_k, history_v = gather_history(case, b)
        assert bits_equal(v_new[loc[b] : loc[b + 1]], history_v[case.context_lens[b] :])
        assert bits_equal(k_new[loc[b] : loc[b + 1]], history_k[case.context_lens[b] :])


def test_token_kv_indices_and_req_to_token_refuse_bad_arguments():
    case = SPECS[0].build()
    with pytest.raises(ValueError, match="part"):
        layouts.token_kv_indices(case, "suffix")
    with pytest.raises(ValueError, match="width"):
        layouts.req_to_token(case, width=case.max_seq_len - 1)


VARIANTS = [{}, {"sliding_window": 5, "sinks": True, "alibi_slopes": True}]


@pytest.mark.parametrize("variant", VARIANTS, ids=["plain", "variants"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_decode_rows_give_the_same_attention(spec, variant):
    import dataclasses

    case = dataclasses.replace(spec, **variant).build()
    rows = layouts.to_decode_rows(case)
    assert rows.num_seqs == case.num_tokens and rows.query_lens == [1] * case.num_tokens
    loc = case.query_start_loc_list
    for b in range(case.num_seqs):  # each row's position is its token's absolute position
        positions = [s - 1 for s in rows.seq_lens_list[loc[b] : loc[b + 1]]]
        assert positions == list(range(case.context_lens[b], case.seq_lens_list[b]))
    assert rows.sliding_window == case.sliding_window and rows.sinks is case.sinks
    # the same problem: the float64 oracle agrees with itself up to its summation order
    # (the 1e-12 relative agreement tests/test_oracle.py holds the oracle to)
    a, b = paged_attention_reference(rows), paged_attention_reference(case)
    err = float((a - b).abs().max() / b.abs().max())
    assert err < 1e-12, f"decode rows differ from the batch by {err:.3g} relative"
    # and a mapping slip (each row one position short) is not the same problem
    short = rows.replace(seq_lens=rows.seq_lens - 1) if min(rows.seq_lens_list) > 1 else None
    if short is not None:
        assert float((paged_attention_reference(short) - b).abs().max() / b.abs().max()) > 1e-3


# ------------------------------------------------------------------ tree masks (FlashInfer custom_mask)
def _tree_masks(query_lens, seed=0):
    """A valid tree mask (diagonal True, nothing above it) per sequence, flattened and concatenated."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for q in query_lens:
        m = torch.tril(torch.rand(q, q, generator=g) < 0.5)
        m.fill_diagonal_(True)
        parts.append(m.reshape(-1))
    return torch.cat(parts)


TREE_BATCHES = [([1], [7]), ([4], [4]), ([1, 3, 5], [9, 3, 21]), ([6, 2], [6, 40])]


@pytest.mark.parametrize(("query_lens", "seq_lens"), TREE_BATCHES, ids=lambda x: "-".join(map(str, x)))
def test_tree_mask_flashinfer_round_trip(query_lens, seq_lens):
    tree = _tree_masks(query_lens)
    custom = layouts.tree_mask_to_flashinfer(tree, query_lens, seq_lens)
    indptr = layouts.flashinfer_mask_indptr(query_lens, seq_lens).tolist()
    total = sum(q * n for q, n in zip(query_lens, seq_lens))
    assert custom.dtype == torch.bool and custom.numel() == indptr[-1] == total, (custom.numel(), indptr[-1], total)
    at = 0
    for b, (q, n) in enumerate(zip(query_lens, seq_lens)):
        rows = custom[indptr[b] : indptr[b + 1]].view(q, n)
        assert bool(rows[:, : n - q].all()), f"request {b}: a cached column is hidden"
        assert_equal(rows[:, n - q :], tree[at : at + q * q].view(q, q), f"request {b}'s new-token columns")
        at += q * q
    assert_equal(layouts.tree_mask_from_flashinfer(custom, query_lens, seq_lens), tree, "the tree mask read back")
    packed, packed_indptr = layouts.pack_mask_bits(custom, query_lens, seq_lens)
    assert packed.dtype == torch.uint8
    sizes = (packed_indptr[1:] - packed_indptr[:-1]).tolist()
    assert sizes == [-(-q * n // 8) for q, n in zip(query_lens, seq_lens)], f"packed segment sizes {sizes}"
    assert_equal(layouts.unpack_mask_bits(packed, packed_indptr, query_lens, seq_lens), custom, "the bits unpacked")


def test_mask_bits_are_packed_in_little_bit_order_per_request():
    # numpy.packbits(..., bitorder="little") of 1,0,1,1,0,0,1,1 is 0b11001101: element k is bit k
    bits = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool)
    packed, indptr = layouts.pack_mask_bits(bits, [1], [8])
    assert packed.tolist() == [0b11001101], f"packed {[bin(x) for x in packed.tolist()]}, expected ['0b11001101']"
    # each request starts a byte of its own: 1x3 then 1x2 bits take two bytes, not one
    packed, indptr = layouts.pack_mask_bits(torch.tensor([1, 0, 1, 1, 1], dtype=torch.bool), [1, 1], [3, 2])
    assert packed.tolist() == [0b101, 0b11] and indptr.tolist() == [0, 1, 2], (packed.tolist(), indptr.tolist())


def test_tree_mask_converters_refuse_what_a_tree_mask_cannot_say():
    with pytest.raises(ValueError, match="tree_mask_to_flashinfer.tree_mask: must hold"):
        layouts.tree_mask_to_flashinfer(torch.ones(5, dtype=torch.bool), [2], [4])
    custom = layouts.tree_mask_to_flashinfer(_tree_masks([2]), [2], [4])
    custom[0] = False  # row 0 no longer sees cached key 0
    with pytest.raises(ValueError, match="request 0 hides a cached column"):
        layouts.tree_mask_from_flashinfer(custom, [2], [4])


# ------------------------------------------------------------------ MLA's latent cache
MLA_SPECS = [
    CaseSpec(
        "t",
        lens,
        num_heads=16,
        num_kv_heads=1,
        head_dim=576,
        head_dim_v=512,
        mla=True,
        scale=0.1352,
        block_size=bs,
        layout="permuted",
        dtype=dt,
    )
    for lens, bs, dt in (
        (((37, 1), (20, 4), (70, 2)), 16, torch.bfloat16),
        (((37, 2), (130, 2)), 64, torch.float16),
        (((9, 1), (12, 3)), 1, torch.float32),
    )
]


@pytest.mark.parametrize("spec", MLA_SPECS, ids=lambda s: s.id)
def test_flashinfer_mla_round_trip(spec):
    case = spec.build()
    assert case.shared_kv
    args = layouts.to_flashinfer_mla(case)
    ckv, kpe = args["ckv_cache"], args["kpe_cache"]
    assert ckv.shape == (case.num_blocks, case.block_size, 512) and kpe.shape == (case.num_blocks, case.block_size, 64)
    assert args["q_nope"].shape == (case.num_tokens, 16, 512) and args["q_pe"].shape == (case.num_tokens, 16, 64)
    # views of the latent cache, not copies
    size = case.key_cache.element_size()
    assert ckv.data_ptr() == case.key_cache.data_ptr() and kpe.data_ptr() == case.key_cache.data_ptr() + 512 * size
    t = case.block_size - 1  # one element of each by hand: the last token of block 2
    assert bits_equal(ckv[2, t, 9], case.key_cache[2, t, 0, 9])
    assert bits_equal(kpe[2, t, 3], case.key_cache[2, t, 0, 515])
    assert args["kv_len_arr"].tolist() == case.seq_lens_list and args["sm_scale"] == 0.1352
    back = layouts.from_flashinfer_mla(args)
    assert back.shared_kv and bits_equal(back.key_cache, case.key_cache)
    _same_problem(back, case)


def test_flashmla_takes_the_latent_cache_itself_at_block_size_64():
    case = MLA_SPECS[1].build()
    args = layouts.to_flashmla(case)
    assert args["k_cache"] is case.key_cache and args["k_cache"].shape[1:] == (64, 1, 576)
    assert args["q"].shape == (case.num_seqs, 2, 16, 576) and args["head_dim_v"] == 512
    back = layouts.from_flashmla(args)
    assert back.shared_kv and back.key_cache is case.key_cache
    _same_problem(back, case)


def test_mla_converters_refuse_what_their_kernels_cannot_take():
    with pytest.raises(ValueError, match="to_flashmla.block_size: must be 64"):
        layouts.to_flashmla(MLA_SPECS[0].build())
    ragged = dataclasses.replace(MLA_SPECS[1], seqs=((70, 1), (130, 2))).build()
    with pytest.raises(ValueError, match="to_flashmla.query_lens: must be equal"):
        layouts.to_flashmla(ragged)
    with pytest.raises(ValueError, match="to_flashinfer_mla.case: must be an MLA case"):
        layouts.to_flashinfer_mla(SPECS[0].build())
    with pytest.raises(ValueError, match="split_latent.latent: must be"):
        layouts.split_latent(torch.zeros(2, 4, 2, 576), 512)


def test_split_latent_copies_only_what_a_kernel_cannot_read_and_never_writes():
    latent = torch.randn(3, 4, 1, 576).to(torch.bfloat16)
    strided = latent.transpose(0, 1)  # [4, 3, 1, 576]: page stride below token stride, still unit last stride
    ckv, kpe = layouts.split_latent(strided, 512)
    assert ckv.data_ptr() == strided.data_ptr(), "a unit-stride view was copied"
    columns = torch.randn(3, 4, 1, 1152).to(torch.bfloat16)[..., ::2]  # last stride 2: a kernel cannot read it
    before = columns.clone()
    ckv, kpe = layouts.split_latent(columns, 512)
    assert ckv.is_contiguous() and kpe.is_contiguous() and bits_equal(ckv, columns[:, :, 0, :512])
    assert bits_equal(kpe, columns[:, :, 0, 512:]) and bits_equal(columns, before)
    assert bits_equal(layouts.join_latent(ckv, kpe), columns.contiguous())
