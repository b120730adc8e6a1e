# ruff: noqa
"""Issue 17, eighth stop: the decode beside FlashInfer's tensor-core decode, in one process.

At each point of the release benchmark's decode grid (bf16, Hq=32, Hkv=8, D=128, page 16,
permuted tables): our ``run`` from a CUDA graph (``ours``), FlashInfer 0.5.3's
``BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)`` on the same pages, from a CUDA
graph where its ``run`` can be captured (``fi``, else eagerly, ``fi_eager``), and SDPA on the
same history made contiguous (``sdpa``, from a graph); alternated, best of two. FlashInfer's
output is compared with ours (``max_abs_diff``). Needs the wheels of h200_call_17fi.sh.

    PYTHONPATH=/tmp/fi:. python benchmarks/results/probe_issue17_fi.py OUT_JSON
"""

import json
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from bench_paged_attention import bench, contiguous_history, graph_replay, machine, paged_batch, sdpa  # noqa: E402

from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402

dev = "cuda"
Hq, Hkv, D, bs = 32, 8, 128, 16
t0 = time.time()
res = {"machine": machine(dev), "points": []}
try:
    import flashinfer

    res["flashinfer"] = flashinfer.__version__
except Exception as e:  # the row says why
    flashinfer = None
    res["flashinfer_error"] = repr(e)[:400]


def log(msg):
    print(f"[{time.time() - t0:5.0f}s] {msg}", flush=True)


def dump():
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1, default=str)


log(f"flashinfer {res.get('flashinfer') or res.get('flashinfer_error')}")
ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
POINTS = [(B, L) for B in (8, 32, 64, 128) for L in (2048, 4096, 8192, 32768)] + [(1, L) for L in (2048, 32768)]
for B, L in POINTS:
    q, k, v, tables, seq_lens, loc = paged_batch(B, L, 1, Hq, Hkv, D, bs, torch.bfloat16, dev)
    row = {"B": B, "L": L, "us": {}}
    graphs = {}
    prep = tpa.prepare(q, k, v, tables, seq_lens, loc)
    out = torch.empty_like(q)
    graphs["ours"] = graph_replay(lambda: tpa.run(prep, q, k, v, out=out), dev)
    kc, vc = contiguous_history(k, v, tables, L)
    qd = q.view(B, Hq, 1, D)
    graphs["sdpa"] = graph_replay(lambda: sdpa(qd, kc, vc), dev)
    fi_out = None
    if flashinfer is not None:
        try:
            nb = -(-L // bs)
            indptr = torch.arange(0, (B + 1) * nb, nb, dtype=torch.int32, device=dev)
            indices = tables[:, :nb].reshape(-1).contiguous()
            last = torch.full((B,), L - (nb - 1) * bs, dtype=torch.int32, device=dev)
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
            w.plan(indptr, indices, last, Hq, Hkv, D, bs, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
            fo = torch.empty_like(q)
            fn = lambda: w.run(q, (k, v), out=fo)
            fn()
            torch.cuda.synchronize()
            fi_out = fo
            try:
                graphs["fi"] = graph_replay(fn, dev)
            except Exception as e:
                row["fi_graph_error"] = repr(e)[:300]
                torch.cuda.synchronize()
                graphs["fi_eager"] = fn
        except Exception as e:
            row["fi_error"] = repr(e)[:400]
    for g in graphs.values():
        g()
    torch.cuda.synchronize()
    if fi_out is not None:
        row["max_abs_diff"] = float((fi_out.float() - out.float()).abs().max())
    for rep in range(2):
        for name, g in graphs.items():
            row["us"].setdefault(name, []).append(1e3 * bench(g, dev))
    best = {n: min(t) for n, t in row["us"].items()}
    row["x_sdpa"] = {n: best["sdpa"] / t for n, t in best.items()}
    fi = best.get("fi", best.get("fi_eager"))
    if fi:
        row["ours_over_fi"] = fi / best["ours"]  # > 1: ours faster
    res["points"].append(row)
    log(
        f"B={B} L={L} "
        + " ".join(f"{n} {t:.1f}us ({row['x_sdpa'][n]:.3f})" for n, t in best.items())
        + f" ours/fi {row.get('ours_over_fi', float('nan')):.3f} diff {row.get('max_abs_diff')} {row.get('fi_error', '')}{row.get('fi_graph_error', '')}"
    )
    dump()
    del q, k, v, kc, vc, graphs, prep, out
    torch.cuda.empty_cache()
log("probe done")
