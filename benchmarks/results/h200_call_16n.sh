#!/bin/bash
# Issue 16, seventh round, third call: as h200_call_16m.sh, after the review's mends (non-finite
# bounds fail, the case's GPU, gamma_{k+3}, the CPU's floor); the GPU tests of the policy, both profiles compared, the bench, one thorough run.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=4 step test_policy 120 python -m pytest -p no:cacheprovider tests/test_policy.py -q -n 4 -rfEx
TAIL=3 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=3 step compare_standard 90 python benchmarks/results/fused_check_compare.py --profile standard
TAIL=60 step profile_lse 60 python benchmarks/results/profile_check.py
TAIL=12 step bench_suite 150 python benchmarks/bench_suite.py --device cuda --repeats 5 --out $OUT/gpu-suite.json
RUNS=${RUNS-1}
for run in $RUNS; do
  export TRITON_CACHE_DIR=$(mktemp -d /tmp/tcache-$run-XXXX)
  TAIL=4 step thorough_run$run 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
    --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 \
    --report-json=$OUT/thorough-run$run.json -q
  count_compiles $TRITON_CACHE_DIR
done
log "done"
