"""``--shard I/N``: one machine's part of a fleet's run.

Every shard collects the whole suite and keeps the cases of its share of the
configurations (compile keys): a configuration is never split, every case is in exactly
one shard for any ``N``, and the split depends only on the collected cases (the same
command on every machine gives the same split). The configurations go, largest first, to
the shard with the fewest cases so far (ties: the lower shard), so shards hold about as
many cases each. Each shard's JSON report records the spec and every collected node id, so
that ``python -m pagedattn report`` can merge the shards and name a case no shard ran.
Torch-free.
"""

from __future__ import annotations

import argparse
import hashlib
import re
from collections.abc import Callable, Sequence

import pytest


def shard_spec(text: str) -> tuple[int, int]:
    """``--shard``'s type: ``I/N`` with ``1 <= I <= N``."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected I/N (shard I of N, 1-based), got {text!r}")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1:
        raise argparse.ArgumentTypeError(f"the shard count N must be at least 1, got {text!r}")
    if not 1 <= index <= count:
        raise argparse.ArgumentTypeError(f"the shard index I must be in 1..{count}, got {text!r}")
    return index, count


def assign(keys: Sequence[str], count: int) -> dict[str, int]:
    """Each configuration of ``keys`` (one entry per case) -> its shard, 1-based."""
    sizes: dict[str, int] = {}
    for key in keys:
        sizes[key] = sizes.get(key, 0) + 1
    load = [0] * count
    out: dict[str, int] = {}
    for key in sorted(sizes, key=lambda k: (-sizes[k], k)):
        shard = min(range(count), key=lambda s: (load[s], s))
        load[shard] += sizes[key]
        out[key] = shard + 1
    return out


def split(items: list[pytest.Item], index: int, count: int, key: Callable[[pytest.Item], str]) -> list[pytest.Item]:
    """The items of other shards (``items`` keeps this shard's, in its order)."""
    shard_of = assign([key(i) for i in items], count)
    dropped = [i for i in items if shard_of[key(i)] != index]
    keep = [i for i in items if shard_of[key(i)] == index]
    items[:] = keep
    return dropped


def collected_digest(nodeids: Sequence[str]) -> str:
    """A digest of the collected node ids (in sorted order): equal on every shard of one run."""
    return hashlib.sha256("\n".join(sorted(nodeids)).encode()).hexdigest()
