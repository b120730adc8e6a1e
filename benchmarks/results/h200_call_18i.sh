#!/bin/bash
# Issue 16, thirteenth stop, after the final read: the thorough profile once more on the final
# code (empty Triton cache), and the warm-up's tests on the GPU.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=3 step gpu_tests 100 python -m pytest -p no:cacheprovider tests/test_ahead.py -q -n 4 -rfEsx
export TRITON_CACHE_DIR=/tmp/tc-18i; rm -rf $TRITON_CACHE_DIR
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
log "done"
