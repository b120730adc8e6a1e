"""The check's fused path (``pagedattn.oracle.fused``: one Triton kernel a block) against its
torch path on every attention case of a profile, on a GPU (or, with ``--cpu``, under the Triton
interpreter: slow). For each case three outputs (a correct kernel's, a precision bug's, the bug's
with a NaN and an infinity) are judged on both paths, the output and its log-sum-exp (exact, off
by 1e-3, off with a NaN and an infinity); prints each
case whose verdicts differ (status, counts, worst element; budget or bound beyond
``policy.FUSED_RTOL``) and a summary line.

    python benchmarks/results/fused_check_compare.py --profile quick
"""

from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="quick")
    ap.add_argument("--cpu", action="store_true", help="the kernel under the Triton interpreter")
    ap.add_argument("-k", default="", help="only cases whose id contains this")
    args = ap.parse_args()
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, REPO)

    from pagedattn.cases import grid
    from pagedattn.oracle import check_attention, check_attention_lse, fused, paged_attention_reference_lse, policy
    from tests.streamed import streamed_attention
    from tests.test_policy import _same_verdict

    device = "cpu" if args.cpu else "cuda"
    fused.ON_CPU = policy.DEVICE_PATH_ON_CPU = args.cpu
    specs = [s for s in grid(args.profile) if s.family not in ("gather", "cache_write") and args.k in s.id]
    cases = differ = torch_only = 0
    t0 = time.perf_counter()
    for spec in specs:
        case = spec.build()
        if not fused.usable(case.to(device)):
            torch_only += 1
            continue
        bug = streamed_attention(case, 16, bug="exp_bf16")
        nan = bug.clone()
        nan[-1, 0, 0], nan[0, -1, -1] = float("nan"), float("inf")
        outs = [streamed_attention(case, 16), bug, nan]
        _, lse = paged_attention_reference_lse(case)
        lse = lse.float()
        # the log-sum-exp judged with each output: exact, off by 1e-3, off with a NaN and an infinity
        lse_nan = lse + 1e-3
        lse_nan[-1, 0], lse_nan[0, -1] = float("nan"), float("inf")
        lses = [lse.to(device), (lse + 1e-3).to(device), lse_nan.to(device)]
        case = case.to(device)
        outs = [o.to(device) for o in outs]
        results = []
        for env in ("0", "1"):
            os.environ[fused.ENV] = env
            results.append(
                [c for o, lo in zip(outs, lses) for c in (check_attention(o, case), *check_attention_lse(o, lo, case))]
            )
        cases += 1
        bad = [(a, b) for a, b in zip(*results) if not _same_verdict(a, b)]
        if bad:
            differ += 1
            print(f"DIFFERS {spec.id}:\n  torch: {bad[0][0]}\n  fused: {bad[0][1]}", flush=True)
    print(
        f"{args.profile}: {cases} cases judged on both paths (9 verdicts a case), {differ} differ; "
        f"{torch_only} float64 cases (torch path only); {time.perf_counter() - t0:.1f} s on {device}"
    )
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
