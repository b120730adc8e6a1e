"""The decode kernel's splits and their merge: splits before a window, the merge's parts,
every launch shape computing the same bits, the short split tier, the split counters."""

import dataclasses

import pytest
import torch

from pagedattn.cases import CaseSpec
from pagedattn.kernels import launch_plan
from pagedattn.kernels.decode_splits import decode_fold, decode_split
from pagedattn.kernels.tuning import TUNING
from pagedattn.oracle import check_attention, check_attention_lse
from tests.asserts import assert_equal
from tests.triton_support import (
    DEVICE,
    KERNEL_CASES,
    SLOW,
    attention,
    case_args,
    force_decode_shape,
    force_flat_grid,
    runs_kernel,
)

triton = pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")
from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402  (after the interpreter is decided)


@runs_kernel
def test_decode_splits_before_the_window_are_neither_computed_nor_merged():
    # 1100 keys, window 77: only the last split holds visible keys. NaN in every other
    # split's scratch proves the merge never reads them.
    spec = CaseSpec("t", ((1100, 1), (600, 1)), num_heads=8, sliding_window=77, sinks=True)
    case = spec.build().to(DEVICE)
    kw = dict(scale=case.scale, sliding_window=77, sinks=case.sinks, return_lse=True)
    prep = tpa.prepare(*case_args(case), **kw)
    assert prep.part_acc is not None and prep.part_ml is not None
    assert prep.plan.max_splits == -(-1100 // decode_split(1100)) >= 3
    prep.part_acc.fill_(float("nan"))
    prep.part_ml.fill_(float("nan"))
    out, lse = tpa.run(prep, case.query, case.key_cache, case.value_cache)
    out_check, lse_check = check_attention_lse(out, lse, case)
    assert out_check.passed and lse_check.passed, f"{out_check}\n{lse_check}"


@runs_kernel
@pytest.mark.parametrize("spp, slots", [(4, 2), (2, 8)], ids=["parts", "splits"])
def test_a_program_of_whole_parts_stores_one_state_a_part(spp, slots, monkeypatch):
    """The merge folds a history's splits in parts (``decode_fold_parts``): where a split-loop
    program's splits are whole parts (``LOOP_PARTS``) it folds them in its loop and stores one
    state a part, else one a split; the same bits either way, and as one split a program's. 8
    splits of 32 keys in 2 parts of 4, under a window from split 3 (part 0's last) and a sink:
    four splits a program store parts 0 and 1 (slots 2-7 untouched, NaN), two a program splits
    3-7."""
    t = dataclasses.replace(TUNING, split_size=32, decode_block_n=16, short_under=0, decode_fold_parts=2)
    spec = CaseSpec(
        "t", ((256, 1),), num_heads=4, num_kv_heads=2, head_dim=32, block_size=8, sliding_window=150, sinks=True
    )
    case = spec.build().to(DEVICE)
    kw = dict(scale=case.scale, sliding_window=150, sinks=case.sinks, return_lse=True)
    with monkeypatch.context() as m:
        force_decode_shape(m, (False, 1, False))
        ref = attention(case, t, **kw)
    force_decode_shape(monkeypatch, (True, spp, False))
    prep = tpa.prepare(*case_args(case), tuning=t, **kw)
    assert prep.plan.max_splits == 8 and prep.plan.decode.SPLITS_PER_PROGRAM == spp
    assert not prep.plan.decode.SPLIT_WHOLE and prep.plan.decode.LOOP_PARTS == (slots == 2)
    prep.part_acc.fill_(float("nan"))
    prep.part_ml.fill_(float("nan"))
    out, lse = tpa.run(prep, case.query, case.key_cache, case.value_cache)
    c1, c2 = check_attention_lse(out, lse, case)
    assert c1.passed and c2.passed and not (c1.warning or c2.warning), f"{c1}\n{c2}"
    assert_equal(out, ref[0], f"{spec.id}: out at {spp} splits a program against one split a program")
    assert_equal(lse, ref[1], f"{spec.id}: lse at {spp} splits a program against one split a program")
    written = ~prep.part_ml[0, :, :, 0].isnan().all(dim=-1)  # [splits]: a state stored in the slot
    expect = [True] * 2 + [False] * 6 if slots == 2 else [False] * 3 + [True] * 5
    assert written.tolist() == expect


@runs_kernel
@pytest.mark.parametrize("fold", [pytest.param(1, marks=SLOW), 2, pytest.param(3, marks=SLOW)])
def test_programs_of_whole_parts_at_every_fold_compute_one_split_a_programs_bits(fold, monkeypatch):
    """The host and the kernel each compute a history's part size (``decode_fold``, the
    kernel's ``fold``): where they disagree, ``LOOP_PARTS`` programs would straddle the kernel's
    parts and drop splits. Histories of 4k to 4k+3 splits (k = ``fold``, ``decode_fold_parts``
    4), and single ones of 9 and 11 splits, at k and 2k splits a program: ``LOOP_PARTS``, the
    bits of one split a program, the oracle's verdict."""
    t = dataclasses.replace(TUNING, split_size=16, decode_block_n=16, short_under=0, long_from=10**6)
    batches = [[16 * (4 * fold + r) - 3 for r in range(4)]] + ([[16 * 9 - 5], [16 * 11]] if fold == 2 else [])
    for lens in batches:
        folds = {decode_fold(-(-n // 16), t) for n in lens}
        assert folds == {fold} or (fold == 2 and len(lens) == 1), (lens, folds)
        case = CaseSpec("t", tuple((n, 1) for n in lens), num_heads=4, num_kv_heads=2, head_dim=32, dtype=torch.float16)
        case = case.build()
        case = case.to(DEVICE)
        with monkeypatch.context() as m:
            force_decode_shape(m, (False, 1, False))
            ref = attention(case, t, scale=case.scale)
        for spp in (fold, 2 * fold):
            with monkeypatch.context() as m:
                force_decode_shape(m, (True, spp, False))
                prep = tpa.prepare(*case_args(case), scale=case.scale, tuning=t)
                assert not prep.plan.decode.SPLIT_WHOLE, (lens, spp)
                assert prep.plan.decode.LOOP_PARTS == (max(folds) > 1), (lens, spp)
                out = tpa.run(prep, case.query, case.key_cache, case.value_cache)
            assert_equal(out, ref, f"histories of {lens} keys at {spp} splits a program against one a program")
        check = check_attention(ref, case)
        assert check.passed and not check.warning, str(check)


@runs_kernel
@pytest.mark.parametrize("grid", ["three-axes", "flat"])
@pytest.mark.parametrize("long_from, max_splits", [(10**9, 3), (48, 2)], ids=["short-splits", "long-splits-from-48"])
@pytest.mark.parametrize("spec", KERNEL_CASES[:3], ids=lambda s: s.id)
def test_many_splits_merge_within_policy(spec, long_from, max_splits, grid, monkeypatch):
    """Small splits, so the log-sum-exp merge of many partial states runs on small cases;
    with ``long_from=48`` the 70-key history takes 64-key splits, the others 32 (the regular
    tiers; the short one has its own test). Both decode grids (three axes, and the one axis of
    launches past ``GRID_YZ_MAX``): several sequences and splits count themselves done per
    (sequence, kv head)."""
    if grid == "flat":
        force_flat_grid(monkeypatch)
    t = dataclasses.replace(TUNING, short_under=0, split_size=32, split_long=64, long_from=long_from, decode_block_n=16)
    case = spec.build().to(DEVICE)
    plan = launch_plan.plan_launch(case.seq_lens_list, case.query_lens, 4, 2, 64, 16, case.dtype, False, tuning=t)
    assert plan.max_splits == max_splits, f"{case.seq_lens_list}: {plan.max_splits} splits, expected {max_splits}"
    assert plan.decode.FLAT_GRID == (grid == "flat")
    check = check_attention(attention(case, t, scale=case.scale), case)
    assert check.passed and not check.warning, str(check)


#: the decode launch's shapes (``decode_launch_shape``'s: the split loop, splits a program, the
#: whole-sequence register cap): one split a program, the split loop at 1, 2, 3, 6 and every split a
#: program (merged in its loop), and that at the register cap of whole sequences past one wave
LAUNCH_SHAPES = {
    "one-split": (False, 1, False),
    **{f"loop-{n}": (True, n, False) for n in (1, 2, 3, 6, 7)},
    "loop-7-capped": (True, 7, True),
}
#: on the interpreter, which has no registers to cap, and where each shape costs a second of CPU
#: time a case: one split a program, and the loop at 1, 3, 6 (whole parts of 1, 2 and 3 splits
#: with decode_fold_parts 2: ``LOOP_PARTS``) and every split a program
INTERPRETER_SHAPES = ("one-split", "loop-1", "loop-3", "loop-6", "loop-7")


@runs_kernel
@pytest.mark.parametrize(
    "kw",
    [
        pytest.param(dict(sinks=True, fold_parts=2), marks=SLOW),
        pytest.param(dict(sliding_window=45, dtype=torch.float32, fold_parts=2), marks=SLOW),
        pytest.param(dict(alibi_slopes=True, logits_soft_cap=20.0, dtype=torch.bfloat16), marks=SLOW),
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
    register cap changes no arithmetic. Histories of one to seven 32-key splits (64-key splits
    from 150 keys), a window that starts mid-split, a continuation beside them; fp16, fp32, bf16
    queries, an fp8 cache."""
    kw = dict(kw)
    negative = kw.pop("negative_scores", False)
    # the merge's parts (decode_fold_parts): 2 gives parts of 1, 2 and 3 splits here (histories
    # of 1-3, 4-5 and 7 splits); 6 splits a program folds whole parts of each (LOOP_PARTS), 2 or 3
    # do not for every history, so every program stores its splits; 4 (the default) parts of
    # one split; 0 one fold of every split
    fold_parts = kw.pop("fold_parts", TUNING.decode_fold_parts)
    t = dataclasses.replace(
        TUNING,
        split_size=32,
        split_long=64,
        long_from=150,
        decode_block_n=16,
        short_under=0,
        decode_fold_parts=fold_parts,
    )
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
    for name, shape in LAUNCH_SHAPES.items():
        if DEVICE == "cpu" and name not in INTERPRETER_SHAPES:
            continue
        with monkeypatch.context() as m:
            force_decode_shape(m, shape)
            kw = dict(scale=case.scale, k_scale=case.k_scale, return_lse=True, tuning=t)
            prep = tpa.prepare(*case_args(case), **kw, **extra)
            cfg = prep.plan.decode
            assert (cfg.SPLIT_LOOP, cfg.SPLITS_PER_PROGRAM, prep.plan.max_splits) == (*shape[:2], 7), name
            assert (cfg.maxnreg is not None) == ("capped" in name), name
            # every split in one program: merged in its loop
            assert cfg.SPLIT_WHOLE == (name in ("loop-7", "loop-7-capped")), name
            assert cfg.LOOP_PARTS == (name == "loop-6" and fold_parts == 2), name
            assert prep.part_acc.shape[1] == prep.part_ml.shape[1] == (1 if cfg.SPLIT_WHOLE else 7), name
            got[name] = tpa.run(prep, case.query, case.key_cache, case.value_cache)
            assert int(prep.done.abs().sum()) == 0, f"{name}: counters left at {prep.done.tolist()}"
    c1, c2 = check_attention_lse(*got["one-split"], case)
    assert c1.passed and c2.passed and not (c1.warning or c2.warning), f"{c1}\n{c2}"
    for name, (out, lse) in got.items():
        assert_equal(out, got["one-split"][0], f"{spec.id}: out of the {name} launch against one-split")
        assert_equal(lse, got["one-split"][1], f"{spec.id}: lse of the {name} launch against one-split")


@runs_kernel
def test_short_history_split_tier_within_policy():
    """Histories under ``short_under`` keys take ``split_short``-key splits, in the kernel as in
    ``decode_split`` (the plan's scratch is sized by the host's rule)."""
    t = dataclasses.replace(TUNING, split_size=32, split_short=16, short_under=64, decode_block_n=16)
    assert [decode_split(n, t) for n in (17, 63, 64, 70)] == [16, 16, 32, 32]
    case = CaseSpec("t", ((63, 1), (70, 1), (9, 1)), sinks=True, dtype=torch.float16).build().to(DEVICE)
    plan = launch_plan.plan_launch(case.seq_lens_list, case.query_lens, 4, 2, 64, 16, case.dtype, False, tuning=t)
    assert plan.max_splits == 4, plan  # 63 keys in 16-key splits
    out, lse = attention(case, t, scale=case.scale, sinks=case.sinks, return_lse=True)
    c1, c2 = check_attention_lse(out, lse, case)
    assert c1.passed and c2.passed and not (c1.warning or c2.warning), f"{c1}\n{c2}"


@runs_kernel
def test_run_leaves_the_split_counters_at_zero():
    """The program whose count completes a sequence's splits resets its counter: the next
    launch, or a graph replay of this one, starts from zero."""
    case = CaseSpec("t", ((1100, 1), (600, 1), (40, 1)), num_heads=8, sliding_window=700).build().to(DEVICE)
    prep = tpa.prepare(*case_args(case), scale=case.scale, sliding_window=700)
    assert prep.done is not None and prep.plan.max_splits == -(-1100 // decode_split(1100)) >= 3
    for _ in range(2):
        out = tpa.run(prep, case.query, case.key_cache, case.value_cache)
        assert int(prep.done.abs().sum()) == 0, f"split counters left at {prep.done.tolist()}"
        check = check_attention(out, case)
        assert check.passed and not check.warning, str(check)
