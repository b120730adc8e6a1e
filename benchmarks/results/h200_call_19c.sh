#!/bin/bash
# Issue 16, fourteenth stop: what each piece of the GPU check costs, by taking it away
# (probe_check_ablate.py), on the last stop's final code.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=5 step ablate 300 python benchmarks/results/probe_check_ablate.py $OUT/probe-check-ablate.json
log "done"
