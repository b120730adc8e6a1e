#!/bin/bash
# One H200 call for issues 16 and 17 (2026-11-30), run from the tree's root with the tree
# copied to .dev/gpu: the kernel's GPU tests, the thorough profile timed (issue 16), the
# kernel's probe and benchmark (issue 17), the suite's check/oracle timings on the GPU, and
# the thorough profile again under --isolate. Each step has its own limit inside one overall
# deadline (BUDGET_S), so the call ends in time and what finished comes back under $OUT:
# call.log (steps, limits, wall times, each log's tail), logs.tgz (every step's full log),
# and the JSON files (at most 8 files come back).
cd .dev/gpu
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
. benchmarks/results/h200_steps.sh  # BUDGET_S, log, step (the copy in .dev/gpu must be of this tree)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; nproc
  python -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])"; } >> $OUT/call.log 2>&1
step test_triton 150 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4
step thorough 200 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
TAIL=30 step probe 270 python benchmarks/results/${PROBE:-probe_issue17b.py} $OUT/probe.json
TAIL=30 step bench 150 python benchmarks/bench_paged_attention.py --out $OUT/h200.json
TAIL=15 step suite 120 python benchmarks/bench_suite.py --device cuda --repeats 3 --out $OUT/gpu-suite.json
step thorough_isolate 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --isolate --report-json=$OUT/thorough-isolate.json -q
log "done"
