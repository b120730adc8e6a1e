"""The ``triton`` backend: our Triton kernel, on the GPU or under the interpreter.

It never falls back to anything else. Where there is no CUDA device, it switches
the Triton interpreter on (``TRITON_INTERPRET=1``, which must happen before
triton is first imported) and says so in the report header.
"""

from __future__ import annotations

import importlib.util

import torch

from pagedattn._version import __version__
from pagedattn.adapters.capabilities import Capabilities
from pagedattn.adapters.exclusion import Exclusion
from pagedattn.adapters.interpreter import arrange_interpreter
from pagedattn.oracle import MLA, VARIANTS, PagedCase

#: The oldest Triton whose interpreter runs this kernel: 3.5's interpreter rejects a
#: ``range`` over loaded scalars (seen with triton 3.5.1, the one torch 2.9 pins).
MIN_INTERPRETER_TRITON = (3, 6)

INSTALL_HINT = "pip install 'pagedattn-conformance[triton]'  (or: pip install triton)"

#: what the MLA kernel (``triton_mla_decode``, a shared latent cache) does not compute
MLA_EXCLUSIONS = tuple(
    Exclusion(f"the MLA kernel has no {name}", variants=frozenset({MLA, name}))
    for name in ("sliding_window", "logits_soft_cap", "alibi_slopes")
)


def kernel_limits(case: PagedCase, operation: str) -> str | None:
    """MLA's value width a power of two >= 16 (the latent part of a cache row is one tile)."""
    dv = case.head_dim_v
    if case.shared_kv and (dv < 16 or dv & (dv - 1)):
        return f"the MLA kernel loads the latent columns as one tile: head_dim_v {dv} is not a power of two >= 16"
    return None


class TritonBackend:
    """``pagedattn.kernels.triton_paged_attention.paged_attention`` behind the adapter contract."""

    name = "triton"

    def __init__(self) -> None:
        if importlib.util.find_spec("triton") is None:
            raise ImportError(f"the triton backend needs Triton, which is not installed: {INSTALL_HINT}")
        self.interpreter = arrange_interpreter()
        import triton

        from pagedattn.kernels import triton_paged_attention as kernel

        self._kernel = kernel
        self.version = f"pagedattn {__version__}, triton {triton.__version__}"
        version = tuple(int(x) for x in triton.__version__.split(".")[:2])
        # what the kernel implements; where it can run differs below
        claims: dict = dict(
            operations=frozenset({"attention", "lse"}),
            variants=frozenset(VARIANTS),
            exclusions=MLA_EXCLUSIONS,
            case_filter=kernel_limits,
        )
        if self.interpreter and version < MIN_INTERPRETER_TRITON:
            self.capabilities = Capabilities(
                devices=frozenset(),
                notes={
                    "devices": f"triton {triton.__version__}'s interpreter cannot run this kernel; "
                    "use triton >= 3.6 (pip install 'triton>=3.6') or a GPU",
                },
                **claims,
            )
        elif self.interpreter:
            self.capabilities = Capabilities(
                devices=frozenset({"cpu"}),
                notes={"devices": "Triton interpreter: tensors on the CPU"},
                **claims,
            )
        else:
            self.capabilities = Capabilities(
                devices=frozenset({"cuda"}),
                notes={
                    "devices": "compiled Triton: CUDA tensors only (no interpreter fallback)",
                },
                **claims,
            )

    @property
    def target(self) -> str:
        if self.interpreter:
            return (
                "triton (interpreter, cpu; bf16 tiles upcast to fp32 after load, rounded by torch: "
                "works around triton-lang/triton#11584)"
            )
        return f"triton (cuda: {torch.cuda.get_device_name()})"

    def paged_attention(self, case: PagedCase, out: torch.Tensor | None = None) -> torch.Tensor:
        return self._call(case, out=out)

    def paged_attention_lse(self, case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
        return self._call(case, return_lse=True)

    def warmup_ahead(self, case: PagedCase, operation: str) -> None:
        """Compile the kernels ``case`` needs as ``operation`` and launch nothing (the
        suite's warm-up ahead, from a second thread); the interpreter compiles nothing."""
        if not self.interpreter:
            self._call(case, return_lse=operation == "lse", compile_only=True)

    def _call(self, case: PagedCase, **kwargs):
        return self._kernel.paged_attention(
            case.query,
            case.key_cache,
            case.value_cache,
            case.block_tables,
            case.seq_lens,
            case.query_start_loc,
            scale=case.scale,
            sliding_window=case.sliding_window,
            logits_soft_cap=case.logits_soft_cap,
            alibi_slopes=case.alibi_slopes,
            sinks=case.sinks,
            k_scale=case.k_scale,
            v_scale=case.v_scale,
            tree_mask=case.tree_mask,
            **kwargs,
        )
