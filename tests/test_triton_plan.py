"""The launch plan's arithmetic, from sizes alone: which launch a sequence takes, its tiles, its
splits, the decode launch's shape and grid, the launch limits. No kernel runs here."""

import dataclasses
import functools
import os
import subprocess
import sys

import pytest
import torch

from pagedattn.kernels import checks, decode_splits, launch_plan
from pagedattn.kernels.decode_splits import decode_launch_shape, decode_work
from pagedattn.kernels.tuning import TUNING
from tests.triton_support import plan_of


def test_launch_limits_fail_before_any_launch():
    """What one launch cannot hold is a ProblemError naming the field, from sizes alone: a
    query needing more than 65535 query tiles (fp32, a GQA group of 16: one token a tile),
    a decode scratch past int32 offsets; a strided query past int32 offsets."""
    with pytest.raises(ValueError, match=r"query_start_loc.*65535"):
        plan_of([70000], [70000], heads=16, kv=1, dtype=torch.float32)
    assert plan_of([65535], [65535], heads=16, kv=1, dtype=torch.float32).other.grid[1] == 65535
    never_whole = dataclasses.replace(TUNING, decode_whole_fill=2.0)  # one split a program: every split stored
    with pytest.raises(ValueError, match=r"seq_lens.*2\*\*31"):
        plan_of([2**24] * 66, [1] * 66, tuning=never_whole)
    # whole sequences a program (528 programs, 2 waves of 264) store no split: one a sequence
    plan = plan_of([2**24] * 66, [1] * 66)
    assert (plan.decode.SPLIT_WHOLE, plan.scratch_splits, plan.max_splits) == (True, 1, 2**24 // TUNING.split_long)
    wide = torch.empty(4, 8, 128, device="meta").as_strided((4, 8, 128), (2**30, 128, 1))
    assert checks.last_offset(wide) == 3 * 2**30 + 7 * 128 + 127 > checks.INT32_MAX


def test_plan_splits_decode_from_the_rest():
    plan = plan_of([5000, 40, 300, 1], [1, 40, 7, 1])
    assert plan.decode_seqs == [0, 3] and plan.other_seqs == [1, 2]
    t = TUNING
    assert plan.max_splits == -(-5000 // t.split_size)
    long_and_short = max(t.long_from // t.split_long, -(-5000 // t.split_size))
    assert plan_of([t.long_from, 5000], [1, 1]).max_splits == long_and_short
    assert plan_of([4 * t.long_from], [1]).max_splits == 4 * t.long_from // t.split_long
    # the decode grid for two sequences: kv heads, split groups, sequences, on three axes
    picked = (plan.decode.FLAT_GRID, plan.decode.grid)
    assert picked == (False, (8, plan.max_splits, 2)) == launch_plan.decode_grid(2, plan.max_splits, 8)
    # three axes hold at most GRID_YZ_MAX programs on their second and third (split groups,
    # sequences): past that, one axis in the same order
    most = launch_plan.GRID_YZ_MAX
    assert launch_plan.decode_grid(most, most, 8) == (False, (8, most, most))
    assert launch_plan.decode_grid(most + 1, 3, 8) == (True, (8 * 3 * (most + 1), 1, 1))
    assert launch_plan.decode_grid(2, most + 1, 8) == (True, (8 * (most + 1) * 2, 1, 1))
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
    plan = plan_of([100, 100], [1, 9], heads, kv, d)
    assert (plan.decode.GROUP_PAD, plan.other.GROUP_PAD, plan.decode.HEAD_DIM_PAD) == (
        group_pad_decode,
        group_pad_other,
        d_pad,
    )
    for cfg in (plan.decode, plan.other):
        assert min(cfg.rows, cfg.BLOCK_N, cfg.HEAD_DIM_PAD) >= launch_plan.MIN_DOT, "tl.dot needs >= 16 on the GPU"
        assert not cfg.UPCAST


def test_plan_is_batch_invariant():
    """A sequence's launch, tiles and splits depend on that sequence alone. The launch's shape
    follows the batch: the grid, the decode's split loop, the splits a program takes, whether a
    program merges its whole sequence, and the register caps, none of which changes a bit
    (``test_launch_shape_changes_no_bit``).
    The batch here passes a wave of the split loop, so its shape differs from the sequence's alone."""
    alone_d, alone_p = plan_of([3000], [1]), plan_of([300], [30])
    batch = plan_of([3000, 300, 17, 9000] + [3000] * 40, [1, 30, 17, 1] + [1] * 40)
    shape = ("grid", "SPLIT_GROUPS", "SPLITS_PER_PROGRAM", "SPLIT_LOOP", "SPLIT_WHOLE", "maxnreg")
    assert alone_d.decode.SPLIT_LOOP and not batch.decode.SPLIT_LOOP
    assert alone_d.decode == dataclasses.replace(batch.decode, **{k: getattr(alone_d.decode, k) for k in shape})
    fp8 = functools.partial(plan_of, query_lens=[1] * 41, kv_dtype=torch.float8_e4m3fn)
    alone_f, batch_f = fp8([3000], query_lens=[1]), fp8([3000] * 41)
    assert alone_f.decode.maxnreg is None and batch_f.decode.maxnreg == TUNING.fp8_decode_maxnreg
    assert alone_f.decode == dataclasses.replace(batch_f.decode, **{k: getattr(alone_f.decode, k) for k in shape})
    assert alone_p.other == dataclasses.replace(batch.other, grid=alone_p.other.grid)


def test_bf16_upcast_only_on_the_interpreter():
    assert plan_of([9], [1], interpreter=True).decode.UPCAST
    assert not plan_of([9], [1], interpreter=False).decode.UPCAST
    assert not plan_of([9], [1], dtype=torch.float16, interpreter=True).decode.UPCAST


def test_decode_launch_shape_fits_the_split_loop_in_one_wave():
    """``decode_launch_shape``: the split loop with the fewest splits a program (up to
    ``decode_spp_max`` and the history's) that fit the launch in ``decode_wave`` programs, else
    one split a program without the loop; the plan's grid holds the split groups."""
    # never whole sequences past one wave (their own test)
    t = dataclasses.replace(TUNING, decode_wave=64, decode_spp_max=4, decode_whole_fill=2.0)

    def shape(n, splits, heads, **kw):  # n histories of `splits` 512-key splits each
        return decode_launch_shape([(splits, 0, 512)] * n, heads, tuning=t, **kw)[:2]

    assert shape(1, 8, 8) == (True, 1)  # 64 programs: one wave
    assert shape(2, 8, 8) == (True, 2) and shape(3, 8, 8) == (True, 4)  # 3 * 8 * 2 programs
    assert shape(2, 9, 8) == (True, 3)  # the fewest splits a program that fit: 2 * 8 * 3
    assert shape(5, 8, 8) == (False, 1) and shape(4, 17, 8) == (False, 1)  # no fit up to the cap
    assert shape(64, 1, 8) == (False, 1) and shape(8, 1, 8) == (True, 1)  # never past the history's splits
    plan = plan_of([5000] * 2, [1] * 2, heads=32, kv=8, tuning=t)  # 10 splits of 512 each: 2 * 8 * 4 programs of 3
    assert (plan.decode.SPLIT_LOOP, plan.decode.SPLITS_PER_PROGRAM, plan.decode.SPLIT_GROUPS) == (True, 3, 4)
    assert (plan.decode.FLAT_GRID, plan.decode.grid) == launch_plan.decode_grid(2, 4, 8)
    assert not plan_of([5000] * 9, [1] * 9, tuning=t).decode.SPLIT_LOOP
    # an fp8 cache takes its own rule (its own test), and the register cap only in a launch of
    # more than decode_wave programs at one split each
    assert shape(1, 8, 8, kv_fp8=True) == (False, 1)
    fp8 = functools.partial(plan_of, query_lens=[1], kv_dtype=torch.float8_e4m3fn, tuning=t)
    assert fp8([100]).decode.maxnreg is None and not fp8([100]).decode.SPLIT_LOOP  # 8 programs
    assert fp8([5000]).decode.maxnreg == t.fp8_decode_maxnreg  # 8 * 10 programs
    assert fp8([5000], heads=8, kv=8, d=256).decode.maxnreg is None  # wider tiles would spill
    assert fp8([512 * 8]).decode.maxnreg is None and fp8([512 * 8 + 1]).decode.maxnreg  # 64 programs; 72
    assert fp8([5000], dtype=torch.float32).decode.maxnreg is None  # fp32 queries: their own tiles
    # the split sizes are checked whatever the batch's histories: the short tier's too
    with pytest.raises(RuntimeError, match="splits of 100 keys are not whole tiles of 64"):
        plan_of([5000], [1], tuning=dataclasses.replace(t, short_under=4096, split_short=100))
    # the kernel walks a program's splits in whole tiles: a split size that is not is refused
    with pytest.raises(RuntimeError, match="splits of 40 keys are not whole tiles of 64"):
        plan_of([5000], [1], tuning=dataclasses.replace(t, short_under=0, split_size=40))


def test_decode_launch_shape_over_an_fp8_cache():
    """An fp8 cache: the split loop at the most splits a program, from ``fp8_decode_spp`` halving
    down to 2, at which at least ``fp8_loop_min_programs`` programs (a kv head each) have keys to
    read, filling at least ``fp8_loop_fill`` of their waves' slots (``fp8_decode_wave``),
    balanced, short of a whole history; else one split a program without the loop, whatever fits
    a wave."""
    t = dataclasses.replace(TUNING, fp8_decode_spp=4, fp8_loop_min_programs=512, fp8_decode_wave=528, fp8_loop_fill=0.8)

    def shape(work, heads=8, cap_ok=True, tuning=t):
        return decode_launch_shape(work, heads, kv_fp8=True, cap_ok=cap_ok, tuning=tuning)

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
    assert shape([(4, 0, 512)] * 40, tuning=dataclasses.replace(t, fp8_loop_fill=0.6)) == (True, 2, False)
    # the programs before a window read nothing and are not counted: splits 6 and 7 of 8 visible,
    # one program a history at four or two
    assert decode_work(4096, sliding_window=1000) == (8, 6, 512)
    assert shape([decode_work(4096, sliding_window=1000)] * 63) == (False, 1, False)  # 63 * 1 * 8
    assert shape([decode_work(4096, sliding_window=1000)] * 64) == (True, 4, False)  # 512
    # balance (mean work over the longest program's, decode_balance 0.75), a kv head: 16 programs
    # of four splits beside 100 of one (0.353; 928 programs fill 0.88), 32 of two beside them (0.621)
    assert shape([(8, 0, 512)] * 8 + [(1, 0, 512)] * 100) == (False, 1, False)
    # 40 of four beside 26 of one (0.705; 528 programs, one full wave), 80 of two beside them
    # (0.877; 848 programs fill 0.803 of two waves, just over fp8_loop_fill)
    assert shape([(8, 0, 512)] * 20 + [(1, 0, 512)] * 26) == (True, 2, False)
    assert shape([(8, 0, 512)] * 26 + [(1, 0, 512)] * 14) == (True, 4, False)  # 52 beside 14: 0.841
    assert shape([(8, 0, 512)] * 64, tuning=dataclasses.replace(t, fp8_decode_spp=1)) == (False, 1, False)
    assert shape([(8, 0, 512)] * 64, tuning=dataclasses.replace(t, fp8_decode_spp=2)) == (True, 2, False)
    # the plan: 32 histories of 4096 keys under 8 kv heads take the loop at four splits a
    # program, at the fp8 register cap (a launch past one wave), and fold the merge's parts (2
    # splits each) in it
    fp8 = functools.partial(plan_of, kv_dtype=torch.float8_e4m3fn)
    d = fp8([4096] * 32, [1] * 32).decode
    assert (d.SPLIT_LOOP, d.SPLITS_PER_PROGRAM, d.SPLIT_GROUPS) == (True, 4, 2)
    assert d.LOOP_PARTS and not d.SPLIT_WHOLE
    assert d.maxnreg == TUNING.fp8_decode_maxnreg
    d = fp8([1024] * 64, [1] * 64).decode  # 4 splits of 256, parts of one: stored, merged by parts
    assert (d.SPLIT_LOOP, d.SPLITS_PER_PROGRAM, d.LOOP_PARTS) == (True, 2, False)
    d = fp8([4096] * 32, [1] * 32, sliding_window=1000).decode  # 256 programs with keys to read
    assert not d.SPLIT_LOOP and d.SPLITS_PER_PROGRAM == 1
    d = fp8([4096], [1]).decode  # B=1: 8 splits a kv head stay 64 programs
    assert not d.SPLIT_LOOP and d.maxnreg is None
    # uncapped tiles (fp32 queries, head_dim 256) take one split a program, as before the rule
    assert not fp8([4096] * 32, [1] * 32, dtype=torch.float32).decode.SPLIT_LOOP
    assert not fp8([4096] * 32, [1] * 32, heads=8, d=256).decode.SPLIT_LOOP


def test_decode_launch_shape_whole_sequences_past_one_wave():
    """Past one wave of the split loop, a whole sequence a program where its programs fill at
    least ``decode_whole_fill`` of the waves' slots, at two programs an SM (``decode_wave``) or,
    where the tiles allow the cap, at three (``decode_wave_capped``, ``decode_whole_maxnreg``):
    the fuller wave, two on a tie; else one split a program. Programs of a launch much shorter
    than its longest (a long history beside short ones) take one split each."""
    t = dataclasses.replace(TUNING, decode_wave=64, decode_wave_capped=96)

    def shape(n, splits=8, heads=8, cap_ok=True, keys=512, tuning=t):
        return decode_launch_shape([(splits, 0, keys)] * n, heads, cap_ok=cap_ok, tuning=tuning)

    assert shape(8) == (True, 8, False)  # 64 programs: one wave of the loop
    assert shape(16) == (True, 8, False)  # 128: two full waves of 64, or 2 of 96 (0.67 full)
    assert shape(12) == (True, 8, True)  # 96: one full wave at three an SM (0.75 at two)
    assert shape(12, cap_ok=False) == (False, 1, False)  # ... which the tiles may not allow
    assert shape(24) == (True, 8, False)  # 192: 3 waves of 64 or 2 of 96, both full: two an SM
    assert shape(10) == (True, 8, True)  # 80: 0.63 and 0.83 of the slots filled
    assert shape(9) == (False, 1, False)  # 72: 0.56 and 0.75
    assert shape(30, splits=40) == (True, 40, False)  # 240 of 256 (0.94), past decode_spp_max splits
    assert shape(9, tuning=dataclasses.replace(t, decode_whole_fill=0.7)) == (True, 8, True)
    # the least fill is taken: 16 programs in 2 waves of 10, 0.8
    assert shape(2, heads=8, tuning=dataclasses.replace(t, decode_wave=10, decode_wave_capped=0)) == (True, 8, False)
    assert shape(12, tuning=dataclasses.replace(t, decode_wave_capped=0)) == (False, 1, False)
    # balance: one history of 16 2048-key splits beside seven of 4 256-key ones (8 kv heads):
    # 4 splits a program would fit one wave of 264, but its 8192-key programs would run while
    # the others (1024 keys) idle; the same at whole sequences past one wave
    t = dataclasses.replace(t, decode_wave=264)
    mixed = [(16, 0, 2048)] + [(4, 0, 256)] * 7
    assert decode_launch_shape(mixed, 8, tuning=t) == (False, 1, False)
    assert decode_launch_shape([(16, 0, 2048)] * 8, 8, tuning=t)[:2] == (True, 4)  # the same launch, balanced
    assert decode_launch_shape(mixed[:2], 8, tuning=t)[:2] == (True, 1)  # one split a program fits: always taken
    # ... even unbalanced (0.56)
    assert decode_launch_shape([(16, 0, 2048), (16, 0, 256)], 8, tuning=t) == (True, 1, False)
    t = dataclasses.replace(t, decode_wave_capped=396)
    assert decode_launch_shape([(16, 0, 512)] * 48, 8, cap_ok=True, tuning=t) == (True, 16, True)  # one wave of 396
    unbalanced = [(16, 0, 512)] * 24 + [(2, 0, 512)] * 24
    assert decode_launch_shape(unbalanced, 8, cap_ok=True, tuning=t) == (False, 1, False)
    # a window: the splits before it have no work (``decode_work``), so long histories under
    # one window are as balanced as short ones
    assert decode_work(32768, sliding_window=4096) == (16, 14, 2048)
    assert decode_work(5000, sliding_window=10**6) == (10, 0, 512)
    assert decode_work(5000) == (10, 0, 512)
    assert decode_work(1100, sliding_window=77) == (5, 3, 256)  # keys 1023 on: split 3 (768-1023)
    assert decode_work(1100, sliding_window=1) == (5, 4, 256)  # key 1099 alone
    assert decode_work(1100, sliding_window=1100) == (5, 0, 256)
    # the splits before the window make no programs: three visible a history, two a program
    # (splits 20-21, of which 21 visible, and 22-23): mean 1.5 splits of the longest 2, 0.75
    assert decode_splits._balanced([(24, 21, 512)] * 8, 2)
    # only the visible splits are work: 16 + 7 x 1 splits over 8 programs of up to 16
    assert not decode_splits._balanced([(16, 0, 512)] + [(16, 15, 512)] * 7, 16)
    windowed = [decode_work(n, sliding_window=1000) for n in [12000] + [5000] * 7]  # 3 splits each
    assert decode_splits._balanced(windowed, 24) and not decode_splits._balanced(
        [decode_work(n) for n in [12000] + [5000] * 7], 24
    )
    # the plan: whole sequences need no scratch beyond one split; the capped launch's registers
    plan = plan_of([5000] * 64, [1] * 64)  # 512 programs, 2 waves of 264 (0.97 full)
    assert (plan.decode.SPLIT_WHOLE, plan.decode.maxnreg, plan.scratch_splits, plan.max_splits) == (True, None, 1, 10)
    plan = plan_of([5000] * 48, [1] * 48)  # 384 programs: one wave of 396
    assert (plan.decode.SPLIT_WHOLE, plan.decode.maxnreg) == (True, TUNING.decode_whole_maxnreg)
    assert plan_of([5000] * 48, [1] * 48, d=256, heads=8, kv=8).decode.maxnreg is None  # wider tiles: no cap ...
    assert not plan_of([5000] * 48, [1] * 48, d=256, heads=8, kv=8).decode.SPLIT_WHOLE  # ... and 0.73 filled
    assert plan_of([5000] * 48, [1] * 48, heads=256, kv=8).decode.maxnreg is None  # a GQA group of 32
    assert plan_of([5000] * 48, [1] * 48, dtype=torch.float32).decode.maxnreg is None
    plan = plan_of([5000] * 36, [1] * 36)  # 288 programs: 0.55 / 0.73 of the slots
    assert (plan.decode.SPLIT_WHOLE, plan.decode.SPLIT_LOOP, plan.scratch_splits) == (False, False, 10)


def test_the_host_side_imports_no_triton():
    """The checks, the launch plan and the tuning run where triton is absent (the plan's tests
    here, the oracle's machines): importing them loads no triton."""
    code = (
        "import sys; import pagedattn.kernels.checks, pagedattn.kernels.launch_plan; "
        "assert 'triton' not in sys.modules, 'the host side imported triton'"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, f"importing the kernel's host side failed or loaded triton:\n{proc.stderr[-2000:]}"
