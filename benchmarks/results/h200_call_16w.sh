#!/bin/bash
# Issue 16, eighth stop, last call: after the memory fix and the inline launch key: the check's
# GPU tests, the fused and torch paths compared (quick), the suite bench, the host probe.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=4 step tests 120 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py -q -n 4 -rfEx
TAIL=3 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=3 step compare_standard 100 python benchmarks/results/fused_check_compare.py --profile standard
TAIL=12 step bench_suite 150 python benchmarks/bench_suite.py --device cuda --repeats 5 --out $OUT/gpu-suite.json
TAIL=12 step probe_host 60 python benchmarks/results/probe_check_host.py $OUT/probe-check-host.json
log "done"
