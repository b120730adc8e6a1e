"""Host time of single torch operations on a GPU (issue 16, fourteenth stop).

Torch's profiler put ``torch.linalg.vector_norm`` at ~115 us of host time a call on the H200's
host, against ~25 us for ``amax`` (``probe_check_pass.py``): the check takes 4-5 of them a call,
the oracle none. This times each candidate for a row norm, and a few of the check's other
operations, as the mean of ``N`` calls issued back to back (then one synchronization): on these
shapes the device keeps up, so that is the host's time a call.

    python benchmarks/results/probe_op_host.py OUT.json
"""

from __future__ import annotations

import json
import sys
import time

import torch

N = 200


def host_us(fn) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(N):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / N * 1e6)
    return round(best, 2)


def main(path: str) -> None:
    dev = "cuda"
    k64 = torch.randn(8, 4000, 128, dtype=torch.float64, device=dev)
    k64s = k64[:, 1000:1700]
    q32 = torch.randn(700, 32, 128, device=dev)
    pool = torch.randn(250, 16, 8, 128, device=dev)
    p64 = torch.rand(8, 4 * 256, 4000, dtype=torch.float64, device=dev)
    rows = {}
    for name, x, wide in (
        ("k64", k64, torch.float64),
        ("k64 slice", k64s, torch.float64),
        ("q32", q32, torch.float32),
        ("pool32", pool, torch.float32),
    ):
        rows[name] = {
            "linalg.vector_norm(dtype)": host_us(lambda x=x, w=wide: torch.linalg.vector_norm(x, dim=-1, dtype=w)),
            "linalg.vector_norm": host_us(lambda x=x: torch.linalg.vector_norm(x, dim=-1)),
            "x.norm": host_us(lambda x=x: x.norm(dim=-1)),
            "square.sum.sqrt_": host_us(lambda x=x: x.square().sum(-1).sqrt_()),
            "mul.sum": host_us(lambda x=x: torch.mul(x, x).sum(-1)),
            "vecdot": host_us(lambda x=x: torch.linalg.vecdot(x, x, dim=-1)),
            "amax": host_us(lambda x=x: x.amax(dim=-1)),
            "sum": host_us(lambda x=x: x.sum(dim=-1)),
            "square": host_us(lambda x=x: x.square()),
            "mean(1)": host_us(lambda x=x: x.mean(dim=1, keepdim=True)),
        }
        print(name, json.dumps(rows[name]), flush=True)
    p32 = torch.empty(p64.shape, device=dev)
    vv = torch.randn(8, 4000, 256, device=dev)
    v64 = torch.randn(8, 4000, 128, dtype=torch.float64, device=dev)
    rows["block ops"] = {
        "copy_ f64->f32": host_us(lambda: p32.copy_(p64)),
        "bmm f32 (s12)": host_us(lambda: torch.bmm(p32, vv)),
        "bmm f64 (o)": host_us(lambda: torch.bmm(p64, v64)),
        "amin(-1)": host_us(lambda: p64.amin(dim=-1)),
        "empty": host_us(lambda: torch.empty(8, 1024, 256, device=dev)),
        "arange": host_us(lambda: torch.arange(0, 4000, device=dev)),
        "tolist [2,8]": host_us(lambda: torch.zeros(2, 8, dtype=torch.float64, device=dev).tolist()),
    }
    print("block ops", json.dumps(rows["block ops"]), flush=True)
    with open(path, "w") as f:
        json.dump(
            {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "calls": N, "host_us": rows}, f, indent=1
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-op-host.json")
