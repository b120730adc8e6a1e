"""The adapter contract: what a backend is (``Backend``), its optional methods (one
protocol each: ``SupportsOut``, ``SupportsLse``, ``SupportsGather``, ``SupportsWriteCache``,
``SupportsWarmup``, ``SupportsClose``), and what the suite reads of its claims (``Claims``).

The claims themselves are ``Capabilities`` (``pagedattn.adapters.capabilities``) and
``Exclusion`` with ``INVARIANCES`` (``pagedattn.adapters.exclusion``); an adapter may import
them from here, with the contract (or from ``pagedattn``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol, runtime_checkable

import torch

from pagedattn.adapters.capabilities import Capabilities
from pagedattn.adapters.exclusion import INVARIANCES, Exclusion
from pagedattn.oracle.case import PagedCase

__all__ = [
    "INVARIANCES",
    "Backend",
    "Capabilities",
    "Claims",
    "Exclusion",
    "SupportsClose",
    "SupportsGather",
    "SupportsLse",
    "SupportsOut",
    "SupportsWarmup",
    "SupportsWarmupAhead",
    "SupportsWriteCache",
]


class Claims(Protocol):
    """What the suite reads of a backend's ``capabilities``: a ``Capabilities``, or the
    isolated backend's view of one that lives in its child process
    (``pagedattn.runner.isolation.RemoteCapabilities``). Adapter writers give a ``Capabilities``."""

    @property
    def dtypes(self) -> frozenset[torch.dtype]: ...
    @property
    def operations(self) -> frozenset[str]: ...
    @property
    def variants(self) -> frozenset[str]: ...
    @property
    def devices(self) -> frozenset[str]: ...
    @property
    def fp32_precision(self) -> str: ...
    @property
    def qk_precision(self) -> str: ...
    @property
    def tanh_precision(self) -> str: ...
    @property
    def partials_precision(self) -> str: ...
    @property
    def declared_on(self) -> str: ...
    @property
    def tolerance_factor(self) -> float: ...
    @property
    def notes(self) -> dict[str, str]: ...
    @property
    def max_seq_len(self) -> int | None: ...
    @property
    def decode_only(self) -> bool: ...
    @property
    def default_scale_only(self) -> bool: ...

    def unsupported_reason(
        self,
        *,
        operation: str = "attention",
        dtype: torch.dtype | None = None,
        head_dim: int | None = None,
        block_size: int | None = None,
        gqa_ratio: int | None = None,
        max_seq_len: int | None = None,
        device: str | torch.device | None = None,
        variants: Collection[str] = (),
    ) -> str | None: ...
    def case_reason(self, case: PagedCase, operation: str = "attention") -> str | None: ...
    def invariance_reason(self, name: str) -> str | None: ...
    def describe(self) -> dict[str, Any]: ...
    def limit_lines(self) -> list[str]: ...


@runtime_checkable
class Backend(Protocol):
    """A paged-attention implementation under test: the required part of the contract.

    Required: ``name``, ``capabilities`` and ``paged_attention``. Everything else is
    optional, each a protocol of its own below, used only when the backend has it:
    ``SupportsOut`` (``paged_attention(case, out=...)``), ``SupportsLse``
    (``paged_attention_lse``, operation ``lse``), ``SupportsGather`` (``gather``,
    operation ``gather``), ``SupportsWriteCache`` (``write_cache``, operation
    ``write_cache``), ``SupportsWarmup`` (``warmup``), ``SupportsWarmupAhead``
    (``warmup_ahead``, compiles beside the cases; not under ``--isolate``) and
    ``SupportsClose`` (``close``).
    An operation is run only when it is claimed in ``capabilities.operations`` too. Two
    optional attributes feed the report: ``version`` (str) and ``target`` (str: where the
    kernel really runs, e.g. ``"triton (interpreter, cpu)"``).

    The suite only ever calls a backend with valid cases it claims to support, and
    never reuses the tensors it passed (a backend that writes into them is caught
    by the input-immutability property, not crashed into). A ``pytest.skip(reason)``
    raised by any method reports the case as unsupported with that reason.

    Attributes:
        name: a short name for the report (``"triton"``).
        capabilities: what it claims (a ``Capabilities``).
    """

    name: str

    @property
    def capabilities(self) -> Claims: ...

    def paged_attention(self, case: PagedCase) -> torch.Tensor:
        """Args:
            case: the problem, on the device under test.

        Returns:
            ``[num_tokens, num_heads, head_dim]`` in ``case.query.dtype`` on ``case.device``.
        """
        ...


@runtime_checkable
class SupportsOut(Protocol):
    """``paged_attention(case, out=buf)`` writes the output into ``buf``
    (``[num_tokens, num_heads, head_dim]`` in the query dtype, on the case's device) and
    returns it (or ``None``). Every element must be written: the suite fills ``buf`` with
    a NaN of a payload no arithmetic produces and fails an element still holding it.

    Whether a backend takes ``out=`` is decided by ``pagedattn.adapters.loading.accepts_out``:
    its ``accepts_out`` attribute, else the signature of its ``paged_attention`` (which
    ``isinstance`` cannot see: ``isinstance(backend, SupportsOut)`` holds for a backend
    that states ``accepts_out``).

    Attributes:
        accepts_out: whether ``out=`` is taken.
    """

    accepts_out: bool

    def paged_attention(self, case: PagedCase, out: torch.Tensor | None = None) -> torch.Tensor | None: ...


@runtime_checkable
class SupportsLse(Protocol):
    """Operation ``lse``."""

    def paged_attention_lse(self, case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
        """The output ``[num_tokens, num_heads, head_dim]`` in the query dtype and the
        log-sum-exp ``[num_tokens, num_heads]`` float32: the natural log of each row's
        softmax denominator, the sink included (see ``PagedCase``). FlashInfer returns
        log2: multiply by ln 2."""
        ...


@runtime_checkable
class SupportsGather(Protocol):
    """Operation ``gather``."""

    def gather(self, pool: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        """``pool``: ``[num_blocks, block_size, num_kv_heads, head_dim]``; ``slot_mapping``:
        ``[n]`` int64. Returns ``[n, num_kv_heads, head_dim]``, bit-identical to
        ``pool.view(-1, num_kv_heads, head_dim)[slot_mapping]`` (NaN payloads included)."""
        ...


@runtime_checkable
class SupportsWriteCache(Protocol):
    """Operation ``write_cache``."""

    def write_cache(self, pool: torch.Tensor, slot_mapping: torch.Tensor, new: torch.Tensor) -> None:
        """Write ``new`` ``[n, num_kv_heads, head_dim]`` into ``pool``
        ``[num_blocks, block_size, num_kv_heads, head_dim]`` in place at the slots of
        ``slot_mapping`` ``[n]`` int64; a slot ``< 0`` means "skip this row". Every other
        slot keeps its bits, and ``new`` is not modified."""
        ...


@runtime_checkable
class SupportsWarmup(Protocol):
    """A JIT backend compiles outside the timed call."""

    def warmup(self, case: PagedCase) -> None:
        """Called once per configuration (``pagedattn.cases.configuration.Configuration.key``:
        dtype, kv dtype, head dim, block size, variants, operation) before the case's own
        call, outside ``--case-timeout``; its result is ignored."""
        ...


@runtime_checkable
class SupportsWarmupAhead(Protocol):
    """A JIT backend whose compiles can run ahead of the cases, beside them."""

    def warmup_ahead(self, case: PagedCase, operation: str) -> None:
        """Compile what ``case`` needs as ``operation`` (``"attention"`` or ``"lse"``) and
        launch none of the kernels under test (torch work on the case's tensors is
        fine). Called from a background thread while other cases run on the
        backend (``pagedattn.runner.warmup``), at most once per kernel class, for cases that run
        later; it must be safe to call concurrently with every other method. Its result
        is ignored, and what it raises too (the case meets the error itself)."""
        ...


@runtime_checkable
class SupportsClose(Protocol):
    """A backend that holds resources (a process, a device context)."""

    def close(self) -> None:
        """Called once, when the session ends."""
        ...
