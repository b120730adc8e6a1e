#!/bin/bash
# Issue 17, nineteenth stop, second call: the minimal decode of proto_decode_swapped.py at
# B=32 L=4k over tiles, warps and stages, both dot forms, bf16 and fp8 caches.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=80 step proto_sweep 400 python benchmarks/results/proto_decode_swapped.py sweep $OUT/proto-swapped-sweep.json
log "done"
