#!/bin/bash
# Issue 17, eighth stop, ninth call (run from the tree's root): the merge in parts (probe round
# 13), then the tree through its tests, the thorough profile and the release benchmark.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
TAIL=70 PROBE_ROUND=13 step probe 150 python benchmarks/results/probe_issue17o.py $OUT/probe.json
TAIL=8 step test_triton 120 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEsx
TAIL=8 step thorough 120 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
TAIL=45 step bench 120 python benchmarks/bench_paged_attention.py --out $OUT/h200.json
log "done"
