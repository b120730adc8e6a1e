#!/bin/bash
# Issue 17, seventh round, second call (run from the tree's root, with .dev/old17o carried: the
# tree of cb2e035 as old_pagedattn): the launch-shape rule (the split loop where one wave holds the launch, else one split a program; fp8 decode at a 128-register cap), timed
# beside the previous kernel and SDPA on a GPU that has run nothing yet; then the kernel's tests
# and the thorough profile.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
PYTHONPATH=$PYTHONPATH:$PWD/.dev/old17o TAIL=80 PROBE_ROUND=2 step probe 270 python benchmarks/results/probe_issue17o.py $OUT/probe.json
TAIL=8 step test_triton 120 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEsx
TAIL=8 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
log "done"
