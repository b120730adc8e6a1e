#!/bin/bash
# Issue 16, fourteenth stop, the final check code (9e420b1: a block of several rows reads its key
# maxima from the sequence's sliding maximum, a decode walks the norms): the check's GPU tests,
# its verdicts against the torch path's, the thorough profile (empty Triton cache), bench_suite's
# memory and times, and the time against the last stop's code (.basetree), alternately.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=3 step gpu_tests 120 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py -q -n 8 -rfEsx
TAIL=2 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=2 step compare_standard 90 python benchmarks/results/fused_check_compare.py --profile standard
export TRITON_CACHE_DIR=/tmp/tc-19i; rm -rf $TRITON_CACHE_DIR
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
unset TRITON_CACHE_DIR
TAIL=8 step bench_new 120 python benchmarks/bench_suite.py --device cuda --repeats 5 --out $OUT/gpu-suite-new.json
for r in 1 2; do
  TAIL=1 step pass_old$r 40 env PROBE_CODE=$PWD/.basetree python benchmarks/results/probe_check_pass.py $OUT/pass-old$r.json
  TAIL=1 step pass_new$r 40 python benchmarks/results/probe_check_pass.py $OUT/pass-new$r.json
done
log "done"
