"""The GPU check's torch dispatches and Triton launches, counted on the CPU (issue 16, fourteenth stop).

On the H200 a check of milliseconds is bound by its host, and inside a check every dispatch
costs about the same (~15-20 us there, a view a little less; a Triton launch ~50-110 us:
``probe_check_ablate.py``), so the count of what the check dispatches beyond the oracle is what
its time over the oracle's follows. Here the fused path runs on CPU tensors with its Triton
launches counted and not run (the verdicts are not looked at), under ``bench_suite.OpCounter``.

    python benchmarks/results/count_check_ops.py [--by-op]
"""

from __future__ import annotations

import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_suite import CASES, OpCounter  # noqa: E402

from pagedattn.cases import grid  # noqa: E402
from pagedattn.oracle import check_attention, fused, paged_attention_reference_lse, policy, reference  # noqa: E402


def main() -> None:
    import torch

    by_op = "--by-op" in sys.argv
    fused.ON_CPU = True
    policy.DEVICE_PATH_ON_CPU = True
    launches: collections.Counter = collections.Counter()

    def counted(kernel, grid_, args, consts, key=None):
        launches[kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel)] += 1

    fused._launch = counted
    # a GPU's blocks and floor (the CPU's are smaller blocks and a floor over the edge columns)
    policy._live = lambda case: policy._LIVE
    reference._visible_floor = lambda scores, hidden, *a: (
        scores.amin(dim=-1) if scores.shape[2] == 1 else scores.masked_fill_(hidden, float("inf")).amin(dim=-1)
    )
    if hasattr(policy, "_centre"):  # a GPU's mean: a product with ones
        real_centre = policy._centre
        policy._centre = lambda v, by_product=None: real_centre(v, True)
    real_usable = fused.usable
    fused.usable = lambda case: case.dtype != torch.float64 or real_usable(case)
    for prof, cid in CASES[:5]:
        case = next(s for s in grid(prof) if s.id == cid).build()
        out = torch.zeros(case.num_tokens, case.num_heads, case.head_dim, dtype=case.dtype)
        with OpCounter() as oracle:
            paged_attention_reference_lse(case)
        launches.clear()
        with OpCounter() as check:
            try:
                check_attention(out, case)
            except (IndexError, RuntimeError):  # the statistics were never written (nor counted): no verdict
                pass
        extra = check.ops - oracle.ops
        print(
            f"{cid}: oracle {oracle.ops}, check {check.ops} (+{extra}, {extra / oracle.ops:.2f}), "
            f"launches {sum(launches.values())} {dict(launches)}, syncs {check.syncs}"
        )
        if by_op:
            diff = {k: check.by_op[k] - oracle.by_op.get(k, 0) for k in check.by_op}
            print("   ", {k: v for k, v in sorted(diff.items(), key=lambda x: -x[1]) if v})


if __name__ == "__main__":
    main()
