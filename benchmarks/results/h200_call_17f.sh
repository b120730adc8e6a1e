#!/bin/bash
# Issues 16/17, fifth round, first H200 call (run from the tree's root): the kernel's GPU tests
# and the thorough profile on this tree (the fourth round's last tree was not run on a GPU),
# then probe_issue17f.py (the decode grid's orders; the per-warp prototype timed) and
# compile_stages.py (a compile's stages, one process and eight at once).
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
TAIL=6 step test_triton 130 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEx
export TRITON_CACHE_DIR=/tmp/tcache-load
TAIL=8 step thorough_load 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough-load.json -q
count_compiles /tmp/tcache-load
unset TRITON_CACHE_DIR
TAIL=16 step probe 200 python benchmarks/results/probe_issue17f.py $OUT/probe.json
TAIL=4 step compile1 40 python benchmarks/results/compile_stages.py 1
TAIL=10 step compile8 60 python benchmarks/results/compile_stages.py 8
log "done"
