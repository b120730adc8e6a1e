#!/bin/bash
# Issue 16, thirteenth stop, third call: the thorough profile's wall with the warm-up ahead's
# classes by GQA group and its mixed cases covering their other regime, now waiting for another
# worker's compile of it before claiming its own class (18b waited while holding it: two threads
# held each other for WAIT_S), twice, each on an empty Triton cache, with the timeline plugin.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
for run in 1 2; do
  export TRITON_CACHE_DIR=/tmp/tc-18c-$run; rm -rf $TRITON_CACHE_DIR
  export PAGEDATTN_TIMELINE=$OUT/timeline$run.jsonl
  TAIL=4 step thorough$run 150 python -m pytest -p pagedattn.plugin -p benchmarks.results.timeline_plugin \
    -p no:cacheprovider conformance --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 \
    --report-json=$OUT/thorough$run.json -q
  unset PAGEDATTN_TIMELINE
  TAIL=14 step report$run 60 python benchmarks/results/timeline_report.py $OUT/timeline$run.jsonl --top 3
done
log "done"
