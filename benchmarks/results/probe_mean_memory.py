"""The peak memory of a mean over the middle dimension on a GPU (issue 16, fourteenth stop).

The allocator's trace of the lse case's check (``probe_check_memory_gpu.py``, call 19g) put a
31.5 MB block under the values' ``mean``; this is the code run on the H200 right after that call
(inline; its output is ``check-issue16/h200-mean-memory.txt``): each way to the mean over the keys
of ``[4, 4000, 128]`` float64 values (16 MB), contiguous and a slice, its peak beyond the input.

    python benchmarks/results/probe_mean_memory.py
"""

import torch

v = torch.randn(4, 4000, 128, dtype=torch.float64, device="cuda")
vs = torch.randn(4, 4100, 128, dtype=torch.float64, device="cuda")[:, 100:]
for name, fn in [
    ("mean", lambda x: x.mean(dim=1, keepdim=True)),
    ("sum", lambda x: x.sum(dim=1, keepdim=True)),
    ("mean f32", lambda x: x.float().mean(dim=1)),
    ("bmm", lambda x: torch.bmm(torch.ones(x.shape[0], 1, x.shape[1], dtype=x.dtype, device=x.device), x)),
]:
    for t, tn in ((v, "contig"), (vs, "slice")):
        fn(t)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        b = torch.cuda.memory_allocated()
        r = fn(t)
        torch.cuda.synchronize()
        print(
            name,
            tn,
            "peak extra MB",
            round((torch.cuda.max_memory_allocated() - b) / 2**20, 3),
            "kept",
            round((torch.cuda.memory_allocated() - b) / 2**20, 4),
        )
