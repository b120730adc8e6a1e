#!/bin/bash
# Issue 17, ninth stop, eighth call (run from the tree's root): the final tree's GPU tests after
# the last host refactor (one wave-fill helper; the same launch shapes).
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=8 step test_triton 150 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEsx
log "done"
