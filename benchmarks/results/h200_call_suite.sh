#!/bin/bash
# Issue 16/17, fourth round, third H200 call (run from the tree's root): the kernel's GPU tests,
# then the thorough profile twice on empty Triton caches, with xdist's default distribution and
# with --dist loadgroup (one configuration per worker: no kernel compiled twice), compiles counted;
# BENCH=1: the kernel benchmark after them.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
. benchmarks/results/h200_steps.sh  # BUDGET_S, log, step, count_compiles
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; nproc
  python -c "import torch, triton, sys, pytest; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0], 'pytest', pytest.__version__)"
  cat .tree-commit 2>/dev/null; } >> $OUT/call.log 2>&1
TAIL=6 step test_triton 130 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEx
for dist in load loadgroup; do
  export TRITON_CACHE_DIR=/tmp/tcache-$dist
  TAIL=8 step thorough_$dist 170 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
    --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --dist $dist --report-json=$OUT/thorough-$dist.json -q
  count_compiles /tmp/tcache-$dist
done
[ -n "$BENCH" ] && TAIL=30 step bench 160 python benchmarks/bench_paged_attention.py --out $OUT/h200.json
log "done"
