"""The Triton kernel: host-side checks and launch arithmetic (anywhere), the kernel on
the interpreter or a GPU, and an ahead-of-time compile for Hopper on this CPU."""

import dataclasses
import functools
import json
import os
import subprocess
import sys

import pytest
import torch

from pagedattn.cases import CaseSpec
from pagedattn.kernels import host
from pagedattn.oracle import check_attention, check_attention_lse, paged_attention_reference_lse

triton = pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")
from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402  (after the interpreter is decided)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

from pagedattn.adapters.triton import MIN_INTERPRETER_TRITON  # noqa: E402

# The interpreter of older Triton cannot run the kernel; the backend reports that as
# unsupported (tests/test_bundled_backends.py), these direct runs are skipped with it.
runs_kernel = pytest.mark.skipif(
    DEVICE == "cpu" and tuple(int(x) for x in triton.__version__.split(".")[:2]) < MIN_INTERPRETER_TRITON,
    reason=f"triton {triton.__version__}'s interpreter cannot run the kernel (needs >= 3.6)",
)

# a matrix's members past the default run's representatives (5-10 s each on the interpreter):
# CI's second step runs them (-m slow); on a GPU run them all with -m "slow or not slow"
_SLOW = pytest.mark.slow


def _args(case):
    return [case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens, case.query_start_loc]


BASE = CaseSpec("t", ((9, 3), (5, 1)), num_heads=4, num_kv_heads=2, head_dim=16, block_size=4)


def _bad(field, fn):
    case = BASE.build()
    args = dict(zip(["query", "key_cache", "value_cache", "block_tables", "seq_lens", "query_start_loc"], _args(case)))
    fn(args)
    return args


def _i32(*xs):
    return torch.tensor(xs, dtype=torch.int32)


def _strided(t):
    """The same values with a non-unit stride in the last dimension."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def test_bad_variant_fails_before_any_launch(monkeypatch):
    monkeypatch.setattr(tpa, "plan_launch", lambda *a: pytest.fail("planned a launch for invalid input"))
    args = _bad("query", lambda a: None)
    with pytest.raises(ValueError, match="sinks"):
        tpa.paged_attention(**args, sinks=torch.zeros(7))


@runs_kernel
def test_decode_splits_before_the_window_are_neither_computed_nor_merged():
    # 1100 keys, window 77: only the last split holds visible keys. NaN in every other
    # split's scratch proves the merge never reads them.
    spec = CaseSpec("t", ((1100, 1), (600, 1)), num_heads=8, sliding_window=77, sinks=True)
    case = spec.build().to(DEVICE)
    kw = dict(scale=case.scale, sliding_window=77, sinks=case.sinks, return_lse=True)
    prep = tpa.prepare(*_args(case), **kw)
    assert prep.part_acc is not None and prep.part_ml is not None
    assert prep.plan.max_splits == -(-1100 // host.decode_split(1100)) >= 3
    prep.part_acc.fill_(float("nan"))
    prep.part_ml.fill_(float("nan"))
    out, lse = tpa.run(prep, case.query, case.key_cache, case.value_cache)
    out_check, lse_check = check_attention_lse(out, lse, case)
    assert out_check.passed and lse_check.passed, f"{out_check}\n{lse_check}"


@runs_kernel
@pytest.mark.parametrize("spp, slots", [(4, 2), (2, 8), (8, 2)], ids=["parts", "splits", "whole-parts"])
def test_a_program_of_whole_parts_stores_one_state_a_part(spp, slots, monkeypatch):
    """The merge folds a history's splits in parts (``DECODE_FOLD_PARTS``): where a split-loop
    program's splits are whole parts (``LOOP_PARTS``) it folds them in its loop and stores one
    state a part, else one a split; the same bits either way, and as one split a program's. 8
    splits of 32 keys in 2 parts of 4, under a window from split 3 (part 0's last) and a sink:
    four splits a program store parts 0 and 1 (slots 2-7 untouched, NaN), two a program splits
    3-7, eight a program (its merge stored, not in its loop) the two parts."""
    for name, value in (("SPLIT_SIZE", 32), ("DECODE_BLOCK_N", 16), ("SHORT_UNDER", 0), ("DECODE_FOLD_PARTS", 2)):
        monkeypatch.setattr(host, name, value)
    monkeypatch.setattr(host, "DECODE_MERGE_IN_LOOP", False)
    spec = CaseSpec(
        "t", ((256, 1),), num_heads=4, num_kv_heads=2, head_dim=32, block_size=8, sliding_window=150, sinks=True
    )
    case = spec.build().to(DEVICE)
    kw = dict(scale=case.scale, sliding_window=150, sinks=case.sinks, return_lse=True)
    with monkeypatch.context() as m:
        m.setattr(host, "DECODE_SPLIT_LOOP", False)
        ref = tpa.paged_attention(*_args(case), **kw)
    monkeypatch.setattr(host, "DECODE_SPLIT_LOOP", True)
    monkeypatch.setattr(host, "DECODE_SPLITS_PER_PROGRAM", spp)
    prep = tpa.prepare(*_args(case), **kw)
    assert prep.plan.max_splits == 8 and prep.plan.decode.SPLITS_PER_PROGRAM == spp
    assert prep.plan.decode.LOOP_PARTS == (slots == 2)
    prep.part_acc.fill_(float("nan"))
    prep.part_ml.fill_(float("nan"))
    out, lse = tpa.run(prep, case.query, case.key_cache, case.value_cache)
    c1, c2 = check_attention_lse(out, lse, case)
    assert c1.passed and c2.passed and not (c1.warning or c2.warning), f"{c1}\n{c2}"
    assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1]), "other bits than one split a program"
    written = ~prep.part_ml[0, :, :, 0].isnan().all(dim=-1)  # [splits]: a state stored in the slot
    expect = [True] * 2 + [False] * 6 if slots == 2 else [False] * 3 + [True] * 5
    assert written.tolist() == expect


@runs_kernel
@pytest.mark.parametrize("fold", [pytest.param(1, marks=_SLOW), 2, pytest.param(3, marks=_SLOW)])
def test_programs_of_whole_parts_at_every_fold_compute_one_split_a_programs_bits(fold, monkeypatch):
    """The host and the kernel each compute a history's part size (``host.decode_fold``, the
    kernel's ``fold``): where they disagree, ``LOOP_PARTS`` programs would straddle the kernel's
    parts and drop splits. Histories of 4k to 4k+3 splits (k = ``fold``, ``DECODE_FOLD_PARTS``
    4), and single ones of 9 and 11 splits, at k and 2k splits a program: ``LOOP_PARTS``, the
    bits of one split a program, the oracle's verdict."""
    for name, value in (("SPLIT_SIZE", 16), ("DECODE_BLOCK_N", 16), ("SHORT_UNDER", 0), ("LONG_FROM", 10**6)):
        monkeypatch.setattr(host, name, value)
    monkeypatch.setattr(host, "DECODE_MERGE_IN_LOOP", False)
    batches = [[16 * (4 * fold + r) - 3 for r in range(4)]] + ([[16 * 9 - 5], [16 * 11]] if fold == 2 else [])
    for lens in batches:
        folds = {host.decode_fold(-(-n // 16)) for n in lens}
        assert folds == {fold} or (fold == 2 and len(lens) == 1), (lens, folds)
        case = CaseSpec("t", tuple((n, 1) for n in lens), num_heads=4, num_kv_heads=2, head_dim=32, dtype=torch.float16)
        case = case.build()
        case = case.to(DEVICE)
        with monkeypatch.context() as m:
            m.setattr(host, "DECODE_SPLIT_LOOP", False)
            ref = tpa.paged_attention(*_args(case), scale=case.scale)
        for spp in (fold, 2 * fold):
            with monkeypatch.context() as m:
                m.setattr(host, "DECODE_SPLIT_LOOP", True)
                m.setattr(host, "DECODE_SPLITS_PER_PROGRAM", spp)
                prep = tpa.prepare(*_args(case), scale=case.scale)
                assert prep.plan.decode.LOOP_PARTS == (max(folds) > 1), (lens, spp)
                out = tpa.run(prep, case.query, case.key_cache, case.value_cache)
            assert torch.equal(out, ref), f"{lens} at {spp} splits a program: other bits than one split a program"
        check = check_attention(ref, case)
        assert check.passed and not check.warning, str(check)


@runs_kernel
def test_lse_is_float32_natural_log_of_the_denominator():
    case = CaseSpec("t", ((40, 7), (30, 1)), num_heads=4, alibi_slopes=True).build().to(DEVICE)
    out, lse = tpa.paged_attention(*_args(case), scale=case.scale, alibi_slopes=case.alibi_slopes, return_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == (case.num_tokens, case.num_heads)
    ref = paged_attention_reference_lse(case)[1]
    assert float((lse.double() - ref).abs().max()) < 1e-4  # natural log, not log2 (ln 2 apart)


@pytest.mark.parametrize("field", ["alibi_slopes", "sinks"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_slopes_and_sinks_fail_before_any_launch(monkeypatch, field, bad):
    # prepare() hands them to the core checks' one device-to-host transfer
    monkeypatch.setattr(tpa, "plan_launch", lambda *a: pytest.fail("planned a launch for invalid input"))
    args = _bad("query", lambda a: None)
    values = torch.ones(args["query"].shape[1], dtype=torch.float32)
    values[-1] = bad
    with pytest.raises(ValueError, match=f"{field}: must be finite"):
        tpa.paged_attention(**args, **{field: values})


def test_scale_times_k_scale_must_stay_in_fp32_before_any_launch(monkeypatch):
    monkeypatch.setattr(tpa, "plan_launch", lambda *a: pytest.fail("planned a launch for invalid input"))
    args = _bad("query", lambda a: None)
    with pytest.raises(ValueError, match="scale"):
        tpa.paged_attention(**args, scale=1e39)


def test_bad_input_fails_before_any_launch(monkeypatch):
    monkeypatch.setattr(tpa, "plan_launch", lambda *a: pytest.fail("planned a launch for invalid input"))
    args = _bad("block_tables", lambda a: a["block_tables"].__setitem__((0, 0), 10**6))
    with pytest.raises(ValueError, match="block_tables"):
        tpa.paged_attention(**args)


def test_bad_scale_and_out():
    args = _bad("query", lambda a: None)
    with pytest.raises(ValueError, match="scale"):
        host.check_paged_inputs(**args, scale=-1.0)
    with pytest.raises(ValueError, match="out"):
        host.check_paged_inputs(**args, out=torch.empty(3))


def _plan(
    seq_lens,
    query_lens,
    heads=32,
    kv=8,
    d=128,
    bs=16,
    dtype=torch.bfloat16,
    interpreter=False,
    kv_dtype=None,
    sliding_window=None,
):
    return host.plan_launch(seq_lens, query_lens, heads, kv, d, bs, dtype, interpreter, kv_dtype, sliding_window)


def test_launch_limits_fail_before_any_launch(monkeypatch):
    """What one launch cannot hold is a ProblemError naming the field, from sizes alone: a
    query needing more than 65535 query tiles (fp32, a GQA group of 16: one token a tile),
    a decode scratch past int32 offsets; a strided query past int32 offsets."""
    with pytest.raises(ValueError, match=r"query_start_loc.*65535"):
        _plan([70000], [70000], heads=16, kv=1, dtype=torch.float32)
    assert _plan([65535], [65535], heads=16, kv=1, dtype=torch.float32).other.grid[1] == 65535
    with monkeypatch.context() as m:  # one split a program: the scratch holds every split
        m.setattr(host, "DECODE_WHOLE_FILL", 2.0)
        with pytest.raises(ValueError, match=r"seq_lens.*2\*\*31"):
            _plan([2**24] * 66, [1] * 66)
    # whole sequences a program (528 programs, 2 waves of 264) store no split: one a sequence
    plan = _plan([2**24] * 66, [1] * 66)
    assert (plan.decode.SPLIT_WHOLE, plan.scratch_splits, plan.max_splits) == (True, 1, 2**24 // host.SPLIT_LONG)
    wide = torch.empty(4, 8, 128, device="meta").as_strided((4, 8, 128), (2**30, 128, 1))
    assert host.last_offset(wide) == 3 * 2**30 + 7 * 128 + 127 > host.INT32_MAX


def test_plan_splits_decode_from_the_rest(monkeypatch):
    plan = _plan([5000, 40, 300, 1], [1, 40, 7, 1])
    assert plan.decode_seqs == [0, 3] and plan.other_seqs == [1, 2]
    assert plan.max_splits == -(-5000 // host.SPLIT_SIZE)
    long_and_short = max(host.LONG_FROM // host.SPLIT_LONG, -(-5000 // host.SPLIT_SIZE))
    assert _plan([host.LONG_FROM, 5000], [1, 1]).max_splits == long_and_short
    assert _plan([4 * host.LONG_FROM], [1]).max_splits == 4 * host.LONG_FROM // host.SPLIT_LONG
    # the decode grid in the order the host picks for two sequences
    grids = {0: (2, plan.max_splits, 8), 1: (8 * plan.max_splits * 2, 1, 1), 2: (8, plan.max_splits, 2)}
    order = host.DECODE_GRIDS[host.DECODE_GRID]
    picked = (plan.decode.GRID_ORDER, plan.decode.grid)
    assert picked == (order, grids[order]) == host.decode_grid(2, plan.max_splits, 8)
    # the three-axis orders hold at most GRID_YZ_MAX programs on their second and third axes
    # (sequences or splits, kv heads): past that, the one-axis form
    big = host.GRID_YZ_MAX + 1
    for name, order in host.DECODE_GRIDS.items():
        monkeypatch.setattr(host, "DECODE_GRID", name)
        assert host.decode_grid(host.GRID_YZ_MAX, host.GRID_YZ_MAX, 8)[0] == order
        one_axis = (1, (8 * 3 * big, 1, 1))
        assert host.decode_grid(big, 3, 8) == {0: (0, (big, 3, 8)), 1: one_axis, 2: one_axis}[order]
        assert host.decode_grid(2, big, 8) == (1, (8 * big * 2, 1, 1))
    assert plan.decode.BLOCK_Q == 1
    assert plan.other.grid == (2, -(-40 // plan.other.BLOCK_Q), 8)
    for split in (plan.decode.SPLIT_SIZE, plan.decode.SPLIT_LONG):
        assert split % plan.decode.BLOCK_N == 0, f"{split}-key splits must hold whole {plan.decode.BLOCK_N}-key tiles"


@pytest.mark.parametrize(
    "heads, kv, d, group_pad_decode, group_pad_other, d_pad",
    [
        (32, 8, 128, 16, 4, 128),  # GQA 4: decode rows padded to the dot minimum
        (8, 8, 48, 16, 1, 64),  # MHA; head_dim padded to a power of two
        (8, 1, 80, 16, 8, 128),  # MQA
        (12, 4, 8, 16, 4, 16),  # GQA 3 padded to 4; head_dim padded up to the dot minimum
        (64, 2, 256, 32, 32, 256),  # a group wider than the dot minimum
    ],
)
def test_tile_sizes(heads, kv, d, group_pad_decode, group_pad_other, d_pad):
    plan = _plan([100, 100], [1, 9], heads, kv, d)
    assert (plan.decode.GROUP_PAD, plan.other.GROUP_PAD, plan.decode.HEAD_DIM_PAD) == (
        group_pad_decode,
        group_pad_other,
        d_pad,
    )
    for cfg in (plan.decode, plan.other):
        assert min(cfg.rows, cfg.BLOCK_N, cfg.HEAD_DIM_PAD) >= host.MIN_DOT, "tl.dot needs >= 16 on the GPU"
        assert not cfg.UPCAST


def test_plan_is_batch_invariant():
    """A sequence's launch, tiles and splits depend on that sequence alone. The launch's shape
    follows the batch: the grid, the decode's split loop, the splits a program takes, whether a
    program merges its whole sequence, and the register caps, none of which changes a bit
    (``test_launch_shape_changes_no_bit``).
    The batch here passes a wave of the split loop, so its shape differs from the sequence's alone."""
    alone_d, alone_p = _plan([3000], [1]), _plan([300], [30])
    batch = _plan([3000, 300, 17, 9000] + [3000] * 40, [1, 30, 17, 1] + [1] * 40)
    shape = ("grid", "SPLIT_GROUPS", "SPLITS_PER_PROGRAM", "SPLIT_LOOP", "SPLIT_WHOLE", "maxnreg")
    assert alone_d.decode.SPLIT_LOOP and not batch.decode.SPLIT_LOOP
    assert alone_d.decode == dataclasses.replace(batch.decode, **{k: getattr(alone_d.decode, k) for k in shape})
    fp8 = functools.partial(_plan, query_lens=[1] * 41, kv_dtype=torch.float8_e4m3fn)
    alone_f, batch_f = fp8([3000], query_lens=[1]), fp8([3000] * 41)
    assert alone_f.decode.maxnreg is None and batch_f.decode.maxnreg == host.FP8_DECODE_MAXNREG
    assert alone_f.decode == dataclasses.replace(batch_f.decode, **{k: getattr(alone_f.decode, k) for k in shape})
    assert alone_p.other == dataclasses.replace(batch.other, grid=alone_p.other.grid)


def test_bf16_upcast_only_on_the_interpreter():
    assert _plan([9], [1], interpreter=True).decode.UPCAST
    assert not _plan([9], [1], interpreter=False).decode.UPCAST
    assert not _plan([9], [1], dtype=torch.float16, interpreter=True).decode.UPCAST


KERNEL_CASES = (
    [CaseSpec("t", ((70, 1), (1, 1), (17, 1)), dtype=dt) for dt in (torch.float32, torch.float16, torch.bfloat16)]
    + [
        CaseSpec(
            "t",
            ((33, 33), (40, 7)),
            num_heads=6,
            num_kv_heads=2,
            head_dim=80,
            block_size=3,
            layout="permuted",
            scale=0.3,
            dtype=dt,
        )
        for dt in (torch.float32, torch.bfloat16)
    ]
    + [
        # fp8 caches: V widened through split/join, bf16 queries on fp16 dots (see _query_rows)
        CaseSpec(
            "t",
            ((300, 1), (45, 1), (40, 9)),
            num_heads=8,
            num_kv_heads=2,
            head_dim=64,
            dtype=dt,
            kv_dtype=kv,
            k_scale=0.5,
            v_scale=2.0,
            query_gain=40.0,
            layout="permuted",
        )
        for dt, kv in ((torch.bfloat16, torch.float8_e4m3fn), (torch.float16, torch.float8_e5m2))
    ]
)


@runs_kernel
@pytest.mark.parametrize("spec", KERNEL_CASES, ids=lambda s: s.id)
def test_kernel_within_policy(spec):
    case = spec.build().to(DEVICE)
    out = tpa.paged_attention(*_args(case), scale=case.scale, k_scale=case.k_scale, v_scale=case.v_scale)
    check = check_attention(out, case)
    assert check.passed and not check.warning, str(check)


@runs_kernel
@pytest.mark.parametrize("grid", sorted(host.DECODE_GRIDS))
@pytest.mark.parametrize("long_from, max_splits", [(10**9, 3), (48, 2)], ids=["short-splits", "long-splits-from-48"])
@pytest.mark.parametrize("spec", KERNEL_CASES[:3], ids=lambda s: s.id)
def test_many_splits_merge_within_policy(spec, long_from, max_splits, grid, monkeypatch):
    """Small splits, so the log-sum-exp merge of many partial states runs on small cases;
    with ``long_from=48`` the 70-key history takes 64-key splits, the others 32. Every decode
    grid order: several sequences and splits count themselves done per (sequence, kv head)."""
    monkeypatch.setattr(host, "DECODE_GRID", grid)
    monkeypatch.setattr(host, "SHORT_UNDER", 0)  # the regular tiers (the short one: its own test)
    monkeypatch.setattr(host, "SPLIT_SIZE", 32)
    monkeypatch.setattr(host, "SPLIT_LONG", 64)
    monkeypatch.setattr(host, "LONG_FROM", long_from)
    monkeypatch.setattr(host, "DECODE_BLOCK_N", 16)
    case = spec.build().to(DEVICE)
    plan = host.plan_launch(case.seq_lens_list, case.query_lens, 4, 2, 64, 16, case.dtype, False)
    assert plan.max_splits == max_splits, f"{case.seq_lens_list}: {plan.max_splits} splits, expected {max_splits}"
    check = check_attention(tpa.paged_attention(*_args(case), scale=case.scale), case)
    assert check.passed and not check.warning, str(check)


def test_decode_launch_shape_fits_the_split_loop_in_one_wave(monkeypatch):
    """``decode_launch_shape``: the split loop with the fewest splits a program (up to
    ``DECODE_SPP_MAX`` and the history's) that fit the launch in ``DECODE_WAVE`` programs, else
    one split a program without the loop; the switches force either; the plan's grid holds the
    split groups."""
    monkeypatch.setattr(host, "DECODE_WAVE", 64)
    monkeypatch.setattr(host, "DECODE_SPP_MAX", 4)
    monkeypatch.setattr(host, "DECODE_WHOLE_FILL", 2.0)  # never past one wave (its own test)

    def shape(n, splits, heads, **kw):  # n histories of `splits` 512-key splits each
        return host.decode_launch_shape([(splits, 0, 512)] * n, heads, **kw)[:2]

    assert shape(1, 8, 8) == (True, 1)  # 64 programs: one wave
    assert shape(2, 8, 8) == (True, 2) and shape(3, 8, 8) == (True, 4)  # 3 * 8 * 2 programs
    assert shape(2, 9, 8) == (True, 3)  # the fewest splits a program that fit: 2 * 8 * 3
    assert shape(5, 8, 8) == (False, 1) and shape(4, 17, 8) == (False, 1)  # no fit up to the cap
    assert shape(64, 1, 8) == (False, 1) and shape(8, 1, 8) == (True, 1)  # never past the history's splits
    plan = _plan([5000] * 2, [1] * 2, heads=32, kv=8)  # 10 splits of 512 each: 2 * 8 * 4 programs of 3
    assert (plan.decode.SPLIT_LOOP, plan.decode.SPLITS_PER_PROGRAM, plan.decode.SPLIT_GROUPS) == (True, 3, 4)
    assert (plan.decode.GRID_ORDER, plan.decode.grid) == host.decode_grid(2, 4, 8)
    assert not _plan([5000] * 9, [1] * 9).decode.SPLIT_LOOP
    monkeypatch.setattr(host, "DECODE_SPLIT_LOOP", True)
    assert shape(5, 8, 8) == (True, 1) and shape(1, 8, 8) == (True, 1)
    monkeypatch.setattr(host, "DECODE_SPLITS_PER_PROGRAM", 3)
    assert shape(1, 8, 8) == (True, 3) and shape(1, 2, 8) == (True, 2)
    plan = _plan([5000], [1])
    assert (plan.decode.SPLITS_PER_PROGRAM, plan.decode.SPLIT_GROUPS, plan.max_splits) == (3, 4, 10)
    monkeypatch.setattr(host, "DECODE_SPLIT_LOOP", False)
    assert shape(1, 8, 8) == (False, 1)
    monkeypatch.setattr(host, "DECODE_SPLIT_LOOP", None)
    monkeypatch.setattr(host, "DECODE_SPLITS_PER_PROGRAM", 0)
    # an fp8 cache takes its own rule (its own test), and the register cap only in a launch of
    # more than DECODE_WAVE programs at one split each
    assert shape(1, 8, 8, kv_fp8=True) == (False, 1)
    fp8 = functools.partial(_plan, query_lens=[1], kv_dtype=torch.float8_e4m3fn)
    assert fp8([100]).decode.maxnreg is None and not fp8([100]).decode.SPLIT_LOOP  # 8 programs
    assert fp8([5000]).decode.maxnreg == host.FP8_DECODE_MAXNREG  # 8 * 10 programs
    assert fp8([5000], heads=8, kv=8, d=256).decode.maxnreg is None  # wider tiles would spill
    assert fp8([512 * 8]).decode.maxnreg is None and fp8([512 * 8 + 1]).decode.maxnreg  # 64 programs; 72
    assert fp8([5000], dtype=torch.float32).decode.maxnreg is None  # fp32 queries: their own tiles
    # the split sizes are checked whatever the batch's histories: the short tier's too
    monkeypatch.setattr(host, "SHORT_UNDER", 4096)
    monkeypatch.setattr(host, "SPLIT_SHORT", 100)
    with pytest.raises(RuntimeError, match="splits of 100 keys are not whole tiles of 64"):
        _plan([5000], [1])
    monkeypatch.setattr(host, "SHORT_UNDER", 0)
    # the kernel walks a program's splits in whole tiles: a split size that is not is refused
    monkeypatch.setattr(host, "SPLIT_SIZE", 40)
    with pytest.raises(RuntimeError, match="splits of 40 keys are not whole tiles of 64"):
        _plan([5000], [1])


def test_decode_launch_shape_over_an_fp8_cache(monkeypatch):
    """An fp8 cache: the split loop at the most splits a program, from ``FP8_DECODE_SPP`` halving
    down to 2, at which at least ``FP8_LOOP_MIN_PROGRAMS`` programs (a kv head each) have keys to
    read, filling at least ``FP8_LOOP_FILL`` of their waves' slots (``FP8_DECODE_WAVE``),
    balanced, short of a whole history; else one split a program without the loop, whatever fits
    a wave. ``FP8_DECODE_SPLIT_LOOP`` gives it the bf16 cache's rule, ``DECODE_SPLIT_LOOP``
    forces either."""
    monkeypatch.setattr(host, "FP8_DECODE_SPP", 4)
    monkeypatch.setattr(host, "FP8_LOOP_MIN_PROGRAMS", 512)
    monkeypatch.setattr(host, "FP8_DECODE_WAVE", 528)
    monkeypatch.setattr(host, "FP8_LOOP_FILL", 0.8)

    def shape(work, heads=8, cap_ok=True):
        return host.decode_launch_shape(work, heads, kv_fp8=True, cap_ok=cap_ok)

    assert shape([(8, 0, 512)] * 32) == (True, 4, False)  # 32 * 2 * 8 = 512 programs of four splits
    assert shape([(8, 0, 512)] * 32, cap_ok=False) == (False, 1, False)  # the waves assume the cap
    assert shape([(8, 0, 512)] * 16) == (True, 2, False)  # 256 at four; 512 at two
    assert shape([(8, 0, 512)] * 15) == (False, 1, False)  # 480 at two: too few
    assert shape([(9, 0, 512)] * 13) == (True, 2, False)  # 13 * 5 * 8 = 520 (the last program one split)
    assert shape([(4, 0, 512)] * 64) == (True, 2, False)  # four a program would be whole histories
    assert shape([(2, 0, 512)] * 64) == (False, 1, False)  # ... and two here
    assert shape([(1, 0, 512)] * 600) == (False, 1, False)  # single splits: nothing to walk
    # the waves' slots: 768 programs at four fill 0.73 of two waves of 528, 1536 at two 0.97
    assert shape([(8, 0, 512)] * 48) == (True, 2, False)
    assert shape([(8, 0, 512)] * 66) == (True, 4, False)  # 1056 at four: two full waves
    assert shape([(4, 0, 512)] * 40) == (False, 1, False)  # 640 at two: 0.61 of two waves
    with monkeypatch.context() as m:
        m.setattr(host, "FP8_LOOP_FILL", 0.6)
        assert shape([(4, 0, 512)] * 40) == (True, 2, False)
    # the programs before a window read nothing and are not counted: splits 6 and 7 of 8 visible,
    # one program a history at four or two
    assert host.decode_work(4096, sliding_window=1000) == (8, 6, 512)
    assert shape([host.decode_work(4096, sliding_window=1000)] * 63) == (False, 1, False)  # 63 * 1 * 8
    assert shape([host.decode_work(4096, sliding_window=1000)] * 64) == (True, 4, False)  # 512
    # balance (mean work over the longest program's, DECODE_BALANCE 0.75), a kv head: 16 programs
    # of four splits beside 100 of one (0.353; 928 programs fill 0.88), 32 of two beside them (0.621)
    assert shape([(8, 0, 512)] * 8 + [(1, 0, 512)] * 100) == (False, 1, False)
    # 40 of four beside 26 of one (0.705; 528 programs, one full wave), 80 of two beside them
    # (0.877; 848 programs fill 0.803 of two waves, just over FP8_LOOP_FILL)
    assert shape([(8, 0, 512)] * 20 + [(1, 0, 512)] * 26) == (True, 2, False)
    assert shape([(8, 0, 512)] * 26 + [(1, 0, 512)] * 14) == (True, 4, False)  # 52 beside 14: 0.841
    monkeypatch.setattr(host, "FP8_DECODE_SPP", 1)
    assert shape([(8, 0, 512)] * 64) == (False, 1, False)
    monkeypatch.setattr(host, "FP8_DECODE_SPP", 2)
    assert shape([(8, 0, 512)] * 64) == (True, 2, False)
    monkeypatch.setattr(host, "FP8_DECODE_SPLIT_LOOP", True)  # the bf16 cache's rule: one wave of 264
    assert shape([(8, 0, 512)] * 32) == (True, 8, False)  # 256 programs of whole sequences
    monkeypatch.setattr(host, "FP8_DECODE_SPLIT_LOOP", False)
    monkeypatch.setattr(host, "DECODE_SPLIT_LOOP", False)
    assert shape([(8, 0, 512)] * 64) == (False, 1, False)
    monkeypatch.setattr(host, "DECODE_SPLIT_LOOP", None)
    monkeypatch.setattr(host, "FP8_DECODE_SPP", 4)
    # the plan: 32 histories of 4096 keys under 8 kv heads take the loop at four splits a
    # program, at the fp8 register cap (a launch past one wave), and fold the merge's parts (2
    # splits each) in it
    fp8 = functools.partial(_plan, kv_dtype=torch.float8_e4m3fn)
    d = fp8([4096] * 32, [1] * 32).decode
    assert (d.SPLIT_LOOP, d.SPLITS_PER_PROGRAM, d.SPLIT_GROUPS) == (True, 4, 2)
    assert d.LOOP_PARTS and not d.SPLIT_WHOLE
    assert d.maxnreg == host.FP8_DECODE_MAXNREG
    d = fp8([1024] * 64, [1] * 64).decode  # 4 splits of 256, parts of one: stored, merged by parts
    assert (d.SPLIT_LOOP, d.SPLITS_PER_PROGRAM, d.LOOP_PARTS) == (True, 2, False)
    d = fp8([4096] * 32, [1] * 32, sliding_window=1000).decode  # 256 programs with keys to read
    assert not d.SPLIT_LOOP and d.SPLITS_PER_PROGRAM == 1
    d = fp8([4096], [1]).decode  # B=1: 8 splits a kv head stay 64 programs
    assert not d.SPLIT_LOOP and d.maxnreg is None
    # uncapped tiles (fp32 queries, head_dim 256) take one split a program, as before the rule
    assert not fp8([4096] * 32, [1] * 32, dtype=torch.float32).decode.SPLIT_LOOP
    assert not fp8([4096] * 32, [1] * 32, heads=8, d=256).decode.SPLIT_LOOP
    monkeypatch.setattr(host, "FP8_DECODE_MAXNREG", None)
    assert not fp8([4096] * 32, [1] * 32).decode.SPLIT_LOOP


def test_decode_launch_shape_whole_sequences_past_one_wave(monkeypatch):
    """Past one wave of the split loop, a whole sequence a program where its programs fill at
    least ``DECODE_WHOLE_FILL`` of the waves' slots, at two programs an SM (``DECODE_WAVE``) or, where the tiles
    allow the cap, at three (``DECODE_WAVE_CAPPED``, ``DECODE_WHOLE_MAXNREG``): the fuller wave,
    two on a tie; else one split a program. Programs of a launch much shorter than its longest
    (a long history beside short ones) take one split each."""
    monkeypatch.setattr(host, "DECODE_WAVE", 64)
    monkeypatch.setattr(host, "DECODE_WAVE_CAPPED", 96)

    def shape(n, splits=8, heads=8, cap_ok=True, keys=512):
        return host.decode_launch_shape([(splits, 0, keys)] * n, heads, cap_ok=cap_ok)

    assert shape(8) == (True, 8, False)  # 64 programs: one wave of the loop
    assert shape(16) == (True, 8, False)  # 128: two full waves of 64, or 2 of 96 (0.67 full)
    assert shape(12) == (True, 8, True)  # 96: one full wave at three an SM (0.75 at two)
    assert shape(12, cap_ok=False) == (False, 1, False)  # ... which the tiles may not allow
    assert shape(24) == (True, 8, False)  # 192: 3 waves of 64 or 2 of 96, both full: two an SM
    assert shape(10) == (True, 8, True)  # 80: 0.63 and 0.83 of the slots filled
    assert shape(9) == (False, 1, False)  # 72: 0.56 and 0.75
    assert shape(30, splits=40) == (True, 40, False)  # 240 of 256 (0.94), past DECODE_SPP_MAX splits
    monkeypatch.setattr(host, "DECODE_WHOLE_FILL", 0.7)
    assert shape(9) == (True, 8, True)
    monkeypatch.setattr(host, "DECODE_WHOLE_FILL", 0.8)
    with monkeypatch.context() as m:  # the least fill is taken: 16 programs in 2 waves of 10, 0.8
        m.setattr(host, "DECODE_WAVE", 10)
        m.setattr(host, "DECODE_WAVE_CAPPED", 0)
        assert shape(2, heads=8) == (True, 8, False)
    with monkeypatch.context() as m:  # storing and merging splits instead: never whole past one wave
        m.setattr(host, "DECODE_MERGE_IN_LOOP", False)
        assert shape(16) == shape(12) == (False, 1, False)
        m.setattr(host, "DECODE_WAVE", 264)
        plan = _plan([5000] * 48, [1] * 48)
        assert (plan.decode.SPLIT_LOOP, plan.decode.SPLIT_WHOLE, plan.decode.maxnreg) == (False, False, None)
    monkeypatch.setattr(host, "DECODE_WAVE_CAPPED", 0)
    assert shape(12) == (False, 1, False)
    # balance: one history of 16 2048-key splits beside seven of 4 256-key ones (8 kv heads):
    # 4 splits a program would fit one wave of 264, but its 8192-key programs would run while
    # the others (1024 keys) idle; the same at whole sequences past one wave
    monkeypatch.setattr(host, "DECODE_WAVE", 264)
    mixed = [(16, 0, 2048)] + [(4, 0, 256)] * 7
    assert host.decode_launch_shape(mixed, 8) == (False, 1, False)
    assert host.decode_launch_shape([(16, 0, 2048)] * 8, 8)[:2] == (True, 4)  # the same launch, balanced
    assert host.decode_launch_shape(mixed[:2], 8)[:2] == (True, 1)  # one split a program fits: always taken
    assert host.decode_launch_shape([(16, 0, 2048), (16, 0, 256)], 8) == (True, 1, False)  # ... even unbalanced (0.56)
    monkeypatch.setattr(host, "DECODE_WAVE_CAPPED", 396)
    assert host.decode_launch_shape([(16, 0, 512)] * 48, 8, cap_ok=True) == (True, 16, True)  # one wave of 396
    assert host.decode_launch_shape([(16, 0, 512)] * 24 + [(2, 0, 512)] * 24, 8, cap_ok=True) == (False, 1, False)
    # a window: the splits before it have no work (``decode_work``), so long histories under
    # one window are as balanced as short ones
    assert host.decode_work(32768, sliding_window=4096) == (16, 14, 2048)
    assert host.decode_work(5000, sliding_window=10**6) == (10, 0, 512)
    assert host.decode_work(5000) == (10, 0, 512)
    assert host.decode_work(1100, sliding_window=77) == (5, 3, 256)  # keys 1023 on: split 3 (768-1023)
    assert host.decode_work(1100, sliding_window=1) == (5, 4, 256)  # key 1099 alone
    assert host.decode_work(1100, sliding_window=1100) == (5, 0, 256)
    # the splits before the window make no programs: three visible a history, two a program
    # (splits 20-21, of which 21 visible, and 22-23): mean 1.5 splits of the longest 2, 0.75
    assert host._balanced([(24, 21, 512)] * 8, 2)
    # only the visible splits are work: 16 + 7 x 1 splits over 8 programs of up to 16
    assert not host._balanced([(16, 0, 512)] + [(16, 15, 512)] * 7, 16)
    windowed = [host.decode_work(n, sliding_window=1000) for n in [12000] + [5000] * 7]  # 3 splits each
    assert host._balanced(windowed, 24) and not host._balanced([host.decode_work(n) for n in [12000] + [5000] * 7], 24)
    # the plan: whole sequences need no scratch beyond one split; the capped launch's registers
    plan = _plan([5000] * 64, [1] * 64)  # 512 programs, 2 waves of 264 (0.97 full)
    assert (plan.decode.SPLIT_WHOLE, plan.decode.maxnreg, plan.scratch_splits, plan.max_splits) == (True, None, 1, 10)
    plan = _plan([5000] * 48, [1] * 48)  # 384 programs: one wave of 396
    assert (plan.decode.SPLIT_WHOLE, plan.decode.maxnreg) == (True, host.DECODE_WHOLE_MAXNREG)
    assert _plan([5000] * 48, [1] * 48, d=256, heads=8, kv=8).decode.maxnreg is None  # wider tiles: no cap ...
    assert not _plan([5000] * 48, [1] * 48, d=256, heads=8, kv=8).decode.SPLIT_WHOLE  # ... and 0.73 filled
    assert _plan([5000] * 48, [1] * 48, heads=256, kv=8).decode.maxnreg is None  # a GQA group of 32
    assert _plan([5000] * 48, [1] * 48, dtype=torch.float32).decode.maxnreg is None
    plan = _plan([5000] * 36, [1] * 36)  # 288 programs: 0.55 / 0.73 of the slots
    assert (plan.decode.SPLIT_WHOLE, plan.decode.SPLIT_LOOP, plan.scratch_splits) == (False, False, 10)


def test_prepare_plans_with_the_window(monkeypatch):
    """``prepare`` hands the sliding window to the plan: the decode launch's shape counts only
    the splits the new token sees (``host.decode_work``)."""
    seen = []
    real = tpa.plan_launch
    monkeypatch.setattr(tpa, "plan_launch", lambda *a: seen.append(a[9]) or real(*a))
    case = CaseSpec("t", ((140, 1), (33, 4)), num_heads=4, num_kv_heads=2, head_dim=32, block_size=8).build()
    case = case.to(DEVICE)
    tpa.prepare(*_args(case), scale=case.scale, sliding_window=45)
    tpa.prepare(*_args(case), scale=case.scale)
    assert seen == [45, None]


#: the decode launch's shapes (host switches): one split a program, uncapped and at a register cap
#: (``DECODE_WAVE`` 0 caps an fp8 cache's), and the split loop at 1, 2, 3 and every split a program
LAUNCH_SHAPES = {
    "one-split": dict(DECODE_SPLIT_LOOP=False),
    "one-split-capped": dict(DECODE_SPLIT_LOOP=False, DECODE_MAXNREG=128, DECODE_WAVE=0),
    **{f"loop-{n}": dict(DECODE_SPLIT_LOOP=True, DECODE_SPLITS_PER_PROGRAM=n) for n in (1, 2, 3, 6, 7)},
    # every split in one program, stored and merged as in other launches instead of in its loop
    "loop-7-stored": dict(DECODE_SPLIT_LOOP=True, DECODE_SPLITS_PER_PROGRAM=7, DECODE_MERGE_IN_LOOP=False),
    # merged in its loop at the register cap of whole sequences past one wave (DECODE_WHOLE_MAXNREG)
    "loop-7-capped": dict(
        DECODE_SPLIT_LOOP=True, DECODE_SPLITS_PER_PROGRAM=7, DECODE_MAXNREG=host.DECODE_WHOLE_MAXNREG
    ),
}
#: on the interpreter, which has no registers to cap, and where each shape costs a second of CPU
#: time a case: one split a program, and the loop at 1, 3, 6 (whole parts of 1, 2 and 3 splits
#: with DECODE_FOLD_PARTS 2: ``LOOP_PARTS``) and every split a program
INTERPRETER_SHAPES = ("one-split", "loop-1", "loop-3", "loop-6", "loop-7", "loop-7-stored")


@runs_kernel
@pytest.mark.parametrize(
    "kw",
    [
        pytest.param(dict(sinks=True, fold_parts=2), marks=_SLOW),
        pytest.param(dict(sliding_window=45, dtype=torch.float32, fold_parts=2), marks=_SLOW),
        pytest.param(dict(alibi_slopes=True, logits_soft_cap=20.0, dtype=torch.bfloat16), marks=_SLOW),
        # the default run's three: parts of several splits under a window, sinks and an fp8 cache,
        # scores below 0 (a merge from 0 would not be exact), and one fold of every split
        dict(
            sliding_window=100,
            sinks=True,
            dtype=torch.bfloat16,
            kv_dtype=torch.float8_e4m3fn,
            k_scale=0.5,
            fold_parts=2,
        ),
        dict(negative_scores=True, fold_parts=2),
        dict(fold_parts=0),
    ],
    ids=[
        "sinks-parts2",
        "window-fp32-parts2",
        "alibi-softcap-bf16",
        "fp8-window-sinks-parts2",
        "negative-scores-parts2",
        "parts0",
    ],
)
def test_launch_shape_changes_no_bit(kw, monkeypatch):
    """Every decode launch shape (``LAUNCH_SHAPES``) computes the same bits (out and lse) and
    leaves the split counters at zero: the split loop stores each split's state at its end and
    starts the next afresh, as a program of its own would (or, walking every split of its
    sequence, merges them in the merge's order in the loop, as the merging program would), and a
    register cap changes no arithmetic. Histories of one to seven 32-key splits (64-key splits from 150 keys), a window
    that starts mid-split, a continuation beside them; fp16, fp32, bf16 queries, an fp8 cache."""
    for name, value in (("SPLIT_SIZE", 32), ("SPLIT_LONG", 64), ("LONG_FROM", 150), ("DECODE_BLOCK_N", 16)):
        monkeypatch.setattr(host, name, value)
    monkeypatch.setattr(host, "FP8_DECODE_BLOCK_N", 16)
    monkeypatch.setattr(host, "SHORT_UNDER", 0)
    kw = dict(kw)
    negative = kw.pop("negative_scores", False)
    # the merge's parts (DECODE_FOLD_PARTS): 2 gives parts of 1, 2 and 3 splits here (histories
    # of 1-3, 4-5 and 7 splits); 6 splits a program folds whole parts of each (LOOP_PARTS), 2 or 3
    # do not for every history, so every program stores its splits; 4 (the default) parts of
    # one split; 0 one fold of every split
    monkeypatch.setattr(host, "DECODE_FOLD_PARTS", kw.pop("fold_parts", host.DECODE_FOLD_PARTS))
    spec = CaseSpec(
        "t",
        ((140, 1), (70, 1), (9, 1), (33, 4), (200, 1), (400, 1)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        block_size=8,
        layout="permuted",
        **{"dtype": torch.float16, **kw},
    )
    case = spec.build().to(DEVICE)
    if negative:  # every score below 0: each split's maximum is negative (a merge from 0 would not be exact)
        case.query.copy_(-case.query.abs())
        case.key_cache.abs_()
    extra = {k: getattr(case, k) for k in ("sinks", "alibi_slopes") if getattr(case, k) is not None}
    extra.update({k: getattr(spec, k) for k in ("sliding_window", "logits_soft_cap") if getattr(spec, k)})
    got = {}
    for name, switches in LAUNCH_SHAPES.items():
        if DEVICE == "cpu" and name not in INTERPRETER_SHAPES:
            continue
        with monkeypatch.context() as m:
            for k, v in switches.items():
                m.setattr(host, k, v)
            prep = tpa.prepare(*_args(case), scale=case.scale, k_scale=case.k_scale, return_lse=True, **extra)
            cfg = prep.plan.decode
            assert (cfg.SPLIT_LOOP, prep.plan.max_splits) == (switches["DECODE_SPLIT_LOOP"], 7), name
            assert cfg.SPLITS_PER_PROGRAM == switches.get("DECODE_SPLITS_PER_PROGRAM", 1), name
            assert (cfg.maxnreg is not None) == ("capped" in name), name
            # every split in one program: merged in its loop
            assert cfg.SPLIT_WHOLE == (name in ("loop-7", "loop-7-capped")), name
            assert cfg.LOOP_PARTS == (name == "loop-6" and host.DECODE_FOLD_PARTS == 2), name
            assert prep.part_acc.shape[1] == prep.part_ml.shape[1] == (1 if cfg.SPLIT_WHOLE else 7), name
            got[name] = tpa.run(prep, case.query, case.key_cache, case.value_cache)
            assert int(prep.done.abs().sum()) == 0, f"{name}: counters left at {prep.done.tolist()}"
    c1, c2 = check_attention_lse(*got["one-split"], case)
    assert c1.passed and c2.passed and not (c1.warning or c2.warning), f"{c1}\n{c2}"
    for name, (out, lse) in got.items():
        assert torch.equal(out, got["one-split"][0]) and torch.equal(lse, got["one-split"][1]), f"{name}: other bits"


@runs_kernel
def test_short_history_split_tier_within_policy(monkeypatch):
    """Histories under SHORT_UNDER keys take SPLIT_SHORT-key splits, in the kernel as in
    ``host.decode_split`` (the plan's scratch is sized by the host's rule)."""
    for name, value in (("SPLIT_SIZE", 32), ("SPLIT_SHORT", 16), ("SHORT_UNDER", 64), ("DECODE_BLOCK_N", 16)):
        monkeypatch.setattr(host, name, value)
    assert [host.decode_split(n) for n in (17, 63, 64, 70)] == [16, 16, 32, 32]
    case = CaseSpec("t", ((63, 1), (70, 1), (9, 1)), sinks=True, dtype=torch.float16).build().to(DEVICE)
    plan = host.plan_launch(case.seq_lens_list, case.query_lens, 4, 2, 64, 16, case.dtype, False)
    assert plan.max_splits == 4, plan  # 63 keys in 16-key splits
    out, lse = tpa.paged_attention(*_args(case), scale=case.scale, sinks=case.sinks, return_lse=True)
    c1, c2 = check_attention_lse(out, lse, case)
    assert c1.passed and c2.passed and not (c1.warning or c2.warning), f"{c1}\n{c2}"


@runs_kernel
@pytest.mark.parametrize("spec", KERNEL_CASES[-2:], ids=lambda s: s.id)
def test_fp8_cache_takes_its_own_decode_tiles_and_splits(spec, monkeypatch):
    """FP8_DECODE_BLOCK_N / FP8_SPLIT_SIZE apply to fp8 caches only (the cache's dtype, not
    the batch, picks them), in the plan and in the kernel's split rule alike."""
    monkeypatch.setattr(host, "FP8_DECODE_BLOCK_N", 32)
    monkeypatch.setattr(host, "FP8_SPLIT_SIZE", 64)
    monkeypatch.setattr(host, "SHORT_UNDER", 0)
    case = spec.build().to(DEVICE)
    sizes = (case.seq_lens_list, case.query_lens, 8, 2, 64, 16, case.dtype, False)
    fp8, wide = host.plan_launch(*sizes, case.kv_dtype), host.plan_launch(*sizes)
    assert (fp8.decode.BLOCK_N, fp8.decode.SPLIT_SIZE, fp8.max_splits) == (32, 64, -(-300 // 64))
    assert (wide.decode.BLOCK_N, wide.decode.SPLIT_SIZE) == (host.DECODE_BLOCK_N, host.SPLIT_SIZE)
    out = tpa.paged_attention(*_args(case), scale=case.scale, k_scale=case.k_scale, v_scale=case.v_scale)
    check = check_attention(out, case)
    assert check.passed and not check.warning, str(check)


#: the first round's kernel (every issue-17 second-round switch off), and the switches one by one
SOFTMAX_PATHS = {
    "first-round": dict(EXP2_SOFTMAX=False, PREFILL_MASK_SPLIT=False, PREFILL_HEAVY_FIRST=False),
    "exp2-only": dict(EXP2_SOFTMAX=True, PREFILL_MASK_SPLIT=False, PREFILL_HEAVY_FIRST=False),
    "all": dict(EXP2_SOFTMAX=True, PREFILL_MASK_SPLIT=True, PREFILL_HEAVY_FIRST=True),
}
#: prefills long enough that whole key tiles lie below the diagonal (the unmasked tiles),
#: several query tiles (the heavy-first order), decodes ending in a partial tile; with
#: sinks and lse (both change units under EXP2), and with soft-cap + ALiBi (the scores
#: are scaled before the exponent there) over an fp8 cache with fp16 dots
PATH_CASES = [
    CaseSpec(
        "t",
        ((150, 40), (83, 1), (40, 9)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        block_size=8,
        sinks=True,
        layout="permuted",
        dtype=torch.float16,
    ),
    CaseSpec(
        "t",
        ((140, 35), (70, 1)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        logits_soft_cap=20.0,
        alibi_slopes=True,
        dtype=torch.bfloat16,
        kv_dtype=torch.float8_e4m3fn,
        k_scale=0.5,
        v_scale=2.0,
    ),
    CaseSpec(
        "t",
        ((150, 40), (83, 1)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        sliding_window=50,
        sinks=True,
        dtype=torch.float32,
    ),
]


def _assert_output_and_lse_within_policy(case):
    """The kernel on ``case`` with every variant the case carries, output and lse judged."""
    out, lse = tpa.paged_attention(
        *_args(case),
        scale=case.scale,
        sliding_window=case.sliding_window,
        logits_soft_cap=case.logits_soft_cap,
        alibi_slopes=case.alibi_slopes,
        sinks=case.sinks,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
        return_lse=True,
    )
    c1, c2 = check_attention_lse(out, lse, case)
    assert c1.passed and c2.passed and not (c1.warning or c2.warning), f"{c1}\n{c2}"


@runs_kernel
@pytest.mark.parametrize("path", sorted(SOFTMAX_PATHS))
@pytest.mark.parametrize("spec", PATH_CASES, ids=lambda s: s.id)
def test_softmax_paths_within_policy(spec, path, monkeypatch):
    for name, value in SOFTMAX_PATHS[path].items():
        monkeypatch.setattr(host, name, value)
    monkeypatch.setattr(host, "PREFILL_BLOCK_N", 16)  # several whole tiles below the diagonal on a small case
    monkeypatch.setattr(host, "PREFILL_ROWS", 32)  # and several query tiles
    case = spec.build().to(DEVICE)
    plan = host.plan_launch(case.seq_lens_list, case.query_lens, 4, 2, 32, spec.block_size, case.dtype, False)
    assert plan.other.grid[1] >= 2, "several query tiles"
    _assert_output_and_lse_within_policy(case)


#: the addressing paths the defaults do not take: int64 cache offsets (a cache past 2**31
#: elements), each decode grid order (for every batch size)
ADDRESSING_PATHS = {
    "int64-offsets": {(tpa, "OFFSETS_I32"): False},
    **{f"{name.replace('_', '-')}-decode-grid": {(host, "DECODE_GRID"): name} for name in host.DECODE_GRIDS},
}


@runs_kernel
@pytest.mark.parametrize("path", sorted(ADDRESSING_PATHS))
@pytest.mark.parametrize("spec", PATH_CASES[:2], ids=lambda s: s.id)
def test_addressing_paths_within_policy(spec, path, monkeypatch):
    for (owner, name), value in ADDRESSING_PATHS[path].items():
        monkeypatch.setattr(owner, name, value)
    case = spec.build().to(DEVICE)
    _assert_output_and_lse_within_policy(case)


@runs_kernel
def test_fp32_takes_the_compiled_tiles_within_policy(monkeypatch):
    """fp32 runs 16 x 16 tiles when compiled (FP32_PREFILL_ROWS, FP32_BLOCK_N) but 32 x 32 on
    the interpreter (FP32_TILE_INTERPRETER, for speed): the compiled shape, run here too."""
    monkeypatch.setattr(host, "FP32_TILE_INTERPRETER", host.FP32_BLOCK_N)
    spec = PATH_CASES[-1]  # fp32, window, sinks; a prefill over several query tiles
    case = spec.build().to(DEVICE)
    plan = host.plan_launch(case.seq_lens_list, case.query_lens, 4, 2, 32, spec.block_size, case.dtype, True)
    assert plan.other.BLOCK_N == host.FP32_BLOCK_N == plan.decode.BLOCK_N and plan.other.rows == host.FP32_PREFILL_ROWS
    _assert_output_and_lse_within_policy(case)


def test_cache_offsets_take_int32_only_when_every_offset_fits():
    """A cache is addressed in int32 only when its last element's offset is below 2**31
    (shapes on the meta device: no memory)."""
    fits = torch.empty(2**31 // (16 * 8 * 128), 16, 8, 128, device="meta")  # last offset 2**31 - 1
    assert host.fits_int32(fits) and not host.fits_int32(torch.empty(fits.shape[0] + 1, 16, 8, 128, device="meta"))
    # a head-major cache viewed as [N, bs, Hkv, D]: its last head starts at 7 * 2**29, past
    # 2**31, so it takes the int64 path, where the head term is widened too (it was not)
    heads_major = torch.empty(8, 2**21, 16, 16, device="meta").permute(1, 2, 0, 3)
    assert heads_major.stride(2) * 7 > 2**31 and not host.fits_int32(heads_major)
    # through strides: one K of an [N, 2, bs, Hkv, D] pool reaches twice as far as its size says
    pool = torch.empty(2**30 // (16 * 8 * 128) + 1, 2, 16, 8, 128, device="meta")
    assert pool[:, 0].numel() < 2**31 and not host.fits_int32(pool[:, 0])


class _Launch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args)`` records the call."""

    def __init__(self, calls, name):
        self.calls, self.name = calls, name

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.name, grid))


def _forbid(what):
    def fail(*a, **k):
        pytest.fail(f"run called {what}: a CUDA graph could not capture it")

    return fail


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_run_is_graph_capturable(dtype, monkeypatch):
    """Given out and lse, ``run`` allocates nothing and reads nothing back from the device:
    everything a replay needs was made by ``prepare``. One decode launch (the merge is
    folded in) and one prefill launch."""
    case = CaseSpec("t", ((70, 1), (33, 9)), dtype=dtype).build().to(DEVICE)  # prepare refuses CPU tensors on a GPU
    prep = tpa.prepare(*_args(case), scale=case.scale, return_lse=True)
    out, lse = torch.empty_like(case.query), torch.empty(case.num_tokens, case.num_heads, device=DEVICE)
    calls: list = []
    monkeypatch.setattr(tpa, "_decode_kernel", _Launch(calls, "decode"))
    monkeypatch.setattr(tpa, "_prefill_kernel", _Launch(calls, "prefill"))
    for name in ("empty", "empty_like", "zeros", "zeros_like", "full", "full_like", "tensor", "cat"):
        monkeypatch.setattr(torch, name, _forbid(f"torch.{name}"))
    for name in ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, _forbid(f"Tensor.{name}"))
    got = tpa.run(prep, case.query, case.key_cache, case.value_cache, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    assert [c[0] for c in calls] == ["decode", "prefill"], calls


@pytest.mark.skipif(
    DEVICE != "cuda",
    reason="CUDA graphs need a GPU; on the CPU, test_run_is_graph_capturable "
    "checks that run allocates nothing and reads nothing back",
)
def test_cuda_graph_replay_computes_what_run_computes():
    """``run`` captured once and replayed gives the eager bits, also after the query tensor
    is refilled (a new step through the same graph)."""
    spec = CaseSpec("t", ((3000, 1), (700, 1), (60, 9)), num_heads=8, dtype=torch.bfloat16, sinks=True)
    case = spec.build().to(DEVICE)
    prep = tpa.prepare(*_args(case), scale=case.scale, sinks=case.sinks, return_lse=True)
    q, k, v = case.query, case.key_cache, case.value_cache
    out, lse = torch.empty_like(q), torch.empty(case.num_tokens, case.num_heads, device=DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile outside the capture
        tpa.run(prep, q, k, v, out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tpa.run(prep, q, k, v, out=out, lse=lse)
    for step in range(3):
        q.copy_(torch.randn_like(q) * (step + 1))
        want_out, want_lse = tpa.run(prep, q, k, v)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse), f"step {step}: replay differs from run"
        assert int(prep.done.abs().sum()) == 0, f"step {step}: split counters left at {prep.done.tolist()}"


@runs_kernel
def test_run_leaves_the_split_counters_at_zero():
    """The program whose count completes a sequence's splits resets its counter: the next
    launch, or a graph replay of this one, starts from zero."""
    case = CaseSpec("t", ((1100, 1), (600, 1), (40, 1)), num_heads=8, sliding_window=700).build().to(DEVICE)
    prep = tpa.prepare(*_args(case), scale=case.scale, sliding_window=700)
    assert prep.done is not None and prep.plan.max_splits == -(-1100 // host.decode_split(1100)) >= 3
    for _ in range(2):
        out = tpa.run(prep, case.query, case.key_cache, case.value_cache)
        assert int(prep.done.abs().sum()) == 0, f"split counters left at {prep.done.tolist()}"
        check = check_attention(out, case)
        assert check.passed and not check.warning, str(check)


@runs_kernel
@pytest.mark.parametrize("gain", [1e6, 1e-33], ids=["huge-queries", "tiny-queries"])
def test_fp8_cache_fp16_dots_keep_any_bf16_query_in_range(gain):
    """bf16 queries over an fp8 cache run fp16 dots: each row is scaled by a power of two
    first, so queries far outside fp16's range (either side) still score exactly."""
    spec = CaseSpec(
        "t",
        ((200, 1), (30, 5)),
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        dtype=torch.bfloat16,
        kv_dtype=torch.float8_e4m3fn,
        query_gain=gain,
        scale=1.0,
    )
    case = spec.build().to(DEVICE)
    out, lse = tpa.paged_attention(*_args(case), scale=case.scale, return_lse=True)
    out_check, lse_check = check_attention_lse(out, lse, case)
    assert out_check.passed and not out_check.warning, str(out_check)
    assert lse_check.passed, str(lse_check)


@runs_kernel
def test_out_is_fully_written_and_returned():
    case = KERNEL_CASES[3].build().to(DEVICE)
    out = torch.full_like(case.query, float("nan"))
    got = tpa.paged_attention(*_args(case), scale=case.scale, out=out)
    assert got is out and not torch.isnan(out).any()


@runs_kernel
def test_noncontiguous_cache_strides_are_honoured():
    case = KERNEL_CASES[0].build().to(DEVICE)
    # a [N, 2, bs, Hkv, D] combined pool viewed as two strided caches (FlashInfer style)
    both = torch.stack([case.key_cache, case.value_cache], dim=1)
    k, v = both[:, 0], both[:, 1]
    assert not k.is_contiguous()
    out = tpa.paged_attention(case.query, k, v, case.block_tables, case.seq_lens, case.query_start_loc)
    assert check_attention(out, case).passed


_AOT = r"""
import json, re, sys, triton, torch
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from pagedattn.kernels import host
from pagedattn.kernels import triton_paged_attention as m

def compile_one(kernel, types, consts, num_warps=4, num_stages=2, ints=None, maxnreg=None):
    names = kernel.arg_names
    sig = {n: "constexpr" if n in consts else types.get(n, "*i32" if n.endswith("_ptr") else "i32") for n in names}
    # what the JIT specializes on a GPU: pointers from torch are 16-byte aligned, and an
    # int argument divisible by 16 is marked so (the pipeliner needs both to copy async)
    ints = ints or {}
    plain = set(m._PLAIN_INTS)  # not specialized by the JIT (no divisibility attribute)
    aligned = [i for i, n in enumerate(names)
               if n not in consts and (n.endswith("_ptr") or (n in ints and ints[n] % 16 == 0 and n not in plain))]
    src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(c),): v for c, v in consts.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    options = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)

results = []
defaults = {k: v for k, v in vars(host).items() if k.isupper()}
OFFSETS_I32 = m.OFFSETS_I32
for dtype, heads, kv, d, bs, kv_dtype, on, *switches in json.loads(sys.argv[1]):
    for k, v in defaults.items():
        setattr(host, k, v)
    m.OFFSETS_I32 = OFFSETS_I32
    for k, v in (switches[0] if switches else {}).items():  # host or kernel-module switches of a non-default path
        setattr(m if hasattr(m, k) and not hasattr(host, k) else host, k, v)
    plan = host.plan_launch([700, 90], [1, 33], heads, kv, d, bs, getattr(torch, dtype), False,
                            getattr(torch, kv_dtype or dtype))
    # the strides of contiguous tensors of this shape (the block table's width is left unmarked)
    pad, splits = plan.decode.HEAD_DIM_PAD, plan.scratch_splits
    ints = {"stride_qt": heads * d, "stride_qh": d, "stride_kb": bs * kv * d, "stride_ks": kv * d, "stride_kh": d,
            "stride_vb": bs * kv * d, "stride_vs": kv * d, "stride_vh": d, "stride_ot": heads * d, "stride_oh": d,
            "stride_lt": heads, "stride_pa_seq": splits * heads * pad, "stride_pa_split": heads * pad,
            "stride_pml_seq": splits * heads * 2, "stride_pml_split": heads * 2}
    t = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[dtype]
    tk = {"float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", None: t}[kv_dtype]
    types = {"q_ptr": "*" + t, "k_cache_ptr": "*" + tk, "v_cache_ptr": "*" + tk, "out_ptr": "*" + t,
             "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32", "done_ptr": "*i32", "alibi_ptr": "*fp32",
             "sinks_ptr": "*fp32",
             "lse_ptr": "*fp32", "scale": "fp32", "v_scale": "fp32", "soft_cap": "fp32"}
    flags = {"USE_WINDOW": on, "USE_SOFTCAP": on, "USE_ALIBI": on, "USE_SINKS": on, "WRITE_LSE": on,
             "KV_FP8": host.fp8_widening(getattr(torch, kv_dtype or dtype),
                                         dtype == "float16" or (dtype == "bfloat16" and m.F16_DOTS_FOR_FP8),
                                         native=True, even=d % 2 == 0),
             "F16_DOTS": kv_dtype is not None and dtype == "bfloat16" and m.F16_DOTS_FOR_FP8,
             "TABLE_AHEAD": True, "OFF_I32": m.OFFSETS_I32}
    keys = ("GROUP", "GROUP_PAD", "BLOCK_Q", "BLOCK_N", "HEAD_DIM", "HEAD_DIM_PAD", "BLOCK_SIZE", "UPCAST",
            "IEEE_FP32", "SPLIT_SIZE", "SPLIT_LONG", "LONG_FROM", "SPLIT_SHORT", "SHORT_UNDER", "EXP2", "MASK_SPLIT",
            "HEAVY_FIRST", "GRID_ORDER", "SPLIT_LOOP", "SPLIT_WHOLE", "FOLD_PARTS", "LOOP_PARTS")
    cfg_name = [dtype, heads, kv, d, bs, kv_dtype, on, *switches]
    for name, kernel, cfg in (("prefill", m._prefill_kernel, plan.other), ("decode", m._decode_kernel, plan.decode)):
        consts = {k: getattr(cfg, k) for k in keys if k in kernel.arg_names}
        consts.update({k: v for k, v in flags.items() if k in kernel.arg_names})
        c = compile_one(kernel, types, consts, cfg.num_warps, cfg.num_stages, ints, cfg.maxnreg)
        # the decode merge (after the counter's reset) must read the partials through L2
        merge = c.asm["ptx"].split("atom.global.gpu.acq_rel.exch")
        waits = [int(w) for w in re.findall(r"cp\.async\.wait_group\s+(\d+)", c.asm["ptx"])]
        results.append({"cfg": cfg_name + [name], "cubin": len(c.asm["cubin"]), "stages": cfg.num_stages,
                        "maxnreg": cfg.maxnreg, "loop_parts": bool(getattr(cfg, "LOOP_PARTS", False)),
                        "whole": bool(getattr(cfg, "SPLIT_WHOLE", False)),
                        "atomics": len(re.findall(r"\batom\.", c.asm["ptx"])),
                        "kv_fp8": flags["KV_FP8"],
                        "cvt_pairs": len(re.findall(r"cvt\.rn\.f16x2\.e\w+x2 t,", c.asm["ptx"])),
                        "deepest_wait": max(waits, default=0),
                        "mma": "mma" in c.asm["ptx"], "shared": c.metadata.shared,
                        "merge": None if name == "prefill" else
                                 {"found": len(merge) == 2, "cp_async": "cp.async" in merge[-1],
                                  "count_acq_rel": "atom.global.gpu.acq_rel.add" in merge[0],
                                  "cg_loads": merge[-1].count("ld.global.cg"),
                                  "cg_vector_loads": merge[-1].count("ld.global.cg.v")}})
print(json.dumps(results))
"""


#: the most dynamic shared memory a block may use on sm_90 (227 KB)
HOPPER_SHARED_MEMORY = 232448


#: an fp8 cache's split loop in the compile test's small batch (its own rule asks for
#: FP8_LOOP_MIN_PROGRAMS programs filling FP8_LOOP_FILL of their waves; the register cap for a
#: launch past DECODE_WAVE programs)
FP8_LOOP = {"FP8_LOOP_MIN_PROGRAMS": 0, "FP8_LOOP_FILL": 0, "DECODE_WAVE": 0, "SPLIT_SHORT": 64}
#: the first round's softmax, 2-stage prefill and sequences-first decode grid
FIRST_ROUND = {
    "EXP2_SOFTMAX": False,
    "PREFILL_MASK_SPLIT": False,
    "PREFILL_HEAVY_FIRST": False,
    "PREFILL_STAGES": 2,
    "DECODE_GRID": "sequences_first",
}
#: a register cap on decode without the split loop, the short-history split tier, a register cap
#: with 32-key prefill tiles, int64 cache offsets (a cache past 2**31 elements), the one-axis decode
#: grid (heads fastest)
SWITCHED = {
    "OFFSETS_I32": False,
    "DECODE_GRID": "heads_fast",
    "DECODE_MAXNREG": 128,
    "DECODE_SPLIT_LOOP": False,
    "SHORT_UNDER": 4096,
    "SPLIT_SHORT": 128,
    "PREFILL_MAXNREG": 128,
    "PREFILL_BLOCK_N": 32,
}

# (query dtype, heads, kv heads, head_dim, block size, fp8 cache dtype, every variant on[, host switches]).
# The default run compiles a representative third (the widest shared-memory tile, every
# variant with an fp8 cache, an odd head dim and block size, MQA at block size 1); the
# rest compile under -m slow, which CI runs as its second step.
HOPPER_CONFIGS = {
    "representative": [
        # every split of a sequence in one program, merged in its loop (no scratch, no count)
        ["float32", 8, 2, 256, 16, "float8_e4m3fn", True, {"DECODE_SPLITS_PER_PROGRAM": 8}],
        # an fp8 cache's split loop (four splits a program, folding the merge's parts of two in it: 700
        # keys in 11 splits of 64) at its register cap, every variant on
        ["bfloat16", 32, 8, 128, 16, "float8_e4m3fn", True, FP8_LOOP],
        # programs of whole parts of the merge (700 keys in 11 splits of 64: parts of 2, 2 a program)
        ["bfloat16", 32, 8, 128, 16, None, False, {"SPLIT_SHORT": 64, "DECODE_SPLITS_PER_PROGRAM": 2}],
        # the int64 cache offsets; decode programs of one split (no split loop)
        ["float16", 6, 2, 48, 13, None, False, {"OFFSETS_I32": False, "DECODE_SPLIT_LOOP": False}],
        ["bfloat16", 8, 1, 80, 1, None, False],
    ],
    "rest": [
        ["float32", 8, 2, 64, 16, None, False],
        ["float16", 32, 8, 128, 16, None, False],
        ["bfloat16", 32, 8, 128, 64, None, False],
        ["float32", 4, 4, 256, 3, None, False],
        ["float32", 8, 2, 256, 16, None, False],
        ["bfloat16", 8, 2, 256, 16, None, False],
        # the variants: window, soft-cap, ALiBi, sinks, lse; fp8 caches of both formats
        ["bfloat16", 32, 8, 128, 16, None, True],
        ["float16", 8, 2, 64, 16, "float8_e5m2", False],
        # the selectable paths issue 17's probe times (host switches over the defaults)
        ["bfloat16", 32, 8, 128, 16, None, True, FIRST_ROUND],
        ["bfloat16", 32, 8, 128, 16, "float8_e4m3fn", True, SWITCHED],
        # an fp8 cache widened by the compiler (no pairs), and only V read as pairs
        ["bfloat16", 32, 8, 128, 16, "float8_e4m3fn", False, {"FP8_PAIRS": False}],
        ["float16", 32, 8, 128, 16, "float8_e5m2", False, {"FP8_PAIRS_K": False}],
        ["float16", 32, 8, 128, 16, "float8_e5m2", False],  # the same with K's pairs: more conversions
        # the decode register cap of an fp8 cache in a launch past one wave (one split a program)
        ["bfloat16", 32, 8, 128, 16, "float8_e5m2", True, {"DECODE_WAVE": 0}],
        # an fp8 cache's decode of one split a program, uncapped (a launch within one wave)
        ["bfloat16", 32, 8, 128, 16, "float8_e4m3fn", True],
        # whole sequences a program past one wave at three programs an SM (DECODE_WHOLE_MAXNREG)
        ["bfloat16", 32, 8, 128, 16, None, True, {"DECODE_WAVE": 5, "DECODE_WAVE_CAPPED": 8}],
    ],
}


@pytest.mark.parametrize(
    "group", ["representative", pytest.param("rest", marks=pytest.mark.slow)], ids=["representative", "rest"]
)
def test_kernel_compiles_for_hopper_without_a_gpu(group):
    """Code the interpreter accepts but the GPU compiler rejects (tl.dot under 16, dtype
    mixes in dot) fails here, on a CPU machine, in CI."""
    configs = HOPPER_CONFIGS[group]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", _AOT, json.dumps(configs)], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, f"compiling for sm_90 failed:\n{proc.stderr[-4000:]}"
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 2 * len(configs)
    for r in results:
        assert r["cubin"] > 0, f"{r['cfg']}: no cubin: {r}"
        # the compiler accepts more shared memory than a launch gets: check the launch limit
        assert r["shared"] <= HOPPER_SHARED_MEMORY, f"{r['cfg']}: {r['shared']} B of shared memory cannot launch"
        if r["merge"] is not None and r["stages"] >= 3:
            # the decode loop keeps K and V tiles of later steps in flight (host-prefetched
            # table entries, TABLE_AHEAD); with the table loaded in the step that uses them,
            # triton waits for every copy at the top of each step (wait_group 0)
            assert r["deepest_wait"] >= 1, f"{r['cfg']}: the decode loop's K/V loads are not multi-buffered: {r}"
        if r["cfg"][-2] == {"SPLIT_SHORT": 64, "DECODE_SPLITS_PER_PROGRAM": 2} and r["cfg"][-1] == "decode":
            assert r["loop_parts"] and not r["whole"], f"{r['cfg']}: not a launch of whole parts: {r}"
        if r["cfg"][-2] == FP8_LOOP and r["cfg"][-1] == "decode":
            assert r["loop_parts"] and not r["whole"] and r["maxnreg"] == host.FP8_DECODE_MAXNREG, (
                f"{r['cfg']}: not the fp8 cache's capped loop of whole parts: {r}"
            )
        if r["cfg"][-2] == {"DECODE_WAVE": 5, "DECODE_WAVE_CAPPED": 8} and r["cfg"][-1] == "decode":
            assert r["whole"] and r["maxnreg"] == host.DECODE_WHOLE_MAXNREG, f"{r['cfg']}: not the capped launch: {r}"
        if r["whole"]:  # merged in the program's loop: no count, no merge of stored splits
            assert r["atomics"] == 0 and not r["merge"]["found"], f"{r['cfg']}: a whole-sequence program counts: {r}"
        elif r["merge"] is not None:
            # a pipelined load becomes cp.async.ca, which reads through the SM's L1 and can see
            # a line cached before another program's split was stored (partials share lines)
            assert r["merge"]["found"] and r["merge"]["cg_loads"] > 0 and not r["merge"]["cp_async"], (
                f"{r['cfg']}: the decode merge must load the partials with ld.global.cg, not cp.async: {r['merge']}"
            )
            # the count that releases a program's stored splits to the merging program (acq_rel)
            assert r["merge"]["count_acq_rel"], f"{r['cfg']}: the split count is not an acq_rel add: {r['merge']}"
            # the partials' rows are 16-aligned (stride_pa_seq specialized by the JIT): vector loads
            assert r["merge"]["cg_vector_loads"] > 0, f"{r['cfg']}: the merge's partial loads are scalar: {r['merge']}"
        # fp8 pairs (``_widen_pairs``, its conversion into its own register ``t``) where chosen, and only there
        pairs = r["cvt_pairs"]
        assert (pairs > 0) == (r["kv_fp8"] >= 2), f"{r['cfg']}: KV_FP8 {r['kv_fp8']}, {pairs} cvt pairs"
        if r["kv_fp8"] >= 4:  # K's pairs too: more conversions than the same kernel with V's alone
            v_only = [q for q in results if q["cfg"][:5] == r["cfg"][:5] and q["cfg"][-1] == r["cfg"][-1]]
            for q in v_only:
                if q["kv_fp8"] in (2, 3):
                    assert pairs > q["cvt_pairs"], f"{r['cfg']}: {pairs} cvt pairs, V's alone {q['cvt_pairs']}"
        if r["mma"] is not None:
            # half-precision dots must land on the tensor cores; IEEE fp32 dots cannot (FMA)
            assert r["mma"] == (r["cfg"][0] != "float32"), f"{r['cfg']}: unexpected tensor-core use: {r}"


@runs_kernel
@pytest.mark.parametrize("block_n", [16, 32, 64])
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fp8_prefill_at_every_tile_width(dtype, kv_dtype, block_n, monkeypatch):
    """An fp8 cache under every key-tile width, prefill and decode: 16-key tiles went wrong on the
    H200 (triton 3.6) through the row-split widening of V, which tiles under 32 rows now skip; on a
    GPU of sm_89 or later the tiles are read as pairs (``_widen_pairs``) at every width."""
    monkeypatch.setattr(host, "PREFILL_BLOCK_N", block_n)
    monkeypatch.setattr(host, "FP8_DECODE_BLOCK_N", block_n)
    spec = CaseSpec(
        "t", ((70, 30), (20, 1)), num_heads=4, num_kv_heads=2, head_dim=32, dtype=dtype, kv_dtype=kv_dtype, v_scale=2.0
    )
    case = spec.build().to(DEVICE)
    out = tpa.paged_attention(*_args(case), scale=case.scale, k_scale=case.k_scale, v_scale=case.v_scale)
    check = check_attention(out, case)
    assert check.passed and not check.warning, str(check)


@runs_kernel
# bf16: the control (bf16 weights keep the range, so it passed on the old kernel too)
@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn], ids=["bf16", "e4m3"])
def test_a_sink_far_above_the_keys_leaves_the_prefill_weights_in_range(kv_dtype):
    """A sink e^25 above every key: relative to it, each key's weight is ~1e-11, below fp16's
    range, and bf16 queries over an fp8 cache run fp16 dots (``F16_DOTS``). Seeded with the sink,
    the prefill's running softmax flushed those weights to 0 and its rows came out 0 (an H200
    thorough search, 2026-12-01); the sink now joins after the keys, as in the decode merge."""
    spec = CaseSpec(
        "t", ((40, 40), (30, 1)), num_heads=4, num_kv_heads=2, head_dim=32, dtype=torch.bfloat16, kv_dtype=kv_dtype
    )
    case = spec.build()
    case = dataclasses.replace(case, sinks=torch.full((4,), 25.0)).to(DEVICE)
    kw = dict(scale=case.scale, k_scale=case.k_scale, v_scale=case.v_scale, sinks=case.sinks)
    out = tpa.paged_attention(*_args(case), **kw)
    check = check_attention(out, case)
    assert check.passed and not check.warning, str(check)


def test_fp8_pairs_are_taken_only_where_they_apply(monkeypatch):
    """``KV_FP8``: the cvt pairs need an fp8 cache, fp16 dots, a GPU that converts pairs and even
    offsets; anything else widens through the compiler (1), and a cache in the query dtype is 0."""
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    assert host.fp8_widening(torch.bfloat16, True, True, True) == 0
    monkeypatch.setattr(host, "FP8_PAIRS_K", False)
    assert host.fp8_widening(e4, True, True, True) == 2
    assert host.fp8_widening(e5, True, True, True) == 3
    for missing in range(3):  # without any one condition: the compiler's widening
        assert host.fp8_widening(e4, *[i != missing for i in range(3)]) == 1
    monkeypatch.setattr(host, "FP8_PAIRS_K", True)
    assert (host.fp8_widening(e4, True, True, True), host.fp8_widening(e5, True, True, True)) == (4, 5)
    monkeypatch.setattr(host, "FP8_PAIRS", False)
    assert host.fp8_widening(e5, True, True, True) == 1
    # the interpreter runs no inline assembly: never native there, whatever the device
    assert not tpa._fp8_native(torch.device("cuda"), True) and not tpa._fp8_native(torch.device("cpu"), False)


def _fp8_pairs_gpu() -> bool:
    return DEVICE == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.skipif(not _fp8_pairs_gpu(), reason="the cvt of fp8 pairs needs a CUDA GPU of sm_89 or later")
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
def test_widen_pairs_converts_every_fp8_pair_exactly(kv_dtype):
    """All 65536 pairs of fp8 bytes through ``_widen_pairs``, against torch's conversion of each byte,
    bit for bit (NaN for NaN): the lower byte is the first value, as memory holds them."""
    import triton.language as tl

    @triton.jit
    def widen(x_ptr, out_ptr, E5M2: tl.constexpr):
        r = tl.arange(0, 512)
        c = tl.arange(0, 128)
        x = tl.load(x_ptr + r[:, None] * 128 + c[None, :])  # [512, 128]: every pair
        y = tpa._widen_pairs(x, E5M2)  # [512, 256]
        c2 = tl.arange(0, 256)
        tl.store(out_ptr + r[:, None] * 256 + c2[None, :], y)

    pairs = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).cuda()  # 0 .. 65535 as 16 bits
    out = torch.empty(1 << 17, dtype=torch.float16, device="cuda")
    widen[(1,)](pairs, out, E5M2=kv_dtype == torch.float8_e5m2)
    want = pairs.view(torch.uint8).view(kv_dtype).to(torch.float16)  # little-endian: the lower byte first
    nan = want.isnan()
    assert torch.equal(nan, out.isnan()), "NaN where the conversion gives none, or the other way"
    assert torch.equal(out[~nan].view(torch.int16), want[~nan].view(torch.int16)), "an fp8 value widened wrongly"


@runs_kernel
@pytest.mark.parametrize("odd", ["key_address", "value_address", "value_stride", "head_dim"])
def test_an_odd_offset_into_an_fp8_cache_widens_through_the_compiler(odd, monkeypatch):
    """16-bit pairs need every offset into both caches even: a cache whose first byte is at an
    odd address, a cache row of an odd number of elements (a padded view) or an odd head_dim
    takes the compiler's widening (``KV_FP8`` 1), and the output is right. The device is made to
    claim the pair conversion (``_fp8_native``), so that the offsets alone decide, here too."""
    spec = CaseSpec(
        "t",
        ((90, 1), (40, 9)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=31 if odd == "head_dim" else 32,
        dtype=torch.float16,
        kv_dtype=torch.float8_e5m2,
        k_scale=0.5,
        v_scale=2.0,
    )
    case = spec.build().to(DEVICE)
    args = _args(case)
    if odd in ("key_address", "value_address"):
        i = 1 if odd == "key_address" else 2
        shifted = torch.empty(args[i].numel() + 1, dtype=torch.uint8, device=DEVICE)[1:].view(args[i].dtype)
        args[i] = shifted.view(args[i].shape).copy_(args[i])  # the same values, one byte further
        assert args[i].data_ptr() % 2 == 1
    elif odd == "head_dim":  # 31 values a head in rows of 32: every stride even, head_dim alone odd
        for i in (1, 2):
            N, bs, H, D = args[i].shape
            args[i] = torch.zeros(N, bs, H, D + 1, dtype=args[i].dtype, device=DEVICE)[..., :D].copy_(args[i])
        assert all(st % 2 == 0 for t in args[1:3] for st in t.stride()[:3])
    elif odd == "value_stride":
        N, bs, H, D = args[2].shape
        padded = torch.zeros(N, bs, H * D + 1, dtype=torch.uint8, device=DEVICE).view(args[2].dtype)
        args[2] = padded[:, :, : H * D].view(N, bs, H, D).copy_(args[2])  # rows of H * D + 1 elements
        assert args[2].stride(1) % 2 == 1
    monkeypatch.setattr(tpa, "_fp8_native", lambda *a: True)
    modes = []
    real = tpa.fp8_widening
    monkeypatch.setattr(tpa, "fp8_widening", lambda *a: modes.append(real(*a)) or modes[-1])
    out = tpa.paged_attention(*args, scale=case.scale, k_scale=case.k_scale, v_scale=case.v_scale)
    assert modes == [1], modes
    check = check_attention(out, case)
    assert check.passed and not check.warning, str(check)


@runs_kernel
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("return_lse", [False, True], ids=["attention", "lse"])
def test_compile_only_launches_nothing_and_compiles_what_the_launch_runs(return_lse, dtype):
    """``compile_only`` (the suite's warm-up ahead) writes nothing (bf16 on the interpreter
    included, where the kernel writes an fp32 copy); compiled, it fills the kernels' caches
    with exactly the specializations the launch then runs (no compile after it; GPU only).
    A head dim and block size no other test here uses: a fresh configuration."""
    spec = CaseSpec("t", ((37, 1), (29, 11)), num_heads=6, num_kv_heads=2, head_dim=40, block_size=7, dtype=dtype)
    case = spec.build().to(DEVICE)
    kernels = (tpa._decode_kernel, tpa._prefill_kernel)

    def compiled():
        return sum(len(caches[0]) for k in kernels for caches in getattr(k, "device_caches", {}).values())

    out = torch.full_like(case.query, float("nan"))
    before = compiled()
    kw = dict(scale=case.scale, return_lse=return_lse)
    result = tpa.paged_attention(*_args(case), out=out, compile_only=True, **kw)
    assert (result[0] if return_lse else result) is out and torch.isnan(out).all(), "compile_only wrote the output"
    after = compiled()
    if not tpa.interpreter_active():
        assert after == before + 2, f"compile_only compiled {after - before} kernels, expected decode and prefill"
    result = tpa.paged_attention(*_args(case), out=out, **kw)
    assert compiled() == after, "the launch compiled again: compile_only specialized differently"
    check = check_attention(result[0] if return_lse else result, case)
    assert check.passed and not check.warning, str(check)


@pytest.mark.parametrize("operation", ["attention", "lse"])
def test_the_adapter_warms_up_ahead_by_compiling_only(operation, monkeypatch):
    """Compiled, ``warmup_ahead`` asks the kernel to compile the case's kernels (the lse
    ones for "lse") and launch nothing; on the interpreter it calls nothing at all."""
    from pagedattn.adapters.triton import TritonBackend

    backend = TritonBackend()
    calls = []
    monkeypatch.setattr(backend._kernel, "paged_attention", lambda *a, **kw: calls.append(kw))
    case = BASE.build().to(DEVICE)
    monkeypatch.setattr(backend, "interpreter", True)
    backend.warmup_ahead(case, operation)
    assert calls == []
    monkeypatch.setattr(backend, "interpreter", False)
    backend.warmup_ahead(case, operation)
    assert len(calls) == 1 and calls[0]["compile_only"] is True and calls[0]["return_lse"] == (operation == "lse")
