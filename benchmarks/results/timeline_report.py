"""Summarize a ``timeline_plugin.py`` log: per process, when it started, configured, ran its
first and last test, and how many seconds its Triton compiles took in its main thread (inside
tests) and in other threads (the warm-up ahead), with the cache hits apart.

    python benchmarks/results/timeline_report.py /tmp/t.jsonl [--top 10]
"""

from __future__ import annotations

import collections
import json
import sys


def main(path: str, top: int = 10) -> None:
    events = [json.loads(line) for line in open(path) if line.strip()]
    by_pid: dict[int, list[dict]] = collections.defaultdict(list)
    for e in events:
        by_pid[e["pid"]].append(e)
    t0 = min((e.get("process_start") or e["t"]) for e in events if e["ev"] == "configure")
    print(
        f"{'process':10s} {'start':>6s} {'conf':>6s} {'first':>6s} {'last':>6s} {'end':>6s} {'tests':>6s} "
        f"{'test_s':>7s} {'main_c':>4s} {'main_s':>7s} {'thr_c':>5s} {'thr_s':>7s} {'hits':>5s}"
    )
    slow_tests: list[tuple[float, str, str]] = []
    names: collections.Counter = collections.Counter()
    for es in sorted(by_pid.values(), key=lambda es: es[0]["t"]):
        conf = next((e for e in es if e["ev"] == "configure"), None)
        who = conf.get("worker", "?") if conf else "?"
        starts: dict[str, float] = {}
        durations = []
        for e in es:
            if e["ev"] == "start":
                starts[e["node"]] = e["t"]
            elif e["ev"] == "finish" and e["node"] in starts:
                d = e["t"] - starts[e["node"]]
                durations.append(d)
                slow_tests.append((d, who, e["node"].split("::")[-1]))
        comp = [e for e in es if e["ev"] == "compile"]
        main = [e for e in comp if e["thread"] == "MainThread" and not e["hit"]]
        other = [e for e in comp if e["thread"] != "MainThread" and not e["hit"]]
        hits = [e for e in comp if e["hit"]]
        for e in main + other:
            names[e["name"]] += 1
        test_t = [e["t"] for e in es if e["ev"] in ("start", "finish")]
        end = next((e["t"] for e in es if e["ev"] == "sessionfinish"), None)

        def rel(x):
            return f"{x - t0:6.1f}" if x is not None else "     -"

        print(
            f"{who:10s} {rel(conf.get('process_start') if conf else None)} {rel(conf['t'] if conf else None)} "
            f"{rel(min(test_t) if test_t else None)} {rel(max(test_t) if test_t else None)} {rel(end)} "
            f"{len(durations):6d} {sum(durations):7.1f} {len(main):4d} {sum(e['us'] for e in main) / 1e6:7.1f} "
            f"{len(other):5d} {sum(e['us'] for e in other) / 1e6:7.1f} {len(hits):5d}"
        )
    print("compiles by kernel (misses):", dict(names.most_common()))
    misses = [e for e in events if e["ev"] == "compile" and not e["hit"]]
    by_hash = collections.Counter(e.get("hash", "") for e in misses)
    extra = sum(n - 1 for n in by_hash.values())
    print(f"{len(misses)} compiles of {len(by_hash)} kernels: {extra} compiled again elsewhere")
    print("startup (s from the first process's start): sessionstart / collected, per process")
    for es in sorted(by_pid.values(), key=lambda es: es[0]["t"]):
        who = next((e.get("worker", "?") for e in es if e["ev"] == "configure"), "?")
        marks = [
            next((f"{e['t'] - t0:5.1f}" for e in es if e["ev"] == ev), "    -") for ev in ("sessionstart", "collected")
        ]
        print(f"  {who:10s} {' / '.join(marks)}")
    print(f"slowest {top} tests:")
    for d, who, node in sorted(slow_tests, reverse=True)[:top]:
        print(f"  {d:6.2f} s {who:6s} {node}")


if __name__ == "__main__":
    args = sys.argv[1:]
    top = 10
    if "--top" in args:
        i = args.index("--top")
        top = int(args[i + 1])
        del args[i : i + 2]
    main(args[0], top)
