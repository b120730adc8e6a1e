"""The oracle's and the check's time on the CPU with and without first touches of fresh pages
(issue 16, thirteenth stop). Each case in a fresh process: the oracle and the check called
alternately (after one call of each), every call's time and minor page faults (``ru_minflt``),
then each one's best; once with glibc's defaults and once with its thresholds raised
(``MALLOC_MMAP_THRESHOLD_`` 32 MiB, ``MALLOC_TRIM_THRESHOLD_`` 1 GiB: freed memory kept, so
no call faults). With ``--suite``, also the reference backend's standard lse, window and
combined cases as a pytest run, both ways.

    python benchmarks/results/cpu_check_faults.py > benchmarks/results/cpu-check-faults-18.txt
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from bench_suite import CASES as BENCH_CASES  # noqa: E402

KEEP = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
#: the bench's cases but the thorough one (seconds a call)
CASES = [c for c in BENCH_CASES if c[0] != "thorough"]


def one(profile: str, case_id: str, repeats: int = 6) -> None:
    import resource

    import torch
    from bench_suite import _case

    from pagedattn.oracle import check_attention, paged_attention_reference_lse

    torch.set_num_threads(1)
    case = _case(profile, case_id, "cpu")
    out = paged_attention_reference_lse(case)[0].to(case.dtype)
    fns = {"oracle": lambda: paged_attention_reference_lse(case), "check": lambda: check_attention(out, case)}
    runs: dict[str, list[tuple[float, int]]] = {"oracle": [], "check": []}
    for _ in range(repeats):
        for name, fn in fns.items():
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            fn()
            runs[name].append(
                (round((time.perf_counter() - t0) * 1e3, 1), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
            )
    best = {n: min(t for t, _ in r[1:]) for n, r in runs.items()}  # the first call of each: lazy setup
    print(f"  {case_id}: oracle {best['oracle']} ms, check {best['check']} ms, x{best['check'] / best['oracle']:.2f}")
    for name, r in runs.items():
        print(f"    {name} (ms, faults): {r}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        one(sys.argv[2], sys.argv[3])
        return
    for label, extra in (("glibc defaults", {}), ("thresholds raised (no call faults)", KEEP)):
        print(f"{label}:", flush=True)
        for profile, case_id in CASES:
            env = {**os.environ, **extra, "PYTHONPATH": REPO}
            proc = subprocess.run(
                [sys.executable, __file__, "--one", profile, case_id], env=env, capture_output=True, text=True
            )
            print(proc.stdout.rstrip() or proc.stderr[-2000:], flush=True)
    if "--suite" in sys.argv:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "conformance", "--backend=reference"]
        cmd += ["--profile=standard", "-k", "lse or sliding or combined"]
        for label, extra in (("glibc defaults", {}), ("thresholds raised", KEEP)):
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, **extra}, capture_output=True, text=True)
            last = proc.stdout.strip().splitlines()[-1]
            print(f"suite run, {label}: {time.perf_counter() - t0:.2f} s wall ({last})", flush=True)


if __name__ == "__main__":
    main()
