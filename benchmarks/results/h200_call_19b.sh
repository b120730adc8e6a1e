#!/bin/bash
# Issue 16, fourteenth stop: the host time of single torch operations (probe_op_host.py): the
# check's row norms against other ways to form them.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=8 step ops 200 python benchmarks/results/probe_op_host.py $OUT/probe-op-host.json
log "done"
