"""The suite's own speed: the oracle, the policy's check, and a whole profile run.

For each case: the float64 oracle (``paged_attention_reference_lse``) and the check
(``check_attention`` of an output of the right shape and dtype; its time and memory do
not depend on the values), each timed (best of a few runs, fewer where a run is slow)
and measured for peak memory in a fresh child process (on a GPU one process per case
times both, the peak counter reset in between): on the CPU the growth of the peak
resident set over the process's size before the call, on a GPU
``torch.cuda.max_memory_allocated`` over what was allocated before. Each is also run
once under ``OpCounter``: the torch operations it dispatches (``oracle_ops``,
``check_ops``; on a GPU each is a launch and the host's time, the cost of these
millisecond calls) and the points where the host would wait for the device
(``oracle_syncs``, ``check_syncs``). On the CPU each is also timed alternately with the other
in one process (``paired``: the allocator's state shared, with each call's minor page faults),
since separate fresh processes can time the same work 1.5x apart (the first touch of fresh
pages). The JSON is rewritten after every case, so a run
cut short keeps what it measured; ``--budget-s`` skips the cases left once it is spent.
Optionally the standard profile of the reference backend
(``pytest conformance --backend=reference --profile standard -n 2``): wall time and
the peak of the summed resident sets of pytest and its workers, sampled every 0.2 s.

    python benchmarks/bench_suite.py --out benchmarks/results/cpu-suite.json
    python benchmarks/bench_suite.py --profile-run --out benchmarks/results/cpu-suite.json
    python benchmarks/bench_suite.py --smoke --out /tmp/smoke.json      # the harness, in seconds
    python benchmarks/bench_suite.py --device cuda --out gpu-suite.json   # ~1 minute on an H200
    python benchmarks/bench_suite.py --skip-thorough --device-path --out /tmp/dp.json  # a GPU's ops, on the CPU

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
from typing import Any

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


#: ``pagedattn.verdict_kernel.host.ENV``: ``0`` turns the check's fused path off
FUSED_ENV = "PAGEDATTN_FUSED_CHECK"
#: set by ``--device-path`` for the measuring processes
DEVICE_PATH_ENV = "PAGEDATTN_BENCH_DEVICE_PATH"


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


class OpCounter:
    """Counts, while active (``with OpCounter() as c:``), the torch operations dispatched
    (``c.ops``: on a GPU each is a kernel launch or at least the host's dispatch, which is
    what a millisecond call costs there) and the points where the host waits for the
    device (``c.syncs``): a tensor's value read on the host (``item``, ``bool``, ``float``,
    ``int``, ``tolist``, ``cpu``, ``numpy``), an op whose output's shape depends on values
    (``nonzero``, ``masked_select``, indexing by a boolean mask, ``unique``,
    ``repeat_interleave`` without ``output_size``), and a copy between the host and a
    device. ``cpu_as_device`` (default): a CPU tensor counts as if it lived on a device, so
    that a CPU run predicts a GPU one (and host-side bookkeeping done with tensors shows).
    ``c.by_op``: the counts per op name; ``c.sync_sites``: the syncs per source line."""

    def __init__(self, cpu_as_device: bool = True) -> None:
        import collections

        self.cpu_as_device = cpu_as_device
        self.ops = self.syncs = 0
        self.by_op: collections.Counter = collections.Counter()
        self.sync_sites: collections.Counter = collections.Counter()
        self._reading = 0  # inside a patched host read: its own dispatches are not syncs again
        self._saved: dict = {}
        self._mode: Any = None

    def _on_device(self, t) -> bool:
        return getattr(t, "device", None) is not None and (self.cpu_as_device or t.device.type != "cpu")

    def _sync(self) -> None:
        import traceback

        self.syncs += 1
        import pagedattn

        # the checkout pagedattn is imported from (with --code, not this script's)
        here = os.path.dirname(os.path.dirname(os.path.abspath(pagedattn.__file__)))
        # the project's own frames (not this script's, nor a virtualenv's inside the checkout, such as tox's)
        frames = [
            f
            for f in traceback.extract_stack()[:-2]
            if os.path.relpath(os.path.abspath(f.filename), here).split(os.sep)[0]
            in ("pagedattn", "conformance", "tests")
        ]
        if frames:
            f = frames[-1]
            self.sync_sites[f"{os.path.relpath(f.filename, here)}:{f.lineno}"] += 1

    def _dispatched(self, func, args, kwargs):
        import torch

        aten = torch.ops.aten
        self.ops += 1
        self.by_op[str(func.overloadpacket).removeprefix("aten.")] += 1
        if self._reading:
            return
        packet = func.overloadpacket
        first = args[0] if args else None
        if packet in (
            aten._local_scalar_dense,
            aten.nonzero,
            aten.masked_select,
            aten._unique2,
            aten.unique_dim,
            aten.unique_consecutive,
        ):
            sync = self._on_device(first)
        elif packet in (aten.index, aten.index_put, aten.index_put_):
            sync = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()))
        elif packet is aten.repeat_interleave:
            sync = kwargs.get("output_size") is None and not (len(args) > 3 and args[3] is not None)
        elif packet in (aten._to_copy, aten.copy_) and isinstance(first, torch.Tensor):
            src = args[1] if packet is aten.copy_ else first
            dst = first.device if packet is aten.copy_ else kwargs.get("device", first.device)
            sync = dst is not None and torch.device(dst).type != torch.device(src.device).type
        else:
            sync = False
        if sync:
            self._sync()

    def __enter__(self) -> OpCounter:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                counter._dispatched(func, args, kwargs)
                return func(*args, **kwargs)

        def reading(name):
            original = getattr(torch.Tensor, name)

            def read(t, *a, **k):
                if counter._on_device(t) and not counter._reading:
                    counter._sync()
                counter._reading += 1
                try:
                    return original(t, *a, **k)
                finally:
                    counter._reading -= 1

            return original, read

        for name in ("tolist", "cpu", "numpy"):
            self._saved[name], patched = reading(name)
            setattr(torch.Tensor, name, patched)
        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        import torch

        self._mode.__exit__(*exc)
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)


def _timed(fn, sync, repeats: int, max_s: float) -> list[float]:
    """Up to ``repeats`` timed calls, fewer once they have taken ``max_s`` seconds in all (at
    least one): quick calls get every repeat, which milliseconds need most."""
    times: list[float] = []
    while len(times) < repeats:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        if sum(times) > max_s:
            break
    return times


def measure_one(profile: str, case_id: str, what: str, device: str, repeats: int, threads: int) -> dict:
    """In this (fresh) process: time ``what`` ("oracle", "check" or, on a GPU, "both") on
    the case, its peak memory, and its counts of ops and syncs (one more call, counted)."""
    import torch

    from pagedattn.oracle import check_attention, check_attention_lse, paged_attention_reference_lse

    torch.set_num_threads(threads)
    if os.environ.get(DEVICE_PATH_ENV) == "1":  # --device-path: the CPU run takes the GPU's code path
        from pagedattn.oracle import policy, verdict

        policy.DEVICE_PATH_ON_CPU = True
        verdict._Verdict.defer_on_cpu = True  # --code: a checkout from before policy.DEVICE_PATH_ON_CPU
    case = _case(profile, case_id, device)
    # one small call of each first: lazy initialisation (allocator pools, BLAS buffers) is
    # neither the oracle's time nor its memory
    warm = _case("quick", SMOKE_CASES[0][1], device)
    check_attention(paged_attention_reference_lse(warm)[0].to(warm.dtype), warm)
    gen = torch.Generator(device=device).manual_seed(0)
    out = torch.randn(case.num_tokens, case.num_heads, case.head_dim, generator=gen, device=device).to(case.dtype)
    lse = torch.randn(case.num_tokens, case.num_heads, generator=gen, device=device)

    def unfused(fn):  # the torch path, where the fused one would run (a GPU): before and after, one process
        def run():
            saved = os.environ.get(FUSED_ENV)
            os.environ[FUSED_ENV] = "0"
            try:
                return fn()
            finally:
                if saved is None:
                    del os.environ[FUSED_ENV]
                else:
                    os.environ[FUSED_ENV] = saved

        return run

    fns = {
        "oracle": lambda: paged_attention_reference_lse(case),
        "check": lambda: check_attention(out, case),
        "check_lse": lambda: check_attention_lse(out, lse, case),
    }
    if device == "cuda":
        fns["check_torch"] = unfused(fns["check"])
        fns["check_lse_torch"] = unfused(fns["check_lse"])
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    result: dict = {}
    if what == "paired":  # the oracle and the check alternately, in one process: the same allocator
        return {"paired": _paired(fns["oracle"], fns["check"], repeats)}
    for name in list(fns) if what == "both" else (what,):
        fn = fns[name]
        if device == "cuda":  # the first call of each pays the lazy loading of its kernels
            fn()  # (not on the CPU: the resident set's peak is for life, this call would set it)
            sync()
        if device == "cuda":
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        else:
            base = _rss_bytes()
        # a slow case is timed once or twice: the bench must finish in its slot
        times = _timed(fn, sync, repeats, 10.0)
        if device == "cuda":
            peak = torch.cuda.max_memory_allocated() - base
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base  # ru_maxrss: KiB on Linux
        with OpCounter(cpu_as_device=device == "cpu") as counter:  # a GPU run: only its tensors sync
            fn()
        sync()
        result[name] = {
            "seconds": min(times),
            "runs": len(times),
            "peak_mb": round(max(peak, 0) / 2**20, 1),
            "ops": counter.ops,
            "syncs": counter.syncs,
        }
    return result


def _paired(oracle, check, repeats: int) -> dict:
    """The oracle and the check called alternately in one process (``repeats`` times each, fewer
    where slow): their best times, and the minor page faults of each call (``ru_minflt``: on the
    CPU a fresh tensor's pages are first touched inside the call that made it, and how many are
    fresh depends on what the allocator kept from the calls before, so separate processes can
    time the same work 1.5x apart)."""
    times: dict[str, list[float]] = {"oracle": [], "check": []}
    faults: dict[str, list[int]] = {"oracle": [], "check": []}
    spent = 0.0
    while len(times["check"]) < repeats and (spent <= 20.0 or not times["check"]):
        for name, fn in (("oracle", oracle), ("check", check)):
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
            spent += times[name][-1]
    return {
        "oracle_s": min(times["oracle"]),
        "check_s": min(times["check"]),
        "runs": len(times["check"]),
        "oracle_faults": faults["oracle"],
        "check_faults": faults["check"],
    }


def _child(profile: str, case_id: str, what: str, device: str, repeats: int, threads: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", profile, case_id, what, device]
    cmd += [str(repeats), str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": CODE[0]})
    if proc.returncode != 0:
        raise RuntimeError(f"{case_id} {what}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_checks(
    cases: list[tuple[str, str]],
    device: str,
    repeats: int,
    threads: int,
    budget_s: float = float("inf"),
    on_row=lambda rows: None,
) -> list[dict]:
    """One row per case, ``on_row(rows)`` after each; the cases left once ``budget_s``
    seconds are spent get a row ``{"skipped": "budget"}``."""
    rows: list[dict] = []
    t0 = time.perf_counter()
    for profile, case_id in cases:
        if time.perf_counter() - t0 > budget_s:
            rows.append({"profile": profile, "case": case_id, "skipped": f"--budget-s {budget_s:g} spent"})
            print(f"{case_id:62s} skipped: --budget-s {budget_s:g} spent", flush=True)
            on_row(rows)
            continue
        if device == "cuda":  # one process: the peak counter is reset between the calls
            both = _child(profile, case_id, "both", device, repeats, threads)
        else:  # the resident set's peak only grows: a fresh process each
            whats = ("oracle", "check", "check_lse")
            both = {w: _child(profile, case_id, w, device, repeats, threads)[w] for w in whats}
            # and the two timed alternately in one process (the allocator's state shared)
            paired = _child(profile, case_id, "paired", device, repeats, threads)["paired"]
        oracle, check = both["oracle"], both["check"]
        row = {
            "profile": profile,
            "case": case_id,
            "oracle_s": oracle["seconds"],
            "check_s": check["seconds"],
            "check_over_oracle": round(check["seconds"] / oracle["seconds"], 2),
            "oracle_peak_mb": oracle["peak_mb"],
            "check_peak_mb": check["peak_mb"],
            "oracle_ops": oracle["ops"],
            "check_ops": check["ops"],
            "oracle_syncs": oracle["syncs"],
            "check_syncs": check["syncs"],
            "runs": [oracle["runs"], check["runs"]],
        }
        if device != "cuda":
            row["paired"] = dict(paired, check_over_oracle=round(paired["check_s"] / paired["oracle_s"], 2))
        # the lse check; on a GPU also both checks on the torch path (the fused kernel off)
        for name, m in both.items():
            if name not in ("oracle", "check"):
                row[f"{name}_s"] = m["seconds"]
                row[f"{name}_over_oracle"] = round(m["seconds"] / oracle["seconds"], 2)
                row[f"{name}_peak_mb"] = m["peak_mb"]
                row[f"{name}_ops"] = m["ops"]
        print(
            f"{case_id:62s} oracle {row['oracle_s']:8.4f} s {row['oracle_peak_mb']:8.1f} MB {row['oracle_ops']:6d} ops"
            f"   check {row['check_s']:8.4f} s {row['check_peak_mb']:8.1f} MB {row['check_ops']:6d} ops"
            f" {row['check_syncs']:4d} syncs   x{row['check_over_oracle']}"
            + "".join(f"   {k[:-12]} x{v}" for k, v in row.items() if k.endswith("_over_oracle") and k[6:-12])
            + (f"   paired x{row['paired']['check_over_oracle']}" if "paired" in row else ""),
            flush=True,
        )
        rows.append(row)
        on_row(rows)
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
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per measurement (fewer where slow)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="skip the cases left once this many seconds are spent (default: 75 on a GPU, none on the CPU)",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the timed calls (1: steadier when shared)")
    ap.add_argument("--profile-run", action="store_true", help="also run the standard profile of the reference backend")
    ap.add_argument(
        "--device-path",
        action="store_true",
        help="on the CPU, take the check's device path (policy.DEVICE_PATH_ON_CPU): its ops and syncs predict a GPU's",
    )
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
    if args.device_path:
        os.environ[DEVICE_PATH_ENV] = "1"
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cases = SMOKE_CASES if args.smoke else [c for c in CASES if not (args.skip_thorough and c[0] == "thorough")]
    result: dict = {"machine": machine(device), "code": CODE[0], "threads": args.threads, "checks": []}
    result["device_path"] = device != "cpu" or args.device_path

    def write(rows: list[dict]) -> None:  # after every case: a run cut short keeps what it measured
        result["checks"] = rows
        done = [r["check_over_oracle"] for r in rows if "check_over_oracle" in r]
        result["worst_check_over_oracle"] = max(done) if done else None
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    budget_s = args.budget_s if args.budget_s is not None else (75.0 if device == "cuda" else float("inf"))
    bench_checks(cases, device, args.repeats, args.threads, budget_s, write)
    if args.profile_run and not args.smoke:
        result["standard_profile_reference"] = profile_run("standard", "reference", 2)
        write(result["checks"])
    return result


if __name__ == "__main__":
    main()
