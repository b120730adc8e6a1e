#!/bin/bash
# Issue 16, fourteenth stop: the host time of the check's Triton launches, piece by piece
# (probe_launch_host.py).
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=10 step launch 200 python benchmarks/results/probe_launch_host.py $OUT/probe-launch-host.json
log "done"
