#!/bin/bash
# Issue 16, eighth stop, third call: the fused check with fewer host costs (the compiled kernel's
# runner, one-launch reduction and value moments, the guard's one read): its GPU tests, the
# fused and torch paths compared, the host probe, the suite bench.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=4 step tests 150 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py tests/test_oracle.py tests/test_capabilities.py -q -n 4 -rfEx
TAIL=3 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=3 step compare_standard 100 python benchmarks/results/fused_check_compare.py --profile standard
TAIL=12 step probe_host 60 python benchmarks/results/probe_check_host.py $OUT/probe-check-host.json
TAIL=12 step bench_suite 160 python benchmarks/bench_suite.py --device cuda --repeats 5 --out $OUT/gpu-suite.json
log "done"
