"""pagedattn: the correctness standard for paged-attention kernels.

The public API: the canonical problem (``PagedCase``), the float64 oracle, the
tolerance policy, and the adapter contract a backend implements to join the
conformance suite (``pytest conformance --backend=...``).

The names are served lazily (module ``__getattr__``): ``import pagedattn``, which every
pytest session does through the plugin's entry point, imports neither torch nor triton;
the first use of a name imports its module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pagedattn._version import __version__

if TYPE_CHECKING:
    from pagedattn.adapters.capabilities import Capabilities
    from pagedattn.adapters.exclusion import INVARIANCES, Exclusion
    from pagedattn.adapters.protocol import (
        Backend,
        Claims,
        SupportsClose,
        SupportsGather,
        SupportsLse,
        SupportsOut,
        SupportsWarmup,
        SupportsWriteCache,
    )
    from pagedattn.oracle import (
        AttentionCheck,
        PagedCase,
        check_attention,
        check_bitexact,
        paged_attention_reference,
        paged_gather,
    )
    from pagedattn.validation import ProblemError

#: each lazy public name and the module that defines it
_LAZY = {
    "INVARIANCES": "pagedattn.adapters.exclusion",
    "Backend": "pagedattn.adapters.protocol",
    "Capabilities": "pagedattn.adapters.capabilities",
    "Exclusion": "pagedattn.adapters.exclusion",
    "Claims": "pagedattn.adapters.protocol",
    "SupportsClose": "pagedattn.adapters.protocol",
    "SupportsGather": "pagedattn.adapters.protocol",
    "SupportsLse": "pagedattn.adapters.protocol",
    "SupportsOut": "pagedattn.adapters.protocol",
    "SupportsWarmup": "pagedattn.adapters.protocol",
    "SupportsWriteCache": "pagedattn.adapters.protocol",
    "ProblemError": "pagedattn.validation",
    "AttentionCheck": "pagedattn.oracle",
    "PagedCase": "pagedattn.oracle",
    "check_attention": "pagedattn.oracle",
    "check_bitexact": "pagedattn.oracle",
    "paged_attention_reference": "pagedattn.oracle",
    "paged_gather": "pagedattn.oracle",
}

__all__ = [
    "INVARIANCES",
    "AttentionCheck",
    "Backend",
    "Capabilities",
    "Claims",
    "Exclusion",
    "PagedCase",
    "ProblemError",
    "SupportsClose",
    "SupportsGather",
    "SupportsLse",
    "SupportsOut",
    "SupportsWarmup",
    "SupportsWriteCache",
    "__version__",
    "check_attention",
    "check_bitexact",
    "paged_attention_reference",
    "paged_gather",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pagedattn' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
