#!/bin/bash
# Issue 17, fourth round, first H200 call (run from the tree's root): Nsight Compute reads the
# decode kernel (bf16 and e4m3, B=32 L=4k and B=8 L=8k; the kv-heads-fastest order too), SDPA's
# decode at the same points, and causal prefill at 8k against SDPA's (ncu_target.py); then
# probe_issue17c.py times the decode variants in one process. Output under $OUT: call.log,
# logs.tgz (every step's full output, the ncu reports as text), probe.json.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
machine_info
{ echo "ncu: $NCU"; $NCU --version | tail -1; } >> $OUT/call.log 2>&1
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats"
prof() {  # prof NAME ARGS...: one profiled launch of ncu_target.py
  local name=$1; shift
  TAIL=4 step ncu_$name 75 $NCU --clock-control none --profile-from-start off $SECTIONS python benchmarks/results/ncu_target.py "$@"
}
prof dec_b32 decode 32 4096
prof sdpa_b32 sdpa-decode 32 4096
prof dec_b32_heads decode 32 4096 DECODE_HEADS_FAST=True
prof e4m3_b32 decode-e4m3 32 4096
prof dec_b8 decode 8 8192
prof sdpa_b8 sdpa-decode 8 8192
prof prefill prefill 1 8192
prof sdpa_prefill sdpa-prefill 1 8192
TAIL=40 step probe 240 python benchmarks/results/probe_issue17c.py $OUT/probe.json
log "done"
