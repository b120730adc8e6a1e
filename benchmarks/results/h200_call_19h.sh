#!/bin/bash
# Issue 16, fourteenth stop, on e214851 (the values' mean as a product on a GPU): the check's GPU
# tests, its verdicts against the torch path's, its peak memory (the allocator's trace; bench_suite,
# one process a case) and its time against the last stop's code (8798f8e, .basetree), alternately.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=3 step gpu_tests 120 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py -q -n 8 -rfEsx
TAIL=2 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=2 step compare_standard 90 python benchmarks/results/fused_check_compare.py --profile standard
TAIL=2 step memory_lse 60 python benchmarks/results/probe_check_memory_gpu.py $OUT/memory-lse.txt
TAIL=8 step bench_new 150 python benchmarks/bench_suite.py --device cuda --repeats 5 --out $OUT/gpu-suite-new.json
for r in 1 2; do
  TAIL=1 step pass_old$r 60 env PROBE_CODE=$PWD/.basetree python benchmarks/results/probe_check_pass.py $OUT/pass-old$r.json
  TAIL=1 step pass_new$r 60 python benchmarks/results/probe_check_pass.py $OUT/pass-new$r.json
done
log "done"
