#!/bin/bash
# Issue 17, sixth round (run from the tree's root): an fp8 cache's V tiles read as 16-bit pairs and
# widened by one cvt a pair (host.FP8_PAIRS). First the kernel's tests on the GPU (the exhaustive
# pair conversion test, the fp8 tile widths, the odd-address fallback), then the probe (every
# configuration judged by the oracle, then timed), then the thorough profile (fp8 cases included).
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
TAIL=8 step test_triton 150 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEsx
TAIL=40 step probe 200 python benchmarks/results/probe_issue17h.py $OUT/probe.json
TAIL=8 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
log "done"
