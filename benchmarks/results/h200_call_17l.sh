#!/bin/bash
# Issue 17, sixth round, fifth call (run from the tree's root): the probe's fourth round again on
# the fixed probe (its setcfg now restores the bf16 switches; rounds 3 and 4 were void), first,
# on a GPU that has run nothing yet; then the final kernel (pair offsets halved by a shift) through
# its tests, the thorough profile and the attention variants.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
PROBE_ROUND=4 TAIL=30 step probe4 240 python benchmarks/results/probe_issue17h.py $OUT/probe4.json
TAIL=8 step test_triton 150 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEsx
TAIL=8 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
TAIL=14 step variants 100 python benchmarks/bench_attention_variants.py --out $OUT/h200-variants.json
log "done"
