#!/bin/bash
# Issue 17, sixth round, second call (run from the tree's root): the kernel's tests on the GPU (the
# exhaustive pair conversion, mended; the prefill sink joining after the keys, the regression of
# the first call's thorough failure), the probe's second round (K as pairs too, with tiles,
# splits, stages and warps), then the thorough profile.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
TAIL=8 step test_triton 150 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEsx
PROBE_ROUND=2 TAIL=40 step probe2 220 python benchmarks/results/probe_issue17h.py $OUT/probe2.json
TAIL=8 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
log "done"
