"""GPU or Triton interpreter, decided before triton is first imported: shared by the
bundled ``triton`` adapter and the adapters of third-party Triton kernels (``contrib``),
so that no adapter imports another for it."""

from __future__ import annotations

import os
import sys

import torch


def arrange_interpreter() -> bool:
    """Decide GPU or interpreter before triton is imported; returns True for the interpreter."""
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return False
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise RuntimeError(
            "the triton backend needs the Triton interpreter on this machine (no CUDA device), but triton was "
            "imported before TRITON_INTERPRET=1 could be set; set TRITON_INTERPRET=1 in the environment"
        )
    os.environ["TRITON_INTERPRET"] = "1"
    return True
