"""What the CPU check (the torch path) allocates at its peak against the oracle, traced (issue 16,
fourteenth stop): torch's profiler with memory events over one call of each, the peak of the
running sum of allocations. RSS figures (``bench_suite.py``) also count what glibc keeps of freed
memory; this counts what the call holds.

    python benchmarks/results/cpu_check_memory_trace.py PROFILE CASE_ID
"""

import os
import sys

from torch.profiler import ProfilerActivity, profile

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")
)
from bench_suite import _case  # noqa: E402

from pagedattn.oracle.reference import paged_attention_reference_lse  # noqa: E402
from pagedattn.oracle.verdict import check_attention  # noqa: E402

profile_name, cid = sys.argv[1:3]
case = _case(profile_name, cid, "cpu")
out = paged_attention_reference_lse(case)[0].to(case.dtype)
check_attention(out, case)
for name, fn in (
    ("oracle", lambda: paged_attention_reference_lse(case)),
    ("check", lambda: check_attention(out, case)),
):
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        fn()
    mem = sorted((ev.start_ns(), ev.nbytes()) for ev in p.profiler.kineto_results.events() if ev.name() == "[memory]")
    total = peak = 0
    for _, b in mem:
        total += b
        peak = max(peak, total)
    print(cid, name, "traced peak MB", round(peak / 2**20, 1))
