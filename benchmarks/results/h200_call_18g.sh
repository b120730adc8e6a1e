#!/bin/bash
# Issue 16, thirteenth stop: the check's time on the GPU, this tree against the last stop's
# (c89df35, carried as .oldtree), alternately, twice each: 18f's lse case ran 5.2 ms against
# 2.7 ms on the eighth stop's tree.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
for r in 1 2; do
  TAIL=7 step new$r 100 python benchmarks/bench_suite.py --device cuda --repeats 5 --skip-thorough --out $OUT/gpu-new$r.json
  TAIL=7 step old$r 100 python benchmarks/bench_suite.py --device cuda --repeats 5 --skip-thorough --code .oldtree --out $OUT/gpu-old$r.json
done
log "done"
