#!/bin/bash
# Issue 16, sixth round, first H200 call (run from the tree's root): the tree's GPU tests, then
# the thorough profile on empty Triton caches with a timeline of every process
# (timeline_probe.py: process start, collection, each case, each warm-up compile) and the
# machine's CPU use sampled every half second, once per --warmup-ahead mode in MODES.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|Model name)" >> $OUT/call.log
[ -z "$NO_TESTS" ] && TAIL=4 step test_triton 150 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEx
for mode in ${MODES:-auto}; do
  export TRITON_CACHE_DIR=$(mktemp -d /tmp/tcache-$mode-XXXX)
  tag=$mode-$(basename $TRITON_CACHE_DIR)
  python benchmarks/results/timeline_probe.py sample $OUT/cpu-$tag.json & sampler=$!
  export TIMELINE_DIR=$OUT/timeline-$tag
  export PYTHONPATH=$PYTHONPATH:$PWD/benchmarks/results
  TAIL=4 step thorough_$mode 150 python -m pytest -p pagedattn.plugin -p timeline_probe -p no:cacheprovider conformance \
    --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --warmup-ahead=$mode \
    --report-json=$OUT/thorough-$tag.json ${PYARGS--q}
  kill -INT $sampler; sleep 1
  python benchmarks/results/timeline_probe.py show $OUT/timeline-$tag $OUT/cpu-$tag.json | tee -a $OUT/call.log
  count_compiles $TRITON_CACHE_DIR
  tar -czf $OUT/timeline-$tag.tgz -C $OUT timeline-$tag cpu-$tag.json && rm -rf $OUT/timeline-$tag $OUT/cpu-$tag.json
done
unset TIMELINE_DIR; export PYTHONPATH=${PYTHONPATH%:$PWD/benchmarks/results}
unset TRITON_CACHE_DIR
log "done"
