"""What two pieces of the GPU check cost, by taking each away (issue 16, twentieth stop): each
row's smallest visible logit (the check's oracle pass forms it, two launches a block of several
rows and one a decode) and a sequence's mean value (``policy._centre``: a product with ones and a
division). ``probe_check_ablate.py`` did this for 8798f8e's check; this one is written for the
current code.

The check is timed whole, in one process, round after round (median of ``ROUNDS``, each call after
a synchronization, until the device is done), as it is and with a piece replaced by a stand-in that
costs nothing: the stand-in's results are wrong (the floor becomes the row's largest logit, the
mean zeros) and the verdicts are not looked at; only the time counts.

    python benchmarks/results/probe_check_ablate2.py OUT.json
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
from pagedattn.oracle import (  # noqa: E402
    check_attention,
    check_attention_lse,
    fused,
    paged_attention_reference_lse,
    policy,
    reference,
)

CASES = [
    ("quick", "sliding_window-gqa4-bs16-d64-fp32-L1100-B2-win700"),
    ("standard", "lse-gqa4-bs16-d128-fp32-L4000-B2"),
    ("standard", "sliding_window-gqa4-bs16-d128-fp32-L4000-B3-permuted-win1024"),
    ("standard", "combined-gqa8-bs16-d64-fp32-L8000-B3-permuted-win128-sinks"),
]
ROUNDS = int(os.environ.get("PROBE_ROUNDS", "25"))


@contextlib.contextmanager
def swapped(pairs):
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in pairs]
    for obj, name, value in pairs:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def _no_floor(case, live=2, budget=None, score_floor=False):
    for c in reference.iter_chunks(case, live=live, budget=budget, score_floor=False):
        yield c._replace(score_floor=c.row_max)


_ZEROS: dict = {}


def _no_centre(v, by_product=None):
    key = (v.shape[0], v.shape[2], v.device, v.dtype)
    if key not in _ZEROS:
        _ZEROS[key] = torch.zeros(v.shape[0], 1, v.shape[2], dtype=v.dtype, device=v.device)
    return _ZEROS[key]


def _under(pairs, fn):
    def call():
        with swapped(pairs):
            return fn()

    return call


def _fns(case, out, lse, floor, centre):
    def check():
        return check_attention(out, case)

    def check_lse():
        return check_attention_lse(out, lse, case)

    return {
        "oracle": lambda: paged_attention_reference_lse(case),
        "check": check,
        "check_lse": check_lse,
        "check_no_floor": _under(floor, check),
        "check_lse_no_floor": _under(floor, check_lse),
        "check_no_centre": _under(centre, check),
        "check_no_floor_centre": _under(floor + centre, check),
    }


def main(path: str) -> None:
    rows = []
    floor = [(fused, "iter_chunks", _no_floor)]
    centre = [(policy, "_centre", _no_centre)]
    for prof, cid in CASES:
        case = next(s for s in grid(prof) if s.id == cid).build().to("cuda")
        gen = torch.Generator(device="cuda").manual_seed(0)
        out = torch.randn(case.num_tokens, case.num_heads, case.head_dim, generator=gen, device="cuda").to(case.dtype)
        lse = torch.randn(case.num_tokens, case.num_heads, generator=gen, device="cuda")

        fns = _fns(case, out, lse, floor, centre)
        for fn in fns.values():  # lazy loading, the runners' first launches
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
        row["over_oracle"] = {k: round(v / med["oracle"], 3) for k, v in med.items()}
        print(json.dumps(row), flush=True)
        rows.append(row)
    with open(path, "w") as f:
        info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": ROUNDS}
        json.dump({**info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-check-ablate2.json")
