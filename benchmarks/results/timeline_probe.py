# ruff: noqa
"""Issue 16, sixth round: where the wall of a ``-n 8`` thorough run goes. A pytest plugin
(``-p benchmarks.results.timeline_probe``, with ``TIMELINE_DIR`` set) that writes, per
process (the xdist controller and each worker), one JSON file of wall-clock times: the
process's start (from /proc), pytest's configure, collection's end, each item's start and
end (setup + call + teardown) and each warm-up-ahead compile's start and end, and the
session's end. Run as a script it samples the machine's CPU use every half second:

    python benchmarks/results/timeline_probe.py sample OUT.json   # until killed
    python benchmarks/results/timeline_probe.py show DIR [CPU.json]  # the summary
"""

import json
import os
import sys
import time

import pytest

_EVENTS: list = []
_T: dict = {}


def _proc_start() -> float:
    """This process's start time (seconds since the epoch), from /proc."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:  # the boot time to 10 ms (/proc/stat's btime: whole seconds)
        boot = time.time() - float(f.read().split()[0])
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _who(config) -> str:
    return getattr(config, "workerinput", {}).get("workerid", "controller")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    _T["proc_start"] = _proc_start()
    _T["configure"] = time.time()
    if _who(config) == "controller" and getattr(config.option, "numprocesses", None):
        return  # the adapter imports torch: not in the xdist controller, which never loads it
    try:  # the Triton adapter's warm-up: each call's start and end
        from pagedattn.adapters import triton as adapter

        orig = adapter.TritonBackend.warmup_ahead

        def timed(self, case, operation, _orig=orig):
            t = time.time()
            try:
                return _orig(self, case, operation)
            finally:
                _EVENTS.append(("warmup", t, time.time()))

        adapter.TritonBackend.warmup_ahead = timed
    except Exception as exc:  # the probe must not break the run
        _T["patch_error"] = repr(exc)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    _T["sessionstart"] = time.time()  # after every configure; on the controller before xdist starts the workers


def pytest_collection(session):
    _T["collect"] = time.time()


def pytest_collection_finish(session):
    _T["collected"] = time.time()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t = time.time()
    yield
    _EVENTS.append((item.nodeid, t, time.time()))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    _T["sessionfinish"] = time.time()


@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    _T["summary"] = time.time()


def pytest_unconfigure(config):
    _T["unconfigure"] = time.time()
    d = os.environ.get("TIMELINE_DIR")
    if d:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{_who(config)}.json"), "w") as f:
            json.dump({"times": _T, "events": _EVENTS}, f)


def _cpu() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def sample(out: str) -> None:
    rows, (b0, t0) = [], _cpu()
    try:
        while True:
            time.sleep(0.5)
            b, t = _cpu()
            rows.append((time.time(), round((b - b0) / max(1, t - t0) * os.cpu_count(), 2)))
            b0, t0 = b, t
            with open(out, "w") as f:
                json.dump({"cpus": os.cpu_count(), "busy": rows}, f)
    except KeyboardInterrupt:
        pass


def show(d: str, cpu: str | None = None) -> None:
    procs = {}
    for name in sorted(os.listdir(d)):
        if name.endswith(".json"):
            procs[name[:-5]] = json.load(open(os.path.join(d, name)))
    t0 = min(p["times"]["proc_start"] for p in procs.values())
    end = max(p["times"]["unconfigure"] for p in procs.values())
    print(f"wall from the controller's start to the last unconfigure: {end - t0:.1f} s")
    for who, p in procs.items():
        T = {k: round(v - t0, 1) for k, v in p["times"].items() if isinstance(v, float)}
        cases = [e for e in p["events"] if e[0] != "warmup"]
        warm = [e for e in p["events"] if e[0] == "warmup"]
        search = [e for e in cases if "test_search" in e[0]]
        other = [e for e in cases if "test_search" not in e[0]]
        line = f"{who}: {T}"
        if other:
            line += (
                f" | cases {len(other)} {sum(e[2] - e[1] for e in other):.1f} s busy,"
                f" first {other[0][1] - t0:.1f} last end {max(e[2] for e in other) - t0:.1f}"
            )
        if search:
            line += (
                f" | search {len(search)}: {min(e[1] for e in search) - t0:.1f}..{max(e[2] for e in search) - t0:.1f}"
            )
        if warm:
            line += (
                f" | warm-ups {len(warm)} {sum(e[2] - e[1] for e in warm):.1f} s,"
                f" {warm[0][1] - t0:.1f}..{warm[-1][2] - t0:.1f}"
            )
        print(line)
    if cpu:
        c = json.load(open(cpu))
        busy = [(t - t0, b) for t, b in c["busy"] if t0 <= t <= end + 1]
        print(f"CPU busy (of {c['cpus']}), 5 s windows:")
        for s in range(0, int(end - t0) + 5, 5):
            w = [b for t, b in busy if s <= t < s + 5]
            if w:
                print(f"  {s:4d}-{s + 5:<4d} {sum(w) / len(w):5.1f}")


if __name__ == "__main__":
    if sys.argv[1] == "sample":
        sample(sys.argv[2])
    else:
        show(*sys.argv[2:])
