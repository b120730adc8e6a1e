import os
import shutil
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


@pytest.fixture
def bad(pytester):
    """tests/bad_backends.py copied next to a pytester run; its path."""
    shutil.copy(Path(__file__).parent / "bad_backends.py", pytester.path / "bad_backends.py")
    return str(pytester.path / "bad_backends.py")
