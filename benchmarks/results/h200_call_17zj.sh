#!/bin/bash
# Issue 17, ninth stop, third call (run from the tree's root, the FlashInfer wheels carried in
# .whl/): the fp8 cache's split loop at up to four splits a program (probe_issue17_fp8.py round 3,
# beside FlashInfer's fp8 tensor-core decode), then the tree through its GPU tests, the thorough
# profile and the variants benchmark (the fp8 row, issue 17's target 4); the release benchmark
# ran in the second call (its bf16 decode and prefill are unchanged since).
pip install -q --no-index --no-deps --target /tmp/fi .whl/*.whl > /tmp/pip.log 2>&1
export PYTHONPATH=/tmp/fi:$PWD FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=${MAX_JOBS:-16}
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
TAIL=60 PROBE_ROUND=3 step probe_fp8 200 python benchmarks/results/probe_issue17_fp8.py $OUT/probe-fp8r3.json
export PYTHONPATH=$PWD  # the tests and benchmarks without FlashInfer on the path
TAIL=8 step test_triton 120 python -m pytest -p no:cacheprovider tests/test_triton.py -q -n 4 -rfEsx
TAIL=8 step thorough 120 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
  --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough.json -q
TAIL=30 step variants 80 python benchmarks/bench_attention_variants.py --out $OUT/h200-variants.json
log "done"
