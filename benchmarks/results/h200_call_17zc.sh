#!/bin/bash
# Issue 17, eighth stop, fifth call (run from the tree's root): the decode pipeline's depth,
# 2, 3 (default) or 4 stages (probe round 11).
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
TAIL=70 PROBE_ROUND=11 step probe 300 python benchmarks/results/probe_issue17o.py $OUT/probe.json
log "done"
