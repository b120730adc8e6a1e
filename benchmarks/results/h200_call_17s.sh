#!/bin/bash
# Issue 17, seventh round, sixth call (run from the tree's root): the window128+sinks decode of the
# variants benchmark with and without the split loop, eager and from a graph.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step, count_compiles
machine_info
TAIL=10 step probe 200 python benchmarks/results/probe_issue17s.py $OUT/probe.json
TAIL=14 step variants 100 python benchmarks/bench_attention_variants.py --out $OUT/h200-variants.json
log "done"
