#!/bin/bash
# Issue 16, eighteenth stop, second call: this stop's tree (the launch's CUDA probe asked once a
# process; no constant of the loaded modules drawn by the search): the check's GPU tests (the
# slow-marked ones too) and the search's, the fused check's verdicts against the torch path's, the
# thorough profile on an empty Triton cache, and the check's time against 0fe5779's (.basetree23)
# alternately, four rounds each.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=3 step gpu_tests 150 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py tests/test_oracle.py tests/test_search.py -m "slow or not slow" -q -n 8 -rfEsx
TAIL=2 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=2 step compare_standard 90 python benchmarks/results/fused_check_compare.py --profile standard
export TRITON_CACHE_DIR=/tmp/tc-23b; rm -rf $TRITON_CACHE_DIR
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
unset TRITON_CACHE_DIR
for r in 1 2 3 4; do
  TAIL=1 step pass_old$r 40 env PROBE_CODE=$PWD/.basetree23 PROBE_ROUNDS=15 python benchmarks/results/probe_check_pass.py $OUT/pass-old$r.json
  TAIL=1 step pass_new$r 40 env PROBE_ROUNDS=15 python benchmarks/results/probe_check_pass.py $OUT/pass-new$r.json
done
tar -czf $OUT/probes.tgz -C $OUT $(cd $OUT && ls pass-*.json) && rm $OUT/pass-*.json
log "done"
