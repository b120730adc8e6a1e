#!/bin/bash
# Issue 17, fourth round, second H200 call (run from the tree's root): probe_issue17d.py times
# int32 offsets / unsigned key division and the decode orders in one process; Nsight Compute
# reads the prefill and the e4m3 decode with them. Output under $OUT: call.log, logs.tgz, probe.json.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
machine_info
TAIL=45 step probe 330 python benchmarks/results/probe_issue17d.py $OUT/probe.json
SECTIONS="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats --print-details all"
TAIL=4 step ncu_prefill_iu 60 $NCU --clock-control none --profile-from-start off $SECTIONS python benchmarks/results/ncu_target.py prefill 1 8192 OFFSETS_I32=True UNSIGNED_INDICES=True
TAIL=4 step ncu_prefill 60 $NCU --clock-control none --profile-from-start off $SECTIONS python benchmarks/results/ncu_target.py prefill 1 8192
TAIL=4 step ncu_e4m3_iu 60 $NCU --clock-control none --profile-from-start off $SECTIONS python benchmarks/results/ncu_target.py decode-e4m3 32 4096 OFFSETS_I32=True UNSIGNED_INDICES=True
TAIL=4 step ncu_dec_iu 60 $NCU --clock-control none --profile-from-start off $SECTIONS python benchmarks/results/ncu_target.py decode 32 4096 OFFSETS_I32=True UNSIGNED_INDICES=True
log "done"
