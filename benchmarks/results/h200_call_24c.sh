#!/bin/bash
# Issue 17, nineteenth stop, third call: the swapped-dots prototype's best forms at 512-, 1024-
# and 2048-key splits (B=32 L=4k), whether a program's own start and end bound the fp8 decode.
. benchmarks/results/h200_steps.sh
machine_info
for S in 512 1024 2048; do
  TAIL=8 step proto_split$S 150 python benchmarks/results/proto_decode_swapped.py splits $OUT/proto-swapped-split$S.json $S
done
log "done"
