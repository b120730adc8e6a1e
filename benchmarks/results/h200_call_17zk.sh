#!/bin/bash
# Issue 17, ninth stop, fourth call (run from the tree's root, the FlashInfer wheels carried in
# .whl/): probe round 3 again on the final fp8 rule (the programs filling 0.8 of their waves'
# slots), then the GPU tests; the kernel's code is the third call's.
pip install -q --no-index --no-deps --target /tmp/fi .whl/*.whl > /tmp/pip.log 2>&1
export PYTHONPATH=/tmp/fi:$PWD FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=${MAX_JOBS:-16}
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=60 PROBE_ROUND=3 step probe_fp8 200 python benchmarks/results/probe_issue17_fp8.py $OUT/probe-fp8r3b.json
export PYTHONPATH=$PWD  # the tests and benchmarks without FlashInfer on the path
TAIL=8 step test_triton 120 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEsx
log "done"
