#!/bin/bash
# Issue 16, fifteenth stop (081a5ab: 20c's code, one kernel for checks with and without the lse, the reduction
# counted one past, after a review): the check's GPU tests, its verdicts against the torch path's, the
# time against the last stop's code (.basetree, f2bbfae)
# alternately, the thorough profile (empty Triton cache), bench_suite.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=3 step gpu_tests 150 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py tests/test_oracle.py -q -n 8 -rfEsx
TAIL=2 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=2 step compare_standard 90 python benchmarks/results/fused_check_compare.py --profile standard
for r in 1 2 3 4; do
  TAIL=1 step pass_old$r 40 env PROBE_CODE=$PWD/.basetree python benchmarks/results/probe_check_pass.py $OUT/pass-old$r.json
  TAIL=1 step pass_new$r 40 python benchmarks/results/probe_check_pass.py $OUT/pass-new$r.json
done
export TRITON_CACHE_DIR=/tmp/tc-20d; rm -rf $TRITON_CACHE_DIR
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
unset TRITON_CACHE_DIR
tar -czf $OUT/probes.tgz -C $OUT $(cd $OUT && ls pass-*.json) && rm $OUT/pass-*.json  # files come back up to a count
TAIL=8 step bench 150 python benchmarks/bench_suite.py --device cuda --repeats 5 --out $OUT/gpu-suite.json
log "done"
