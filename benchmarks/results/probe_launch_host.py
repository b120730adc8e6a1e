"""Host time of the check's verdict launch, piece by piece (issue 16, fourteenth stop).

Taking the verdict kernel's launches out of a check saved ~110 us each on the H200's host
(``probe_check_ablate.py``), where the eighth stop had timed the compiled kernel's runner alone at
~14 us. This captures the arguments of a real check's launches (the lse case: its decode block
and a prefill block) and times, as the mean of ``N`` back-to-back calls (then one
synchronization), ``fused._launch`` whole (with ``_key``, and from the fifteenth stop with the
caller's key) and its parts: ``_key``, the runner, the device query. (The fifteenth stop's
``_launch`` calls a kept kernel's ``run`` itself, not its runner: "_launch" times that.)

    python benchmarks/results/probe_launch_host.py OUT.json
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402

from pagedattn.cases import grid  # noqa: E402
from pagedattn.oracle import check_attention, fused  # noqa: E402

N = 300


def host_us(fn) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(N):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / N * 1e6)
    return round(best, 2)


def _row(launch, kernel, grid_, args, consts, own_key) -> dict:
    """One captured launch's pieces, timed."""
    flags = fused._plan(kernel)
    key = (kernel, torch.cuda.current_device(), tuple(consts.items()), own_key or fused._key(args, flags))
    kept = fused._RUNNERS.get(key)
    compiled = kept[0] if isinstance(kept, tuple) else kept  # (kernel, direct) from the fifteenth stop
    row = {
        "args": len(args),
        "_launch": host_us(lambda: launch(kernel, grid_, args, consts)),
        "_launch, the caller's key": host_us(lambda: launch(kernel, grid_, args, consts, own_key)),
        "_key": host_us(lambda: fused._key(args, flags)),
        "current_device": host_us(lambda: torch.cuda.current_device()),
        "runner hit": compiled is not None,
    }
    if compiled is not None:
        g = tuple(grid_) + (1,) * (3 - len(grid_))
        vals = tuple(consts.values())
        row["runner"] = host_us(lambda: compiled[g](*args, *vals))
        run = compiled[g]
        row["runner, made once"] = host_us(lambda: run(*args, *vals))
    row["jit"] = host_us(lambda: kernel[grid_](*args, **consts))
    return row


def main(path: str) -> None:
    case = next(s for s in grid("standard") if s.id == "lse-gqa4-bs16-d128-fp32-L4000-B2").build().to("cuda")
    out = torch.randn(case.num_tokens, case.num_heads, case.head_dim, device="cuda").to(case.dtype)
    captured = []
    launch = fused._launch

    def capture(kernel, grid_, args, consts, key=None):
        captured.append((kernel, grid_, args, dict(consts), key))
        launch(kernel, grid_, args, consts, key)

    check_attention(out, case)  # compiles, fills the runners
    fused._launch = capture
    check_attention(out, case)
    fused._launch = launch
    rows = {}
    names = {fused._compiled().verdict: "verdict", fused._compiled().moments: "moments"}
    for i, (kernel, grid_, args, consts, key) in enumerate(captured):
        name = f"{names.get(kernel, 'reduce')} {i} grid {grid_}"
        rows[name] = _row(launch, kernel, grid_, args, consts, key)
        print(name, json.dumps(rows[name]), flush=True)
    with open(path, "w") as f:
        json.dump(
            {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "calls": N, "host_us": rows}, f, indent=1
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-launch-host.json")
