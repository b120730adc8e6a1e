#!/bin/bash
# Issue 16, eighth stop, final call: the final tree's GPU tests (check and kernel), the fused and
# torch paths compared, the suite bench, the host probe, one thorough run of the Triton backend.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=4 step tests 150 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py tests/test_oracle.py tests/test_capabilities.py -q -n 4 -rfEx
TAIL=3 step compare_quick 90 python benchmarks/results/fused_check_compare.py --profile quick
TAIL=3 step compare_standard 100 python benchmarks/results/fused_check_compare.py --profile standard
TAIL=12 step bench_suite 150 python benchmarks/bench_suite.py --device cuda --repeats 5 --out $OUT/gpu-suite.json
TAIL=12 step probe_host 60 python benchmarks/results/probe_check_host.py $OUT/probe-check-host.json
export TRITON_CACHE_DIR=$(mktemp -d /tmp/tcache-XXXX)
TAIL=4 step thorough 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 \
  --report-json=$OUT/thorough.json -q
count_compiles $TRITON_CACHE_DIR
log "done"
