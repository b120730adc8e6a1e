#!/bin/bash
# Issue 17, eighth stop, first call (run from the tree's root): whole sequences a program past
# one wave (probe round 7: B = 48, 64, 96, 128), merged in the loop, with and without a
# 168-register cap (three programs an SM).
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
TAIL=60 PROBE_ROUND=7 step probe 400 python benchmarks/results/probe_issue17o.py $OUT/probe.json
log "done"
