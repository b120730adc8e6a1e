#!/bin/bash
# Issue 17, sixth round, fourth call (run from the tree's root): the probe's fourth round first, on
# a GPU that has not yet run anything heavy (the third call's probe ran after the thorough profile
# and its latency-bound rows came out 15-25% slower): the bf16 decode grid at 64- and 32-key tiles
# beside SDPA, fp8 at three points; then the release benchmark.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
PROBE_ROUND=4 TAIL=30 step probe4 240 python benchmarks/results/probe_issue17h.py $OUT/probe4.json
TAIL=40 step bench 240 python benchmarks/bench_paged_attention.py --out $OUT/h200.json
log "done"
