import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

pytest_plugins = ["pytester"]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each xdist worker gets one core: torch's intra-op threads from two workers on two
    # cores spin against each other and make small ops ~10x slower.
    torch.set_num_threads(1)
    # and so do the suite runs they start in subprocesses (pytester), which inherit this
    os.environ["OMP_NUM_THREADS"] = "1"

if not torch.cuda.is_available():
    # The Triton kernel runs under the interpreter here; that must be decided before
    # triton is first imported (by any test).
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
    # Dozens of tests start a Python process (pytester runs, scripts). Without bytecode each
    # one compiles pagedattn again and pytest rewrites the plugin's modules again: 0.6 s of
    # a 3 s run. Their bytecode goes to one cache outside the checkout instead, which the
    # setting asked to keep free of it (the variables reach only the processes started here).
    # One cache per user id (getpass.getuser() raises for an id without a passwd entry, as in
    # some containers), private to it; one that another user made first is not used.
    _cache = Path(tempfile.gettempdir()) / f"pagedattn-pycache-{os.getuid()}"
    _cache.mkdir(mode=0o700, exist_ok=True)
    if _cache.stat().st_uid == os.getuid():
        os.environ["PYTHONPYCACHEPREFIX"] = str(_cache)
        del os.environ["PYTHONDONTWRITEBYTECODE"]

# Tests that start Python processes run first, and the longest first of all (a whole
# quick profile in a subprocess: 10-35 s of CPU each), so that no long test starts last
# and leaves the other xdist worker idle. Seconds of CPU, measured on 2 cores.
_LONG_FIRST = {
    "test_bundled_backend_passes_the_quick_profile[triton]": 35,
    "test_bundled_backend_passes_the_quick_profile[flex]": 32,
    "test_bundled_backend_passes_the_quick_profile[tlsim]": 35,
    "test_cpu_mode_writes_every_figure": 13,
    "test_backend_passes_the_decode_family[flex]": 11,
    "test_backend_passes_the_decode_family[tlsim]": 4,
    "test_xdist_gives_the_serial_outcome": 11,
    "test_bundled_backend_passes_the_quick_profile[reference]": 6,
    "test_bundled_backend_passes_the_quick_profile[sdpa]": 6,
    # in-process, but long (the GPU verdict kernel or ours under the Triton interpreter): started
    # late (weight 0), one could keep a worker busy after the other had finished
    "test_launch_shape_changes_no_bit[negative-scores-parts2]": 9,
    "test_the_fused_check_judges_as_the_torch_path[fp32-window]": 9,
    "test_the_fused_check_judges_as_the_torch_path[bf16-softcap-alibi]": 8,
    "test_the_fused_check_judges_as_the_torch_path[fp16-sinks-subnormal-weights]": 8,
    "test_the_fused_check_judges_as_the_torch_path[fp32-alibi-window]": 7,
    "test_launch_shape_changes_no_bit[parts0]": 7,
    "test_programs_of_whole_parts_at_every_fold_compute_one_split_a_programs_bits[2]": 6,
    "test_launch_shape_changes_no_bit[fp8-window-sinks-parts2]": 5,
}
_STARTS_PROCESSES = {"test_benchmarks.py", "test_packaging.py", "test_lazy_imports.py"}


def _weight(item: pytest.Item) -> int:
    if item.name in _LONG_FIRST:
        return _LONG_FIRST[item.name]
    if "pytester" in getattr(item, "fixturenames", ()) or item.path.name in _STARTS_PROCESSES:
        return 1
    return 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # a stable sort: within each weight, the files and their tests keep their order
    items.sort(key=_weight, reverse=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``-n 2`` schedules by work stealing: each worker starts with half of the (ordered)
    tests and an idle one takes half of what the other has left. xdist's default ``load``
    sends the first ~90 tests to one worker at once, which would give it every long one."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)


@pytest.fixture
def bad(pytester):
    """tests/planted/bad_backends.py copied next to a pytester run; its path."""
    shutil.copy(Path(__file__).parent / "planted" / "bad_backends.py", pytester.path / "bad_backends.py")
    return str(pytester.path / "bad_backends.py")


#: skip reasons that mean the installed Triton cannot run a part of the project (the kernel on
#: its interpreter, the GPU verdict kernel, the sm_90 compile script): said in the summary
_TRITON_SKIPS = ("cannot run the kernel", "verdict kernel cannot run", "takes no constexprs")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Tests skipped because the installed Triton cannot run what they test, counted by reason,
    so that an older Triton's skipped kernel is said outright rather than lost among skips."""
    reasons: dict[str, int] = {}
    for rep in terminalreporter.stats.get("skipped", []):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        if any(s in reason for s in _TRITON_SKIPS):
            reason = reason.removeprefix("Skipped: ")
            reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.write_sep("-", "not tested with this Triton")
        for reason, n in sorted(reasons.items()):
            terminalreporter.write_line(f"{n} tests skipped: {reason}", yellow=True)
