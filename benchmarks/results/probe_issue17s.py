# ruff: noqa
"""Issue 17, seventh round: the attention-variants benchmark's window128+sinks decode went from
18.3 us (5f0f425) to 30.4 us (b380377, eager launches). This times that decode (B=32, L=4096,
bf16, window 128 + sinks) and window 1024, with and without the split loop, eagerly (as the
variants benchmark does) and from a CUDA graph, in one process, and compares their bits.

    PYTHONPATH=. python benchmarks/results/probe_issue17s.py OUT_JSON
"""

import json
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from bench_paged_attention import bench, graph_replay, machine, paged_batch  # noqa: E402

from pagedattn.kernels import host  # noqa: E402
from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402

dev = "cuda"
B, L, Hq, Hkv, D = 32, 4096, 32, 8, 128
q, k, v, tables, seq_lens, loc = paged_batch(B, L, 1, Hq, Hkv, D, 16, torch.bfloat16, dev)
sinks = torch.linspace(-1.0, 6.0, Hq, device=dev)
res = {"machine": machine(dev), "rows": []}
for wname, kw in {
    "window128+sinks": {"sliding_window": 128, "sinks": sinks},
    "window1024": {"sliding_window": 1024},
    "none": {},
}.items():
    row = {"variant": wname, "us": {}, "shape": {}}
    outs = {}
    for loop in (None, False, True):
        host.DECODE_SPLIT_LOOP = loop
        prep = tpa.prepare(q, k, v, tables, seq_lens, loc, **kw)
        name = {None: "rule", False: "no_loop", True: "loop"}[loop]
        row["shape"][name] = (prep.plan.decode.SPLIT_LOOP, prep.plan.decode.SPLITS_PER_PROGRAM, prep.plan.decode.grid)
        out = torch.empty_like(q)
        tpa.run(prep, q, k, v, out=out)
        outs[name] = out.clone()
        g = graph_replay(lambda: tpa.run(prep, q, k, v, out=out), dev)
        for rep in range(2):
            row["us"].setdefault(f"{name}_eager", []).append(1e3 * bench(lambda: tpa.run(prep, q, k, v, out=out), dev))
            row["us"].setdefault(f"{name}_graph", []).append(1e3 * bench(g, dev))
        t0 = time.perf_counter()
        for _ in range(200):
            tpa.run(prep, q, k, v, out=out)
        torch.cuda.synchronize()
        row["us"].setdefault(f"{name}_host_loop", []).append(1e6 * (time.perf_counter() - t0) / 200)
    host.DECODE_SPLIT_LOOP = None
    row["same_bits"] = all(torch.equal(o, outs["rule"]) for o in outs.values())
    res["rows"].append(row)
    print(
        wname,
        row["shape"],
        {n: round(min(t), 1) for n, t in row["us"].items()},
        "same bits",
        row["same_bits"],
        flush=True,
    )
json.dump(res, open(sys.argv[1], "w"), indent=1, default=str)
