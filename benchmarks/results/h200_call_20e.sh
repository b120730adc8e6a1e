#!/bin/bash
# Issue 16, fifteenth stop: 20d's thorough run took 69.1 s wall (warm-up compiles 322 s, against
# 186-252 s in the stop's earlier calls). The thorough profile on one lease, empty Triton caches,
# the last stop's check (.basetree, f2bbfae) then this stop's (081a5ab's code), to tell the code's
# share from the lease's.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
for tree in old new; do
  export TRITON_CACHE_DIR=/tmp/tc-20e-$tree; rm -rf $TRITON_CACHE_DIR
  code=$PWD; [ $tree = old ] && code=$PWD/.basetree:$PWD
  TAIL=3 step thorough_$tree 150 env PYTHONPATH=$code python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
    --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough-$tree.json -q
done
log "done"
