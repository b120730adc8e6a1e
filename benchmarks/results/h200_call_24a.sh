#!/bin/bash
# Issue 17, nineteenth stop, first call: the decode's dots with keys as M (wgmma), a minimal
# prototype against the same decode as the kernel forms it (mma.sync), bf16 and fp8 caches.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=12 step proto_compile 120 python benchmarks/results/proto_decode_swapped.py compile
TAIL=30 step proto_time 300 python benchmarks/results/proto_decode_swapped.py time $OUT/proto-swapped.json
log "done"
