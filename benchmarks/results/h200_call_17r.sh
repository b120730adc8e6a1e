#!/bin/bash
# Issue 17, seventh round, fourth call (run from the tree's root, with .dev/old17o carried): the
# split loop past one wave (DECODE_WAVE 528 to 2112: whole sequences a program at B >= 48).
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
PYTHONPATH=$PYTHONPATH:$PWD/.dev/old17o TAIL=60 PROBE_ROUND=3 step probe 270 python benchmarks/results/probe_issue17o.py $OUT/probe.json
log "done"
