"""Where a fused check's time goes on a GPU, phase by phase (issue 16, sixteenth stop): the
oracle's pass (``iter_chunks``' blocks), a sequence's moments, each Triton launch, the final
read (which waits for the device), the rest; and the device's own time (torch's profiler, CUDA
kernels by name). Host times by ``perf_counter`` around wrapped functions, medians of 30 checks.

    python benchmarks/results/probe_check_phases.py OUT.json
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402

from pagedattn.cases import grid  # noqa: E402
from pagedattn.oracle import check_attention, fused, paged_attention_reference_lse  # noqa: E402

CASES = [
    ("quick", "sliding_window-gqa4-bs16-d64-fp32-L1100-B2-win700"),
    ("standard", "lse-gqa4-bs16-d128-fp32-L4000-B2"),
    ("standard", "sliding_window-gqa4-bs16-d128-fp32-L4000-B3-permuted-win1024"),
]
acc: dict[str, float] = collections.defaultdict(float)


def timed(name, fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[name] += time.perf_counter() - t0

    return wrapper


def timed_gen(name, gen_fn):
    def wrapper(*a, **k):
        it = gen_fn(*a, **k)
        while True:
            t0 = time.perf_counter()
            try:
                c = next(it)
            except StopIteration:
                acc[name] += time.perf_counter() - t0
                return
            acc[name] += time.perf_counter() - t0
            yield c

    return wrapper


orig_launch = fused._launch


def launch(kernel, grid_, args, consts, key=None):
    name = "launch_" + getattr(kernel, "__name__", getattr(getattr(kernel, "fn", None), "__name__", "?"))
    t0 = time.perf_counter()
    try:
        return orig_launch(kernel, grid_, args, consts, key)
    finally:
        acc[name] += time.perf_counter() - t0


fused._launch = launch
fused.iter_chunks = timed_gen("pass", fused.iter_chunks)
fused.sequence_moments = timed("moments_all", fused.sequence_moments)
fused._read = timed("read_sync", fused._read)
fused.policy._centre = timed("centre", fused.policy._centre)

rows = []
for profile, case_id in CASES:
    case = next(s for s in grid(profile) if s.id == case_id).build().to("cuda")
    out = torch.randn(case.num_tokens, case.num_heads, case.head_dim, device="cuda").to(case.dtype)
    for _ in range(3):
        check_attention(out, case)
        paged_attention_reference_lse(case)
    torch.cuda.synchronize()
    per: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(30):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        paged_attention_reference_lse(case)
        torch.cuda.synchronize()
        per["oracle"].append(time.perf_counter() - t0)
        acc.clear()
        t0 = time.perf_counter()
        check_attention(out, case)
        per["check"].append(time.perf_counter() - t0)
        for k, v in acc.items():
            per[k].append(v)
    med = {k: round(statistics.median(v) * 1e3, 4) for k, v in per.items()}
    known = sum(v for k, v in med.items() if k not in ("oracle", "check", "centre"))
    med["rest"] = round(med["check"] - known, 4)
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprof

    with tprof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            check_attention(out, case)
        torch.cuda.synchronize()
    kern = collections.Counter()
    for e in p.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA or getattr(e, "self_device_time_total", 0) > 0:
            kern[e.key[:60]] += getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) / 5
    cpu_ops = sorted(
        (
            (e.key, e.count // 5, round(e.self_cpu_time_total / 5, 1))
            for e in p.key_averages()
            if e.self_cpu_time_total > 0
        ),
        key=lambda r: -r[2],
    )[:25]
    row = {"case": case_id, "ms": med, "device_us": dict(kern.most_common(20)), "host_ops_us": cpu_ops}
    print(json.dumps({"case": case_id, "ms": med}), flush=True)
    print("  device us a check:", {k: round(v, 1) for k, v in kern.most_common(12)}, flush=True)
    print("  host ops (name, calls, self us a check):", cpu_ops[:14], flush=True)
    rows.append(row)
json.dump(
    {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(sys.argv[1], "w"), indent=1
)
