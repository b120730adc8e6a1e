#!/bin/bash
# Issue 16, eighteenth stop, fifth call: the final tree (3d4fe66's code: the search's budget stop
# reviewed) on the H200: the search's and the fused check's GPU tests and the thorough profile on
# an empty Triton cache.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=3 step gpu_tests 150 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_search.py -m "slow or not slow" -q -n 8 -rfEsx
export TRITON_CACHE_DIR=/tmp/tc-23e; rm -rf $TRITON_CACHE_DIR
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
log "done"
