"""pytest-xdist's processes as the plugin sees them: the controller, its workers, their devices.

Torch-free, as the plugin is (every pytest session imports it): ``preload`` imports torch and
hypothesis in the controller's background thread only once a run has started.
"""

from __future__ import annotations

import os
import re

import pytest

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
