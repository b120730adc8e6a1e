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
T0=$(date +%s); END=$((T0 + ${BUDGET_S:-560}))
mkdir -p /tmp/logs
log() { echo "[$(date -u +%T) +$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/call.log; }
step() {  # name max_seconds command...: runs with min(max, time left), logs rc and wall time
  local name=$1 max=$2; shift 2
  local left=$((END - $(date +%s))); local lim=$(( left < max ? left : max ))
  if [ $lim -lt 20 ]; then log "$name: skipped (${left}s left)"; return; fi
  log "$name: start (limit ${lim}s)"
  local s=$(date +%s%N)
  timeout -s INT $lim "$@" > /tmp/logs/$name.log 2>&1; local rc=$?
  log "$name: rc=$rc wall $(( ($(date +%s%N) - s) / 1000000 )) ms"
  grep -v '^\s*$' /tmp/logs/$name.log | tail -${TAIL:-6} | cut -c1-220 | tee -a $OUT/call.log
  tar -czf $OUT/logs.tgz -C /tmp logs
}
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
