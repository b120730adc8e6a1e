"""The pytest plugin: ``--backend`` and friends, and the hooks that run the suite.

Registered through the ``pytest11`` entry point (``-p pagedattn.plugin`` from a
checkout without an install). It does nothing unless a test asks for the
``conformance_spec`` fixture or ``--backend`` is given. The work is done elsewhere:
``pagedattn.runner.collection`` (which cases, in what order), ``pagedattn.runner.suite`` and
``pagedattn.runner.properties`` (what a case does), ``pagedattn.runner.recording`` and
``pagedattn.runner.case_record`` (one record per case), ``pagedattn.runner.report`` (header, summary, JSON),
``pagedattn.runner.expectations`` (known failures), ``pagedattn.runner.replay`` (saved cases),
``pagedattn.runner.construction`` (the backend, at configure time), ``pagedattn.runner.workers``
(pytest-xdist's controller and workers) and ``pagedattn.runner.warmup_start`` (the warm-up ahead).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

# torch-free on purpose: this module is imported by every pytest session where pagedattn is
# installed; torch, the cases, the suite and the backend loaders are imported by the hooks
# that need them, once --backend is given
from pagedattn.runner import collection, report
from pagedattn.runner import recording as recorder
from pagedattn.runner.case_record import note, noted
from pagedattn.runner.command_line import add_options
from pagedattn.runner.construction import (
    LEFTOVER_KEY,
    THREADS_BEFORE_KEY,
    construct_backend,
    end_despite_leftover_threads,
    note_leftover_threads,
    usage_error,
)
from pagedattn.runner.expectations import load_expectations
from pagedattn.runner.gate import gate_of
from pagedattn.runner.options import DEFAULT_TIMEOUT_S
from pagedattn.runner.record_book import RecordBook, claim_report, release_report
from pagedattn.runner.replay import ReplaySpec, prune, rerun_command
from pagedattn.runner.session import RUN_KEY, SUITE_DIR, SUITE_KEY, Run, restore_signals, stop_on_signals
from pagedattn.runner.warmup_start import start_warmup_ahead
from pagedattn.runner.workers import (
    StopAtFirstStartFailure,
    backend_file_problem,
    is_controller,
    loadgroup_problem,
    preload,
    usable_cores,
    worker_device,
    workers_share_this_process,
)

if TYPE_CHECKING:
    from pagedattn.runner.suite import Suite

SESSION_KEY = pytest.StashKey[pytest.Session]()


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


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
    worker = getattr(config, "workerinput", None)
    if worker is None:
        # the process that writes the report: its path checked and taken now (a directory, an
        # uncreatable folder or another run's report is one usage error), and the book made
        # before any other usage error, so that the report keeps it
        path = config.getoption("--report-json")
        run.report_lock = claim_report(path) if path else None
        stop_on_signals(run)  # SIGTERM, SIGHUP: as Ctrl-C, the report settled and written
        book = run.book = RecordBook(path, header=lambda: report.report_header(config) | gate_of(config).header())
        book.remote = is_controller(config)
        book.rerun = lambda rec: rerun_command(
            rec.nodeid, rec.extra.get("file"), str(config.rootpath), run.spec, run.device, run.profile
        )
        config.pluginmanager.register(recorder.Recorder(config, run, book), "pagedattn-recorder")
        prune(config.getoption("--replay-dir"), spare=config.getoption("--replay"))  # bounded across runs
    try:
        if config.getoption("--replay"):
            ReplaySpec.load(config.getoption("--replay"))  # a bad file: one usage error, now
        run.expectations = load_expectations(config.getoption("--expectations"))
    except pytest.UsageError as exc:
        usage_error(config, run, str(exc))
    device = config.getoption("--device") or ""
    # the xdist controller imports torch only to check an asked-for CUDA device; its default
    # device is picked when first read (``Run.device``), after xdist has started the workers
    if device.startswith("cuda") or not is_controller(config):
        import torch

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device.startswith("cuda") and not torch.cuda.is_available():
            usage_error(config, run, f"--device={device}: torch sees no CUDA device here")
    timeout = config.getoption("--case-timeout")
    run.isolate = bool(config.getoption("--isolate") or isinstance(timeout, float))
    run.timeout = timeout if isinstance(timeout, float) else (DEFAULT_TIMEOUT_S if timeout is None else None)
    if not run.isolate:
        run.timeout = None
    run.device = device
    if is_controller(config):
        # the workers load the backend; the controller only distributes and reports. Under
        # --isolate, one configuration (compile key) per worker: --dist loadgroup becomes the
        # effective -n mode. Not without --isolate: pytest-xdist 3.8's group scheduler fails
        # (KeyError, or a hang) when it replaces a crashed worker; plain load replaces it.
        run.controller = True
        # where the installed pair cannot group (``loadgroup_problem``), --isolate keeps --dist
        # load, and an asked-for loadgroup is said not to group from the header on
        ungrouped = loadgroup_problem()
        if config.getoption("dist") == "load" and run.isolate and not ungrouped:
            config.option.dist = "loadgroup"
        if config.getoption("dist") == "loadgroup" and ungrouped:
            run.grouping_lost = f"--dist loadgroup does not group the cases by configuration: {ungrouped}"
        from pagedattn.runner.backend_spec import spec_problem

        # before the workers start (each would fail to load it), where they see what this process sees
        shared = workers_share_this_process(config.getoption("tx", None))
        problem = (spec_problem(spec) or backend_file_problem(spec)) if shared else None
        if problem is not None:
            usage_error(config, run, problem)
        config.pluginmanager.register(StopAtFirstStartFailure(config), "pagedattn-start-failure")
        return
    if worker is not None and worker.get("pagedattn_loadgroup"):
        config.option.loadgroup = True  # xdist's worker appends each item's group to its node id
    import torch

    if worker is not None:
        from pagedattn.runner.isolation_child import die_with_parent

        # a worker whose controller was killed has nobody to report to: it ends too, and with
        # it the isolated child of the case it was running, instead of running that case on
        die_with_parent(os.getppid())
    if worker is not None and not device.startswith("cuda"):
        # one core per xdist worker: intra-op threads of several workers spin against each other
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(worker.get("workercount", 1))))
    if worker is not None and device == "cuda":
        device = run.device = worker_device(device, worker["workerid"], torch.cuda.device_count())
    config.stash[THREADS_BEFORE_KEY] = frozenset(threading.enumerate())  # a backend's own threads are the rest
    try:
        backend, extra = construct_backend(run, spec, device)
    except pytest.UsageError as exc:
        usage_error(config, run, str(exc))
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


@pytest.hookimpl(hookwrapper=True)  # old-style: pluggy < 1.1 (pytest 7.4 allows it) has no wrapper=True
def pytest_sessionstart(session: pytest.Session) -> Generator[None, None, None]:
    """On the xdist controller, once every ``pytest_sessionstart`` has run (xdist's starts the
    workers) and where the host has a core to spare for it beside each worker: import in a
    background thread what the controller needs once the workers report and at the end
    (``workers.preload``). Done in the main thread, these imports hold the controller seconds
    after the workers have collected, before it hands out the first cases. Where the workers
    take every core (2 cores, ``-n 2``) the thread would only slow their own start."""
    yield
    run = session.config.stash.get(RUN_KEY, None)
    workers = session.config.getoption("numprocesses", None)
    spare = isinstance(workers, int) and usable_cores() >= 2 * workers
    started = session.config.pluginmanager.has_plugin("dsession")  # none under --collect-only
    if run is not None and run.controller and spare and started:
        run.preload = threading.Thread(target=preload, args=(run,), name="pagedattn-preload", daemon=True)
        run.preload.start()


@pytest.hookimpl(trylast=True)  # last: a backend's leftover threads end the process here (below)
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
    if run is not None:
        restore_signals(run)
        if run.report_lock:
            release_report(run.report_lock)
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        end_despite_leftover_threads(config, int(session.exitstatus))
    else:  # the run stopped in configure: a usage error, which pytest prints only after this hook
        status = getattr(config, "_pagedattn_exit", None)
        error = run.broken.removeprefix("usage error: ") if run is not None else ""
        end_despite_leftover_threads(
            config, int(status if status is not None else pytest.ExitCode.INTERNAL_ERROR), error=error
        )


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
            collection.keep_shard(config, items)
            collection.spread_search(items, [i for i in items if noted(i).get("configuration") == "search"])


def pytest_collection_finish(session: pytest.Session) -> None:
    """After deselection (``-k``, ``-m``): start this process's warm-up ahead
    (``pagedattn.runner.warmup``) over the items it may run, where ``--warmup-ahead`` and the
    backend allow; the choice goes into ``run.info``."""
    config = session.config
    run, suite = config.stash.get(RUN_KEY, None), config.stash.get(SUITE_KEY, None)
    if run is not None and suite is not None:
        start_warmup_ahead(session, run, suite)


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.spec:
        return []
    return [collection.collection_line(items)]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(RUN_KEY, None)
    if run is not None and run.spec:
        report.terminal_summary(terminalreporter, config, run)
    for line in config.stash.get(LEFTOVER_KEY, []):
        terminalreporter.write_line(f"warning: {line}", yellow=True)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """On the xdist controller: a worker's warning about threads its backend left running."""
    line = getattr(node, "workeroutput", {}).get("pagedattn_leftover_threads")
    run = node.config.stash.get(RUN_KEY, None)
    if line:
        node.config.stash.setdefault(LEFTOVER_KEY, []).append(line)
        if run is not None and run.book is not None:
            run.book.notes.append(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    config.stash[SESSION_KEY] = session  # its final exit status, for pytest_unconfigure
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
    worker = getattr(config, "workerinput", None)
    leftover = note_leftover_threads(config, f" on worker {worker['workerid']}" if worker else "")
    if leftover and run.book is not None:
        run.book.notes.append(leftover)
    if hasattr(config, "workerinput"):
        config.workeroutput["pagedattn_leftover_threads"] = leftover  # type: ignore[attr-defined]
        config.workeroutput["pagedattn_info"] = run.info  # type: ignore[attr-defined]
        config.workeroutput["pagedattn_broken"] = run.broken  # type: ignore[attr-defined]
        config.workeroutput["pagedattn_gate"] = recorder.gate_output(config)  # type: ignore[attr-defined]
        return  # the controller writes the report
    assert run.book is not None
    recorder.finish(session, run, run.book)
