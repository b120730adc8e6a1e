#!/bin/bash
# Issue 16, eighteenth stop, fourth call: the thorough profile of the final tree twice more, each on
# an empty Triton cache (call 23c's run took 64.3 s wall against 55.6 s on 56201ba: its cases waited
# longer on the warm-up's compiles; is that the lease or the tree?).
. benchmarks/results/h200_steps.sh
machine_info
for r in 1 2; do
  export TRITON_CACHE_DIR=/tmp/tc-23d$r; rm -rf $TRITON_CACHE_DIR
  TAIL=3 step thorough$r 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
    --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough$r.json -q
done
log "done"
