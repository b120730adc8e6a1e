#!/bin/bash
# Issue 16, sixteenth stop, fifth call (the final check code, after the review's changes to
# ab7f0bc): the check's GPU tests, its verdicts against the torch path's, the thorough profile on
# an empty Triton cache.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=3 step gpu_tests 150 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py tests/test_oracle.py -q -n 8 -rfEsx
TAIL=2 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=2 step compare_standard 90 python benchmarks/results/fused_check_compare.py --profile standard
export TRITON_CACHE_DIR=/tmp/tc-21e; rm -rf $TRITON_CACHE_DIR
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
log "done"
