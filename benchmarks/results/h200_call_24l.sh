#!/bin/bash
# The device's tree has no installed package: no entry points, and no `pagedattn.conformance`
# (a package-dir mapping of conformance/), so test_search.py's three pytester runs fail there.
# This call installs the tree itself (no index, no build isolation) into a target directory put
# first on PYTHONPATH, and runs those tests and the rest of test_search.py.
. benchmarks/results/h200_steps.sh
machine_info
TAIL=4 step install 120 python -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/site .
export PYTHONPATH=/tmp/site:$PYTHONPATH
python -c "import pagedattn, pagedattn.conformance, importlib.metadata as m; print(pagedattn.__file__, [e.name for e in m.entry_points(group='pytest11')])" >> $OUT/call.log 2>&1
TAIL=6 step test_search 150 python -m pytest -p no:cacheprovider tests/test_search.py -q -n 8 -rfEsx
log "done"
