"""What each piece of the GPU check costs, by taking it away (issue 16, fourteenth stop).

Torch's profiler misleads here (its own cost per recorded call inflates some operations 10x:
``probe_op_host.py``), and host timers around pieces cost time themselves. So the check is timed
whole, in one process, round after round (median of ``ROUNDS``, each call after a synchronization),
once as it is and once with one piece replaced by a stand-in that costs nothing: the stand-ins'
results are wrong (the verdicts are not looked at), only the time counts. The difference is what
the piece costs inside a check.

    python benchmarks/results/probe_check_ablate.py OUT.json
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402

from pagedattn.cases import grid  # noqa: E402
from pagedattn.oracle import check_attention, fused, paged_attention_reference_lse, policy, reference  # noqa: E402

CASES = [
    ("quick", "sliding_window-gqa4-bs16-d64-fp32-L1100-B2-win700"),
    ("standard", "lse-gqa4-bs16-d128-fp32-L4000-B2"),
    ("standard", "sliding_window-gqa4-bs16-d128-fp32-L4000-B3-permuted-win1024"),
    ("standard", "combined-gqa8-bs16-d64-fp32-L8000-B3-permuted-win128-sinks"),
]
ROUNDS = int(os.environ.get("PROBE_ROUNDS", "25"))


@contextlib.contextmanager
def swapped(obj, name, value):
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


def variants(case):
    """Each variant: a context that takes one piece away. Written for the check it measured
    (8798f8e: ``fused.value_moments``, the fused path's ``policy._KeyMax``); later checks have
    neither, and the variants would take nothing away."""
    if not hasattr(fused, "value_moments"):
        raise SystemExit("probe_check_ablate.py measures 8798f8e's check (fused.value_moments): run it there")
    moments = {}

    def cached_moments(v):
        key = (v.shape, v.data_ptr())
        if key not in moments:
            moments[key] = fused_value_moments(v)
        return moments[key]

    fused_value_moments = fused.value_moments
    key_max_call = policy._KeyMax.__call__
    km_cache = {}

    def cached_key_max(self, c):
        key = (c.seq, c.keys.start, c.keys.stop)
        if key not in km_cache:
            km_cache[key] = key_max_call(self, c)
        return km_cache[key]

    def no_floor(case, live=2, budget=None, score_floor=False):
        for c in iter_chunks(case, live, budget, False):
            yield c._replace(score_floor=c.row_max)

    iter_chunks = reference.iter_chunks
    launch = fused._launch

    def no_verdict_launch(kernel, grid, args, consts):
        if kernel is not fused._compiled().verdict:
            launch(kernel, grid, args, consts)

    return {  # name: a factory of the context (a generator's context serves once)
        "as is": contextlib.nullcontext,
        "no guard": lambda: swapped(policy, "_weights_stay_normal", lambda case, m: True),
        "no launches": lambda: swapped(fused, "_launch", lambda *a, **k: None),
        "no verdict launches": lambda: swapped(fused, "_launch", no_verdict_launch),
        "moments cached": lambda: swapped(fused, "value_moments", cached_moments),
        "key max cached": lambda: swapped(policy._KeyMax, "__call__", cached_key_max),
        "no floor": lambda: swapped(fused, "iter_chunks", no_floor),
    }


def main(path: str) -> None:
    rows = []
    for prof, cid in CASES:
        case = next(s for s in grid(prof) if s.id == cid).build().to("cuda")
        gen = torch.Generator(device="cuda").manual_seed(0)
        out = torch.randn(case.num_tokens, case.num_heads, case.head_dim, generator=gen, device="cuda").to(case.dtype)
        fns = {"oracle": lambda case=case: paged_attention_reference_lse(case)}
        ctxs = variants(case)
        for name in ctxs:
            fns[name] = lambda case=case, make=ctxs[name], out=out: _checked(make, case, out)
        for fn in fns.values():
            fn()
            fn()
        torch.cuda.synchronize()
        wall: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(ROUNDS):
            for name, fn in fns.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                wall[name].append((time.perf_counter() - t0) * 1e3)
        med = {k: statistics.median(v) for k, v in wall.items()}
        row = {"case": cid, "median_ms": {k: round(v, 4) for k, v in med.items()}}
        row["saves_ms"] = {k: round(med["as is"] - v, 4) for k, v in med.items() if k not in ("oracle", "as is")}
        row["check_over_oracle"] = round(med["as is"] / med["oracle"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
    with open(path, "w") as f:
        json.dump(
            {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": ROUNDS, "rows": rows},
            f,
            indent=1,
        )


def _checked(make, case, out):
    with make():
        try:
            return check_attention(out, case)
        except IndexError:  # a stand-in's statistics name no element: the verdict is not looked at
            return None


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-check-ablate.json")
