#!/bin/bash
# Issue 16, eighteenth stop, third call: the final tree (a search item's first claimed draw may
# start late; _cuda_available a functools.cache): the fused check's and the search's GPU tests
# (the slow-marked ones too) and the thorough profile on an empty Triton cache.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=3 step gpu_tests 150 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_search.py -m "slow or not slow" -q -n 8 -rfEsx
export TRITON_CACHE_DIR=/tmp/tc-23c; rm -rf $TRITON_CACHE_DIR
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
log "done"
