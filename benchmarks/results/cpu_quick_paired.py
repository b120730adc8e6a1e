"""The CPU's quick window case (bench_suite's first): the oracle, the check and the lse check called
in turn in one process, one torch thread, best of 30 (issue 16, sixteenth stop). Run it plain and
with glibc's thresholds raised (no page faults in the calls) to split the check's extra into
arithmetic and first touches:

    python benchmarks/results/cpu_quick_paired.py
    MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456 \\
        python benchmarks/results/cpu_quick_paired.py
"""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_suite import _case  # noqa: E402

from pagedattn.oracle import check_attention, check_attention_lse, paged_attention_reference_lse  # noqa: E402

torch.set_num_threads(1)
case = _case("quick", "sliding_window-gqa4-bs16-d64-fp32-L1100-B2-win700", "cpu")
g = torch.Generator().manual_seed(0)
out = torch.randn(case.num_tokens, case.num_heads, case.head_dim, generator=g).to(case.dtype)
lse = torch.randn(case.num_tokens, case.num_heads, generator=g)
calls = {
    "oracle": lambda: paged_attention_reference_lse(case),
    "check": lambda: check_attention(out, case),
    "check_lse": lambda: check_attention_lse(out, lse, case),
}
for f in calls.values():
    f()
times: dict[str, list[float]] = {k: [] for k in calls}
for _ in range(30):
    for k, f in calls.items():
        t0 = time.perf_counter()
        f()
        times[k].append(time.perf_counter() - t0)
best = {k: min(v) for k, v in times.items()}
print(
    {k: round(v * 1e3, 3) for k, v in best.items()},
    "check/oracle",
    round(best["check"] / best["oracle"], 2),
    "lse/oracle",
    round(best["check_lse"] / best["oracle"], 2),
)
