#!/bin/bash
# Issue 17, eighth stop, fourth call (run from the tree's root): the merge of stored splits with its
# loads one or two splits ahead (probe round 10).
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
TAIL=70 PROBE_ROUND=10 step probe 300 python benchmarks/results/probe_issue17o.py $OUT/probe.json
log "done"
