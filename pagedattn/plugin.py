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
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# torch-free on purpose: this module is imported by every pytest session where pagedattn is
# installed; torch, the cases, the suite and the backend loaders are imported by the hooks
# that need them, once --backend is given
from pagedattn._version import __version__
from pagedattn.options import DEFAULT_TIMEOUT_S, NO_LIMIT, PROFILES, case_timeout, positive_seconds
from pagedattn.record import FAILING, CaseRecord, RecordBook, Status, format_table, note, noted, split_group

if TYPE_CHECKING:
    from pagedattn.suite import Suite

SUITE_KEY = pytest.StashKey["Suite | None"]()
RUN_KEY = pytest.StashKey["Run"]()
EXPECT_KEY = pytest.StashKey[list]()


@dataclass
class Run:
    """What this process knows of the run. On the pytest-xdist controller the backend is
    not loaded (``suite`` is None): its description arrives from the workers."""

    spec: str | None = None
    device: str = "cpu"
    profile: str = "quick"
    isolate: bool = False
    timeout: float | None = None
    controller: bool = False  # the xdist controller (no backend here)
    suite: Suite | None = None
    info: dict[str, Any] = field(default_factory=dict)  # backend_info()
    broken: str = ""  # the backend crashed while being constructed
    book: RecordBook | None = None
    watch: Any = None
    crashed_workers: int = 0


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
        type=case_timeout,
        default=None,
        metavar="SECONDS|none",
        help="seconds (positive, finite) a case may take before it counts as timed out; implies --isolate. "
        f"'none': no limit. Default under --isolate: {DEFAULT_TIMEOUT_S:g}",
    )
    group.addoption(
        "--isolate",
        action="store_true",
        help="construct and run the backend in a child process that is replaced when it crashes (segfault, "
        "CUDA fault) or hangs",
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
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return device


def _rerun_command(config: pytest.Config, run: Run, rec: CaseRecord) -> str:
    """The command that reruns one case by its node id, isolated (for a case whose process
    died before a replay file could be saved; the case is rebuilt from its id)."""
    path, sep, rest = rec.nodeid.partition("::")
    target = str(rec.extra.get("file") or config.rootpath / path) + sep + rest
    args = ["pytest", target, f"--backend={run.spec}", f"--device={run.device}", f"--profile={run.profile}",
            "-p", "pagedattn.plugin", "--isolate"]  # fmt: skip
    return " ".join(shlex.quote(a) for a in args)


def _is_controller(config: pytest.Config) -> bool:
    """This process is a pytest-xdist controller (it distributes, the workers run)."""
    return not hasattr(config, "workerinput") and (config.getoption("dist", "no") or "no") != "no"


def pytest_configure(config: pytest.Config) -> None:
    config._pagedattn_start = time.time()  # type: ignore[attr-defined]
    run = Run()
    config.stash[RUN_KEY] = run
    config.stash[SUITE_KEY] = None
    config.stash[EXPECT_KEY] = []
    spec = config.getoption("--backend")
    if not spec:
        return
    import torch

    from pagedattn.adapters.loading import BackendLoadError, load_backend
    from pagedattn.isolation import BackendFault, backend_info
    from pagedattn.suite import Suite

    run.spec = spec
    run.profile = config.getoption("--profile")
    if config.getoption("--replay"):
        _ReplaySpec.load(config.getoption("--replay"))  # a bad file: one usage error, now
    device = config.getoption("--device") or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise pytest.UsageError(f"--device={device}: torch sees no CUDA device here")
    config.stash[EXPECT_KEY] = load_expectations(config.getoption("--expectations"))
    timeout = config.getoption("--case-timeout")
    run.isolate = bool(config.getoption("--isolate") or isinstance(timeout, float))
    run.timeout = timeout if isinstance(timeout, float) else (DEFAULT_TIMEOUT_S if timeout is None else None)
    if not run.isolate:
        run.timeout = None
    run.device = device
    worker = getattr(config, "workerinput", None)
    if worker is None:
        run.book = RecordBook(config.getoption("--report-json"), header=lambda: report_header(config))
        run.book.rerun = lambda rec: _rerun_command(config, run, rec)
        config.pluginmanager.register(_Recorder(config, run), "pagedattn-recorder")
    if _is_controller(config):
        # the workers load the backend; the controller only distributes and reports. Under
        # --isolate, one configuration (compile key) per worker: --dist loadgroup becomes the
        # effective -n mode. Not without --isolate: pytest-xdist 3.8's group scheduler fails
        # (KeyError, or a hang) when it replaces a crashed worker; plain load replaces it.
        run.controller = True
        if config.getoption("dist") == "load" and run.isolate:
            config.option.dist = "loadgroup"
        return
    if worker is not None and worker.get("pagedattn_loadgroup"):
        config.option.loadgroup = True  # xdist's worker appends each item's group to its node id
    if worker is not None and not device.startswith("cuda"):
        # one core per xdist worker: intra-op threads of several workers spin against each other
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(worker.get("workercount", 1))))
    if worker is not None and device == "cuda":
        device = run.device = worker_device(device, worker["workerid"], torch.cuda.device_count())
    extra = [f"--profile={run.profile}"]
    if run.book is not None:
        # written before the backend is constructed, and watched: a constructor that kills
        # this process still leaves a report and a hint
        run.book.notes.append("constructing the backend")
        run.book.flush()
        run.watch = _start_watch(run.book.path)
        _tell(run, "start the backend's construction")
    try:
        if run.isolate:
            from pagedattn.isolation import IsolatedBackend

            backend: Any = IsolatedBackend(spec, device, run.timeout)
            extra += ["--isolate", f"--case-timeout={run.timeout:g}" if run.timeout else f"--case-timeout={NO_LIMIT}"]
        else:
            backend = load_backend(spec)
    except BackendLoadError as exc:
        raise pytest.UsageError(str(exc)) from None
    except BackendFault as exc:
        # a crash while constructing: every case is reported not_run, the report is written
        run.broken = str(exc)
        run.info = {"name": spec, "target": f"{spec} (not constructed: {exc})"}
        return
    finally:
        _tell(run, "end")
        if run.book is not None:
            run.book.notes.remove("constructing the backend")
    run.info = backend_info(backend)
    config.stash[SUITE_KEY] = run.suite = Suite(
        backend=backend,
        backend_spec=spec,
        device=device,
        profile=run.profile,
        replay_dir=os.path.abspath(config.getoption("--replay-dir")),
        suite_path=os.path.relpath(SUITE_DIR) if not os.path.relpath(SUITE_DIR).startswith("..") else SUITE_DIR,
        extra_args=extra,
        probe_unclaimed=config.getoption("--probe-unclaimed") or 0,
        tb_long=config.getoption("tbstyle", "auto") == "long",
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


def _target(run: Run) -> str:
    if run.info.get("target"):
        return str(run.info["target"])
    if run.info.get("name"):
        return f"{run.info['name']} ({run.device})"
    return f"{run.spec} (loaded in the xdist workers)"


def _guard_line(run: Run) -> str:
    if run.isolate:
        limit = f"{run.timeout:g} s per case" if run.timeout else "no time limit (--case-timeout=none)"
        return f"  guard: each case runs in a child process that is replaced when it crashes; {limit}"
    return "  guard: none: a crash or a hang of the backend ends the run (the JSON report still accounts for " \
           "every case); --isolate contains them"  # fmt: skip


def _claims_lines(info: dict[str, Any]) -> list[str]:
    caps = info.get("capabilities") or {}
    lines = [
        f"  policy: fp32 dot precision {info.get('fp32_precision', 'ieee')}"
        + (f", q.k precision {info['qk_precision']}" if info.get("qk_precision", "fp32") != "fp32" else "")
        + (
            f", tolerance x{info['tolerance_factor']:g} (backend override)"
            if info.get("tolerance_factor", 1) != 1
            else ""
        ),  # fmt: skip
        f"  claims: operations {', '.join(caps.get('operations', []))}; "
        f"variants {', '.join(caps.get('variants', [])) or 'none'}",
    ]
    if info.get("limit_lines"):  # Capabilities.limit_lines: every limit, declined invariances included
        return lines + [f"  limit: {line}" for line in info["limit_lines"]]
    declined = {k: v for k, v in (info.get("invariances") or {}).items() if v}
    lines += [f"  declined: {reason}" for reason in declined.values()]
    lines += [f"  narrowed {key}: {note_}" for key, note_ in (info.get("notes") or {}).items()]
    return lines


def pytest_report_header(config: pytest.Config) -> list[str]:
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.spec:
        return []
    import torch

    env = f"  torch {torch.__version__}, triton {_triton_version()}, python {platform.python_version()}"
    if run.controller:
        return [
            f"pagedattn {__version__}: backend {run.spec} (loaded in each xdist worker, not in this process)",
            f"  device {run.device}; profile {run.profile}; --dist {config.getoption('dist')} "
            + (
                "(each configuration on one worker)"
                if config.getoption("dist") == "loadgroup"
                else "(--dist loadgroup keeps each configuration on one worker; the default with --isolate)"
            ),
            env,
            _guard_line(run),
        ]
    name = f"{run.info.get('name', run.spec)} {run.info.get('version', '') or ''}".rstrip()
    lines = [
        f"pagedattn {__version__}: backend {name}",
        f"  runs on: {_target(run)}; device {_device_name(run.device)}; profile {run.profile}",
        env,
        _guard_line(run),
    ]
    if run.broken:
        return lines + [f"  ERROR: {run.broken}"]
    return lines + _claims_lines(run.info)


@pytest.fixture
def pagedattn_suite(request: pytest.FixtureRequest) -> Suite:
    """The run's ``Suite`` (backend, device, profile)."""
    run = request.config.stash.get(RUN_KEY, None)
    if run is not None and run.broken:
        note(request.node, not_run=run.broken)
        pytest.skip(f"not run: {run.broken}")
    suite = request.config.stash.get(SUITE_KEY, None)
    if suite is None:
        raise pytest.UsageError(_need_backend())
    return suite


def _need_backend() -> str:
    from pagedattn.adapters.loading import available_backends

    names = ", ".join(sorted(available_backends())) or "(none installed)"
    return f"the conformance suite needs --backend=NAME (available: {names}), package.module:attr or file.py:attr"


def _replay_families() -> frozenset[str]:
    """The families a saved case may name: those of the suite's modules (``FAMILY``)."""
    from pagedattn.cases import FAMILIES

    return frozenset(FAMILIES) | {"properties", "search-replay"}


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
            from pagedattn.cases import load_case
            from pagedattn.cases.io import CaseFileError

            try:
                case, meta = load_case(path)
            except CaseFileError as exc:
                raise pytest.UsageError(f"--replay={exc}") from None
            family = meta.get("family")
            families = _replay_families()
            if family not in families:
                raise pytest.UsageError(
                    f"--replay={path}: unknown family {family!r} (known: {', '.join(sorted(families))})"
                )
            cls._loaded[key] = (case, meta)
        return cls._loaded[key]

    def build(self, seed: int = 0):
        return self._case.clone()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_spec" not in metafunc.fixturenames:
        return
    config = metafunc.config
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.spec:
        # reported once, for the whole run, in pytest_collection_modifyitems
        metafunc.parametrize("conformance_spec", [None], ids=["no-backend"])
        return
    from pagedattn.cases import FAMILIES, grid

    family = metafunc.module.FAMILY
    replay = config.getoption("--replay")
    specs: list[Any]
    if replay:
        spec = _ReplaySpec(replay)
        specs = [spec] if spec.family == family else []
    else:
        source = getattr(metafunc.module, "SPECS", None)
        if callable(source):
            specs = source(run.profile)
        else:
            specs = grid(run.profile, family) if family in FAMILIES else []  # replay-only modules
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


#: the operation each conformance module runs (the rest run ``attention``)
_OPERATIONS = {"gather": "gather", "cache_write": "write_cache", "lse": "lse"}


def _base_facts(item: pytest.Item) -> dict[str, Any] | None:
    """What the record of a suite item says before it runs: id, family, dtype, operation
    and configuration (from the spec, without building the case)."""
    from pagedattn.suite import dtype_name, spec_configuration

    module = getattr(item, "module", None)
    family = getattr(module, "FAMILY", None)
    if family is None:
        return None
    spec = _spec_of(item)
    if spec is None:
        if "conformance_spec" in getattr(getattr(item, "callspec", None), "params", {}):
            return None
        return {"file": str(item.path), "id": family, "family": family, "dtype": "mixed", "operation": "attention",
                "configuration": family}  # fmt: skip
    operation = getattr(spec, "operation", None) if isinstance(spec, _ReplaySpec) else None
    operation = operation or _OPERATIONS.get(family, "attention")
    facts = {
        "worker": os.environ.get("PYTEST_XDIST_WORKER"),
        "file": str(item.path),
        "id": spec.id,
        "family": family if family in ("properties", "cache_write") else spec.family,
        "dtype": dtype_name(spec.dtype, spec.kv_dtype) if hasattr(spec, "dtype") else _replay_dtype(spec),
        "operation": operation,
        "configuration": spec_configuration(spec, operation),
    }
    params = item.callspec.params  # type: ignore[attr-defined]
    if "prop" in params:
        facts["property"] = params["prop"]
    return facts


def _replay_dtype(spec: Any) -> str:
    from pagedattn.suite import dtype_name

    case = spec.build()
    return dtype_name(case.dtype, case.kv_dtype)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.spec:
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
    if config.getoption("--replay"):
        keep = [i for i in items if isinstance(_spec_of(i), _ReplaySpec)]
        dropped = [i for i in items if i not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    # one record per case from the start; cases ordered by configuration (compile key) and,
    # under --dist loadgroup, each configuration kept on one worker
    keys: dict[int, str] = {}
    for item in items:
        facts = _base_facts(item)
        if facts is not None:
            note(item, **facts)
            keys[id(item)] = facts["configuration"]
            if item.get_closest_marker("xdist_group") is None:  # the search's items carry their own
                item.add_marker(pytest.mark.xdist_group(name=facts["configuration"]))
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda i: (id(i) not in keys, keys.get(id(i), ""), order[id(i)]))


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.spec:
        return []
    keys = {noted(i).get("configuration") for i in items} - {None}
    return [f"pagedattn: {len(items)} cases in {len(keys)} configurations (dtype, kv dtype, head dim, block size, "
            "variants, operation), run in that order"]  # fmt: skip


# ------------------------------------------------------------------ results
_WATCH = r"""
import sys
running, done = None, False
for line in sys.stdin:
    cmd, _, arg = line.rstrip("\n").partition(" ")
    running = arg if cmd == "start" else None if cmd == "end" else running
    done = done or cmd == "done"
if not done:
    where = f" while running {running}" if running else ""
    path = sys.argv[1]
    sys.stderr.write(
        f"\npagedattn: the test process died{where}. "
        + (f"The JSON report {path} accounts for every collected case (a case running then as crashed); "
           f"python -m pagedattn report {path} prints its table. " if path else "")
        + "Rerun with --isolate to contain crashes and hangs.\n"
    )
"""


def _start_watch(path: str | None) -> Any:
    """A tiny process that outlives a crash of this one and prints what happened and what to
    do (Python cannot run code after a segfault; this is the fatal-error handler)."""
    try:
        return subprocess.Popen([sys.executable, "-c", _WATCH, path or ""], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, text=True)  # fmt: skip
    except OSError:
        return None


def _tell(run: Run, line: str) -> None:
    if run.watch is not None and run.watch.stdin is not None:
        try:
            run.watch.stdin.write(line + "\n")
            run.watch.stdin.flush()
        except (OSError, ValueError):
            run.watch = None


class _Recorder:
    """The one owner of the case records (``RecordBook``): in a serial run, or on the
    pytest-xdist controller, where the reports arrive from the workers."""

    def __init__(self, config: pytest.Config, run: Run):
        self.config = config
        self.run = run
        self.book: RecordBook = run.book  # type: ignore[assignment]

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.run.controller:
            return
        for item in session.items:
            self.book.collected(item.nodeid, noted(item))
        self.book.flush()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        # a worker parses the command line again: tell it the --dist mode chosen here
        node.workerinput["pagedattn_loadgroup"] = self.config.getoption("dist") == "loadgroup"

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        fresh = [i for i in ids if i not in self.book.records]
        for nodeid in fresh:
            self.book.collected(nodeid)
        if fresh:
            self.book.flush()

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        if nodeid in self.book.records:
            self.book.start(nodeid)
            _tell(self.run, f"start {split_group(nodeid)[0]}")

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        _tell(self.run, "end")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        rec = self.book.update(report)
        if rec is None:
            return
        if report.when == "???":
            self.run.crashed_workers += 1
        # JUnit XML (and anything else reading the reports here) gets the record, not the raw facts
        report.user_properties = [("pagedattn_status", rec.status.value),
                                  ("pagedattn", json.dumps(rec.to_dict() | {"traceback": None}))]  # fmt: skip

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        info = getattr(node, "workeroutput", {}).get("pagedattn_info")
        if info and not self.run.info.get("capabilities"):
            self.run.info = info
            self.run.broken = getattr(node, "workeroutput", {}).get("pagedattn_broken", "")


def _records(config: pytest.Config) -> list[CaseRecord]:
    run = config.stash.get(RUN_KEY, None)
    return list(run.book.records.values()) if run is not None and run.book is not None else []


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
            row["would_pass"] += r["probe"] in ("would pass", "would hold")
            row["cases"][r["id"] + (f" ({r['property']})" if r.get("property") else "")] = r["probe"]
    return out


def report_header(config: pytest.Config) -> dict[str, Any]:
    """The JSON report's non-case part: the schema, the execution target, expectations."""
    import torch

    run: Run = config.stash[RUN_KEY]
    cases = [r.to_dict() for r in _records(config)]
    info = run.info
    return {
        "schema": "pagedattn-report/2",
        "suite_version": __version__,
        "exit_status": getattr(config, "_pagedattn_exit", None),
        "duration_s": round(time.time() - getattr(config, "_pagedattn_start", time.time()), 3),
        "target": {
            "backend": info.get("name", run.spec),
            "backend_spec": run.spec,
            "backend_version": info.get("version", ""),
            "runs_on": _target(run),
            "device": _device_name(run.device),
            "profile": run.profile,
            "isolated": run.isolate,
            "case_timeout_s": run.timeout,
            "torch": torch.__version__,
            "triton": _triton_version(),
            "python": platform.python_version(),
            "capabilities": info.get("capabilities"),
            "limits": info.get("limit_lines", []),
            "declined_invariances": {k: v for k, v in (info.get("invariances") or {}).items() if v},
            "qk_precision": info.get("qk_precision", "fp32"),
        },
        "error": run.broken or None,
        "expectations": {
            "file": config.getoption("--expectations", None),
            "stale": stale_expectations(config, cases),
            "unexpected_passes": [r["id"] for r in cases if r["status"] == "xpassed"],
        },
        "probes": probe_summary(cases),
    }


def build_report(config: pytest.Config, exitstatus: int) -> dict:
    run: Run = config.stash[RUN_KEY]
    config._pagedattn_exit = int(exitstatus)  # type: ignore[attr-defined]
    assert run.book is not None
    return run.book.report()


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    run = config.stash.get(RUN_KEY, None)
    records = _records(config)
    if run is None or not run.spec or not records:
        return
    tr = terminalreporter
    cases = [r.to_dict() for r in records]
    tr.write_sep("=", f"pagedattn conformance: {run.info.get('name', run.spec)} on {_target(run)}")
    if run.broken:
        tr.write_line(f"ERROR: {run.broken}; no case ran", red=True)
    for line in format_table(run.book.report()["summary"]):  # type: ignore[union-attr]
        tr.write_line(line)
    for reason in sorted({r.reason for r in records if r.status is Status.UNSUPPORTED}):
        tr.write_line(f"unsupported: {reason}")
    for reason, row in probe_summary(cases).items():
        tr.write_line(f"probe of unclaimed cases ({reason}): {row['would_pass']} of {row['probed']} would pass")
        for case_id, verdict in row["cases"].items():
            tr.write_line(f"  {case_id}: {verdict}")
    for r in records:
        if r.status is Status.XPASSED:
            tr.write_line(f"unexpected pass (listed in --expectations): {r.id} ({r.nodeid})")
    for e in stale_expectations(config, cases):
        tr.write_line(f"stale expectation: {e['case']!r} matched no case ({e['reason']})")
    bad = [r for r in records if r.status in (Status.CRASHED, Status.TIMED_OUT)]
    for r in bad:
        first = r.message.splitlines()[0] if r.message else ""
        tr.write_line(f"{r.status.value}: " + (first if first.startswith(r.id) else f"{r.id}: {first}"), red=True)
    never: dict[str, int] = {}
    for r in records:
        if r.status is Status.NOT_RUN:
            never[r.reason] = never.get(r.reason, 0) + 1
    for reason, n in never.items():
        tr.write_line(f"not run: {n} case{'s' if n > 1 else ''}: {reason}", red=True)
    configurations = {r.configuration for r in records if r.configuration}
    tr.write_line(f"{len(records)} cases in {len(configurations)} configurations")
    path = config.getoption("--report-json")
    if path:
        tr.write_line(f"JSON report: {path} (python -m pagedattn report {path})")


def _stop_reason(session: pytest.Session, run: Run) -> str:
    if run.crashed_workers:
        return (f"never run: pytest-xdist did not run it after {run.crashed_workers} worker crashes (it stops "
                "replacing crashed workers after --max-worker-restart); rerun with --isolate")  # fmt: skip
    stop = session.shouldstop or session.shouldfail
    if stop:
        return f"never run: the run stopped early ({stop})"
    return "never run: the run ended before this case (interrupted, or a crash)"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.spec:
        return
    if hasattr(config, "workerinput"):
        config.workeroutput["pagedattn_info"] = run.info  # type: ignore[attr-defined]
        config.workeroutput["pagedattn_broken"] = run.broken  # type: ignore[attr-defined]
        return  # the controller writes the report
    book = run.book
    assert book is not None
    collect_only = bool(config.getoption("collectonly", False))
    book.stop("not run: --collect-only" if collect_only else _stop_reason(session, run))
    failing = FAILING - {Status.XPASSED} - ({Status.NOT_RUN} if collect_only else set())
    if any(r.status in failing for r in book.records.values()) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if run.broken and session.exitstatus in (0, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    config._pagedattn_exit = int(session.exitstatus)  # type: ignore[attr-defined]
    book.flush()
    _tell(run, "done")
    if run.watch is not None:
        try:
            run.watch.stdin.close()
            run.watch.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
