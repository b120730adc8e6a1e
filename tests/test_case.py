"""PagedCase: every validation rule raises a ValueError naming its field and bound."""

import time
import zipfile

import numpy as np
import pytest
import torch

from pagedattn import PagedCase
from pagedattn.cases import CaseSpec, load_case, save_case
from pagedattn.cases.io import CaseFileError
from pagedattn.kernels import host
from pagedattn.plugin import _glob
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
    # probed inputs that are not what they look like (issue 14)
    "scale-string": (lambda g: _bad(g, scale="0.25"), "scale", "finite float > 0, got '0.25' of type str"),
    "scale-bool": (lambda g: _bad(g, scale=True), "scale", "of type bool"),
    "scale-complex": (lambda g: _bad(g, scale=0.25 + 0j), "scale", "of type complex"),
    "scale-tensor": (lambda g: _bad(g, scale=torch.tensor(0.25)), "scale", "of type Tensor"),
    "block-size-zero": (
        lambda g: _bad(g, key_cache=g["key_cache"][:, :0], value_cache=g["value_cache"][:, :0]),
        "key_cache",
        "block_size (dimension 1) must be >= 1",
    ),
    "no-heads": (lambda g: _bad(g, query=g["query"][:, :0]), "query", "num_heads (dimension 1) must be >= 1"),
    "meta": (
        lambda g: {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in g.items()},
        "query",
        "meta device",
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


def test_numpy_scalars_are_real_numbers(good):
    assert PagedCase(**_bad(good, scale=np.float32(0.5))).scale == 0.5


# ------------------------------------------------------------ the kernel's host checks
def _host_args():
    case = CaseSpec("t", ((9, 3), (5, 1)), num_heads=4, num_kv_heads=2, head_dim=16, block_size=4).build()
    return dict(case.tensors())


HOST_BAD = {
    "scale-string": ("scale", "of type str", lambda a: a.update(scale="0.25")),
    "scale-bool": ("scale", "of type bool", lambda a: a.update(scale=True)),
    "scale-complex": ("scale", "of type complex", lambda a: a.update(scale=1j)),
    "scale-over-fp32": ("scale", "outside fp32's normal range", lambda a: a.update(scale=1e39)),
    "scale-under-fp32": ("scale", "outside fp32's normal range", lambda a: a.update(scale=1e-40)),
    "block-size-zero": ("key_cache", "block_size (dimension 1) must be >= 1",
                        lambda a: a.update(key_cache=a["key_cache"][:, :0], value_cache=a["value_cache"][:, :0])),
    "meta": ("query", "meta device", lambda a: a.update({k: v.to("meta") for k, v in a.items()})),
    "alibi-nan": ("alibi_slopes", "finite", lambda a: a.update(alibi_slopes=torch.tensor([0.5, float("nan"), 0, 0]))),
    "sinks-inf": ("sinks", "finite", lambda a: a.update(sinks=torch.tensor([0.0, 0.0, float("-inf"), 0.0]))),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(HOST_BAD))
def test_host_checks_name_field_and_bound(name):
    field, text, change = HOST_BAD[name]
    args = _host_args()
    change(args)
    with pytest.raises(ValueError) as info:
        host.check_paged_inputs(**args)
    msg = str(info.value)
    assert msg.startswith(f"paged_attention: {field}:") and text in msg, f"{name}: {msg}"


def test_host_finite_check_reads_the_device_once(monkeypatch):
    """The slopes' and sinks' finiteness rides on the one transfer of the lengths."""
    args = _host_args()
    calls = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: calls.append(1) or real(self))
    host.check_paged_inputs(**args, alibi_slopes=torch.ones(4), sinks=torch.zeros(4))
    assert len(calls) == 1, f"{len(calls)} device-to-host transfers, expected one"


HOST_BAD_VARIANTS = {
    "scale-times-k-scale": ("k_scale", "scale * k_scale = 1e+40", dict(scale=1e20, k_scale=1e20)),
    "default-scale-times-k-scale": ("k_scale", "outside fp32's normal range", dict(k_scale=2e39)),
    "v-scale-over-fp32": ("v_scale", "outside fp32's normal range", dict(v_scale=3.5e38)),
    "scale-string": ("scale", "of type str", dict(scale="0.25")),
    "k-scale-bool": ("k_scale", "of type bool", dict(k_scale=True)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(HOST_BAD_VARIANTS))
def test_host_variant_checks_name_field_and_bound(name):
    field, text, kwargs = HOST_BAD_VARIANTS[name]
    args = _host_args()
    fp8 = args["key_cache"].to(torch.float8_e4m3fn)
    with pytest.raises(ValueError) as info:
        host.check_variants(args["query"], fp8, **kwargs)
    msg = str(info.value)
    assert msg.startswith(f"paged_attention: {field}:") and text in msg, f"{name}: {msg}"


def test_host_accepts_what_a_case_accepts():
    args = _host_args()
    host.check_paged_inputs(**args, scale=np.float64(0.3), alibi_slopes=torch.ones(4), sinks=torch.zeros(4))
    fp8 = args["key_cache"].to(torch.float8_e4m3fn)
    assert host.check_variants(args["query"], fp8, scale=0.3, k_scale=1e30, v_scale=2.0).k_scale == 1e30


# ------------------------------------------------------------------- saved case files
def _write(path, payload):
    torch.save(payload, path)
    return path


def _zip(path):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x", "y")
    return path


def _state(case):
    return {"format": "pagedattn-case/1", "tensors": dict(case.tensors()), "options": case.options(), "meta": {}}


BAD_FILES = {
    "missing": (lambda p, c: p, "no such file"),
    "directory": (lambda p, c: p.mkdir() or p, "not a file"),
    "text": (lambda p, c: (p.write_text("hello"), p)[1], "not a torch.save zip archive"),
    "damaged-zip": (lambda p, c: _zip(p), "cannot be read as a saved case"),
    "a-list": (lambda p, c: _write(p, [1, 2]), "format 'pagedattn-case/1' expected"),
    "no-tensors": (lambda p, c: _write(p, {**_state(c), "tensors": 3}), "'tensors' must be a dict of tensors"),
    "lacks-query": (lambda p, c: _write(p, {**_state(c), "tensors": {"seq_lens": c.seq_lens}}), "lacks query"),
    "unknown-option": (lambda p, c: _write(p, {**_state(c), "options": {"bogus": 1}}), "'options' must be a dict"),
    "invalid-case": (lambda p, c: _write(p, {**_state(c), "options": {"scale": -1.0}}),
                     "holds an invalid case: PagedCase.scale"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_bad_case_file_is_one_error_naming_file_and_problem(name, tmp_path):
    make, text = BAD_FILES[name]
    path = make(tmp_path / "case.pt", CaseSpec("t", ((5, 2),)).build())
    with pytest.raises(CaseFileError) as info:
        load_case(path)
    assert str(info.value).startswith(str(path)) and text in str(info.value), f"{name}: {info.value}"


def test_replay_of_a_bad_file_is_one_usage_error(pytester, tmp_path):
    case = CaseSpec("t", ((5, 2),)).build()
    unknown = tmp_path / "unknown.pt"
    save_case(case, unknown, family="no-such-family", id="x")
    text = tmp_path / "text.pt"
    text.write_text("hello")
    for path, problem in ((unknown, "unknown family 'no-such-family'"), (text, "not a torch.save zip archive")):
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pyargs", "pagedattn.conformance",
                                               "--backend=reference", "--replay", str(path))  # fmt: skip
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
        errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
        assert len(errors) == 1 and errors[0].startswith(f"ERROR: --replay={path}: "), result.stderr.lines
        assert problem in errors[0], errors
        assert "Traceback" not in result.stdout.str() + result.stderr.str()


# -------------------------------------------------------------- expectation patterns
@pytest.mark.parametrize(
    "pattern, text, want",
    [
        ("decode-*-bf16-*", "decode-gqa2-bs16-d64-bf16-L70-B3", True),
        ("decode-*-bf16", "decode-gqa2-bs16-d64-bf16-L70", False),
        ("test_property[mixed-*-determinism]", "test_property[mixed-gqa2-determinism]", True),
        ("test_x[?]", "test_x[a]", True),
        ("test_x[ab]", "test_x[a]", False),  # brackets are literal, not a character class
        ("*", "", True),
        ("a*b*c", "abxbc", True),
        ("a*b*c", "abxbcd", False),
    ],
)
def test_expectation_pattern_semantics(pattern, text, want):
    assert _glob(pattern, text) is want


def test_expectation_patterns_match_in_linear_time():
    pattern = "*a" * 14 + "b"  # a backtracking regex tries C(n, 14) splits of the text
    text = "a" * 400
    start = time.perf_counter()
    assert not _glob(pattern, text)
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5, f"a 14-star pattern took {elapsed:.2f} s on a 400-character id"
