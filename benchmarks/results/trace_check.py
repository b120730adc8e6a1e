"""A torch.profiler timeline (Chrome trace) of the oracle and of the fused check, one case each,
after a warm-up: where the check's host waits and where its launches go (issue 16, eighth stop).

    python benchmarks/results/trace_check.py OUTDIR [profile case_id]...
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from pagedattn.cases import grid  # noqa: E402
from pagedattn.oracle import check_attention, paged_attention_reference_lse  # noqa: E402


def main(outdir: str, pairs: list[tuple[str, str]]) -> None:
    os.makedirs(outdir, exist_ok=True)
    for prof_name, cid in pairs:
        case = next(s for s in grid(prof_name) if s.id == cid).build().to("cuda")
        out = torch.randn(case.num_tokens, case.num_heads, case.head_dim, device="cuda").to(case.dtype)
        runs = {
            "oracle": lambda case=case: paged_attention_reference_lse(case),
            "check": lambda out=out, case=case: check_attention(out, case),
        }
        for what, fn in runs.items():
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=False) as p:
                fn()
                torch.cuda.synchronize()
            p.export_chrome_trace(os.path.join(outdir, f"{cid[:40]}-{what}.json"))
            print(cid, what, "traced", flush=True)


if __name__ == "__main__":
    args = sys.argv[2:] or ["standard", "sliding_window-gqa4-bs16-d128-fp32-L4000-B3-permuted-win1024"]
    main(sys.argv[1], list(zip(args[::2], args[1::2])))
