#!/bin/bash
# Issue 16, fifth round, second H200 call (run from the tree's root): the thorough profile on an
# empty Triton cache with the warm-up ahead (its default on a GPU) and without it
# (--warmup-ahead=off), -n 8, then the kernel's GPU tests (compile_only among them).
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
for mode in ${MODES:-auto off}; do
  export TRITON_CACHE_DIR=$(mktemp -d /tmp/tcache-$mode-XXXX)
  TAIL=10 step thorough_$mode 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
    --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --warmup-ahead=$mode \
    --report-json=$OUT/thorough-$mode-$(basename $TRITON_CACHE_DIR).json -q
  count_compiles $TRITON_CACHE_DIR
done
unset TRITON_CACHE_DIR
[ -z "$NO_TESTS" ] && TAIL=6 step test_triton 130 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEx
log "done"
