#!/bin/bash
# Issue 16/17, fourth round, third H200 call (run from the tree's root): the kernel's GPU tests,
# then the thorough profile twice on empty Triton caches, with xdist's default distribution and
# with --dist loadgroup (one configuration per worker: no kernel compiled twice), compiles counted;
# BENCH=1: the kernel benchmark after them.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
TAIL=6 step test_triton 130 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEx
for dist in load loadgroup; do
  export TRITON_CACHE_DIR=/tmp/tcache-$dist
  TAIL=8 step thorough_$dist 170 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
    --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --dist $dist --report-json=$OUT/thorough-$dist.json -q
  count_compiles /tmp/tcache-$dist
done
[ -n "$BENCH" ] && TAIL=30 step bench 160 python benchmarks/bench_paged_attention.py --out $OUT/h200.json
log "done"
