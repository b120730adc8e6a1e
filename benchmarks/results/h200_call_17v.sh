#!/bin/bash
# Issue 17, seventh round, ninth call (run from the tree's root, with .dev/old17o carried):
# a whole sequence a program merging its splits in its loop (B=16 and 32), beside storing them.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
PYTHONPATH=$PYTHONPATH:$PWD/.dev/old17o TAIL=60 PROBE_ROUND=5 step probe 270 python benchmarks/results/probe_issue17o.py $OUT/probe.json
log "done"
