#!/bin/bash
# Issue 16, twentieth stop, fourth call: what the check's smallest logits and the values' mean cost
# inside a GPU check, by taking each away (probe_check_ablate2.py), twice in two processes.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=4 step ablate1 200 python benchmarks/results/probe_check_ablate2.py $OUT/ablate2-1.json
TAIL=4 step ablate2 200 python benchmarks/results/probe_check_ablate2.py $OUT/ablate2-2.json
log "done"
