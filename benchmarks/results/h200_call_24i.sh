#!/bin/bash
# Issue 17, nineteenth stop, ninth call (.dev/old24 carried: 439970b's tree as old_pagedattn): the
# block table a page at a time again, and one-warp 16-key fp8 programs at every batch with shorter
# splits (probe_issue17_table.py round 2), each judged by the oracle first.
. benchmarks/results/h200_steps.sh
machine_info
PYTHONPATH=$PWD/.dev/old24:$PYTHONPATH PROBE_ROUND=2 TAIL=40 step probe 400 python benchmarks/results/probe_issue17_table.py $OUT/probe-table2.json
log "done"
