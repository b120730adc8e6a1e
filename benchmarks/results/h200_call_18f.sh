#!/bin/bash
# Issue 16, thirteenth stop, final call (run from the tree's root): the GPU tests of what this stop
# changed (the oracle's history conversion, the check's moments, the search's rejections, the
# warm-up ahead), the thorough profile twice on an empty Triton cache (timeline plugin on), and the
# check's time against the oracle's on the GPU.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=4 step gpu_tests 150 python -m pytest -p no:cacheprovider tests/test_oracle.py tests/test_policy.py \
  tests/test_fused.py tests/test_search.py tests/test_ahead.py -q -n 4 -rfEsx
for run in 1 2; do
  export TRITON_CACHE_DIR=/tmp/tc-18f-$run; rm -rf $TRITON_CACHE_DIR
  export PAGEDATTN_TIMELINE=$OUT/timeline$run.jsonl
  TAIL=4 step thorough$run 150 python -m pytest -p pagedattn.plugin -p benchmarks.results.timeline_plugin \
    -p no:cacheprovider conformance --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 \
    --report-json=$OUT/thorough$run.json -q
  unset PAGEDATTN_TIMELINE
  TAIL=14 step report$run 60 python benchmarks/results/timeline_report.py $OUT/timeline$run.jsonl --top 3
done
TAIL=8 step bench_suite 150 python benchmarks/bench_suite.py --device cuda --repeats 5 --out $OUT/gpu-suite.json
log "done"
