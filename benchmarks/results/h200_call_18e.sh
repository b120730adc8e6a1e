#!/bin/bash
# Issue 17, tenth stop, first call (run from the tree's root): probe round 15, whole sequences a
# program (the rule at B >= 48 past one wave) against programs of a merge part (16 splits), 8 or
# 32 splits, where FlashInfer's TC decode was 2% faster (B=128 L=32k) and beside it.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=40 PROBE_ROUND=15 step probe 300 python benchmarks/results/probe_issue17o.py $OUT/probe.json
log "done"
