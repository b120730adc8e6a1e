#!/bin/bash
# Issue 17, nineteenth stop, eighth call (with .dev/old24 carried: 439970b's tree as
# old_pagedattn): the block table read a page at a time (bit-identical, timed against the previous
# kernel), the decode's whole tiles unmasked and small fp8 programs, then the kernel's GPU tests.
. benchmarks/results/h200_steps.sh
machine_info
PYTHONPATH=$PWD/.dev/old24:$PYTHONPATH TAIL=40 step probe 330 python benchmarks/results/probe_issue17_table.py $OUT/probe-table.json
TAIL=8 step test_triton 150 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 8 -rfEsx
log "done"
