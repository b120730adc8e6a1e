#!/bin/bash
# Issue 17, ninth stop: the final kernel's decode beside FlashInfer 0.5.3's tensor-core decode
# again (probe_issue17_fi.py, unchanged since the eighth stop), then the fp8 decode's launch
# switches beside FlashInfer's own fp8 decode (probe_issue17_fp8.py). Run from the tree's root
# with the wheels carried in .whl/ (flashinfer-python 0.5.3, apache-tvm-ffi 0.1.15.post2,
# nvidia-cudnn-frontend 1.32.0).
pip install -q --no-index --no-deps --target /tmp/fi .whl/*.whl > /tmp/pip.log 2>&1
export PYTHONPATH=/tmp/fi:$PWD FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=${MAX_JOBS:-16}
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
tail -2 /tmp/pip.log >> $OUT/call.log
TAIL=40 step probe_fi 200 python benchmarks/results/probe_issue17_fi.py $OUT/probe-fi.json
TAIL=40 step probe_fp8 340 python benchmarks/results/probe_issue17_fp8.py $OUT/probe-fp8.json
log "done"
