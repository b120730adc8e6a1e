"""Where the GPU check's host time goes by Python function (issue 16, eighteenth stop): cProfile
over ``CALLS`` checks (``check_attention_lse``) of each of ``probe_check_pass.CASES``, after a
warm-up, the device synchronized after each; the functions by their own time and by their
cumulative time. The check on a GPU is bound by its host, so this is its time.

    python benchmarks/results/probe_check_cprofile.py OUT.txt
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.environ.get("PROBE_CODE") or HERE)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from probe_check_pass import CASES  # noqa: E402

from pagedattn.cases import grid  # noqa: E402
from pagedattn.oracle import check_attention_lse, paged_attention_reference_lse  # noqa: E402

CALLS = 40


def main(path: str) -> None:
    lines = []
    for prof, cid in CASES:
        case = next(s for s in grid(prof) if s.id == cid).build().to("cuda")
        gen = torch.Generator(device="cuda").manual_seed(0)
        out = torch.randn(case.num_tokens, case.num_heads, case.head_dim, generator=gen, device="cuda").to(case.dtype)
        lse = torch.randn(case.num_tokens, case.num_heads, generator=gen, device="cuda")
        for _ in range(3):
            check_attention_lse(out, lse, case)
            paged_attention_reference_lse(case)
        torch.cuda.synchronize()
        calls = {
            "oracle": lambda case=case: paged_attention_reference_lse(case),
            "check_lse": lambda out=out, lse=lse, case=case: check_attention_lse(out, lse, case),
        }
        for name, fn in calls.items():
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(CALLS):
                fn()
                torch.cuda.synchronize()
            pr.disable()
            for key in ("tottime", "cumtime"):
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats(key).print_stats(28)
                lines.append(f"=== {cid} {name} by {key} ({CALLS} calls)\n{s.getvalue()}\n")
        print(cid, "done", flush=True)
    with open(path, "w") as f:
        f.write(f"# {torch.cuda.get_device_name()} torch {torch.__version__}\n" + "".join(lines))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-check-cprofile.txt")
