#!/bin/bash
# Issue 16, thirteenth stop, last call: the warm-up ahead with its claims in one order (after a
# review), the thorough profile once on an empty Triton cache (timeline plugin on), and the GPU
# tests of the warm-up and the search.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=4 step gpu_tests 100 python -m pytest -p no:cacheprovider tests/test_ahead.py tests/test_search.py -q -n 4 -rfEsx
export TRITON_CACHE_DIR=/tmp/tc-18h; rm -rf $TRITON_CACHE_DIR
export PAGEDATTN_TIMELINE=$OUT/timeline.jsonl
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p benchmarks.results.timeline_plugin \
  -p no:cacheprovider conformance --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 \
  --report-json=$OUT/thorough.json -q
unset PAGEDATTN_TIMELINE
TAIL=14 step report 60 python benchmarks/results/timeline_report.py $OUT/timeline.jsonl --top 3
log "done"
