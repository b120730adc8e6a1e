"""The pytest plugin: ``--backend`` and friends, case parametrization, reports.

Registered through the ``pytest11`` entry point (``-p pagedattn.plugin`` from a
checkout without an install). It does nothing unless a test asks for the
``conformance_spec`` fixture or ``--backend`` is given.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from pagedattn._version import __version__
from pagedattn.adapters.loading import BackendLoadError, available_backends, load_backend
from pagedattn.cases import FAMILIES, PROFILES, grid, load_case
from pagedattn.cases.io import CaseFileError
from pagedattn.search import positive_seconds
from pagedattn.suite import RECORD_KEY, Suite

SUITE_KEY = pytest.StashKey["Suite | None"]()
RESULTS_KEY = pytest.StashKey[list]()
EXPECT_KEY = pytest.StashKey[list]()


def _suite_dir() -> str:
    """Where the suite's test modules are: ``pagedattn/conformance`` in an installed wheel,
    ``conformance/`` in a checkout (editable or on ``PYTHONPATH``)."""
    try:
        spec = importlib.util.find_spec("pagedattn.conformance")
    except ImportError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return str(list(spec.submodule_search_locations)[0])
    return str(Path(__file__).resolve().parent.parent / "conformance")


SUITE_DIR = _suite_dir()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pagedattn", "paged-attention conformance")
    group.addoption(
        "--backend",
        default=None,
        help="backend under test: an entry-point name (pagedattn.backends), package.module:attr, "
        "or path/to/file.py:attr",
    )
    group.addoption("--device", default=None, help="cuda when available, else cpu")
    group.addoption("--profile", default="quick", choices=PROFILES, help="case grid profile (default quick)")
    group.addoption("--report-json", default=None, metavar="PATH", help="write a JSON report here")
    group.addoption("--replay", default=None, metavar="FILE", help="run only the case saved in FILE")
    group.addoption(
        "--case-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="run the backend in a child process and fail a case that takes longer (implies --isolate)",
    )
    group.addoption(
        "--isolate",
        action="store_true",
        help="run the backend in a child process that is replaced when it crashes (segfault, CUDA fault)",
    )
    group.addoption(
        "--expectations",
        default=None,
        metavar="FILE",
        help='JSON file of known failures: {"expected_failures": [{"case": PATTERN, "reason": TEXT}]}',
    )
    group.addoption(
        "--probe-unclaimed",
        type=int,
        nargs="?",
        const=3,
        default=0,
        metavar="N",
        help="run up to N (default 3) unclaimed cases per reason anyway and report which would pass",
    )
    group.addoption(
        "--search-examples",
        type=int,
        default=None,
        metavar="N",
        help="hypothesis draws of the whole search family, shared by its items (default: 25 quick, 100 standard, "
        "300 thorough)",
    )
    group.addoption(
        "--search-budget",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="seconds for the whole search family, finding and shrinking, shared by its items (default: 60 on a "
        "GPU, 30 on the CPU)",
    )
    group.addoption(
        "--replay-dir",
        default=os.path.join(".pagedattn", "failures"),
        metavar="DIR",
        help="where failing cases are saved for replay (default .pagedattn/failures)",
    )


def _triton_version() -> str:
    # from the metadata: importing triton here would fix TRITON_INTERPRET too early
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return device


def pytest_configure(config: pytest.Config) -> None:
    config.stash[RESULTS_KEY] = []
    config.stash[SUITE_KEY] = None
    config._pagedattn_start = time.time()  # type: ignore[attr-defined]
    config.pluginmanager.register(_Recorder(config), "pagedattn-recorder")
    spec = config.getoption("--backend")
    if not spec:
        return
    if config.getoption("--replay"):
        _ReplaySpec.load(config.getoption("--replay"))  # a bad file: one usage error, now
    device = config.getoption("--device") or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise pytest.UsageError(f"--device={device}: torch sees no CUDA device here")
    worker = getattr(config, "workerinput", None)
    if worker is not None and not device.startswith("cuda"):
        # one core per xdist worker: intra-op threads of several workers spin against each other
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(worker.get("workercount", 1))))
    if worker is not None and device == "cuda":
        device = worker_device(device, worker["workerid"], torch.cuda.device_count())
    try:
        backend = load_backend(spec)
    except BackendLoadError as exc:
        raise pytest.UsageError(str(exc)) from None
    extra = [f"--profile={config.getoption('--profile')}"]
    timeout = config.getoption("--case-timeout")
    if timeout is not None or config.getoption("--isolate"):
        from pagedattn.isolation import IsolatedBackend

        backend = IsolatedBackend(spec, backend, device, timeout)
        extra += ["--isolate"] + ([f"--case-timeout={timeout:g}"] if timeout is not None else [])
    config.stash[EXPECT_KEY] = load_expectations(config.getoption("--expectations"))
    config.stash[SUITE_KEY] = Suite(
        backend=backend,
        backend_spec=spec,
        device=device,
        profile=config.getoption("--profile"),
        replay_dir=os.path.abspath(config.getoption("--replay-dir")),
        suite_path=os.path.relpath(SUITE_DIR) if not os.path.relpath(SUITE_DIR).startswith("..") else SUITE_DIR,
        extra_args=extra,
        probe_unclaimed=config.getoption("--probe-unclaimed") or 0,
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    suite = config.stash.get(SUITE_KEY, None)
    if suite is not None and hasattr(suite.backend, "close"):
        suite.backend.close()


def worker_device(device: str, worker_id: str | None, device_count: int) -> str:
    """The device of one pytest-xdist worker: with ``--device=cuda`` (no index) and several
    GPUs, worker ``gwN`` takes ``cuda:(N mod device_count)``; an explicit index, one GPU, the
    CPU or a serial run keep ``device`` as given."""
    if worker_id is None or device != "cuda" or device_count <= 1:
        return device
    return f"cuda:{int(worker_id.removeprefix('gw')) % device_count}"


def _target(suite: Suite) -> str:
    return str(getattr(suite.backend, "target", None) or f"{suite.backend.name} ({suite.device})")


def pytest_report_header(config: pytest.Config) -> list[str]:
    suite = config.stash.get(SUITE_KEY, None)
    if suite is None:
        return []
    caps = suite.caps
    lines = [
        f"pagedattn {__version__}: backend {suite.backend.name} {getattr(suite.backend, 'version', '') or ''}".rstrip(),
        f"  runs on: {_target(suite)}; device {_device_name(suite.device)}; profile {suite.profile}",
        f"  torch {torch.__version__}, triton {_triton_version()}, python {platform.python_version()}",
        f"  policy: fp32 dot precision {caps.fp32_precision}"
        + (f", tolerance x{caps.tolerance_factor:g} (backend override)" if caps.tolerance_factor != 1.0 else ""),
    ]
    lines.append(
        f"  claims: operations {', '.join(sorted(caps.operations))}; "
        f"variants {', '.join(sorted(caps.variants)) if caps.variants else 'none'}"
    )
    for key, note in caps.notes.items():
        lines.append(f"  narrowed {key}: {note}")
    return lines


@pytest.fixture
def pagedattn_suite(request: pytest.FixtureRequest) -> Suite:
    """The run's ``Suite`` (backend, device, profile)."""
    suite = request.config.stash.get(SUITE_KEY, None)
    if suite is None:
        raise pytest.UsageError(_need_backend())
    return suite


def _need_backend() -> str:
    names = ", ".join(sorted(available_backends())) or "(none installed)"
    return f"the conformance suite needs --backend=NAME (available: {names}), package.module:attr or file.py:attr"


#: the families a saved case may name: those of the suite's modules (``FAMILY``)
REPLAY_FAMILIES = frozenset(FAMILIES) | {"properties", "search-replay"}


class _ReplaySpec:
    """A saved case posing as a grid spec. ``_ReplaySpec(path)`` reads the file once per
    process (every test module asks for it); a bad file is one ``pytest.UsageError``
    naming the file and the problem, raised from ``pytest_configure``."""

    _loaded: dict[tuple, tuple[Any, dict]] = {}  # by path and modification time

    def __init__(self, path: str):
        self.path = path
        case, self.meta = self.load(path)
        self.family = self.meta.get("family", "replay")
        self.id = "replay-" + str(self.meta.get("id", os.path.basename(path)))
        self.operation = self.meta.get("operation", "attention")
        self._case = case

    @classmethod
    def load(cls, path: str) -> tuple[Any, dict]:
        """``(case, meta)`` of the file, or ``pytest.UsageError``."""
        try:
            key: tuple = (os.path.abspath(path), os.stat(path).st_mtime_ns)
        except OSError:
            key = (os.path.abspath(path), None)  # load_case says what is wrong
        if key not in cls._loaded:
            try:
                case, meta = load_case(path)
            except CaseFileError as exc:
                raise pytest.UsageError(f"--replay={exc}") from None
            family = meta.get("family")
            if family not in REPLAY_FAMILIES:
                raise pytest.UsageError(
                    f"--replay={path}: unknown family {family!r} (known: {', '.join(sorted(REPLAY_FAMILIES))})"
                )
            cls._loaded[key] = (case, meta)
        return cls._loaded[key]

    def build(self, seed: int = 0):
        return self._case.clone()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_spec" not in metafunc.fixturenames:
        return
    config = metafunc.config
    suite = config.stash.get(SUITE_KEY, None)
    if suite is None:
        # reported once, for the whole run, in pytest_collection_modifyitems
        metafunc.parametrize("conformance_spec", [None], ids=["no-backend"])
        return
    family = metafunc.module.FAMILY
    replay = config.getoption("--replay")
    specs: list[Any]
    if replay:
        spec = _ReplaySpec(replay)
        wanted = spec.family == family and getattr(metafunc.module, "REPLAYABLE", True)
        specs = [spec] if wanted else []
    else:
        source = getattr(metafunc.module, "SPECS", None)
        if callable(source):
            specs = source(suite.profile)
        else:
            specs = grid(suite.profile, family) if family in FAMILIES else []  # replay-only modules
    metafunc.parametrize("conformance_spec", specs, ids=[s.id for s in specs])


def _spec_of(item: pytest.Item):
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("conformance_spec") if callspec else None


def load_expectations(path: str | None) -> list[dict]:
    """The known failures of ``path``: ``[{"case": pattern, "reason": text}]``. A pattern
    (``*`` and ``?`` wildcards) matches a case id or a test name such as
    ``test_property[mixed-*-determinism]``."""
    if not path:
        return []
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise pytest.UsageError(f"--expectations={path}: cannot read it as JSON: {exc}") from None
    entries = data.get("expected_failures") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise pytest.UsageError(f"--expectations={path}: needs a top-level 'expected_failures' list")
    for i, e in enumerate(entries):
        if not (isinstance(e, dict) and isinstance(e.get("case"), str) and str(e.get("reason", "")).strip()):
            raise pytest.UsageError(f"--expectations={path}: entry {i} needs a 'case' pattern and a 'reason'")
    return entries


def _glob(pattern: str, text: str) -> bool:
    """Whether ``text`` matches ``pattern`` as a whole: ``*`` (any run) and ``?`` (any one
    character) are the only wildcards; brackets are literal, as in test names ``test_x[id]``.

    Greedy matching that remembers only the last ``*``: at most ``len(pattern) * len(text)``
    steps whatever the pattern (a backtracking regex takes exponential time on many stars)."""
    p = t = 0
    star, resume = -1, 0  # the last star's position in the pattern; where its run ends in the text
    while t < len(text):
        if p < len(pattern) and pattern[p] == "*":
            star, resume = p, t
            p += 1
        elif p < len(pattern) and pattern[p] in ("?", text[t]):
            p += 1
            t += 1
        elif star >= 0:  # let the last star take one more character
            resume += 1
            p, t = star + 1, resume
        else:
            return False
    return all(c == "*" for c in pattern[p:])


def _matches(entry: dict, case_id: str, test_name: str) -> bool:
    return _glob(entry["case"], case_id) or _glob(entry["case"], test_name)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.stash.get(SUITE_KEY, None) is None:
        if any("conformance_spec" in getattr(getattr(i, "callspec", None), "params", {}) for i in items):
            raise pytest.UsageError(_need_backend())
        return
    # modules with nothing to run in this mode (replay-only ones) got an empty parameter set
    empty = [i for i in items if "conformance_spec" in getattr(getattr(i, "callspec", None), "params", {})
             and not hasattr(_spec_of(i), "build")]  # fmt: skip
    if empty:
        config.hook.pytest_deselected(items=empty)
        items[:] = [i for i in items if i not in empty]
    for item in items:
        spec = _spec_of(item)
        if spec is None:
            continue
        for entry in config.stash[EXPECT_KEY]:
            if _matches(entry, spec.id, item.name):
                item.add_marker(pytest.mark.xfail(reason=f"expected failure: {entry['reason']}", strict=False))
                break
    if not config.getoption("--replay"):
        return
    keep = [i for i in items if isinstance(_spec_of(i), _ReplaySpec)]
    dropped = [i for i in items if i not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


# ------------------------------------------------------------------ results
class _Recorder:
    """Collects each case's record from the test reports (on the xdist controller too,
    where the reports arrive from the workers)."""

    def __init__(self, config: pytest.Config):
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = next((v for k, v in report.user_properties if k == RECORD_KEY), None)
        if not isinstance(props, dict):
            return
        if not (report.when == "call" or (report.when == "setup" and not report.passed)):
            return
        rec = dict(props)
        if hasattr(report, "wasxfail"):
            rec["status"] = "xfailed" if report.skipped else "xpassed"
            rec["expectation"] = report.wasxfail
        elif report.failed:
            # the backend raised, or the judgement failed: the report decides
            rec["status"] = "failed"
            rec.setdefault("message", str(report.longrepr)[-2000:] if report.longrepr else "")
        rec["nodeid"] = report.nodeid
        rec["duration_s"] = round(report.duration, 4)
        self.config.stash[RESULTS_KEY].append(rec)


STATUSES = ("passed", "failed", "warned", "unsupported", "xfailed", "xpassed")


def summarize(results: list[dict]) -> dict[tuple[str, str], dict]:
    """``{(family, dtype): {passed, failed, warned, unsupported, worst_budget}}``."""
    table: dict[tuple[str, str], dict] = {}
    for r in results:
        row = table.setdefault((r["family"], r["dtype"]), {s: 0 for s in STATUSES} | {"worst_budget": None})
        status = r["status"] if r["status"] in STATUSES else "failed"
        row[status] += 1
        budget = (r.get("metrics") or {}).get("budget_used")
        if isinstance(budget, (int, float)):
            row["worst_budget"] = budget if row["worst_budget"] is None else max(row["worst_budget"], budget)
        elif isinstance(budget, str):  # inf
            row["worst_budget"] = float("inf")
    return table


def format_table(table: dict[tuple[str, str], dict]) -> list[str]:
    cols = ["passed", "failed", "warned", "unsupported"]
    cols += [c for c in ("xfailed", "xpassed") if any(row[c] for row in table.values())]
    dw = max([7] + [len(d) + 2 for _, d in table])
    head = (
        f"{'family':<14}{'dtype':<{dw}}" + "".join(f"{c:>{max(8, len(c) + 2)}}" for c in cols) + f"{'worst budget':>14}"
    )
    lines = [head, "-" * len(head)]
    for (family, dtype), row in sorted(table.items()):
        wb = row["worst_budget"]
        wb_s = "-" if wb is None else f"{wb:.3g}"
        cells = "".join(f"{row[c]:>{max(8, len(c) + 2)}}" for c in cols)
        lines.append(f"{family:<14}{dtype:<{dw}}{cells}{wb_s:>14}")
    return lines


def stale_expectations(config: pytest.Config, results: list[dict]) -> list[dict]:
    """Expectation entries that matched no case of this run."""
    return [
        e
        for e in config.stash.get(EXPECT_KEY, [])
        if not any(_matches(e, r.get("id", ""), r.get("nodeid", "").split("::")[-1]) for r in results)
    ]


def probe_summary(results: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for r in results:
        if "probe" in r:
            row = out.setdefault(r.get("reason", ""), {"probed": 0, "would_pass": 0, "cases": {}})
            row["probed"] += 1
            row["would_pass"] += r["probe"] == "would pass"
            row["cases"][r["id"]] = r["probe"]
    return out


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    suite = config.stash.get(SUITE_KEY, None)
    results = config.stash.get(RESULTS_KEY, [])
    if suite is None or not results:
        return
    tr = terminalreporter
    tr.write_sep("=", f"pagedattn conformance: {suite.backend.name} on {_target(suite)}")
    for line in format_table(summarize(results)):
        tr.write_line(line)
    unsupported = sorted({r.get("reason", "") for r in results if r["status"] == "unsupported"})
    for reason in unsupported:
        tr.write_line(f"unsupported: {reason}")
    for reason, row in probe_summary(results).items():
        tr.write_line(f"probe of unclaimed cases ({reason}): {row['would_pass']} of {row['probed']} would pass")
        for case_id, verdict in row["cases"].items():
            tr.write_line(f"  {case_id}: {verdict}")
    for r in results:
        if r["status"] == "xpassed":
            tr.write_line(f"unexpected pass (listed in --expectations): {r['id']} ({r['nodeid']})")
    for e in stale_expectations(config, results):
        tr.write_line(f"stale expectation: {e['case']!r} matched no case ({e['reason']})")
    path = config.getoption("--report-json")
    if path:
        tr.write_line(f"JSON report: {path}")


def build_report(config: pytest.Config, exitstatus: int) -> dict:
    suite = config.stash.get(SUITE_KEY, None)
    results = config.stash.get(RESULTS_KEY, [])
    table = summarize(results)
    return {
        "schema": "pagedattn-report/1",
        "suite_version": __version__,
        "exit_status": int(exitstatus),
        "duration_s": round(time.time() - getattr(config, "_pagedattn_start", time.time()), 3),
        "target": {
            "backend": suite.backend.name if suite else None,
            "backend_spec": suite.backend_spec if suite else None,
            "backend_version": str(getattr(suite.backend, "version", "") or "") if suite else None,
            "runs_on": _target(suite) if suite else None,
            "device": _device_name(suite.device) if suite else None,
            "profile": suite.profile if suite else None,
            "torch": torch.__version__,
            "triton": _triton_version(),
            "python": platform.python_version(),
            "capabilities": suite.caps.describe() if suite else None,
        },
        "summary": [
            {"family": f, "dtype": d, **{k: (v if v != float("inf") else "inf") for k, v in row.items()}}
            for (f, d), row in sorted(table.items())
        ],
        "expectations": {
            "file": config.getoption("--expectations", None),
            "stale": stale_expectations(config, results),
            "unexpected_passes": [r["id"] for r in results if r["status"] == "xpassed"],
        },
        "probes": probe_summary(results),
        "cases": results,
    }


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput"):
        return  # the controller writes the report
    path = config.getoption("--report-json", None)
    if path and config.stash.get(SUITE_KEY, None) is not None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(build_report(config, exitstatus), f, indent=1)
