#!/bin/bash
# Issue 16, seventh round (run from the tree's root): the check's fused path on the GPU. The
# policy's tests there (the fused kernel compiled, against the torch path), the fused path
# against the torch path on every quick and standard attention case, the check's time against
# the oracle's (bench_suite.py: fused and torch paths in one process), then the thorough profile
# on empty Triton caches with a timeline (the fused kernel's compiles are new in every worker).
. benchmarks/results/h200_steps.sh
machine_info
TAIL=4 step test_policy 120 python -m pytest -p no:cacheprovider tests/test_policy.py -q -n 4 -rfEx
TAIL=3 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=3 step compare_standard 90 python benchmarks/results/fused_check_compare.py --profile standard
TAIL=12 step bench_suite 150 python benchmarks/bench_suite.py --device cuda --repeats 5 --out $OUT/gpu-suite.json
for run in ${RUNS:-1 2}; do
  export TRITON_CACHE_DIR=$(mktemp -d /tmp/tcache-$run-XXXX)
  tag=run$run
  python benchmarks/results/timeline_probe.py sample $OUT/cpu-$tag.json & sampler=$!
  export TIMELINE_DIR=$OUT/timeline-$tag
  export PYTHONPATH=$PYTHONPATH:$PWD/benchmarks/results
  TAIL=4 step thorough_$tag 150 python -m pytest -p pagedattn.plugin -p timeline_probe -p no:cacheprovider conformance \
    --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 \
    --report-json=$OUT/thorough-$tag.json -q
  kill -INT $sampler; sleep 1
  python benchmarks/results/timeline_probe.py show $OUT/timeline-$tag $OUT/cpu-$tag.json | tail -25 | tee -a $OUT/call.log
  count_compiles $TRITON_CACHE_DIR
  tar -czf $OUT/timeline-$tag.tgz -C $OUT timeline-$tag cpu-$tag.json && rm -rf $OUT/timeline-$tag $OUT/cpu-$tag.json
  export PYTHONPATH=${PYTHONPATH%:$PWD/benchmarks/results}
done
log "done"
