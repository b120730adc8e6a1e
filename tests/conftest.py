import os

import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each xdist worker gets one core: torch's intra-op threads from two workers on two
    # cores spin against each other and make small ops ~10x slower.
    torch.set_num_threads(1)

if not torch.cuda.is_available():
    # The Triton kernel runs under the interpreter here; that must be decided before
    # triton is first imported (by any test).
    os.environ.setdefault("TRITON_INTERPRET", "1")
