#!/bin/bash
# Issue 16, fifth round, third H200 call (run from the tree's root): what the start of a -n 8
# run costs (collection only), then the thorough profile on empty Triton caches, twice with the
# warm-up ahead and once without, then the kernel's GPU tests.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
[ -z "$NO_COLLECT" ] && TAIL=3 step collect_n8 60 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --collect-only -q
for mode in ${MODES:-auto off auto}; do
  export TRITON_CACHE_DIR=$(mktemp -d /tmp/tcache-$mode-XXXX)
  TAIL=4 step thorough_$mode 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
    --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --warmup-ahead=$mode \
    --report-json=$OUT/thorough-$mode-$(basename $TRITON_CACHE_DIR).json -q
  count_compiles $TRITON_CACHE_DIR
done
unset TRITON_CACHE_DIR
[ -z "$NO_TESTS" ] && TAIL=4 step test_triton 130 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEx
log "done"
