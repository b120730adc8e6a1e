#!/bin/bash
# Issue 17, nineteenth stop, sixth call: small decode programs (one or two warps, 16- or 32-key tiles)
# under register caps, bf16 and fp8, B=32 L=4k.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=60 step proto_small 400 python benchmarks/results/proto_decode_swapped.py small $OUT/proto-small.json
log "done"
