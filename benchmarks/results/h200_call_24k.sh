#!/bin/bash
# Issue 16, nineteenth stop: the thorough profile once more on the final tree (the package's code is
# 439970b's, as in call 23e), on an empty Triton cache: another sample of target 4 (under 60 s).
. benchmarks/results/h200_steps.sh
machine_info
export TRITON_CACHE_DIR=/tmp/tc-24k; rm -rf $TRITON_CACHE_DIR
TAIL=4 step thorough 200 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
log "done"
