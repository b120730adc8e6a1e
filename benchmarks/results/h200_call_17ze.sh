#!/bin/bash
# Issue 17, eighth stop, sixth call (run from the tree's root): a program's splits folded in its loop, one state stored
# a group (probe round 12, an experiment: the bits follow the launch shape).
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
TAIL=70 PROBE_ROUND=12 step probe 300 python benchmarks/results/probe_issue17o.py $OUT/probe.json
log "done"
