#!/bin/bash
# Issue 16, sixteenth stop, second call (70e1e20's check code): the fused check's host time by
# function under cProfile, on the quick window case and the W=1024 case (profile_check.py).
. benchmarks/results/h200_steps.sh
machine_info
TAIL=60 step profile_quick 60 python benchmarks/results/profile_check.py quick sliding_window-gqa4-bs16-d64-fp32-L1100-B2-win700
TAIL=60 step profile_w1024 60 python benchmarks/results/profile_check.py standard sliding_window-gqa4-bs16-d128-fp32-L4000-B3-permuted-win1024
log "done"
