#!/bin/bash
# Issue 16, sixteenth stop, fourth call (ab7f0bc: a decode's value sums in the verdict kernel,
# policy.direct_decode): the check's GPU tests, its verdicts against the torch path's, how far the
# decodes' bounds move from the float32 product's, the time against the last stop's final code
# (.basetree: 70e1e20) alternately on one lease, the phases, the thorough profile on an empty Triton
# cache, bench_suite (memory).
. benchmarks/results/h200_steps.sh
machine_info
TAIL=3 step gpu_tests 150 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py tests/test_oracle.py -q -n 8 -rfEsx
TAIL=2 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=2 step compare_standard 90 python benchmarks/results/fused_check_compare.py --profile standard
TAIL=1 step direct_quick 60 python benchmarks/results/direct_decode_bounds.py --profile quick --device cuda
TAIL=1 step direct_standard 90 python benchmarks/results/direct_decode_bounds.py --profile standard --device cuda
for r in 1 2 3; do
  TAIL=1 step pass_old$r 40 env PROBE_CODE=$PWD/.basetree python benchmarks/results/probe_check_pass.py $OUT/pass-old$r.json
  TAIL=1 step pass_new$r 40 python benchmarks/results/probe_check_pass.py $OUT/pass-new$r.json
done
TAIL=8 step phases 60 python benchmarks/results/probe_check_phases.py $OUT/phases-21d.json
export TRITON_CACHE_DIR=/tmp/tc-21d; rm -rf $TRITON_CACHE_DIR
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
unset TRITON_CACHE_DIR
tar -czf $OUT/probes.tgz -C $OUT $(cd $OUT && ls pass-*.json) && rm $OUT/pass-*.json
TAIL=8 step bench 150 python benchmarks/bench_suite.py --device cuda --repeats 5 --out $OUT/gpu-suite.json
log "done"
