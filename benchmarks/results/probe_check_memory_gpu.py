"""What the GPU check holds at its peak, against the oracle (issue 16, fourteenth stop).

On the lse case of ``bench_suite.py`` the check's ``max_memory_allocated`` is 65.3 MB against the
oracle's 56.7 on the H200, where the same operations traced on the CPU with exact sizes peak at
53.1 against 56.7 (``check_memory_trace.py``). Here CUDA's allocator records every allocation and
free of one call (``torch.cuda.memory._record_memory_history``, Python frames); replaying its
trace gives the peak and the blocks alive there, each with its size (the allocator's block, which
``max_memory_allocated`` counts) and the line of this package that asked for it.

    python benchmarks/results/probe_check_memory_gpu.py OUT.txt [PROFILE CASE]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402

from pagedattn.cases import grid  # noqa: E402
from pagedattn.oracle import check_attention, paged_attention_reference_lse  # noqa: E402


def _site(frames) -> str:
    for f in frames:
        name = f.get("filename", "")
        if "pagedattn" in name:
            return f"{name.split('pagedattn/')[-1]}:{f.get('line')} {f.get('name')}"
    return "?"


def peak_blocks(fn) -> tuple[int, list[tuple[int, str]], int]:
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=100000)
    fn()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak_stat = torch.cuda.max_memory_allocated() - base
    live: dict[int, tuple[int, str]] = {}
    total = best = 0
    best_live: list = []
    for ev in snap["device_traces"][0]:
        if ev["action"] == "alloc":
            live[ev["addr"]] = (ev["size"], _site(ev.get("frames", [])))
            total += ev["size"]
            if total > best:
                best, best_live = total, sorted(live.values(), reverse=True)
        elif ev["action"] in ("free_requested",) and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]
    return best, best_live, peak_stat


def main(path: str, profile: str, cid: str) -> None:
    case = next(s for s in grid(profile) if s.id == cid).build().to("cuda")
    out = torch.randn(case.num_tokens, case.num_heads, case.head_dim, device="cuda").to(case.dtype)
    lines = []
    for name, fn in (
        ("oracle", lambda: paged_attention_reference_lse(case)),
        ("check", lambda: check_attention(out, case)),
    ):
        best, blocks, stat = peak_blocks(fn)
        lines.append(
            f"== {cid} {name}: replayed peak {best / 2**20:.2f} MB, max_memory_allocated {stat / 2**20:.2f} MB"
        )
        for size, site in blocks:
            lines.append(f"   {size / 2**20:8.3f} MB  {site}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], *(args[1:3] if len(args) > 2 else ("standard", "lse-gqa4-bs16-d128-fp32-L4000-B2")))
