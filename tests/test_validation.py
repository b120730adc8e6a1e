"""The problem's rules (``pagedattn.validation``), stated once: one table of bad inputs,
run against both callers, ``PagedCase`` and the Triton kernel's host checks. Each must
raise a ``ProblemError`` that names the same field and states the bound."""

import numpy as np
import pytest
import torch

from pagedattn import PagedCase
from pagedattn.cases import CaseSpec
from pagedattn.kernels import checks, tlsim_programs
from pagedattn.oracle import case as case_module
from pagedattn.validation import ProblemError, check_tensors
from tests.asserts import assert_equal

E4M3 = torch.float8_e4m3fn
# fp32 (the kernel's dtypes), T=4 tokens, B=2 sequences, block_size 4, 7 blocks, 4 columns
BASE = CaseSpec("t", ((9, 3), (5, 1)), num_heads=4, num_kv_heads=2, head_dim=16, block_size=4)


def _args() -> dict:
    case = BASE.build()
    return dict(case.tensors(), scale=None)


def _i32(*xs):
    return torch.tensor(xs, dtype=torch.int32)


def _strided(t):
    """The same values with a non-unit stride in the last dimension."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _set(**changes):
    return lambda a: a.update(changes)


def _fp8(**changes):
    """An fp8 cache (the only kind that takes scales) plus ``changes``."""
    return lambda a: a.update(key_cache=a["key_cache"].to(E4M3), value_cache=a["value_cache"].to(E4M3), **changes)


def _entry(table: str, index: tuple, value: int):
    def change(a):
        a[table] = a[table].clone()
        a[table][index] = value

    return change


BOTH, KERNEL = "both", "kernel"  # who rejects it (KERNEL: a kernel limit, a valid case)
# name: (who, field, text of the bound, change to the base arguments)
BAD = {
    "query-rank": (BOTH, "query", "rank 3", lambda a: a.update(query=a["query"][0])),
    "key-rank": (BOTH, "key_cache", "rank 4", lambda a: a.update(key_cache=a["key_cache"][0])),
    "value-shape": (
        BOTH,
        "value_cache",
        "must have the key_cache's [num_blocks, block_size, num_kv_heads]",
        lambda a: a.update(value_cache=a["value_cache"][:, :1]),
    ),
    "value-dtype": (
        BOTH,
        "value_cache",
        "must have the key_cache dtype",
        lambda a: a.update(value_cache=a["value_cache"].half()),
    ),
    "fp8-k-only": (
        BOTH,
        "value_cache",
        "must have the key_cache dtype",
        lambda a: a.update(key_cache=a["key_cache"].to(E4M3)),
    ),
    "dtype-mix": (BOTH, "key_cache", "must be the query dtype", lambda a: a.update(key_cache=a["key_cache"].half())),
    "kv-other-dtype": (
        BOTH,
        "key_cache",
        "must be the query dtype",
        lambda a: a.update(key_cache=a["key_cache"].half(), value_cache=a["value_cache"].half()),
    ),
    "head-dim": (
        BOTH,
        "key_cache",
        "must have the query head_dim 8, got head_dim 16",
        lambda a: a.update(query=a["query"][..., :8].contiguous()),
    ),
    "gqa": (BOTH, "query", "multiple of num_kv_heads 2", lambda a: a.update(query=a["query"][:, :3].contiguous())),
    "query-int": (BOTH, "query", "must be float32/float16/bfloat16", lambda a: a.update(query=a["query"].int())),
    "fp8-query": (BOTH, "query", "must be float32/float16/bfloat16", lambda a: a.update(query=a["query"].to(E4M3))),
    "tables-int64": (BOTH, "block_tables", "int32", lambda a: a.update(block_tables=a["block_tables"].long())),
    "seqlens-int64": (BOTH, "seq_lens", "int32", lambda a: a.update(seq_lens=a["seq_lens"].long())),
    "loc-float": (BOTH, "query_start_loc", "int32", lambda a: a.update(query_start_loc=a["query_start_loc"].float())),
    "tables-rows": (
        BOTH,
        "block_tables",
        "a row per sequence (2 in seq_lens)",
        lambda a: a.update(block_tables=a["block_tables"][:1]),
    ),
    "loc-len": (
        BOTH,
        "query_start_loc",
        "num_seqs + 1 = 3",
        lambda a: a.update(query_start_loc=a["query_start_loc"][:2]),
    ),
    "loc-start": (BOTH, "query_start_loc", "start at 0", _set(query_start_loc=_i32(1, 2, 4))),
    "loc-end": (BOTH, "query_start_loc", "end at num_tokens = 4", _set(query_start_loc=_i32(0, 1, 3))),
    "loc-decreasing": (BOTH, "query_start_loc", "never decrease", _set(query_start_loc=_i32(0, 5, 4))),
    "empty-query": (BOTH, "query_start_loc", ">= 1 new token", _set(query_start_loc=_i32(0, 0, 4))),
    "seq-shorter-than-query": (BOTH, "seq_lens", "below its query length 3", _set(seq_lens=_i32(2, 5))),
    "too-few-blocks": (BOTH, "block_tables", "needs 5 blocks", _set(seq_lens=_i32(17, 5))),
    "block-id-negative": (
        BOTH,
        "block_tables",
        "[1, 0] = -1 outside [0, num_blocks=7)",
        _entry("block_tables", (1, 0), -1),
    ),
    "block-id-too-big": (
        BOTH,
        "block_tables",
        "[0, 2] = 1000000 outside [0, num_blocks=7)",
        _entry("block_tables", (0, 2), 10**6),
    ),
    "not-a-tensor": (BOTH, "seq_lens", "torch.Tensor", _set(seq_lens=[9, 5])),
    "device": (BOTH, "seq_lens", "one device for all", lambda a: a.update(seq_lens=a["seq_lens"].to("meta"))),
    "meta": (
        BOTH,
        "query",
        "meta device",
        lambda a: a.update({k: v.to("meta") for k, v in a.items() if isinstance(v, torch.Tensor)}),
    ),
    "block-size-zero": (
        BOTH,
        "key_cache",
        "must have block_size (dimension 1) >= 1",
        lambda a: a.update(key_cache=a["key_cache"][:, :0], value_cache=a["value_cache"][:, :0]),
    ),
    "no-heads": (BOTH, "query", "must have num_heads (dimension 1) >= 1", lambda a: a.update(query=a["query"][:, :0])),
    "scale-zero": (BOTH, "scale", "> 0", _set(scale=0.0)),
    "scale-nan": (BOTH, "scale", "finite", _set(scale=float("nan"))),
    "scale-string": (BOTH, "scale", "finite float > 0, got '0.25' of type str", _set(scale="0.25")),
    "scale-bool": (BOTH, "scale", "of type bool", _set(scale=True)),
    "scale-complex": (BOTH, "scale", "of type complex", _set(scale=0.25 + 0j)),
    "scale-tensor": (BOTH, "scale", "of type Tensor", _set(scale=torch.tensor(0.25))),
    # the variants
    "window-zero": (BOTH, "sliding_window", "int >= 1", _set(sliding_window=0)),
    "window-float": (BOTH, "sliding_window", "int >= 1", _set(sliding_window=4.0)),
    "window-bool": (BOTH, "sliding_window", "int >= 1", _set(sliding_window=True)),
    "cap-negative": (BOTH, "logits_soft_cap", "> 0", _set(logits_soft_cap=-1.0)),
    "cap-zero": (BOTH, "logits_soft_cap", "finite float > 0", _set(logits_soft_cap=0.0)),
    "cap-inf": (BOTH, "logits_soft_cap", "finite", _set(logits_soft_cap=float("inf"))),
    "cap-nan": (BOTH, "logits_soft_cap", "finite float > 0", _set(logits_soft_cap=float("nan"))),
    "alibi-shape": (BOTH, "alibi_slopes", "[num_heads] = (4,)", _set(alibi_slopes=torch.ones(3))),
    "alibi-dtype": (BOTH, "alibi_slopes", "float32", _set(alibi_slopes=torch.ones(4, dtype=torch.float16))),
    "alibi-list": (BOTH, "alibi_slopes", "torch.Tensor", _set(alibi_slopes=[1.0] * 4)),
    "alibi-nan": (BOTH, "alibi_slopes", "finite", _set(alibi_slopes=torch.tensor([0.5, float("nan"), 0, 0]))),
    "sinks-nan": (BOTH, "sinks", "finite", _set(sinks=torch.tensor([0.0, float("nan"), 0.0, 0.0]))),
    "sinks-inf": (BOTH, "sinks", "finite", _set(sinks=torch.tensor([0.0, 0.0, float("-inf"), 0.0]))),
    "sinks-device": (BOTH, "sinks", "one device for all", _set(sinks=torch.zeros(4, device="meta"))),
    "sinks-list": (BOTH, "sinks", "torch.Tensor", _set(sinks=[0.0] * 4)),
    "k-scale-not-fp8": (BOTH, "k_scale", "fp8 caches only", _set(k_scale=0.5)),
    "v-scale-not-fp8": (BOTH, "v_scale", "fp8 caches only", _set(v_scale=2.0)),
    "k-scale-bool": (BOTH, "k_scale", "of type bool", _fp8(k_scale=True)),
    "v-scale-zero": (BOTH, "v_scale", "> 0", _set(v_scale=0.0)),
    "v-scale-inf": (BOTH, "v_scale", "finite float > 0", _set(v_scale=float("inf"))),
    # the kernel's own limits: a valid case that this kernel cannot take
    "query-fp64": (
        KERNEL,
        "query",
        "must be float32/float16/bfloat16, got torch.float64",
        lambda a: a.update(**{k: a[k].double() for k in ("query", "key_cache", "value_cache")}),
    ),
    "strided-d": (KERNEL, "query", "contiguous", lambda a: a.update(query=_strided(a["query"]))),
    "strided-table": (
        KERNEL,
        "block_tables",
        "contiguous",
        lambda a: a.update(block_tables=_strided(a["block_tables"])),
    ),
    "strided-alibi": (KERNEL, "alibi_slopes", "contiguous", _set(alibi_slopes=torch.ones(8)[::2])),
    "scale-over-fp32": (KERNEL, "scale", "fp32's normal range", _set(scale=1e39)),
    "scale-under-fp32": (KERNEL, "scale", "fp32's normal range", _set(scale=1e-40)),
    "scale-times-k-scale": (
        KERNEL,
        "k_scale",
        "scale * k_scale must be inside fp32's normal range",
        _fp8(scale=1e20, k_scale=1e20),
    ),
    "default-scale-times-k-scale": (KERNEL, "k_scale", "fp32's normal range", _fp8(k_scale=2e39)),
    "v-scale-over-fp32": (KERNEL, "v_scale", "fp32's normal range", _fp8(v_scale=3.5e38)),
    "window-over-int32": (KERNEL, "sliding_window", "2**31 - 1", _set(sliding_window=2**31)),
}

_TENSORS = ("query", "key_cache", "value_cache", "block_tables", "seq_lens", "query_start_loc")


def _case(a: dict) -> None:
    PagedCase(**a)


def _kernel(a: dict) -> None:
    """What the kernel's ``prepare`` checks, in its order (no triton needed)."""
    heads = {k: a[k] for k in ("alibi_slopes", "sinks") if k in a}
    tensors = {k: a[k] for k in _TENSORS}
    checks.check_paged_inputs(**tensors, scale=a.get("scale"), **heads)
    options = {k: v for k, v in a.items() if k not in _TENSORS}
    checks.check_variants(a["query"], a["key_cache"], **options)


CALLERS = {"PagedCase": _case, "paged_attention": _kernel}


#: what ``check_variants`` alone sees: the options and the per-head tensors' structure
#: (their finiteness is a value, read by ``check_paged_inputs``' one transfer)
_OPTION_FIELDS = {"scale", "sliding_window", "logits_soft_cap", "k_scale", "v_scale", "alibi_slopes", "sinks"}


#: values read on the device (the per-head tensors' finiteness): check_paged_inputs' job
_VALUE_READS = {"alibi-nan", "sinks-nan", "sinks-inf"}


@pytest.mark.parametrize("name", sorted(n for n, e in BAD.items() if e[1] in _OPTION_FIELDS and n not in _VALUE_READS))
def test_check_variants_alone_names_field_and_bound(name):
    """The kernel's variant checks, called alone (as ``prepare`` calls them after the
    tensor checks), blame the same field: everything but a value read on the device."""
    _, field, text, change = BAD[name]
    args = _args()
    change(args)
    options = {k: v for k, v in args.items() if k not in _TENSORS}
    with pytest.raises(ProblemError) as info:
        checks.check_variants(args["query"], args["key_cache"], **options)
    msg = str(info.value)
    assert info.value.field == field and msg.startswith(f"paged_attention.{field}: ") and text in msg, f"{name}: {msg}"


def test_check_variants_returns_the_checked_variants():
    args = _args()
    var = checks.check_variants(
        args["query"],
        args["key_cache"].to(E4M3),
        scale=0.3,
        k_scale=1e30,
        v_scale=2.0,
        sliding_window=7,
        logits_soft_cap=5,
        return_lse=1,
    )
    assert (var.k_scale, var.v_scale, var.sliding_window, var.logits_soft_cap, var.return_lse) == (
        1e30,
        2.0,
        7,
        5.0,
        True,
    )
    assert isinstance(var.logits_soft_cap, float)


@pytest.mark.parametrize("caller", sorted(CALLERS))
@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_names_field_and_bound(name, caller):
    who, field, text, change = BAD[name]
    args = _args()
    change(args)
    if who == KERNEL and caller == "PagedCase":
        _case(args)  # inside the problem: a case accepts it
        return
    with pytest.raises(ProblemError) as info:
        CALLERS[caller](args)
    err, msg = info.value, str(info.value)
    assert err.field == field and msg.startswith(f"{caller}.{field}: "), f"{name}: {msg!r} does not blame {field!r}"
    assert text in msg, f"{name}: message {msg!r} does not state the bound {text!r}"
    assert isinstance(err, ValueError), "a ProblemError is a ValueError (what callers catch)"


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_both_callers_accept_the_base_and_its_variants(caller):
    args = _args()
    CALLERS[caller](args)
    _fp8(
        scale=np.float64(0.3),
        k_scale=1e30,
        v_scale=2.0,
        sliding_window=3,
        logits_soft_cap=5.0,
        alibi_slopes=torch.ones(4),
        sinks=torch.zeros(4),
    )(args)
    CALLERS[caller](args)


def test_padding_entries_are_not_validated():
    args = _args()
    _entry("block_tables", (1, 3), 12345)(args)  # past sequence 1's last block: padding, never read
    for caller in CALLERS.values():
        caller(args)


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_the_values_are_read_in_one_transfer(monkeypatch, caller):
    """Lengths, offsets, block ids and the per-head tensors' finiteness: one transfer."""
    args = _args()
    args.update(alibi_slopes=torch.ones(4), sinks=torch.zeros(4))
    calls = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: calls.append(1) or real(self))
    CALLERS[caller](args)
    assert len(calls) == 1, f"{caller}: {len(calls)} device-to-host transfers, expected one"


def test_no_sync_mode_reads_no_values(monkeypatch):
    args = _args()
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: pytest.fail("read the device without sync"))
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda self: pytest.fail("read the device without sync"))
    tensors = [args[k] for k in _TENSORS]
    assert check_tensors("x", *tensors, sync=False) is None
    with pytest.raises(ProblemError, match="x.seq_lens: must be int32"):
        check_tensors("x", *tensors[:4], tensors[4].long(), tensors[5], sync=False)


def test_clone_and_to_copy_a_valid_case_without_validating_it(monkeypatch):
    case = BASE.build()
    monkeypatch.setattr(case_module, "check_problem", lambda *a, **k: pytest.fail("validated a copy"))
    for copy in (case.clone(), case.to("cpu")):
        assert copy.query_lens == case.query_lens and copy.seq_lens_list == case.seq_lens_list
        assert_equal(copy.query, case.query, "a copy's query")
        assert copy.scale == case.scale, f"a copy's scale {copy.scale} is not {case.scale}"
    assert case.clone().query.data_ptr() != case.query.data_ptr()


# ---------------------------------------------------------------- the slot operations
def _slots_args() -> dict:
    pool = BASE.build().key_cache.clone()  # [7, 4, 2, 16]: 28 slots
    return dict(pool=pool, slot_mapping=torch.tensor([0, 27, 5]), new=torch.zeros(3, 2, 16))


BOTH_OPS, WRITE = ("gather_slots", "write_slots"), ("write_slots",)
# name: (operations that must refuse it, field, text of the bound, change)
BAD_SLOTS = {
    "slot-past-the-pool": (
        BOTH_OPS,
        "slot_mapping",
        "got slots from 0 to 28",
        _set(slot_mapping=torch.tensor([0, 28, 5])),
    ),
    "slots-list": (BOTH_OPS, "slot_mapping", "torch.Tensor", _set(slot_mapping=[0, 1, 2])),
    "slots-float": (BOTH_OPS, "slot_mapping", "int32 or int64", _set(slot_mapping=torch.tensor([0.0, 1.0, 2.0]))),
    "slots-2d": (BOTH_OPS, "slot_mapping", "[n] int32 or int64", _set(slot_mapping=torch.tensor([[0, 1, 2]]))),
    "slots-device": (
        BOTH_OPS,
        "slot_mapping",
        "pool's device",
        _set(slot_mapping=torch.tensor([0, 1, 2], device="meta")),
    ),
    "new-rows": (WRITE, "new", "of shape (3, 2, 16)", _set(new=torch.zeros(2, 2, 16))),
    "new-dtype": (WRITE, "new", "torch.float32", _set(new=torch.zeros(3, 2, 16, dtype=torch.float16))),
    "pool-strided": (WRITE, "pool", "contiguous", lambda a: a.update(pool=_strided(a["pool"]))),
}
SLOT_OPS = {
    "gather_slots": lambda a: tlsim_programs.gather_slots(a["pool"], a["slot_mapping"]),
    "write_slots": lambda a: tlsim_programs.write_slots(a["pool"], a["slot_mapping"], a["new"]),
}


@pytest.mark.parametrize("name, op", [(n, op) for n in sorted(BAD_SLOTS) for op in BAD_SLOTS[n][0]])
def test_bad_slot_operation_names_field_and_bound(name, op):
    _, field, text, change = BAD_SLOTS[name]
    args = _slots_args()
    change(args)
    with pytest.raises(ProblemError) as info:
        SLOT_OPS[op](args)
    msg = str(info.value)
    assert info.value.field == field and msg.startswith(f"{op}.{field}: ") and text in msg, f"{name}: {msg!r}"


def test_a_negative_slot_is_skipped_by_a_write_and_refused_by_a_gather():
    args = _slots_args()
    args["slot_mapping"] = torch.tensor([0, -1, 5])
    SLOT_OPS["write_slots"](args)  # slot < 0: skip the row
    with pytest.raises(ProblemError, match=r"gather_slots.slot_mapping: must hold slots \[0, num_blocks \* block_size"):
        SLOT_OPS["gather_slots"](args)
