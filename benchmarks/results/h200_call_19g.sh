#!/bin/bash
# Issue 16, fourteenth stop: what the GPU check holds at its peak on the lse case, against the
# oracle (probe_check_memory_gpu.py: the allocator's recorded trace, replayed).
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=40 step memory 120 python benchmarks/results/probe_check_memory_gpu.py $OUT/check-memory-gpu.txt
log "done"
