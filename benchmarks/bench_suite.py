"""The suite's own speed: the oracle, the policy's check, and a whole profile run.

For each case: the float64 oracle (``paged_attention_reference_lse``) and the check
(``check_attention`` of an output of the right shape and dtype; its time and memory do
not depend on the values), each timed (best of a few runs) and measured for peak
memory in a fresh child process: on the CPU the growth of the peak resident set over
the process's size before the call, on a GPU ``torch.cuda.max_memory_allocated`` over
what was allocated before. Optionally the standard profile of the reference backend
(``pytest conformance --backend=reference --profile standard -n 2``): wall time and
the peak of the summed resident sets of pytest and its workers, sampled every 0.2 s.

    python benchmarks/bench_suite.py --out benchmarks/results/cpu-suite.json
    python benchmarks/bench_suite.py --profile-run --out benchmarks/results/cpu-suite.json
    python benchmarks/bench_suite.py --smoke --out /tmp/smoke.json      # the harness, in seconds

Speed is recorded with the machine, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the checkout whose pagedattn is measured (``--code``: another one, for before/after figures)
CODE = [REPO]

#: (profile, case id): a quick window case, the standard profile's long cases (the 8000-token
#: combined one dominated its run), and the thorough 32k history under a 4096-key window
CASES = [
    ("quick", "sliding_window-gqa4-bs16-d64-fp32-L1100-B2-win700"),
    ("standard", "lse-gqa4-bs16-d128-fp32-L4000-B2"),
    ("standard", "sliding_window-gqa4-bs16-d128-fp32-L4000-B3-permuted-win1024"),
    ("standard", "combined-gqa8-bs16-d64-fp32-L8000-B3-permuted-win128-sinks"),
    ("standard", "combined-gqa8-bs16-d64-bf16-L8000-B3-permuted-win128-sinks"),
    ("thorough", "sliding_window-mqa8-bs16-d128-fp32-L32768-B2-win4096"),
]
SMOKE_CASES = [
    ("quick", "sliding_window-gqa2-bs4-d64-fp32-L50-B2-win8"),
    ("quick", "sinks-gqa4-bs16-d64-bf16-L40-B3-sinks"),
]


def machine(device: str) -> dict:
    import torch

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "device": device,
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _case(profile: str, case_id: str, device: str):
    from pagedattn.cases import grid

    spec = next((s for s in grid(profile) if s.id == case_id), None)
    if spec is None:
        raise SystemExit(f"no case {case_id!r} in the {profile} grid")
    return spec.build().to(device)


def measure_one(profile: str, case_id: str, what: str, device: str, repeats: int, threads: int) -> dict:
    """In this (fresh) process: time ``what`` ("oracle" or "check") on the case, and its peak memory."""
    import torch

    from pagedattn.oracle import check_attention, paged_attention_reference_lse

    torch.set_num_threads(threads)
    case = _case(profile, case_id, device)
    # one small call of each first: lazy initialisation (allocator pools, BLAS buffers) is
    # neither the oracle's time nor its memory
    warm = _case("quick", SMOKE_CASES[0][1], device)
    check_attention(paged_attention_reference_lse(warm)[0].to(warm.dtype), warm)
    gen = torch.Generator(device=device).manual_seed(0)
    out = torch.randn(case.num_tokens, case.num_heads, case.head_dim, generator=gen, device=device).to(case.dtype)
    fn = (lambda: paged_attention_reference_lse(case)) if what == "oracle" else (lambda: check_attention(out, case))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = _rss_bytes()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        if times[-1] > 20.0:  # a slow case is timed once
            break
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base  # ru_maxrss: KiB on Linux
    return {"seconds": min(times), "runs": len(times), "peak_mb": round(max(peak, 0) / 2**20, 1)}


def _child(profile: str, case_id: str, what: str, device: str, repeats: int, threads: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", profile, case_id, what, device]
    cmd += [str(repeats), str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": CODE[0]})
    if proc.returncode != 0:
        raise RuntimeError(f"{case_id} {what}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_checks(cases: list[tuple[str, str]], device: str, repeats: int, threads: int) -> list[dict]:
    rows = []
    for profile, case_id in cases:
        oracle = _child(profile, case_id, "oracle", device, repeats, threads)
        check = _child(profile, case_id, "check", device, repeats, threads)
        row = {
            "profile": profile,
            "case": case_id,
            "oracle_s": oracle["seconds"],
            "check_s": check["seconds"],
            "check_over_oracle": round(check["seconds"] / oracle["seconds"], 2),
            "oracle_peak_mb": oracle["peak_mb"],
            "check_peak_mb": check["peak_mb"],
        }
        print(
            f"{case_id:62s} oracle {row['oracle_s']:8.3f} s {row['oracle_peak_mb']:8.1f} MB   check "
            f"{row['check_s']:8.3f} s {row['check_peak_mb']:8.1f} MB   x{row['check_over_oracle']}",
            flush=True,
        )
        rows.append(row)
    return rows


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def profile_run(profile: str, backend: str, workers: int) -> dict:
    """Run the conformance suite once; wall time and the peak summed RSS of the process tree."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "conformance",
        f"--backend={backend}",
        f"--profile={profile}",
        "-q",
        "-p",
        "no:cacheprovider",
        "-n",
        str(workers),
        "--device=cpu",
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            total = 0
            for p in _tree(proc.pid):
                try:
                    total += _rss_bytes(p)
                except OSError:
                    pass
            peak[0] = max(peak[0], total)
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    summary = next((ln for ln in reversed(lines) if " in " in ln and ("passed" in ln or "failed" in ln)), lines[-1])
    print(f"{' '.join(cmd[2:])}: {wall:.1f} s wall, peak RSS {peak[0] / 2**30:.2f} GiB; {summary}", flush=True)
    return {
        "command": " ".join(cmd[1:]),
        "returncode": proc.returncode,
        "wall_s": round(wall, 1),
        "peak_rss_gb": round(peak[0] / 2**30, 2),
        "summary": summary.strip("= "),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--smoke", action="store_true", help="two tiny cases, no profile run: the harness only")
    ap.add_argument("--skip-thorough", action="store_true", help="leave out the 32k-token case")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the timed calls (1: steadier when shared)")
    ap.add_argument("--profile-run", action="store_true", help="also run the standard profile of the reference backend")
    ap.add_argument("--code", default=REPO, help="checkout whose pagedattn is measured (default: this one)")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--one", nargs=6, metavar=("PROFILE", "CASE", "WHAT", "DEVICE", "REPEATS", "THREADS"), help=argparse.SUPPRESS
    )
    args = ap.parse_args(argv)
    if args.one:
        profile, case_id, what, device, repeats, threads = args.one
        print(json.dumps(measure_one(profile, case_id, what, device, int(repeats), int(threads))))
        return {}
    import torch

    CODE[0] = os.path.abspath(args.code)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cases = SMOKE_CASES if args.smoke else [c for c in CASES if not (args.skip_thorough and c[0] == "thorough")]
    result: dict = {
        "machine": machine(device),
        "code": CODE[0],
        "threads": args.threads,
        "checks": bench_checks(cases, device, args.repeats, args.threads),
    }
    result["worst_check_over_oracle"] = max(r["check_over_oracle"] for r in result["checks"])
    if args.profile_run and not args.smoke:
        result["standard_profile_reference"] = profile_run("standard", "reference", 2)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
