#!/bin/bash
# Issue 16, eighth stop, fourth call: timelines of the oracle and the fused check (trace_check.py).
. benchmarks/results/h200_steps.sh
machine_info
TAIL=6 step trace 90 python benchmarks/results/trace_check.py $OUT/traces standard sliding_window-gqa4-bs16-d128-fp32-L4000-B3-permuted-win1024 standard lse-gqa4-bs16-d128-fp32-L4000-B2
gzip $OUT/traces/*.json
log "done"
