#!/bin/bash
# Issue 17, fifth round, last H200 call (run from the tree's root): the release benchmark on the
# tree whose decode grid puts kv heads first (DECODE_GRID='heads_first').
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
TAIL=40 step bench 300 python benchmarks/bench_paged_attention.py --out $OUT/h200.json
log "done"
