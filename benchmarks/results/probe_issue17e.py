# ruff: noqa
"""Issue 17, fourth round, last H200 call: B=1 decode from a CUDA graph at 2k to 32k keys,
the defaults against each of this round's switches turned back (``DECODE_HEADS_FAST``,
``OFFSETS_I32``), in one process, each configuration timed twice in alternation (the
benchmark's B=1 rows moved by up to 0.07 between calls). Its first version let each
prepared batch die after its graph's capture: the graphs then shared the freed scratch
(split counters and partials reused by the next ``prepare``) and one replay ended in
``cudaErrorInvalidAddressSpace``; each configuration alone, eager and from a graph, was right
at every L (``diag_graph_b1.py``, results/h200-call-17e.log).

    PYTHONPATH=. python benchmarks/results/probe_issue17e.py OUT_JSON
"""

import json
import os
import sys
import time

DRY = os.environ.get("PROBE_DRY") == "1"
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"

import torch

sys.path.insert(0, "benchmarks")
from bench_paged_attention import bench, contiguous_history, graph_replay, machine, paged_batch, sdpa  # noqa: E402

from pagedattn.kernels import host  # noqa: E402
from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402

dev = "cuda" if not DRY else "cpu"
Hq, Hkv, D = (32, 8, 128) if not DRY else (4, 2, 32)
CFG = {
    "new": {},
    "grid3": {(host, "DECODE_HEADS_FAST"): False},
    "i64": {(tpa, "OFFSETS_I32"): False},
    "grid3_i64": {(host, "DECODE_HEADS_FAST"): False, (tpa, "OFFSETS_I32"): False},
}
DEFAULT = {(o, k): getattr(o, k) for c in CFG.values() for (o, k) in c}
res = {"machine": machine(dev), "rows": []}
t0 = time.time()
for L in (2048, 4096, 8192, 32768) if not DRY else (64, 600):
    q, k, v, tables, seq_lens, loc = paged_batch(1, L, 1, Hq, Hkv, D, 16, torch.bfloat16, dev)
    kc, vc = contiguous_history(k, v, tables, L)
    qd = q.view(1, Hq, 1, D)
    out = torch.empty_like(q)
    row = {"L": L, "us": {}}
    graphs, preps = {"sdpa": graph_replay(lambda: sdpa(qd, kc, vc), dev)}, {}
    for name, cfg in CFG.items():
        for (o, kk), val in {**DEFAULT, **cfg}.items():
            setattr(o, kk, val)
        prep = preps[name] = tpa.prepare(q, k, v, tables, seq_lens, loc)  # alive as long as its graph
        graphs[name] = graph_replay(lambda prep=prep: tpa.run(prep, q, k, v, out=out), dev)
    for (o, kk), val in DEFAULT.items():
        setattr(o, kk, val)
    for rep in range(2):
        for name, g in graphs.items():
            row["us"].setdefault(name, []).append(1e3 * bench(g, dev))
    row["ratio"] = {n: min(row["us"]["sdpa"]) / min(t) for n, t in row["us"].items()}
    res["rows"].append(row)
    print(
        f"[{time.time() - t0:4.0f}s] B=1 L={L} graph ratio "
        + " ".join(f"{n} {x:.3f}" for n, x in row["ratio"].items()),
        flush=True,
    )
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1, default=str)
