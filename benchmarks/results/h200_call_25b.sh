#!/bin/bash
# Issue 16, twentieth stop, second call: the GPU tests on the tree as the device runs it (not
# installed, PYTHONPATH=.), now that test_search.py's three pytest runs name the suite by its
# directory (they failed here before), and the thorough profile once more on an empty Triton cache.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=3 step gpu_tests 200 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_search.py tests/test_triton.py -m "slow or not slow" -q -n 8 -rfEsx
export TRITON_CACHE_DIR=/tmp/tc-25b; rm -rf $TRITON_CACHE_DIR
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
log "done"
