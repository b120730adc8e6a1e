#!/bin/bash
# Issue 16, fifteenth stop: 20e meant to run the last stop's check, but `python -m pytest` from the
# tree's root puts the root ahead of PYTHONPATH, so both of its runs most likely imported this
# stop's pagedattn (a review found it). Here the last stop's tree (.basetree: f2bbfae's pagedattn,
# conformance and pyproject.toml) runs from its own directory, then this stop's from the root, each
# on an empty Triton cache, each printing which pagedattn it imports.
. benchmarks/results/h200_steps.sh  # the environment, BUDGET_S, machine_info, log, step
machine_info
root=$PWD
for tree in old new; do
  export TRITON_CACHE_DIR=/tmp/tc-20f-$tree; rm -rf $TRITON_CACHE_DIR
  dir=$root; [ $tree = old ] && dir=$root/.basetree
  cd $dir
  log "$tree: $(python -c 'import pagedattn; print(pagedattn.__file__)')"
  TAIL=3 step thorough_$tree 150 python -m pytest -p pagedattn.plugin -p no:cacheprovider conformance \
    --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough-$tree.json -q
  cd $root
done
log "done"
