#!/bin/bash
# Issue 16, sixteenth stop, sixth call (the final check code): its time against the last stop's
# final code (.basetree: 70e1e20's pagedattn) alternately, four rounds each, on another lease than
# 21d's.
. benchmarks/results/h200_steps.sh
machine_info
for r in 1 2 3 4; do
  TAIL=1 step pass_old$r 40 env PROBE_CODE=$PWD/.basetree python benchmarks/results/probe_check_pass.py $OUT/pass-old$r.json
  TAIL=1 step pass_new$r 40 python benchmarks/results/probe_check_pass.py $OUT/pass-new$r.json
done
tar -czf $OUT/probes.tgz -C $OUT $(cd $OUT && ls pass-*.json) && rm $OUT/pass-*.json
log "done"
