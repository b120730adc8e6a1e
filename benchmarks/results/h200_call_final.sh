#!/bin/bash
# The H200 call on the release tree (2026-11-30, third stop), run from the tree's root:
# the kernel's GPU tests (issue 18's one validator and the verdict's device path on CUDA),
# the thorough profile timed on a fresh Triton cache with its compiles counted (issue 16),
# the check/oracle timings on the GPU (issue 16) and the kernel benchmark (issue 17).
# (The first call of the stop, log h200-call-final-a.log, ran the fp8 diagnosis,
# diag_fp8_small_tile.py, in place of the benchmark: DIAG=1 runs it again.) Each step has
# its own limit inside one deadline (BUDGET_S); what finished comes back under $OUT: call.log (steps, limits, wall times, tails), logs.tgz, JSON files.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
TAIL=12 step test_triton 130 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEx
export TRITON_CACHE_DIR=/tmp/tcache-thorough
step thorough 170 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
count_compiles /tmp/tcache-thorough
unset TRITON_CACHE_DIR
[ -n "$DIAG" ] && TAIL=16 step diag_fp8 120 python benchmarks/results/diag_fp8_small_tile.py $OUT/diag-fp8.json
TAIL=15 step suite 100 python benchmarks/bench_suite.py --device cuda --repeats 3 --out $OUT/gpu-suite.json
TAIL=30 step bench 160 python benchmarks/bench_paged_attention.py --out $OUT/h200.json
log "done"
