#!/bin/bash
# Issue 16, fourteenth stop: the fused check with each row's largest key norm found in the
# verdict kernel (2bb4541): its GPU tests, its verdicts against the torch path's on the quick and
# standard profiles, and its time against the last stop's code (8798f8e, carried as .basetree),
# alternately, on one lease (probe_check_pass.py, each tree twice).
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=3 step gpu_tests 150 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py -q -n 8 -rfEsx
TAIL=3 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=3 step compare_standard 90 python benchmarks/results/fused_check_compare.py --profile standard
for r in 1 2; do
  TAIL=1 step pass_old$r 60 env PROBE_CODE=$PWD/.basetree python benchmarks/results/probe_check_pass.py $OUT/pass-old$r.json
  TAIL=1 step pass_new$r 60 python benchmarks/results/probe_check_pass.py $OUT/pass-new$r.json
done
log "done"
