# ruff: noqa
"""Issue 16: where a Triton compile of the kernel spends its time, per stage (sm_90, the compile
test's ahead-of-time path, ``tests/test_triton.py``'s ``_AOT``), for three thorough-profile
configurations (both kernels each), in one process or in N at once (the thorough profile
compiles on 8 xdist workers together):

    PYTHONPATH=. python benchmarks/results/compile_stages.py [N]

prints one JSON line per process: its wall time and the seconds in each compiler stage
(``ttir`` ... ``cubin``; the frontend's AST walk is the rest of the total).
"""

import json
import os
import subprocess
import sys
import tempfile
import time

CONFIGS = [
    ["bfloat16", 32, 8, 128, 16, None, False],
    ["float16", 8, 2, 96, 16, None, False],
    ["float32", 8, 2, 96, 16, None, False],
]

CHILD = r"""
import json, sys, time
import triton
from triton.backends.nvidia.compiler import CUDABackend
orig, T = CUDABackend.add_stages, {}
def add_stages(self, stages, options, language):
    orig(self, stages, options, language)
    for k, f in list(stages.items()):
        def timed(src, md, f=f, k=k):
            t = time.perf_counter(); r = f(src, md); T[k] = T.get(k, 0) + time.perf_counter() - t; return r
        stages[k] = timed
CUDABackend.add_stages = add_stages
sys.path.insert(0, ".")
import tests.test_triton as tt
sys.argv = [sys.argv[0], sys.argv[1]]
t0 = time.perf_counter()
exec(compile(tt._AOT.replace("print(json.dumps(results))", ""), "aot", "exec"))
print(json.dumps({"kernels": 2 * len(json.loads(sys.argv[1])), "total_s": round(time.perf_counter() - t0, 2),
                  "stages_s": {k: round(v, 2) for k, v in T.items()}}))
"""

if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    procs = []
    t0 = time.perf_counter()
    for i in range(n):
        env_i = {**env, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix=f"compile-stages-{i}-")}  # an empty cache each
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", CHILD, json.dumps(CONFIGS)], env=env_i, stdout=subprocess.PIPE, text=True
            )
        )
    for p in procs:
        out, _ = p.communicate()
        print(out.strip().splitlines()[-1] if out.strip() else f"failed: {p.returncode}")
    print(json.dumps({"processes": n, "wall_s": round(time.perf_counter() - t0, 2)}))
