"""Where the fused check's time goes on a GPU, case by case (issue 16, item 1; eighth stop).

For each case: the oracle's and the check's wall (best of 20 after a warm-up); under
torch.profiler, the device time of each (the sum of its kernels' durations), its kernel count
and its host time by operation; the check's pieces on their own (``policy._terms``, which holds
``_weights_stay_normal``; ``_value_moments``; ``_key_reach``); and the verdict kernel's host
cost per launch, through Triton's JIT path and through the compiled kernel's own runner.

    python benchmarks/results/probe_check_gpu.py OUT.json
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from pagedattn.cases import grid  # noqa: E402
from pagedattn.oracle import check_attention, check_attention_lse, fused, paged_attention_reference_lse, policy  # noqa: E402
from pagedattn.oracle.reference import iter_chunks  # noqa: E402

CASES = [
    ("quick", "sliding_window-gqa4-bs16-d64-fp32-L1100-B2-win700"),
    ("standard", "lse-gqa4-bs16-d128-fp32-L4000-B2"),
    ("standard", "sliding_window-gqa4-bs16-d128-fp32-L4000-B3-permuted-win1024"),
    ("standard", "combined-gqa8-bs16-d64-fp32-L8000-B3-permuted-win128-sinks"),
    ("thorough", "sliding_window-mqa8-bs16-d128-fp32-L32768-B2-win4096"),
]


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


def profiled(fn, reps=3):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    dev_us = sum(e.self_device_time_total for e in events) / reps
    kernels = sum(e.count for e in events if e.self_device_time_total > 0) / reps
    host = sorted(events, key=lambda e: -e.self_cpu_time_total)[:14]
    return {
        "device_ms": dev_us / 1e3,
        "kernels": kernels,
        "host_top": [(e.key, round(e.self_cpu_time_total / reps / 1e3, 3), e.count // reps) for e in host],
        "device_top": [
            (e.key[:60], round(e.self_device_time_total / reps / 1e3, 3), e.count // reps)
            for e in sorted(events, key=lambda e: -e.self_device_time_total)[:10]
        ],
    }


def launch_cost(case, out):
    """The verdict kernel's host cost per launch: through Triton's JIT and through the compiled
    kernel's own runner (on adf21b0, where this first ran, the check launched through the JIT;
    since, ``fused._launch`` takes the runner after a kernel's first launch)."""
    kernel = fused._compiled().verdict
    calls = []
    real = fused._launch

    def capture(k, grid, args, consts):
        if k is kernel:
            calls.append((grid, args, consts))
        return real(k, grid, args, consts)

    fused._launch = capture
    try:
        check_attention(out, case)
    finally:
        fused._launch = real
    grid, args, kw = calls[0]
    with torch.cuda.device(case.device):
        compiled = kernel[grid](*args, **kw)
        torch.cuda.synchronize()
        n = 200
        t0 = time.perf_counter()
        for _ in range(n):
            kernel[grid](*args, **kw)
        torch.cuda.synchronize()
        jit_us = (time.perf_counter() - t0) / n * 1e6
        full = list(args) + list(kw.values())
        runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]
        runner(*full)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            runner(*full)
        torch.cuda.synchronize()
        direct_us = (time.perf_counter() - t0) / n * 1e6
    return {"launches_per_check": len(calls), "jit_us": jit_us, "direct_us": direct_us, "args": len(full)}


def pieces(case):
    r = {}
    r["terms_ms"] = best(lambda: policy._terms(case, "ieee", "fp32", "ieee"), 10)
    r["weights_stay_normal_ms"] = best(lambda: policy._weights_stay_normal(case, 2.0**-126), 10)
    chunks = list(iter_chunks(case, live=policy._live(case), score_floor=True))
    seqs = {}
    for c in chunks:
        seqs.setdefault(c.seq, c)
    r["chunks"] = len(chunks)
    r["value_moments_ms"] = best(lambda: [policy._value_moments(c.v_all) for c in seqs.values()], 10)
    r["key_reach_ms"] = best(lambda: [policy._key_reach(c.k_all, case.sliding_window) for c in seqs.values()], 10)
    r["iter_chunks_floor_ms"] = best(lambda: [None for _ in iter_chunks(case, live=2, score_floor=True)], 10)
    r["iter_chunks_ms"] = best(lambda: [None for _ in iter_chunks(case, live=2)], 10)
    return r


def main(path):
    rows = []
    for prof, cid in CASES:
        case = next(s for s in grid(prof) if s.id == cid).build().to("cuda")
        g = torch.Generator(device="cuda").manual_seed(0)
        out = torch.randn(case.num_tokens, case.num_heads, case.head_dim, device="cuda", generator=g).to(case.dtype)
        lse = torch.randn(case.num_tokens, case.num_heads, device="cuda", generator=g)
        row = {"case": cid}

        def oracle(case=case):
            return paged_attention_reference_lse(case)

        def check(out=out, case=case):
            return check_attention(out, case)

        row["oracle_ms"] = best(oracle)
        row["check_ms"] = best(check)
        row["check_lse_ms"] = best(lambda out=out, lse=lse, case=case: check_attention_lse(out, lse, case))
        row["oracle_prof"] = profiled(oracle)
        row["check_prof"] = profiled(check)
        row["launch"] = launch_cost(case, out)
        row["pieces"] = pieces(case)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_prof")}), flush=True)
        for k in ("oracle_prof", "check_prof"):
            p = row[k]
            print(f"  {k}: device {p['device_ms']:.3f} ms, kernels {p['kernels']:.0f}")
            for e in p["host_top"][:10]:
                print("     host", e)
            for e in p["device_top"][:6]:
                print("     dev ", e)
        rows.append(row)
        torch.cuda.empty_cache()
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    import triton

    info["triton"] = triton.__version__
    with open(path, "w") as f:
        json.dump({"machine": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-check-gpu.json")
