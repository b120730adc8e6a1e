"""What the adapters of third-party Triton kernels share: where the kernel runs (the
Triton interpreter on the CPU, or compiled for CUDA) and the claims that follow."""

from __future__ import annotations

from typing import Any

import torch

from pagedattn.adapters.interpreter import arrange_interpreter

__all__ = ["INTERPRETER_BF16", "arrange_interpreter", "grouped_head_blocks", "runtime_claims"]

INTERPRETER_BF16 = (
    "the Triton interpreter computes these kernels' bf16 tiles wrongly (numpy has no bf16); bf16 runs on the GPU"
)


#: query heads per program of the grouped split-K decode kernels (``BLOCK_H`` in SGLang's and
#: vLLM's ``decode_attention.py``)
GROUPED_BLOCK_H = 16
GROUPED_HEAD_BLOCKS = (
    "the grouped decode kernel gives each program 16 query heads and picks their kv head as program // "
    "cdiv(group, 16): with more than one kv head and a group over 16 that is no multiple of 16, a block straddles "
    "two kv heads and its heads past the boundary read the wrong one (real deviation)"
)


def grouped_head_blocks(case, operation: str) -> str | None:
    """GQA groups over 16 query heads per kv head that are no multiple of 16, with several kv heads, are excluded:
    the grouped decode kernel's 16-head blocks straddle two kv heads."""
    group = case.gqa_ratio
    if case.num_kv_heads > 1 and group > GROUPED_BLOCK_H and group % GROUPED_BLOCK_H:
        return GROUPED_HEAD_BLOCKS
    return None


def runtime_claims(interpreter: bool, notes: dict[str, str]) -> dict[str, Any]:
    """``Capabilities`` keywords for where the kernel runs (``devices``, and on the
    interpreter ``dtypes`` without bf16); the reasons are added to ``notes``."""
    if interpreter:
        notes["dtypes"] = INTERPRETER_BF16
        notes["devices"] = "Triton interpreter: tensors on the CPU"
        return {"devices": frozenset({"cpu"}), "dtypes": frozenset({torch.float32, torch.float16})}
    notes["devices"] = "compiled Triton: CUDA tensors only"
    return {"devices": frozenset({"cuda"})}
