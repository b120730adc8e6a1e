#!/bin/bash
# Issue 16, eighth stop, second call: the fused check's host time piece by piece (probe_check_host.py).
. benchmarks/results/h200_steps.sh
machine_info
TAIL=20 step probe_host 200 python benchmarks/results/probe_check_host.py $OUT/probe-check-host.json
log "done"
