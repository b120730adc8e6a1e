#!/bin/bash
# Issue 17, nineteenth stop, tenth call: do one-, two- and four-warp programs of 16-key fp8 tiles
# compute the same bits, with the row sums by tl.sum and by a dot with ones (the prototype), and
# how fast are four-warp 16-key programs at small batches.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=20 step proto_warps 300 python benchmarks/results/proto_decode_swapped.py warps $OUT/proto-warps.json
log "done"
