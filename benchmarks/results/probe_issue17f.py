# ruff: noqa
"""Issue 17, fifth round, first H200 call, in one process:

1. the decode grid's three orders (``host.DECODE_GRIDS``: sequences first, one axis with kv
   heads fastest, kv heads first on three axes) from a CUDA graph at B = 1, 8, 32 against
   SDPA on a contiguous cache (eager and its own graph), each configuration timed twice in
   alternation; the fourth round measured the one-axis order 3-7% slower at B=1 only;
2. the per-warp decode prototype (``proto_decode_per_warp.py``: W sub-tiles of SUB keys a
   64-key step, one per warp) timed for the first time, W x SUB = 1 x 64 (the kernel's
   structure in the prototype's harness), 2 x 32 and 4 x 16, over B x L keys in 512-key
   splits (one program a split and kv head, no merge), beside the kernel and SDPA on the
   same B and L.

    PYTHONPATH=. python benchmarks/results/probe_issue17f.py OUT_JSON

Ran on f959571 (results/h200-probe-issue17f.json, h200-call-17f.log); ``heads_first`` became
the default after it.
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
sys.path.insert(0, "benchmarks/results")
from bench_paged_attention import bench, contiguous_history, graph_replay, machine, paged_batch, sdpa  # noqa: E402
from proto_decode_per_warp import dec4_kernel  # noqa: E402

from pagedattn.kernels import host  # noqa: E402
from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402

dev = "cuda" if not DRY else "cpu"
Hq, Hkv, D = (32, 8, 128) if not DRY else (4, 2, 32)
dtype = torch.bfloat16 if not DRY else torch.float16
res = {"machine": machine(dev), "grid": [], "proto": []}
t0 = time.time()


def kernel_graph(q, k, v, tables, seq_lens, loc, keep):
    prep = tpa.prepare(q, k, v, tables, seq_lens, loc)
    keep.append(prep)  # alive as long as its graph
    out = torch.empty_like(q)
    keep.append(out)
    return graph_replay(lambda: tpa.run(prep, q, k, v, out=out), dev)


def dump():
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1, default=str)


POINTS = [(1, 2048), (1, 4096), (1, 8192), (1, 32768), (8, 2048), (8, 8192), (32, 2048), (32, 8192)]
if DRY:
    POINTS = [(1, 600), (3, 200)]
for B, L in POINTS:
    q, k, v, tables, seq_lens, loc = paged_batch(B, L, 1, Hq, Hkv, D, 16, dtype, dev)
    kc, vc = contiguous_history(k, v, tables, L)
    qd = q.view(B, Hq, 1, D)
    keep, graphs = [], {"sdpa_graph": graph_replay(lambda: sdpa(qd, kc, vc), dev), "sdpa": lambda: sdpa(qd, kc, vc)}
    for name in host.DECODE_GRIDS:
        host.DECODE_GRID = name
        graphs[name] = kernel_graph(q, k, v, tables, seq_lens, loc, keep)
    host.DECODE_GRID = "heads_fast"
    row = {"B": B, "L": L, "us": {}}
    for rep in range(2):
        for name, g in graphs.items():
            row["us"].setdefault(name, []).append(1e3 * bench(g, dev))
    row["ratio"] = {n: min(row["us"]["sdpa"]) / min(t) for n, t in row["us"].items()}
    res["grid"].append(row)
    print(
        f"[{time.time() - t0:4.0f}s] B={B} L={L} " + " ".join(f"{n} {x:.3f}" for n, x in row["ratio"].items()),
        flush=True,
    )
    dump()
    del keep, graphs

# 2. the prototype: B x L keys as one history in one table, a program per (kv head, 512-key split)
SPLIT = 512
for B, L in [(32, 4096), (8, 8192), (128, 2048)] if not DRY else [(2, 512)]:
    q, k, v, tables, seq_lens, loc = paged_batch(B, L, 1, Hq, Hkv, D, 16, dtype, dev)
    kc, vc = contiguous_history(k, v, tables, L)
    qd = q.view(B, Hq, 1, D)
    flat = tables.reshape(-1).contiguous()
    group_pad = 16
    qp = torch.randn(Hkv * group_pad, D, dtype=dtype, device=dev)
    outp = torch.empty_like(qp)
    n_splits = B * L // SPLIT
    keep, graphs = [], {"sdpa": lambda: sdpa(qd, kc, vc)}
    graphs["kernel"] = kernel_graph(q, k, v, tables, seq_lens, loc, keep)
    regs = {}
    for W, SUB in ((1, 64), (2, 32), (4, 16)):

        def launch(W=W, SUB=SUB):
            return dec4_kernel[(Hkv, n_splits)](
                qp,
                k,
                v,
                flat,
                outp,
                B * L,
                k.stride(0),
                k.stride(1),
                k.stride(2),
                0.125 * 1.4426950408889634,
                GROUP_PAD=group_pad,
                D=D,
                W=W,
                SUB=SUB,
                BLOCK_SIZE=16,
                SPLIT=SPLIT,
                num_warps=4,
                num_stages=3,
            )

        c = launch()
        regs[f"proto_{W}x{SUB}"] = getattr(c, "n_regs", None) if c is not None else None
        graphs[f"proto_{W}x{SUB}"] = graph_replay(launch, dev)
    row = {"B": B, "L": L, "us": {}, "regs": regs}
    for rep in range(2):
        for name, g in graphs.items():
            row["us"].setdefault(name, []).append(1e3 * bench(g, dev))
    nbytes = 2 * B * L * Hkv * D * k.element_size()
    row["tb_s"] = {n: nbytes / (min(t) * 1e-6) / 1e12 for n, t in row["us"].items()}
    row["ratio"] = {n: min(row["us"]["sdpa"]) / min(t) for n, t in row["us"].items()}
    res["proto"].append(row)
    print(
        f"[{time.time() - t0:4.0f}s] proto B={B} L={L} regs {regs} "
        + " ".join(f"{n} {x:.3f}" for n, x in row["ratio"].items()),
        flush=True,
    )
    dump()
    del keep, graphs
