#!/bin/bash
# Issue 17, seventh round, tenth call (run from the tree's root, with .dev/old17o carried): whole
# sequences a program at B=8, 16, 24 (probe round 6, not the rule's choice there); then the final
# kernel through its tests, the thorough profile and the release benchmark.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
PYTHONPATH=$PYTHONPATH:$PWD/.dev/old17o TAIL=40 PROBE_ROUND=6 step probe 150 python benchmarks/results/probe_issue17o.py $OUT/probe.json
TAIL=8 step test_triton 150 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEsx
TAIL=8 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
TAIL=40 step bench 200 python benchmarks/bench_paged_attention.py --out $OUT/h200.json
log "done"
