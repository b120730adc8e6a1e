"""The ``reference`` backend: the float64 oracle rounded to the query dtype."""

from __future__ import annotations

import torch

from pagedattn._version import __version__
from pagedattn.adapters.capabilities import Capabilities
from pagedattn.oracle import VARIANTS, PagedCase, paged_attention_reference_lse, paged_gather, write_cache_by_indexing


class ReferenceBackend:
    """The oracle itself, rounded once to the output dtype: the suite's sanity anchor."""

    name = "reference"
    version = __version__
    capabilities = Capabilities(
        operations=frozenset({"attention", "gather", "write_cache", "lse"}),
        variants=frozenset(VARIANTS),
    )

    def paged_attention(self, case: PagedCase) -> torch.Tensor:
        return paged_attention_reference_lse(case)[0].to(case.dtype)

    def paged_attention_lse(self, case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = paged_attention_reference_lse(case)
        return out.to(case.dtype), lse.to(torch.float32)

    def gather(self, pool: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        return paged_gather(pool, slot_mapping)

    def write_cache(self, pool: torch.Tensor, slot_mapping: torch.Tensor, new: torch.Tensor) -> None:
        write_cache_by_indexing(pool, slot_mapping, new)
