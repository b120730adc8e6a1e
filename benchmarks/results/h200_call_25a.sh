#!/bin/bash
# Issue 17, twentieth stop, first call: the quarter-split prototype (proto_decode_quarters.py):
# whether quarters in turn on one warp and side by side on four give the same bits, and how
# fast each is at small and large batches beside the minimal decode's forms.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=30 step proto_quarters 420 python benchmarks/results/proto_decode_quarters.py time $OUT/proto-quarters.json
log "done"
