# ruff: noqa
"""One configuration of the B=1 decode in one process (a CUDA error poisons the process):
eager, then from a CUDA graph, at each L; prints OK or the error. Used to find which
configuration raised ``cudaErrorInvalidAddressSpace`` in probe_issue17e.py.

    PYTHONPATH=. python benchmarks/results/diag_graph_b1.py CONFIG [L ...]
"""

import sys

import torch

sys.path.insert(0, "benchmarks")
from bench_paged_attention import graph_replay, paged_batch, sdpa, contiguous_history  # noqa: E402

from pagedattn.kernels import host  # noqa: E402
from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402

name = sys.argv[1]
if "grid3" in name:
    host.DECODE_HEADS_FAST = False
if "i64" in name:
    tpa.OFFSETS_I32 = False
for L in [int(x) for x in sys.argv[2:]] or [2048, 4096, 8192, 32768]:
    q, k, v, tables, seq_lens, loc = paged_batch(1, L, 1, 32, 8, 128, 16, torch.bfloat16, "cuda")
    kc, vc = contiguous_history(k, v, tables, L)
    ref = sdpa(q.view(1, 32, 1, 128).float(), kc.float(), vc.float()).view(1, 32, 128)
    out = torch.empty_like(q)
    for mode in ("eager", "graph", "graph-again"):
        try:
            prep = tpa.prepare(q, k, v, tables, seq_lens, loc)
            fn = lambda: tpa.run(prep, q, k, v, out=out)
            if mode.startswith("graph"):
                fn = graph_replay(fn, "cuda")
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            err = float((out.float() - ref).abs().max())
            print(name, L, mode, "OK err", f"{err:.2e}", flush=True)
        except Exception as e:
            print(name, L, mode, "ERROR", repr(e)[:200], flush=True)
            sys.exit(1)
