#!/bin/bash
# Issue 16, eighteenth stop, first call: where the GPU check's host time goes on the lse, W=1024 and
# combined cases (1.41-1.67x the oracle at the last stop): the pieces, paired (probe_check_pass.py,
# with torch's profiler by operation), and the check's Python by function (probe_check_cprofile.py).
. benchmarks/results/h200_steps.sh
machine_info
TAIL=5 step pass 150 python benchmarks/results/probe_check_pass.py $OUT/pass.json $OUT/pass-profile.txt
TAIL=5 step cprofile 150 python benchmarks/results/probe_check_cprofile.py $OUT/cprofile.txt
log "done"
