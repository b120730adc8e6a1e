#!/bin/bash
# Issue 17, ninth stop, sixth call (run from the tree's root, the FlashInfer wheels carried in
# .whl/): the final kernel beside FlashInfer 0.5.3's tensor-core decode twice more
# (probe_issue17_fi.py, unchanged), to see whether the three points where the first call found
# ours 1-2% slower are the two kernels' run-to-run spread.
pip install -q --no-index --no-deps --target /tmp/fi .whl/*.whl > /tmp/pip.log 2>&1
export PYTHONPATH=/tmp/fi:$PWD FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=${MAX_JOBS:-16}
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=20 step probe_fi_a 150 python benchmarks/results/probe_issue17_fi.py $OUT/probe-fi-a.json
TAIL=20 step probe_fi_b 150 python benchmarks/results/probe_issue17_fi.py $OUT/probe-fi-b.json
log "done"
