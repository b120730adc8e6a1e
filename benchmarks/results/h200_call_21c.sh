#!/bin/bash
# Issue 16, sixteenth stop, third call (7eb388a: a kept kernel's tensors go to Triton's launcher as
# addresses): the check's GPU tests, its verdicts against the torch path's, the time against the
# last stop's final code (.basetree: 70e1e20's pagedattn) alternately on one lease, the phases, the
# thorough profile on an empty Triton cache.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=3 step gpu_tests 150 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py tests/test_oracle.py -q -n 8 -rfEsx
TAIL=2 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=2 step compare_standard 90 python benchmarks/results/fused_check_compare.py --profile standard
for r in 1 2 3; do
  TAIL=1 step pass_old$r 40 env PROBE_CODE=$PWD/.basetree python benchmarks/results/probe_check_pass.py $OUT/pass-old$r.json
  TAIL=1 step pass_new$r 40 python benchmarks/results/probe_check_pass.py $OUT/pass-new$r.json
done
TAIL=8 step phases 60 python benchmarks/results/probe_check_phases.py $OUT/phases-21c.json
export TRITON_CACHE_DIR=/tmp/tc-21c; rm -rf $TRITON_CACHE_DIR
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
unset TRITON_CACHE_DIR
tar -czf $OUT/probes.tgz -C $OUT $(cd $OUT && ls pass-*.json) && rm $OUT/pass-*.json
log "done"
