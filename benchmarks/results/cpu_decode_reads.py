"""What a decode's bound must read on the CPU, each operation timed alone (issue 16, eighteenth
stop): the quick window case's decode shapes (2 kv heads, a GQA group of 4, 700 visible keys of
D=64 in a 1100-key history), one torch thread, best of 200. Beside them the oracle's own two
products, for scale.

    python benchmarks/results/cpu_decode_reads.py
"""

import time

import torch

torch.set_num_threads(1)
Hkv, G, Lc, D = 2, 4, 700, 64
v = torch.randn(Hkv, 1100, D, dtype=torch.float64)[:, 400:]
k = torch.randn(Hkv, 1100, D, dtype=torch.float64)[:, 400:]
p = torch.rand(Hkv, G, Lc, dtype=torch.float64)
q = torch.randn(Hkv, G, D, dtype=torch.float64)
centre = torch.randn(Hkv, 1, D, dtype=torch.float64)
vv32 = torch.empty(Hkv, Lc, 2 * D, dtype=torch.float32)
p32 = p.float()


def best(fn, n=200):
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e6


rows = {
    "the keys' largest norm (norm, amax)": lambda: k.norm(dim=-1).amax(-1),
    "|v| into float32": lambda: vv32[..., :D].copy_(v).abs_(),
    "(v - c)^2 in float64": lambda: torch.sub(v, centre).square_(),
    "(v - c)^2 in float64, into float32": lambda: vv32[..., D:].copy_(torch.sub(v, centre).square_()),
    "the weights in float32": lambda: p.float(),
    "the float32 product [|v|, (v - c)^2]": lambda: torch.bmm(p32, vv32),
    "(oracle) the scores q k^T": lambda: torch.bmm(q, k.transpose(1, 2)),
    "(oracle) the output p v": lambda: torch.bmm(p, v),
}
for name, fn in rows.items():
    print(f"{name:40s} {best(fn):7.1f} us")
