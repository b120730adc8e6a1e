#!/bin/bash
# Issue 17, nineteenth stop, fifth call: the prototype's fp8 decode under register caps (more
# programs an SM) and on two warps, B=32 L=4k: does occupancy close the gap to the loads alone?
. benchmarks/results/h200_steps.sh
machine_info
TAIL=60 step proto_regs 400 python benchmarks/results/proto_decode_swapped.py regs $OUT/proto-regs.json
log "done"
