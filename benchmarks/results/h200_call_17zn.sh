#!/bin/bash
# Issue 17, ninth stop, seventh call (run from the tree's root): probe round 14, what the merge in
# parts costs at the points where FlashInfer's TC decode is faster (B=128 L=32k, B=1 at 2k and
# 32k) and beside them (the merge of the seventh stop, DECODE_FOLD_PARTS 0: other bits).
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=40 PROBE_ROUND=14 step probe 200 python benchmarks/results/probe_issue17o.py $OUT/probe.json
log "done"
