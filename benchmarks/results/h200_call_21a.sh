#!/bin/bash
# Issue 16, sixteenth stop, first call (70e1e20, the fifteenth stop's final code): what the last
# stop owed (GPU tests, the verdicts against the torch path's, the thorough profile on an empty
# Triton cache), then where the fused check's time goes, phase by phase, on the three short cases.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=3 step gpu_tests 150 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py tests/test_oracle.py -q -n 8 -rfEsx
TAIL=2 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=2 step compare_standard 90 python benchmarks/results/fused_check_compare.py --profile standard
TAIL=12 step phases 90 python benchmarks/results/probe_check_phases.py $OUT/phases-21a.json
export TRITON_CACHE_DIR=/tmp/tc-21a; rm -rf $TRITON_CACHE_DIR
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
log "done"
