#!/bin/bash
# Issue 17, sixth round, third call (run from the tree's root): K and V read as fp8 pairs by default
# (FP8_PAIRS_K), so the kernel's tests and the thorough profile again; then the probe's third round
# (32-key decode tiles at 3 to 5 stages for both caches, beside SDPA) and the attention variants.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
TAIL=8 step test_triton 150 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEsx
TAIL=8 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
PROBE_ROUND=3 TAIL=40 step probe3 200 python benchmarks/results/probe_issue17h.py $OUT/probe3.json
TAIL=20 step variants 100 python benchmarks/bench_attention_variants.py --out $OUT/h200-variants.json
log "done"
