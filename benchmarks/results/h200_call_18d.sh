#!/bin/bash
# Issue 16, thirteenth stop, fourth call: the thorough profile's startup (each process's session
# start and end of collection, beside its tests and compiles: the timeline plugin), on an empty
# Triton cache, once.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
export TRITON_CACHE_DIR=/tmp/tc-18d; rm -rf $TRITON_CACHE_DIR
export PAGEDATTN_TIMELINE=$OUT/timeline.jsonl
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p benchmarks.results.timeline_plugin \
  -p no:cacheprovider conformance --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 \
  --report-json=$OUT/thorough.json -q
unset PAGEDATTN_TIMELINE
TAIL=28 step report 60 python benchmarks/results/timeline_report.py $OUT/timeline.jsonl --top 3
log "done"
