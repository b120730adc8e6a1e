#!/bin/bash
# Issue 16, fourteenth stop: where the GPU check's time goes, in one process, many rounds
# (probe_check_pass.py), on the last stop's final code.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=4 step probe 300 python benchmarks/results/probe_check_pass.py $OUT/probe-check-pass.json $OUT/probe-check-profile.txt
log "done"
