"""Where a check's host time goes on a GPU: the oracle, the fused check and the torch-path
check of one case timed (best of 20, after a warm-up), then the fused check under cProfile
(its functions by own time: torch's dispatch, Triton's launcher, ours).

    python benchmarks/results/profile_check.py [standard lse-gqa4-bs16-d128-fp32-L4000-B2]
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402

from pagedattn.cases import grid  # noqa: E402
from pagedattn.oracle import check_attention, fused, paged_attention_reference_lse  # noqa: E402

profile, case_id = sys.argv[1:3] if len(sys.argv) > 2 else ("standard", "lse-gqa4-bs16-d128-fp32-L4000-B2")
case = next(s for s in grid(profile) if s.id == case_id).build().to("cuda")
out = torch.randn(case.num_tokens, case.num_heads, case.head_dim, device="cuda").to(case.dtype)


def best(fn, n=20):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def torch_path():
    saved = os.environ.get(fused.ENV)
    os.environ[fused.ENV] = "0"
    try:
        check_attention(out, case)
    finally:
        if saved is None:
            del os.environ[fused.ENV]
        else:
            os.environ[fused.ENV] = saved


print(case_id)
o = best(lambda: paged_attention_reference_lse(case))
f = best(lambda: check_attention(out, case))
t = best(torch_path)
print(f"oracle {o:.3f} ms   fused check {f:.3f} ms (x{f / o:.2f})   torch check {t:.3f} ms (x{t / o:.2f})")
prof = cProfile.Profile()
prof.enable()
for _ in range(10):
    check_attention(out, case)
torch.cuda.synchronize()
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(22)
prof = cProfile.Profile()
prof.enable()
for _ in range(10):
    paged_attention_reference_lse(case)
torch.cuda.synchronize()
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(12)
