# Sourced by the H200 call scripts (h200_call*.sh), from the tree's root: the environment (this
# tree on PYTHONPATH, the compiled Triton, not the interpreter), a deadline of BUDGET_S seconds
# (default 560) for the whole call, `machine_info` (the GPU, driver, versions and the tree's
# commit, from .tree-commit: write it before the call, the device has no git), `log` (a
# timestamped line in $OUT/call.log), `count_compiles DIR` (the kernels a Triton cache holds,
# by name) and `step NAME MAX CMD...`
# (runs CMD with min(MAX, time left), logs its exit status and wall time and the last TAIL lines
# of its output, and keeps every step's full log in $OUT/logs.tgz), so that a call ends in time
# and what finished comes back.
case ":$PYTHONPATH:" in *":$PWD:"*) ;; *) export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} ;; esac  # keeps a caller's own first
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
T0=$(date +%s); END=$((T0 + ${BUDGET_S:-560}))
mkdir -p /tmp/logs
log() { echo "[$(date -u +%T) +$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/call.log; }
step() {
  local name=$1 max=$2; shift 2
  local left=$((END - $(date +%s))); local lim=$(( left < max ? left : max ))
  if [ $lim -lt 20 ]; then log "$name: skipped (${left}s left)"; return; fi
  log "$name: start (limit ${lim}s)"
  local s=$(date +%s%N)
  timeout -s INT $lim "$@" > /tmp/logs/$name.log 2>&1; local rc=$?
  log "$name: rc=$rc wall $(( ($(date +%s%N) - s) / 1000000 )) ms"
  grep -v '^\s*$' /tmp/logs/$name.log | tail -${TAIL:-6} | cut -c1-240 | tee -a $OUT/call.log
  tar -czf $OUT/logs.tgz -C /tmp logs
}
count_compiles() {  # the kernels a Triton cache holds, by name
  python - "$1" <<'PY' | tee -a $OUT/call.log
import collections, pathlib, sys
c = collections.Counter(p.stem for p in pathlib.Path(sys.argv[1]).rglob("*.cubin"))
print("compiled kernels:", sum(c.values()), dict(c))
PY
}
machine_info() {
  { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; nproc
    python -c "import torch, triton, sys, pytest; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0], 'pytest', pytest.__version__)"
    cat .tree-commit 2>/dev/null; } >> $OUT/call.log 2>&1
}
