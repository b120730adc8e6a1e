"""What the adapters of third-party Triton kernels share: where the kernel runs (the
Triton interpreter on the CPU, or compiled for CUDA) and the claims that follow."""

from __future__ import annotations

from typing import Any

import torch

from pagedattn.adapters.interpreter import arrange_interpreter

__all__ = ["INTERPRETER_BF16", "arrange_interpreter", "runtime_claims"]

INTERPRETER_BF16 = (
    "the Triton interpreter computes these kernels' bf16 tiles wrongly (numpy has no bf16); bf16 runs on the GPU"
)


def runtime_claims(interpreter: bool, notes: dict[str, str]) -> dict[str, Any]:
    """``Capabilities`` keywords for where the kernel runs (``devices``, and on the
    interpreter ``dtypes`` without bf16); the reasons are added to ``notes``."""
    if interpreter:
        notes["dtypes"] = INTERPRETER_BF16
        notes["devices"] = "Triton interpreter: tensors on the CPU"
        return {"devices": frozenset({"cpu"}), "dtypes": frozenset({torch.float32, torch.float16})}
    notes["devices"] = "compiled Triton: CUDA tensors only"
    return {"devices": frozenset({"cuda"})}
