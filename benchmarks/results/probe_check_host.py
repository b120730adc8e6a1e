"""The fused check's host time on a GPU, piece by piece (issue 16, eighth stop).

Each piece of ``check_attention`` (and of the oracle) is wrapped in a host timer (inclusive,
no synchronization added: on the H200 a check of milliseconds is bound by its host), over 20
checks after a warm-up; what the wrapped pieces leave is the fused loop's own torch calls.

    python benchmarks/results/probe_check_host.py OUT.json
"""

from __future__ import annotations

import collections
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402

from pagedattn.cases import grid  # noqa: E402
from pagedattn.oracle import check_attention, fused, paged_attention_reference_lse, policy, reference, verdict  # noqa: E402

CASES = [
    ("quick", "sliding_window-gqa4-bs16-d64-fp32-L1100-B2-win700"),
    ("standard", "lse-gqa4-bs16-d128-fp32-L4000-B2"),
    ("standard", "sliding_window-gqa4-bs16-d128-fp32-L4000-B3-permuted-win1024"),
    ("standard", "combined-gqa8-bs16-d64-fp32-L8000-B3-permuted-win128-sinks"),
]
SPENT: collections.Counter = collections.Counter()
DEPTH = [0]


def timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            SPENT[name] += time.perf_counter() - t0

    return wrapper


def timed_gen(name, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        it = fn(*a, **k)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                SPENT[name] += time.perf_counter() - t0
                return
            SPENT[name] += time.perf_counter() - t0
            yield item

    return wrapper


def patch():
    fused.iter_chunks = timed_gen("oracle pass (iter_chunks)", fused.iter_chunks)
    reference.iter_chunks = timed_gen("oracle pass (iter_chunks)", reference.iter_chunks)
    for mod, name in [
        (policy, "_terms"),
        (policy, "_weights_stay_normal"),
        (fused, "value_moments"),
        (fused, "_launch"),
        (policy, "_key_reach"),
        (policy, "_spent"),
        (policy, "_subnormal_weights"),
        (fused, "reduced"),
        (verdict, "_read"),
        (fused, "_rows"),
        (verdict, "_judged_by"),
        (verdict, "_output_problem"),
    ]:
        setattr(mod, name, timed(name, getattr(mod, name)))
    policy._KeyMax.__call__ = timed("key max", policy._KeyMax.__call__)
    verdict._Verdict.check = timed("verdict.check", verdict._Verdict.check)


def main(path):
    rows = []
    patch()
    for prof, cid in CASES:
        case = next(s for s in grid(prof) if s.id == cid).build().to("cuda")
        out = torch.randn(case.num_tokens, case.num_heads, case.head_dim, device="cuda").to(case.dtype)
        row = {"case": cid}
        runs = [
            ("oracle", lambda case=case: paged_attention_reference_lse(case)),
            ("check", lambda out=out, case=case: check_attention(out, case)),
        ]
        for what, fn in runs:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            SPENT.clear()
            n = 20
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            total = (time.perf_counter() - t0) / n * 1e3
            pieces = {k: round(v / n * 1e3, 4) for k, v in SPENT.most_common()}
            row[what] = {"ms": round(total, 4), "pieces_ms": pieces}
            print(cid, what, f"{total:.3f} ms", json.dumps(pieces), flush=True)
        rows.append(row)
    with open(path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-check-host.json")
