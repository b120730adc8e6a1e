"""The Triton kernel's tuning: tile sizes, split sizes and the decode launch's thresholds.

One frozen object, ``TUNING``, read by the launch plan (``launch_plan.plan_launch``).
None of these values changes what a sequence computes in a way that depends on the
batch: each is a fixed rule of a sequence's own sizes, or a launch shape that changes
no bit. The measurements behind each value are in ``docs/kernel-tuning.md``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelTuning:
    """Every tuned constant of the kernel, with why it has its value (H200, triton 3.6)."""

    # decode tiles and splits
    decode_block_n: int = 64  # keys a decode step; every split size below is a whole number of steps
    decode_warps: int = 4  # warps a decode program: the wave sizes below count programs of four warps
    decode_stages: int = 3  # two K/V tiles in flight beside the one in use (the table is read a step ahead)
    split_size: int = 512  # keys a split: one history fills the GPU, with few partial states to merge
    split_long: int = 2048  # from long_from keys on: fewer partial states, still enough programs alone
    long_from: int = 16384  # the length from which a history takes split_long-key splits (eight or more)
    split_short: int = 256  # under short_under keys: twice the programs, where one history leaves SMs idle
    short_under: int = 4096  # the short tier's bound; past it the extra partial states cost large batches (0: none)
    decode_fold_parts: int = 4  # the merge's parts a history: a split-loop program folds whole parts in its loop
    # prefill tiles
    prefill_rows: int = 128  # query rows a tile (tokens x padded GQA group): eight warps at head_dim > 64
    prefill_block_n: int = 64  # keys a step: three stages beside 128 rows fit the budget; trees take <= 64
    prefill_stages: int = 3  # a third K/V buffer where it fits prefill_shared_budget, else 2
    prefill_shared_budget: int = 160 * 1024  # of 227 KB on sm_90: room for fp8's widened V and layout conversions
    # fp32 queries: IEEE dots on the FMA units, which the compiler unrolls
    fp32_prefill_rows: int = 16  # small tiles keep fp32's compile time down; its speed is not what is tuned
    fp32_block_n: int = 16  # the same, for the keys of both kernels
    fp32_tile_interpreter: int = 32  # the interpreter compiles nothing and pays per step: larger tiles run faster
    # the decode launch's shape (``launch_plan.decode_launch_shape``)
    decode_wave: int = 264  # split-loop programs in one wave: two an SM on the H200's 132 SMs
    decode_spp_max: int = 16  # the most splits a program takes to fit the split loop in one wave
    decode_balance: float = 0.75  # programs of several splits need mean work this share of the longest's
    decode_whole_fill: float = 0.8  # whole sequences a program past one wave must fill this share of the slots
    decode_wave_capped: int = 396  # programs in one wave at decode_whole_maxnreg registers: three an SM
    decode_whole_maxnreg: int = 168  # 168 registers x 128 threads x 3 programs fit an SM's 65536
    # decode over an fp8 cache
    fp8_decode_maxnreg: int = 128  # past one wave: four programs an SM instead of three, with no spill
    fp8_decode_spp: int = 4  # the most splits an fp8 split-loop program takes (halved down to 2)
    fp8_loop_min_programs: int = 512  # the fewest programs with keys to read at which the fp8 loop gains
    fp8_decode_wave: int = 528  # four programs an SM at fp8_decode_maxnreg registers on 132 SMs (0: no loop)
    fp8_loop_fill: float = 0.8  # the fp8 split loop's programs must fill this share of their waves' slots
    # MLA decode (``triton_mla_decode``): its splits are the decode splits above
    mla_block_h: int = 16  # query heads a program: the dot minimum; each further block reads the keys again (from L2)
    mla_block_n: int = 32  # keys a step: a 576-wide 16-bit tile is 36 KB, two stages of it beside the query fit
    mla_warps: int = 4  # warps a program: the [16, 512] fp32 accumulator is 64 registers a thread at four
    mla_stages: int = 2  # one key tile in flight beside the one in use (the tiles are wide)
    mla_multi_rows: int = 32  # rows (new tokens x heads) a program of several new tokens: MTP's 2 tokens of 16 heads
    mla_multi_warps: int = 8  # its [32, 512] fp32 accumulator at 64 registers a thread


#: the kernel's tuning; tests and benchmarks pass ``dataclasses.replace(TUNING, ...)`` to
#: ``plan_launch`` or ``prepare`` to run other tile and split sizes
TUNING = KernelTuning()
