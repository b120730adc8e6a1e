#!/bin/bash
# Issue 16, fourteenth stop, on 5e78c10 (each row's largest key norm in the verdict kernel; a
# sequence's terms freed after its last block): the GPU tests of the check, bench_suite's figures
# (time and peak memory, one process a case) on this tree and on the last stop's (8798f8e,
# .basetree), and the thorough profile (empty Triton cache).
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=3 step gpu_tests 120 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py -q -n 8 -rfEsx
TAIL=8 step bench_new 150 python benchmarks/bench_suite.py --device cuda --repeats 5 --out $OUT/gpu-suite-new.json
TAIL=8 step bench_old 150 python benchmarks/bench_suite.py --device cuda --repeats 5 --code .basetree --out $OUT/gpu-suite-old.json
export TRITON_CACHE_DIR=/tmp/tc-19f; rm -rf $TRITON_CACHE_DIR
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
log "done"
