"""PagedCase: construction, conveniences, variants, saved case files (its validation
rules: tests/test_problem.py)."""

import time
import zipfile

import numpy as np
import pytest
import torch

from pagedattn import PagedCase
from pagedattn.cases import CaseSpec, load_case, save_case
from pagedattn.cases.io import CaseFileError
from pagedattn.runner.expectations import glob_match
from tests.asserts import assert_equal
from tests.helpers import import_session_modules, make_case, run_inprocess

import_session_modules()  # before the in-process runs below (see its docstring)


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
    case = PagedCase(
        **_bad(
            good,
            query=good["query"].float(),
            key_cache=good["key_cache"].to(torch.float8_e5m2),
            value_cache=good["value_cache"].to(torch.float8_e5m2),
            sliding_window=3,
            logits_soft_cap=7.5,
            alibi_slopes=torch.rand(4),
            sinks=torch.randn(4),
            k_scale=0.25,
            v_scale=3.0,
        )
    )
    assert case.variants == {"sliding_window", "logits_soft_cap", "alibi_slopes", "sinks", "fp8_e5m2"}
    assert case.kv_dtype == torch.float8_e5m2 and case.dtype == torch.float32
    assert "sliding_window=3" in repr(case) and "k_scale=0.25" in repr(case)
    save_case(case, tmp_path / "c.pt")
    back, _ = load_case(tmp_path / "c.pt")
    assert back.options() == case.options()
    for name, t in case.tensors().items():
        assert_equal(
            back.tensors()[name].view(torch.uint8) if t.element_size() == 1 else back.tensors()[name],
            t.view(torch.uint8) if t.element_size() == 1 else t,
            f"{name} after a save and a load",
        )
    clone = case.clone()
    assert clone.sinks is not None and clone.sinks.data_ptr() != case.sinks.data_ptr()
    assert PagedCase(**good).variants == frozenset()


def test_numpy_scalars_are_real_numbers(good):
    assert PagedCase(**_bad(good, scale=np.float32(0.5))).scale == 0.5


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
    "invalid-case": (
        lambda p, c: _write(p, {**_state(c), "options": {"scale": -1.0}}),
        "holds an invalid case: PagedCase.scale",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_bad_case_file_is_one_error_naming_file_and_problem(name, tmp_path):
    make, text = BAD_FILES[name]
    path = make(tmp_path / "case.pt", CaseSpec("t", ((5, 2),)).build())
    with pytest.raises(CaseFileError) as info:
        load_case(path)
    assert str(info.value).startswith(str(path)) and text in str(info.value), f"{name}: {info.value}"


@pytest.mark.parametrize(
    "old, new",
    [("window", "sliding_window"), ("softcap", "logits_soft_cap"), ("alibi", "alibi_slopes"), ("decode", "decode")],
)
def test_a_file_saved_under_an_old_family_name_loads_under_the_new_one(tmp_path, old, new):
    save_case(CaseSpec("t", ((5, 2),)).build(), tmp_path / "c.pt", family=old, id="x")
    assert load_case(tmp_path / "c.pt")[1]["family"] == new


def test_replay_of_a_bad_file_is_one_usage_error(pytester, tmp_path):
    case = CaseSpec("t", ((5, 2),)).build()
    unknown = tmp_path / "unknown.pt"
    save_case(case, unknown, family="no-such-family", id="x")
    text = tmp_path / "text.pt"
    text.write_text("hello")
    for path, problem in ((unknown, "unknown family 'no-such-family'"), (text, "not a torch.save zip archive")):
        result = run_inprocess(
            pytester,
            "-p",
            "no:cacheprovider",
            "--pyargs",
            "pagedattn.conformance",
            "--backend=reference",
            "--replay",
            str(path),
        )
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
    assert glob_match(pattern, text) is want


def test_expectation_patterns_match_in_linear_time():
    pattern = "*a" * 14 + "b"  # a backtracking regex tries C(n, 14) splits of the text
    text = "a" * 400
    start = time.perf_counter()
    assert not glob_match(pattern, text)
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5, f"a 14-star pattern took {elapsed:.2f} s on a 400-character id"
