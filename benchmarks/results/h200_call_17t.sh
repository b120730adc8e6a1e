#!/bin/bash
# Issue 17, seventh round, seventh call (run from the tree's root, with .dev/old17o carried):
# 256-key splits below 4k keys (SHORT_UNDER), with and without the split loop, B=1 to 128.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
PYTHONPATH=$PYTHONPATH:$PWD/.dev/old17o TAIL=60 PROBE_ROUND=4 step probe 270 python benchmarks/results/probe_issue17o.py $OUT/probe.json
log "done"
