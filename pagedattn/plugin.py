"""The pytest plugin: ``--backend`` and friends, and the hooks that run the suite.

Registered through the ``pytest11`` entry point (``-p pagedattn.plugin`` from a
checkout without an install). It does nothing unless a test asks for the
``conformance_spec`` fixture or ``--backend`` is given. The work is done elsewhere:
``pagedattn.runner.collection`` (which cases, in what order), ``pagedattn.runner.suite`` and
``pagedattn.runner.properties`` (what a case does), ``pagedattn.runner.recording`` and
``pagedattn.runner.case_record`` (one record per case), ``pagedattn.runner.report`` (header, summary, JSON),
``pagedattn.runner.expectations`` (known failures) and ``pagedattn.runner.replay`` (saved cases).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

# torch-free on purpose: this module is imported by every pytest session where pagedattn is
# installed; torch, the cases, the suite and the backend loaders are imported by the hooks
# that need them, once --backend is given
from pagedattn.runner import collection, report
from pagedattn.runner import recording as recorder
from pagedattn.runner.case_record import note, noted
from pagedattn.runner.expectations import load_expectations
from pagedattn.runner.options import DEFAULT_TIMEOUT_S, NO_LIMIT, PROFILES, case_timeout, positive_seconds
from pagedattn.runner.record_book import CRASH_HINT, RecordBook
from pagedattn.runner.replay import ReplaySpec, rerun_command
from pagedattn.runner.session import RUN_KEY, SUITE_DIR, SUITE_KEY, Run

if TYPE_CHECKING:
    from pagedattn.adapters.protocol import Backend
    from pagedattn.runner.suite import Suite


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
        "--warmup-ahead",
        default="auto",
        choices=("auto", "on", "off"),
        help="compile later cases' kernels in a background thread while cases run, for backends with "
        "warmup_ahead (auto: on a GPU; never on the CPU unless 'on', nor under --isolate, --replay or "
        "--collect-only)",
    )
    group.addoption(
        "--replay-dir",
        default=os.path.join(".pagedattn", "failures"),
        metavar="DIR",
        help="where failing cases are saved for replay (default .pagedattn/failures)",
    )


def _is_controller(config: pytest.Config) -> bool:
    """This process is a pytest-xdist controller (it distributes, the workers run)."""
    return not hasattr(config, "workerinput") and (config.getoption("dist", "no") or "no") != "no"


def pytest_configure(config: pytest.Config) -> None:
    config._pagedattn_start = time.time()  # type: ignore[attr-defined]
    run = Run()
    config.stash[RUN_KEY] = run
    config.stash[SUITE_KEY] = None
    config.pluginmanager.register(_SearchLast(), "pagedattn-search-last")
    spec = config.getoption("--backend")
    if not spec:
        return
    run.spec = spec
    run.profile = config.getoption("--profile")
    if config.getoption("--replay"):
        ReplaySpec.load(config.getoption("--replay"))  # a bad file: one usage error, now
    device = config.getoption("--device") or ""
    # the xdist controller imports torch only to check an asked-for CUDA device; its default
    # device is picked when first read (``Run.device``), after xdist has started the workers
    if device.startswith("cuda") or not _is_controller(config):
        import torch

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise pytest.UsageError(f"--device={device}: torch sees no CUDA device here")
    run.expectations = load_expectations(config.getoption("--expectations"))
    timeout = config.getoption("--case-timeout")
    run.isolate = bool(config.getoption("--isolate") or isinstance(timeout, float))
    run.timeout = timeout if isinstance(timeout, float) else (DEFAULT_TIMEOUT_S if timeout is None else None)
    if not run.isolate:
        run.timeout = None
    run.device = device
    worker = getattr(config, "workerinput", None)
    if worker is None:
        book = run.book = RecordBook(config.getoption("--report-json"), header=lambda: report.report_header(config))
        book.rerun = lambda rec: rerun_command(
            rec.nodeid, rec.extra.get("file"), str(config.rootpath), run.spec, run.device, run.profile
        )
        config.pluginmanager.register(recorder.Recorder(config, run, book), "pagedattn-recorder")
    if _is_controller(config):
        # the workers load the backend; the controller only distributes and reports. Under
        # --isolate, one configuration (compile key) per worker: --dist loadgroup becomes the
        # effective -n mode. Not without --isolate: pytest-xdist 3.8's group scheduler fails
        # (KeyError, or a hang) when it replaces a crashed worker; plain load replaces it.
        run.controller = True
        if config.getoption("dist") == "load" and run.isolate:
            config.option.dist = "loadgroup"
        from pagedattn.runner.backend_spec import spec_problem

        # before the workers start (each would fail to load it), where they see what this process sees
        problem = spec_problem(spec) if workers_share_this_process(config.getoption("tx", None)) else None
        if problem is not None:
            _usage_error(config, run, problem)
        return
    if worker is not None and worker.get("pagedattn_loadgroup"):
        config.option.loadgroup = True  # xdist's worker appends each item's group to its node id
    import torch

    if worker is not None and not device.startswith("cuda"):
        # one core per xdist worker: intra-op threads of several workers spin against each other
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(worker.get("workercount", 1))))
    if worker is not None and device == "cuda":
        device = run.device = worker_device(device, worker["workerid"], torch.cuda.device_count())
    try:
        backend, extra = _construct(run, spec, device)
    except pytest.UsageError as exc:
        _usage_error(config, run, str(exc))
    if backend is None:
        return
    from pagedattn.adapters.loading import backend_info
    from pagedattn.runner.suite import Suite

    run.info = backend_info(backend)
    suite_path = os.path.relpath(SUITE_DIR)
    config.stash[SUITE_KEY] = run.suite = Suite(
        backend=backend,
        backend_spec=spec,
        device=device,
        profile=run.profile,
        replay_dir=os.path.abspath(config.getoption("--replay-dir")),
        suite_path=suite_path if not suite_path.startswith("..") else SUITE_DIR,
        extra_args=extra,
        probe_unclaimed=config.getoption("--probe-unclaimed") or 0,
        tb_long=config.getoption("tbstyle", "auto") == "long",
    )


def workers_share_this_process(txs: list[str] | None) -> bool:
    """Whether pytest-xdist's workers (``--tx`` specs; ``-n N`` gives plain ``popen``) run here,
    in this directory, with this interpreter: ``popen`` without options. A ``chdir=``, another
    ``python=``, ``ssh`` or ``socket`` worker may find files and modules this process does not."""
    return all(re.fullmatch(r"(\d+\*)?popen", tx) for tx in txs or [])


def _usage_error(config: pytest.Config, run: Run, message: str) -> NoReturn:
    """Stop the run with a usage error (exit 4) whose message the JSON report keeps too (its
    ``error``, ``exit_status`` 4), so that a CI job reading the report sees why no case ran."""
    if run.book is not None:
        run.broken = f"usage error: {message}"
        config._pagedattn_exit = int(pytest.ExitCode.USAGE_ERROR)  # type: ignore[attr-defined]
        run.book.stop("not run: usage error")  # finished, not crashed: nothing was collected
        run.book.flush()
    raise pytest.UsageError(message)


def _construct(run: Run, spec: str, device: str) -> tuple[Backend | None, list[str]]:
    """The backend (in this process, or isolated in a child) and the arguments a replay
    command repeats; ``None`` when it crashed while being constructed (``run.broken``)."""
    from pagedattn.adapters.loading import BackendLoadError, load_backend
    from pagedattn.runner.faults import BackendFault
    from pagedattn.runner.isolation import isolated_backend

    extra = [f"--profile={run.profile}"]
    if run.book is not None:
        # written before the backend is constructed, and watched: a constructor that kills
        # this process still leaves a report and a hint
        run.book.notes.append("constructing the backend")
        run.book.flush()
        run.watch = recorder.start_watch(run.book.path)
        recorder.tell(run, "start the backend's construction")
    try:
        backend: Backend
        if run.isolate:
            backend = isolated_backend(spec, device, run.timeout)
            extra += ["--isolate", f"--case-timeout={run.timeout:g}" if run.timeout else f"--case-timeout={NO_LIMIT}"]
        else:
            backend = load_backend(spec)
    except BackendLoadError as exc:
        raise pytest.UsageError(str(exc)) from None
    except BackendFault as exc:
        # a crash while constructing: every case is reported not_run, the report is written
        run.broken = str(exc)
        run.info = {"name": spec, "target": f"{spec} (not constructed: {exc})"}
        return None, extra
    finally:
        recorder.tell(run, "end")
        if run.book is not None:
            run.book.notes.remove("constructing the backend")
    return backend, extra


@pytest.hookimpl(hookwrapper=True)  # old-style: pluggy < 1.1 (pytest 7.4 allows it) has no wrapper=True
def pytest_sessionstart(session: pytest.Session) -> Generator[None, None, None]:
    """On the xdist controller, once every ``pytest_sessionstart`` has run (xdist's starts the
    workers) and where the host has a core to spare for it beside each worker: import in a
    background thread what the controller needs once the workers report (torch, the default
    device and CUDA's device name for the report's header, first written when a worker has
    collected) and at the end (hypothesis, whose own pytest plugin imports it in the terminal
    summary). Measured with ``benchmarks/results/timeline_probe.py`` on the H200 (16 cores,
    ``-n 8``): done in the main thread, these imports held the controller 2-4 s after the
    workers had collected, before it handed out the first cases (most likely the GIL, which a C
    extension's import and CUDA's initialization keep; not profiled), and hypothesis ~1 s after
    the last case. Where the
    workers take every core (2 cores, ``-n 2``) the thread would only slow their own start."""
    yield
    run = session.config.stash.get(RUN_KEY, None)
    workers = session.config.getoption("numprocesses", None)
    spare = isinstance(workers, int) and usable_cores() >= 2 * workers
    started = session.config.pluginmanager.has_plugin("dsession")  # none under --collect-only
    if run is not None and run.controller and spare and started:
        run.preload = threading.Thread(target=_preload, args=(run,), name="pagedattn-preload", daemon=True)
        run.preload.start()


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS tells it, else all)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _preload(run: Run) -> None:
    try:
        report.device_name(run.device)  # torch, the default device, CUDA's device name
        import hypothesis  # noqa: F401
    except BaseException:  # noqa: BLE001 - the main thread meets any error where it needs these
        pass


def pytest_unconfigure(config: pytest.Config) -> None:
    from pagedattn.adapters.protocol import SupportsClose

    run = config.stash.get(RUN_KEY, None)
    if run is not None and run.preload is not None:
        run.preload.join(30.0)  # no import left half done in a daemon thread at the interpreter's exit
    if run is not None and run.watch is not None:
        # the process ends on its own (Ctrl-C, a SystemExit or another plugin's error before the
        # session finished): the watch speaks only for a death, which skips this hook
        recorder.release(run)
    suite = config.stash.get(SUITE_KEY, None)
    if suite is not None and isinstance(suite.backend, SupportsClose):
        suite.backend.close()


def worker_device(device: str, worker_id: str | None, device_count: int) -> str:
    """The device of one pytest-xdist worker: with ``--device=cuda`` (no index) and several
    GPUs, worker ``gwN`` takes ``cuda:(N mod device_count)``; an explicit index, one GPU, the
    CPU or a serial run keep ``device`` as given."""
    if worker_id is None or device != "cuda" or device_count <= 1:
        return device
    return f"cuda:{int(worker_id.removeprefix('gw')) % device_count}"


def pytest_report_header(config: pytest.Config) -> list[str]:
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.spec:
        return []
    return report.header_lines(config, run)


@pytest.fixture
def pagedattn_suite(request: pytest.FixtureRequest) -> Suite:
    """The run's ``Suite`` (backend, device, profile)."""
    run = request.config.stash.get(RUN_KEY, None)
    if run is not None and run.broken:
        note(request.node, not_run=run.broken)
        pytest.skip(f"not run: {run.broken}")
    suite = request.config.stash.get(SUITE_KEY, None)
    if suite is None:
        raise pytest.UsageError(collection.need_backend())
    return suite


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_spec" in metafunc.fixturenames:
        collection.parametrize(metafunc, metafunc.config.stash.get(RUN_KEY, None) or Run())


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.spec:
        if any("conformance_spec" in getattr(getattr(i, "callspec", None), "params", {}) for i in items):
            raise pytest.UsageError(collection.need_backend())
        return
    collection.arrange(config, run, items)


class _SearchLast:
    """A second ``pytest_collection_modifyitems``, after deselection (``-k``, ``-m``,
    ``--deselect``): the search's items among the last of the items left
    (``collection.spread_search``). Its own plugin object, as a module has one function per
    hook name (pluggy's ``specname``, the alternative, needs pluggy >= 1.0; pytest 7.4, which
    the package allows, takes pluggy from 0.12)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        run = config.stash.get(RUN_KEY, None)
        if run is not None and run.spec:
            collection.spread_search(items, [i for i in items if noted(i).get("configuration") == "search"])


def warmup_ahead_wanted(config: pytest.Config, run: Run) -> bool:
    """``--warmup-ahead`` asks for it here: ``on``, or ``auto`` off the CPU; never under
    ``--isolate``, ``--replay`` or ``--collect-only`` (the backend must offer it too)."""
    choice = config.getoption("--warmup-ahead")
    if run.isolate or config.getoption("--replay") or config.getoption("collectonly", False):
        return False
    return choice == "on" or (choice == "auto" and not run.device.startswith("cpu"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """After deselection (``-k``, ``-m``): start this process's warm-up ahead
    (``pagedattn.runner.warmup``) over the items it may run, where ``--warmup-ahead`` and the
    backend allow; the choice goes into ``run.info``."""
    config = session.config
    run, suite = config.stash.get(RUN_KEY, None), config.stash.get(SUITE_KEY, None)
    if run is None or suite is None:
        return
    from pagedattn.adapters.protocol import SupportsWarmupAhead

    on = isinstance(suite.backend, SupportsWarmupAhead) and warmup_ahead_wanted(config, run)
    run.info["warmup_ahead"] = on
    if not on:
        return
    from pagedattn.cases.spec import CaseSpec
    from pagedattn.runner import warmup as ahead

    cases = []
    for item in session.items:
        spec, facts = collection.spec_of(item), noted(item)
        if isinstance(spec, CaseSpec) and facts.get("operation") in ("attention", "lse"):
            cases.append((spec, facts["operation"]))
    worker = getattr(config, "workerinput", None)
    claims = ahead.claim_dir(worker["testrunuid"]) if worker and worker.get("testrunuid") else None
    suite.ahead = ahead.WarmupAhead(suite.backend, suite.device, ahead.plan(cases), claims, suite.caps)
    book = run.book
    if book is not None:  # a serial run: its own book words crashes while the walk is on
        book.crash_hint = CRASH_HINT  # (under xdist the controller learns it from AHEAD_KEY)
        suite.ahead.on_end = lambda: setattr(book, "crash_hint", "")
    suite.ahead.start()


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.spec:
        return []
    return [collection.collection_line(items)]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(RUN_KEY, None)
    if run is not None and run.spec:
        report.terminal_summary(terminalreporter, config, run)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.spec:
        return
    suite = config.stash.get(SUITE_KEY, None)
    if suite is not None and suite.ahead is not None:
        suite.ahead.stop()
        run.info["warmup_ahead_stats"] = suite.ahead.stats()
    if run.controller and run.testrunuid:
        from pagedattn.runner.warmup import remove_claims

        remove_claims(run.testrunuid)  # the workers' claim files
    if hasattr(config, "workerinput"):
        config.workeroutput["pagedattn_info"] = run.info  # type: ignore[attr-defined]
        config.workeroutput["pagedattn_broken"] = run.broken  # type: ignore[attr-defined]
        return  # the controller writes the report
    assert run.book is not None
    recorder.finish(session, run, run.book)
