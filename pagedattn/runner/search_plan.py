"""The search's plan: its items (one seed each) and their share of the draws and of the
budget, the configurations and axes it draws from (those the backend claims), and what a
draw should cost (``Pace``), so that the budget covers finding and shrinking alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pagedattn.adapters.protocol import Claims
from pagedattn.cases import CaseSpec, grid
from pagedattn.cases.configuration import Configuration
from pagedattn.cases.grid import BLOCK_SIZES, FAMILIES, FREE_BLOCK_SIZES, FREE_GQA_RATIOS, FREE_HEAD_DIMS, HEAD_DIMS

#: hypothesis draws of the whole search (all items together), per profile
EXAMPLES = {"quick": 25, "standard": 100, "thorough": 300}
#: items the search is split into, per profile (at most one per xdist worker is useful)
ITEMS = {"quick": 2, "standard": 4, "thorough": 8}
#: seconds for the whole search (finding and shrinking) when ``--search-budget`` is not given
DEFAULT_BUDGET = {"cuda": 60.0, "cpu": 30.0}
#: the families whose grid configurations a compile-per-shape kernel has compiled for
#: ``attention`` (``lse`` returns more, gather and cache writes are other kernels)
_ATTENTION_FAMILIES = tuple(f for f in FAMILIES if f not in ("gather", "cache_write", "lse"))


def budget_seconds(option: float | None, device: str) -> float:
    """The whole search's budget: the option, else 60 s on a GPU and 30 s on the CPU."""
    if option is not None:
        return option
    return DEFAULT_BUDGET["cuda" if str(device).startswith("cuda") else "cpu"]


def grid_configurations(profile: str, caps: Claims) -> list[Configuration]:
    """The configurations of the profile's attention grid that ``caps`` claims, simplest first."""
    found = {Configuration.of_spec(s) for f in _ATTENTION_FAMILIES for s in grid(profile, f)}
    claimed = [
        c
        for c in found
        if caps.unsupported_reason(
            dtype=c.dtype,
            head_dim=c.head_dim,
            block_size=c.block_size,
            gqa_ratio=c.num_heads // c.num_kv_heads,
            variants=c.all_variants,
        )
        is None
    ]
    return sorted(claimed, key=Configuration.sort_key)


def _claims_axis(caps: Claims, key: str, value: int) -> bool:
    """Whether ``caps`` claims ``value`` on the one axis ``key`` (``head_dim``, ...)."""
    asked: dict[str, Any] = {key: value}
    return caps.unsupported_reason(**asked) is None


def free_axes(caps: Claims) -> tuple[dict[str, list[int]], str | None]:
    """The head dims, block sizes and GQA ratios that fresh draws take: those of the free
    draws that ``caps`` claims (else the grid's others it claims); and why none, if so."""
    axes: dict[str, list[int]] = {}
    for name, key, candidates in (
        ("head_dims", "head_dim", (FREE_HEAD_DIMS, HEAD_DIMS)),
        ("block_sizes", "block_size", (FREE_BLOCK_SIZES, BLOCK_SIZES)),
        ("gqa_ratios", "gqa_ratio", (FREE_GQA_RATIOS,)),
    ):
        for values in candidates:
            axes[name] = [x for x in values if _claims_axis(caps, key, x)]
            if axes[name]:
                break
        else:
            tried = sorted({x for values in candidates for x in values})
            return axes, f"the backend claims none of the {key.replace('_', ' ')}s {tried}"
    return axes, None


@dataclass(frozen=True)
class SearchItem:
    """One item of the search: its index (its seed), how many items share the search,
    and its share of the draws."""

    index: int
    count: int
    max_examples: int

    @property
    def id(self) -> str:
        return f"search-seed{self.index}"

    @property
    def fresh_shapes(self) -> bool:
        """The second half of the items draws new shapes; the first stays on the grid's."""
        return self.index >= (self.count + 1) // 2


def search_items(profile: str, examples: int | None = None) -> list[SearchItem]:
    """The items of one search: ``ITEMS[profile]`` of them, sharing ``examples`` draws
    (default ``EXAMPLES[profile]``)."""
    count = ITEMS[profile]
    n = examples or EXAMPLES[profile]
    return [SearchItem(i, count, max(1, -(-n // count))) for i in range(count)]


def spec_work(spec: CaseSpec) -> int:
    """What a draw costs, in units its time grows with: query-key pairs times heads and
    head_dim (the oracle and the check are dense), plus the cache it builds."""
    pairs = sum(q * s for s, q in spec.seqs)
    return (pairs * spec.num_heads + sum(s for s, _ in spec.seqs) * spec.num_kv_heads) * spec.head_dim


@dataclass
class Pace:
    """Seconds per draw as ``overhead + rate * work``, from the draws so far: the overhead
    is the fastest draw, the rate the time above it per unit of work over all draws (so
    the large draws dominate it, not the noise of small ones)."""

    draws: list[tuple[int, float]] = field(default_factory=list)  # (work, seconds)

    def add(self, work: int, seconds: float) -> None:
        self.draws.append((max(1, work), seconds))

    def estimate(self, work: int) -> float:
        """Seconds a draw of ``work`` should take; 0 before any draw."""
        if not self.draws:
            return 0.0
        overhead = min(t for _, t in self.draws)
        rate = sum(t - overhead for _, t in self.draws) / sum(w for w, _ in self.draws)
        return overhead + rate * work
