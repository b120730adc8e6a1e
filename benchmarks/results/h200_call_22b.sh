#!/bin/bash
# Issue 16, seventeenth stop, second call: a long decode's direct sums over slices of its keys
# (fused.decode_sums_kernel; every decode's sums direct on the device path): the check's GPU tests
# (the slow-marked ones too), its verdicts against the torch path's, the thorough profile on an
# empty Triton cache, the check's time against 29aab0b's (.basetree22) alternately, three rounds
# each, and bench_suite (memory).
. benchmarks/results/h200_steps.sh
machine_info
TAIL=3 step gpu_tests 150 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py tests/test_oracle.py -m "slow or not slow" -q -n 8 -rfEsx
TAIL=2 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=2 step compare_standard 90 python benchmarks/results/fused_check_compare.py --profile standard
export TRITON_CACHE_DIR=/tmp/tc-22b; rm -rf $TRITON_CACHE_DIR
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
unset TRITON_CACHE_DIR
for r in 1 2 3; do
  TAIL=1 step pass_old$r 40 env PROBE_CODE=$PWD/.basetree22 python benchmarks/results/probe_check_pass.py $OUT/pass-old$r.json
  TAIL=1 step pass_new$r 40 python benchmarks/results/probe_check_pass.py $OUT/pass-new$r.json
done
tar -czf $OUT/probes.tgz -C $OUT $(cd $OUT && ls pass-*.json) && rm $OUT/pass-*.json
TAIL=8 step bench 150 python benchmarks/bench_suite.py --device cuda --repeats 3 --out $OUT/gpu-suite.json
log "done"
