#!/bin/bash
# Issue 17, nineteenth stop, fourth call: what the decode's page reads alone reach at B=32 L=4k,
# bf16 and fp8, in the benchmark's token-major layout and head-major, beside the full decode.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=14 step proto_ceiling 300 python benchmarks/results/proto_decode_swapped.py ceiling $OUT/proto-ceiling.json
log "done"
