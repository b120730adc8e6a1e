"""The GPU check's memory without a GPU (issue 16, thirteenth stop): the check's device path
(``policy.DEVICE_PATH_ON_CPU``, ``fused.ON_CPU``) on the CPU with its Triton launches left out
(memory only: the same tensors, no kernel runs), under torch's profiler with memory events; the
peak of the running sum of allocations against the oracle's. Torch's CPU allocator sizes are
exact; CUDA's caching allocator rounds a block's size up, so a GPU's ``max_memory_allocated``
can be larger.

    python benchmarks/results/check_memory_trace.py [quick|standard CASE_ID]
"""

import sys

from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "benchmarks")
from bench_suite import _case

from pagedattn.oracle import fused, policy
from pagedattn.oracle.reference import paged_attention_reference_lse
from pagedattn.oracle.verdict import check_attention

policy.DEVICE_PATH_ON_CPU = True
fused.ON_CPU = True
policy._live = lambda c: 2
fused._launch = lambda kernel, grid, args, consts: None  # memory only: no kernel runs
fused._compiled = lambda: fused.Kernels(None, None, None)
profile_name, cid = sys.argv[1:3] if len(sys.argv) > 2 else ("standard", "lse-gqa4-bs16-d128-fp32-L4000-B2")
case = _case(profile_name, cid, "cpu")
out = paged_attention_reference_lse(case)[0].to(case.dtype)
check_attention(out, case)
runs = (("oracle", lambda: paged_attention_reference_lse(case)), ("check", lambda: check_attention(out, case)))
for name, fn in runs:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as p:
        fn()
    mem = sorted((ev.start_ns(), ev.nbytes()) for ev in p.profiler.kineto_results.events() if ev.name() == "[memory]")
    total = peak = 0
    at = None
    for t, b in mem:
        total += b
        if total > peak:
            peak, at = total, t
    print(cid, name, "peak MB", round(peak / 2**20, 1))
