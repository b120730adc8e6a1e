"""The ``tlsim`` backend: the tlsim kernels (Triton's programming model in torch)."""

from __future__ import annotations

import torch

from pagedattn._version import __version__
from pagedattn.adapters.capabilities import Capabilities
from pagedattn.kernels import tlsim_programs as programs
from pagedattn.oracle import PER_HEAD_SCALES, SHAPE_VARIANTS, VARIANTS, PagedCase


class TLSimBackend:
    """Runs the fused streaming kernel, the slot gather and the cache write as tlsim
    programs, on whatever device the case is on (a Python loop over programs: slow,
    meant for correctness, not speed)."""

    name = "tlsim"
    version = __version__
    capabilities = Capabilities(
        operations=frozenset({"attention", "gather", "write_cache", "lse"}),
        variants=frozenset(VARIANTS) - {PER_HEAD_SCALES, *SHAPE_VARIANTS},
        notes={
            "variants": "no per-head fp8 scales: the kernel takes one k_scale and one v_scale; "
            "one head dim for keys and values (no MLA, no head_dim_v) and causal masks only (no tree_mask)"
        },
    )

    def __init__(self, tile: int = 16):
        self.tile = tile

    @property
    def target(self) -> str:
        return f"tlsim (torch {torch.__version__}, Python-level SPMD loop)"

    def paged_attention(self, case: PagedCase) -> torch.Tensor:
        return programs.paged_attention(case, tile=self.tile)

    def paged_attention_lse(self, case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
        return programs.paged_attention(case, tile=self.tile, return_lse=True)

    def gather(self, pool: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        return programs.gather_slots(pool, slot_mapping, tile=self.tile)

    def write_cache(self, pool: torch.Tensor, slot_mapping: torch.Tensor, new: torch.Tensor) -> None:
        programs.write_slots(pool, slot_mapping, new, tile=self.tile)
