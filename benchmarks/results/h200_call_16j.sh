#!/bin/bash
# Issue 16, sixth round: the same lease runs 1ca826e (the tree before the controller's imports
# moved to right after the workers start; a copy under .tox/old1ca826e, carried) and this tree,
# alternately, twice each: the thorough profile, -n 8, empty Triton caches, header written.
. benchmarks/results/h200_steps.sh
machine_info
export PYTHONPATH=$PYTHONPATH:$PWD/benchmarks/results
for which in old new old new; do
  export TRITON_CACHE_DIR=$(mktemp -d /tmp/tcache-$which-XXXX); tag=$which-$(basename $TRITON_CACHE_DIR)
  export TIMELINE_DIR=$OUT/timeline-$tag
  if [ $which = old ]; then
    (cd .tox/old1ca826e && export PYTHONPATH=$PWD:$PWD/../../benchmarks/results && TAIL=3 step thorough_$which 120 python -m pytest -p pagedattn.plugin -p timeline_probe -p no:cacheprovider conformance --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough-$tag.json)
  else
    TAIL=3 step thorough_$which 120 python -m pytest -p pagedattn.plugin -p timeline_probe -p no:cacheprovider conformance --backend=pagedattn.adapters.triton:TritonBackend --profile=thorough -n 8 --report-json=$OUT/thorough-$tag.json
  fi
  python benchmarks/results/timeline_probe.py show $TIMELINE_DIR | head -1 | tee -a $OUT/call.log
  tar -czf $OUT/timeline-$tag.tgz -C $OUT timeline-$tag && rm -rf $OUT/timeline-$tag
done
log done
