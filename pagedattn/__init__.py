"""pagedattn: the correctness standard for paged-attention kernels.

The public API: the canonical problem (``PagedCase``), the float64 oracle, the
tolerance policy, and the adapter contract a backend implements to join the
conformance suite (``pytest conformance --backend=...``).
"""

from pagedattn._version import __version__
from pagedattn.adapters.protocol import INVARIANCES, Backend, Capabilities, Exclusion
from pagedattn.oracle import (
    AttentionCheck,
    PagedCase,
    check_attention,
    check_bitexact,
    paged_attention_reference,
    paged_gather,
)

__all__ = [
    "INVARIANCES",
    "AttentionCheck",
    "Backend",
    "Capabilities",
    "Exclusion",
    "PagedCase",
    "__version__",
    "check_attention",
    "check_bitexact",
    "paged_attention_reference",
    "paged_gather",
]
