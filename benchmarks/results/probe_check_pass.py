"""The GPU check's time against the oracle's, in one process, piece by piece (issue 16, fourteenth stop).

``bench_suite.py`` times the oracle and the check best of 5, each in a process of its own; on the
H200 the same code's check took 2.8 to 5.2 ms from one run to the next (eleventh stop of the suite's
figures), so a ratio of two such minima says little. Here every piece is called in turn, round after
round (``ROUNDS``), each after a synchronization, and timed twice: until it returns (its host time)
and until the device is done (its wall). The pieces: the oracle; the check (output; output and
log-sum-exp); the oracle's pass alone (``iter_chunks``, nothing consuming it) without and with each
row's smallest logit (the check's pass); the subnormal guard; each sequence's value moments. Then
torch's profiler, over ``PROFILED`` calls of the oracle and of the check, groups their host time by
operation.

    python benchmarks/results/probe_check_pass.py OUT.json [PROFILE.txt]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

# PROBE_CODE: another checkout's pagedattn (a before/after pair on one lease)
HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.environ.get("PROBE_CODE") or HERE)
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
PROFILED = 10


def _drain(it) -> None:
    for _ in it:
        pass


def pieces(case, out, lse):
    histories = [reference.gather_history(case, b) for b in range(case.num_seqs)]
    values = [reference.dequantized(v.transpose(0, 1), case.v_scale) for _, v in histories]
    keys = [reference.dequantized(k.transpose(0, 1), case.k_scale) for k, _ in histories]
    if hasattr(fused, "sequence_moments"):  # the values' moments and the keys' norms in one launch
        moments = lambda: [fused.sequence_moments(v, k) for v, k in zip(values, keys)]  # noqa: E731
    else:
        moments = lambda: [fused.value_moments(v) for v in values]  # noqa: E731
    min_normal = policy.DTYPE_TABLE[case.dtype].weights_min_normal
    return {
        "oracle": lambda: paged_attention_reference_lse(case),
        "check": lambda: check_attention(out, case),
        "check_lse": lambda: check_attention_lse(out, lse, case),
        "pass": lambda: _drain(reference.iter_chunks(case)),
        "pass_floor": lambda: _drain(reference.iter_chunks(case, live=policy._live(case), score_floor=True)),
        "guard": lambda: policy._weights_stay_normal(case, min_normal),
        "moments": moments,
    }


def main(path: str, profile_path: str | None) -> None:
    rows = []
    prof_lines = []
    for prof, cid in CASES:
        case = next(s for s in grid(prof) if s.id == cid).build().to("cuda")
        gen = torch.Generator(device="cuda").manual_seed(0)
        out = torch.randn(case.num_tokens, case.num_heads, case.head_dim, generator=gen, device="cuda").to(case.dtype)
        lse = torch.randn(case.num_tokens, case.num_heads, generator=gen, device="cuda")
        fns = pieces(case, out, lse)
        for fn in fns.values():  # lazy loading, the runners' first launches
            fn()
            fn()
        torch.cuda.synchronize()
        host: dict[str, list[float]] = {k: [] for k in fns}
        wall: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(ROUNDS):
            for name, fn in fns.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                host[name].append((t1 - t0) * 1e3)
                wall[name].append((t2 - t0) * 1e3)
        row = {"case": cid}
        for name in fns:
            row[name] = {
                "wall_min": round(min(wall[name]), 4),
                "wall_median": round(statistics.median(wall[name]), 4),
                "host_median": round(statistics.median(host[name]), 4),
            }
        o = row["oracle"]
        for name in ("check", "check_lse"):
            row[name]["over_oracle_min"] = round(row[name]["wall_min"] / o["wall_min"], 3)
            row[name]["over_oracle_median"] = round(row[name]["wall_median"] / o["wall_median"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
        if profile_path:
            from torch.profiler import ProfilerActivity, profile

            for name in ("oracle", "check"):
                with profile(activities=[ProfilerActivity.CPU]) as p:
                    for _ in range(PROFILED):
                        fns[name]()
                    torch.cuda.synchronize()
                table = p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
                prof_lines.append(f"=== {cid} {name} ({PROFILED} calls)\n{table}\n")
    with open(path, "w") as f:
        info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": ROUNDS}
        info["code"] = os.environ.get("PROBE_CODE") or "this tree"
        json.dump({**info, "rows": rows}, f, indent=1)
    if profile_path:
        with open(profile_path, "w") as f:
            f.write("".join(prof_lines))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-check-pass.json", sys.argv[2] if len(sys.argv) > 2 else None)
