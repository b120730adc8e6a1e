#!/bin/bash
# Issue 16, thirteenth stop, first call (run from the tree's root): where the thorough profile's
# wall goes. One run on an empty Triton cache with the timeline plugin (every process's test
# starts and ends and every Triton compile, its thread and stages), summarized.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
export TRITON_CACHE_DIR=/tmp/tc-18a; rm -rf $TRITON_CACHE_DIR
export PAGEDATTN_TIMELINE=$OUT/timeline.jsonl
TAIL=8 step thorough 150 python -m pytest -p pagedattn.plugin -p benchmarks.results.timeline_plugin \
  -p no:cacheprovider conformance --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 \
  --report-json=$OUT/thorough.json -q
unset PAGEDATTN_TIMELINE
count_compiles $TRITON_CACHE_DIR
TAIL=40 step report 60 python benchmarks/results/timeline_report.py $OUT/timeline.jsonl --top 15
log "done"
