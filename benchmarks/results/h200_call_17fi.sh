#!/bin/bash
# Issue 17, eighth stop: the decode beside FlashInfer 0.5.3's tensor-core decode (one process),
# run from the tree's root with the wheels carried in .whl/ (flashinfer-python 0.5.3,
# apache-tvm-ffi 0.1.15.post2, nvidia-cudnn-frontend 1.32.0).
pip install -q --no-index --no-deps --target /tmp/fi .whl/*.whl > /tmp/pip.log 2>&1
export PYTHONPATH=/tmp/fi:$PWD FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=${MAX_JOBS:-8}
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
tail -2 /tmp/pip.log >> $OUT/call.log
TAIL=40 step probe_fi 500 python benchmarks/results/probe_issue17_fi.py $OUT/probe-fi.json
log "done"
