#!/bin/bash
# Issue 17, nineteenth stop, seventh call: the kernel's fp8 decode in small programs (one or two
# warps, 16- or 32-key tiles; probe_issue17_fp8.py round 4), each judged by the oracle first,
# against the bf16 decode at its default and in the same form, and SDPA.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=40 PROBE_ROUND=4 step probe_r4 450 python benchmarks/results/probe_issue17_fp8.py $OUT/probe-fp8r4.json
log "done"
