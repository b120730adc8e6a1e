#!/bin/bash
# Issue 16, fourteenth stop, after the final read (d6edf9e: Chunk.last in place of the two paths'
# own test for a sequence's last block): the check's GPU tests and its verdicts against the
# torch path's on the quick and standard profiles.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=3 step gpu_tests 120 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py tests/test_oracle.py -q -n 8 -rfEsx
TAIL=2 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=2 step compare_standard 90 python benchmarks/results/fused_check_compare.py --profile standard
log "done"
