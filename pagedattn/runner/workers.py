"""pytest-xdist's processes as the plugin sees them: the controller, its workers, their devices.

Torch-free, as the plugin is (every pytest session imports it): ``preload`` imports torch and
hypothesis in the controller's background thread only once a run has started.
"""

from __future__ import annotations

import ast
import os
import re
from typing import Any

import pytest

from pagedattn._version import dist_version
from pagedattn.runner import report
from pagedattn.runner.session import Run


def is_controller(config: pytest.Config) -> bool:
    """This process is a pytest-xdist controller (it distributes, the workers run)."""
    return not hasattr(config, "workerinput") and (config.getoption("dist", "no") or "no") != "no"


def workers_share_this_process(txs: list[str] | None) -> bool:
    """Whether pytest-xdist's workers (``--tx`` specs; ``-n N`` gives plain ``popen``) run here,
    in this directory, with this interpreter: ``popen`` without options. A ``chdir=``, another
    ``python=``, ``ssh`` or ``socket`` worker may find files and modules this process does not."""
    return all(re.fullmatch(r"(\d+\*)?popen", tx) for tx in txs or [])


def worker_device(device: str, worker_id: str | None, device_count: int) -> str:
    """The device of one pytest-xdist worker: with ``--device=cuda`` (no index) and several
    GPUs, worker ``gwN`` takes ``cuda:(N mod device_count)``; an explicit index, one GPU, the
    CPU or a serial run keep ``device`` as given."""
    if worker_id is None or device != "cuda" or device_count <= 1:
        return device
    return f"cuda:{int(worker_id.removeprefix('gw')) % device_count}"


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS tells it, else all)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def preload(run: Run) -> None:
    """What the controller needs once the workers report (torch, the default device and CUDA's
    device name for the report's header) and at the end (hypothesis, whose own pytest plugin
    imports it in the terminal summary), imported in a background thread."""
    try:
        report.device_name(run.device)  # torch, the default device, CUDA's device name
        import hypothesis  # noqa: F401
    except BaseException:  # noqa: BLE001 - the main thread meets any error where it needs these
        pass


def _release(version: str) -> tuple[int, ...]:
    """``"9.2.0"`` -> ``(9, 2)``: the major and minor numbers of a version (``(0,)`` if none)."""
    return tuple(int(x) for x in re.findall(r"\d+", version)[:2]) or (0,)


def loadgroup_problem(pytest_version: str | None = None, xdist_version: str | None = None) -> str:
    """Why ``--dist loadgroup`` cannot group cases with the installed pytest and pytest-xdist,
    or ``""``: pytest >= 9.2 keeps a node's id in a structured field that pytest-xdist <= 3.8's
    worker does not update when it appends the group (``item._nodeid``), so its scheduler sees
    no groups (pytest-xdist#1386)."""
    pytest_version = pytest_version or pytest.__version__
    xdist_version = xdist_version or dist_version("pytest-xdist")
    if xdist_version == "not installed" or _release(pytest_version) < (9, 2) or _release(xdist_version) > (3, 8):
        return ""
    return (
        f"pytest {pytest_version} ignores the groups pytest-xdist {xdist_version} gives (pytest-xdist#1386); "
        "pytest < 9.2 groups them"
    )


def backend_file_problem(spec: str) -> str | None:
    """What the controller can tell of a ``path/to/file.py:attr`` backend from its source alone,
    without running it (the controller imports no torch, nor the backend): a syntax error, no
    top-level ``attr``, or a class or function ``attr`` that needs arguments (a backend is
    constructed with none). ``None`` when none of these shows, or for another kind of spec:
    the workers' loading finds the rest (``stop_at_first_start_failure`` stops the run there)."""
    where, _, attr = spec.rpartition(":")
    if not where.endswith(".py") or not os.path.isfile(where):
        return None
    try:
        with open(where, "rb") as f:
            tree = ast.parse(f.read(), where)
    except SyntaxError as exc:
        return f"--backend={spec}: importing {where!r} failed: SyntaxError: {exc.msg} ({where}, line {exc.lineno})"
    except (OSError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == attr:
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            needed = _required(init.args)[1:] if init is not None else []
            call = f"{attr}.__init__()"
        elif isinstance(node, ast.FunctionDef) and node.name == attr:
            needed, call = _required(node.args), f"{attr}()"
        else:
            continue
        if needed:
            return (
                f"--backend={spec}: constructing the backend failed: {call} needs the arguments "
                f"{', '.join(needed)}; a backend is constructed with none (give a class or factory that takes none)"
            )
    return None


def _required(args: ast.arguments) -> list[str]:
    """The parameters of a ``def`` that have no default (positional, then keyword-only)."""
    positional = [*args.posonlyargs, *args.args]
    without = positional[: len(positional) - len(args.defaults)]
    keyword = [a for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    return [a.arg for a in [*without, *keyword]]


class StopAtFirstStartFailure:
    """On the pytest-xdist controller: the first worker that fails to start with a usage error
    (the backend's import, attribute or constructor) ends the run, where pytest-xdist would
    replace it again and again (``--max-worker-restart``, default 4 per worker), each
    replacement failing the same way after its own imports."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.collected: set[str] = set()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.collected.add(str(getattr(getattr(node, "gateway", None), "id", "")))

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        started = str(getattr(getattr(node, "gateway", None), "id", "")) in self.collected
        if not error or started or "UsageError" not in str(error):
            return
        dsession = self.config.pluginmanager.getplugin("dsession")
        if dsession is not None and hasattr(dsession, "_failed_nodes_count"):
            # pytest-xdist replaces a crashed worker while the crashes so far are within its
            # limit: the limit becomes this count, so that it shuts down instead
            dsession._max_worker_restart = dsession._failed_nodes_count
