#!/bin/bash
# Issue 16, seventeenth stop, third call (08d3167, the release): the project's GPU tests, the
# slow-marked ones too (test_triton.py's matrices, the fused comparisons, the verdict key over
# direct decodes), beside the kernel's own.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=3 step gpu_tests 300 python -m pytest -p no:cacheprovider tests/test_fused.py tests/test_policy.py tests/test_oracle.py tests/test_triton.py -m "slow or not slow" -q -n 8 -rfEsx
log "done"
