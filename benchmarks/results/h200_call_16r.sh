#!/bin/bash
# Issue 16, eighth stop, first call: where the fused check's time goes on the GPU
# (probe_check_gpu.py: wall, device time, host operations, launch cost, the check's pieces).
. benchmarks/results/h200_steps.sh
machine_info
TAIL=80 step probe_check 300 python benchmarks/results/probe_check_gpu.py $OUT/probe-check-gpu.json
log "done"
