"""PagedCase: every validation rule raises a ValueError naming its field and bound."""

import pytest
import torch

from pagedattn import PagedCase
from tests.helpers import make_case


def _fields(case):
    return dict(
        query=case.query,
        key_cache=case.key_cache,
        value_cache=case.value_cache,
        block_tables=case.block_tables,
        seq_lens=case.seq_lens,
        query_start_loc=case.query_start_loc,
        scale=None,
    )


@pytest.fixture
def good():
    return _fields(make_case([(5, 1), (3, 3)], num_heads=4, num_kv_heads=2, block_size=2))


def _bad(good, **changes):
    f = dict(good)
    f.update(changes)
    return f


BAD = {
    "query-rank": (lambda g: _bad(g, query=g["query"][0]), "query", "rank 3"),
    "key-rank": (lambda g: _bad(g, key_cache=g["key_cache"][0]), "key_cache", "rank 4"),
    "value-shape": (
        lambda g: _bad(g, value_cache=g["value_cache"][:, :1]),
        "value_cache",
        "must equal key_cache shape",
    ),
    "value-dtype": (lambda g: _bad(g, value_cache=g["value_cache"].float()), "value_cache", "dtype"),
    "head-dim": (lambda g: _bad(g, query=g["query"][..., :3]), "key_cache", "head_dim 4 must equal query head_dim 3"),
    "gqa": (lambda g: _bad(g, query=g["query"][:, :3]), "query", "multiple of num_kv_heads 2"),
    "query-int": (lambda g: _bad(g, query=g["query"].to(torch.int32)), "query", "floating"),
    "tables-int64": (lambda g: _bad(g, block_tables=g["block_tables"].long()), "block_tables", "int32"),
    "seqlens-int64": (lambda g: _bad(g, seq_lens=g["seq_lens"].long()), "seq_lens", "int32"),
    "loc-float": (lambda g: _bad(g, query_start_loc=g["query_start_loc"].float()), "query_start_loc", "int32"),
    "tables-rows": (lambda g: _bad(g, block_tables=g["block_tables"][:1]), "block_tables", "2 sequences"),
    "loc-len": (lambda g: _bad(g, query_start_loc=g["query_start_loc"][:2]), "query_start_loc", "num_seqs + 1 = 3"),
    "loc-start": (
        lambda g: _bad(g, query_start_loc=torch.tensor([1, 2, 4], dtype=torch.int32)),
        "query_start_loc",
        "start at 0",
    ),
    "loc-end": (
        lambda g: _bad(g, query_start_loc=torch.tensor([0, 1, 3], dtype=torch.int32)),
        "query_start_loc",
        "end at num_tokens = 4",
    ),
    "loc-decreasing": (
        lambda g: _bad(g, query_start_loc=torch.tensor([0, 5, 4], dtype=torch.int32)),
        "query_start_loc",
        "never decrease",
    ),
    "empty-query": (
        lambda g: _bad(g, query_start_loc=torch.tensor([0, 0, 4], dtype=torch.int32)),
        "query_start_loc",
        ">= 1",
    ),
    "seq-shorter-than-query": (
        lambda g: _bad(g, seq_lens=torch.tensor([5, 2], dtype=torch.int32)),
        "seq_lens",
        "below its query length 3",
    ),
    "too-few-blocks": (
        lambda g: _bad(g, seq_lens=torch.tensor([9, 3], dtype=torch.int32)),
        "block_tables",
        "needs 5 blocks",
    ),
    "block-id-negative": (
        lambda g: _bad(g, block_tables=g["block_tables"].clone().index_fill_(1, torch.tensor([1]), -1)),
        "block_tables",
        "outside [0, num_blocks=",
    ),
    "block-id-too-big": (
        lambda g: _bad(g, block_tables=g["block_tables"].clone().index_fill_(1, torch.tensor([0]), 99)),
        "block_tables",
        "outside [0, num_blocks=6)",
    ),
    "scale-zero": (lambda g: _bad(g, scale=0.0), "scale", "> 0"),
    "scale-nan": (lambda g: _bad(g, scale=float("nan")), "scale", "finite"),
    "not-a-tensor": (lambda g: _bad(g, seq_lens=[5, 3]), "seq_lens", "torch.Tensor"),
    "device": (lambda g: _bad(g, seq_lens=g["seq_lens"].to("meta")), "seq_lens", "one device for all"),
    # the variants
    "window-zero": (lambda g: _bad(g, sliding_window=0), "sliding_window", "int >= 1"),
    "window-float": (lambda g: _bad(g, sliding_window=4.0), "sliding_window", "int >= 1"),
    "window-bool": (lambda g: _bad(g, sliding_window=True), "sliding_window", "int >= 1"),
    "cap-negative": (lambda g: _bad(g, logits_soft_cap=-1.0), "logits_soft_cap", "> 0"),
    "cap-inf": (lambda g: _bad(g, logits_soft_cap=float("inf")), "logits_soft_cap", "finite"),
    "alibi-shape": (lambda g: _bad(g, alibi_slopes=torch.ones(2)), "alibi_slopes", "[num_heads] = (4,)"),
    "alibi-dtype": (lambda g: _bad(g, alibi_slopes=torch.ones(4, dtype=torch.float64)), "alibi_slopes", "float32"),
    "alibi-list": (lambda g: _bad(g, alibi_slopes=[1.0] * 4), "alibi_slopes", "torch.Tensor"),
    "sinks-nan": (lambda g: _bad(g, sinks=torch.tensor([0.0, float("nan"), 0.0, 0.0])), "sinks", "finite"),
    "sinks-device": (lambda g: _bad(g, sinks=torch.zeros(4, device="meta")), "sinks", "one device for all"),
    "k-scale-not-fp8": (lambda g: _bad(g, k_scale=0.5), "k_scale", "fp8 caches only"),
    "v-scale-zero": (lambda g: _bad(g, v_scale=0.0), "v_scale", "> 0"),
    "kv-other-dtype": (
        lambda g: _bad(g, key_cache=g["key_cache"].half(), value_cache=g["value_cache"].half()),
        "key_cache",
        "must equal the query dtype",
    ),
    "fp8-query": (lambda g: _bad(g, query=g["query"].to(torch.float8_e4m3fn)), "query", "floating"),
    "fp8-k-only": (
        lambda g: _bad(g, key_cache=g["key_cache"].to(torch.float8_e4m3fn)),
        "value_cache",
        "must equal key_cache dtype",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_validation_names_field_and_bound(good, name):
    build, field, text = BAD[name]
    with pytest.raises(ValueError) as info:
        PagedCase(**build(good))
    msg = str(info.value)
    assert msg.startswith(f"PagedCase.{field}:"), f"{name}: message {msg!r} does not name field {field!r}"
    assert text in msg, f"{name}: message {msg!r} does not state the bound {text!r}"


def test_padding_entries_are_not_validated(good):
    tables = good["block_tables"].clone()
    tables[1, -1] = 12345  # past sequence 1's last block: padding, never read
    PagedCase(**_bad(good, block_tables=tables))


def test_default_scale_and_convenience(good):
    case = PagedCase(**good)
    assert case.scale == pytest.approx(4**-0.5)
    assert case.num_seqs == 2 and case.query_lens == [1, 3] and case.context_lens == [4, 0]
    assert case.gqa_ratio == 2 and case.block_size == 2 and case.num_blocks == 6
    slots = case.slot_mapping(0)
    blocks = case.block_tables[0].long()
    assert slots.tolist() == [int(blocks[p // 2]) * 2 + p % 2 for p in range(5)]
    assert case.to("cpu").query is not None and case.clone().query.data_ptr() != case.query.data_ptr()


def test_case_is_frozen(good):
    case = PagedCase(**good)
    with pytest.raises(AttributeError):
        case.scale = 2.0


def test_variants_round_trip(good, tmp_path):
    from pagedattn.cases import load_case, save_case

    case = PagedCase(**_bad(good, query=good["query"].float(),
                            key_cache=good["key_cache"].to(torch.float8_e5m2),
                            value_cache=good["value_cache"].to(torch.float8_e5m2),
                            sliding_window=3, logits_soft_cap=7.5, alibi_slopes=torch.rand(4),
                            sinks=torch.randn(4), k_scale=0.25, v_scale=3.0))  # fmt: skip
    assert case.variants == {"sliding_window", "logits_soft_cap", "alibi", "sinks", "fp8_e5m2"}
    assert case.kv_dtype == torch.float8_e5m2 and case.dtype == torch.float32
    assert "sliding_window=3" in repr(case) and "k_scale=0.25" in repr(case)
    save_case(case, tmp_path / "c.pt")
    back, _ = load_case(tmp_path / "c.pt")
    assert back.options() == case.options()
    for name, t in case.tensors().items():
        assert torch.equal(t.view(torch.uint8) if t.element_size() == 1 else t, back.tensors()[name].view(
            torch.uint8) if t.element_size() == 1 else back.tensors()[name]), name  # fmt: skip
    clone = case.clone()
    assert clone.sinks is not None and clone.sinks.data_ptr() != case.sinks.data_ptr()
    assert PagedCase(**good).variants == frozenset()
