#!/bin/bash
# Issue 16, twentieth stop, third call: the GPU tests on the uninstalled tree again, after the
# search's collection runs name the reference backend by its path (call 25b: 2 of the 3 pytest
# runs still failed there, on the backend's entry-point name).
. benchmarks/results/h200_steps.sh
machine_info
TAIL=3 step gpu_tests 200 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_search.py tests/test_triton.py -m "slow or not slow" -q -n 8 -rfEsx
log "done"
