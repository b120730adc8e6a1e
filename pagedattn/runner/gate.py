"""The run's verdict as a CI gate: a run passes only when it judged cases, enough of them,
and every expectation held.

``judged`` cases reached a verdict (passed, failed, warned, xfailed, xpassed); a run that
judged none (every case unsupported, deselected or not run) exits ``NOTHING_JUDGED``, a
status of its own beside pytest's 0-5. ``--min-judged`` raises the floor. Expectations are
strict unless ``--lenient-expectations``: an unexpected pass or an entry that matches no
collected case fails the run. The same rules judge a saved report
(``python -m pagedattn report``, ``pagedattn.runner.merge``). Torch-free.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

#: exit status of a run (and of ``python -m pagedattn report``) that judged no case, or
#: fewer than ``--min-judged``; pytest's own statuses are 0-5
NOTHING_JUDGED = 6

#: statuses that mean a verdict was reached on the case
JUDGED = frozenset({"passed", "failed", "warned", "xfailed", "xpassed"})


def min_judged(text: str) -> int | float:
    """``--min-judged``: a count (``10``; ``0``: no floor) or a fraction of the collected cases
    (``0.5``, in (0, 1])."""
    try:
        value: int | float = int(text) if text.strip().lstrip("+").isdigit() else float(text)
    except ValueError:
        value = float("nan")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, float) and 0.0 < value <= 1.0:
        return value
    raise argparse.ArgumentTypeError(f"expected a count >= 0 or a fraction in (0, 1], got {text!r}")


def floor_of(spec: int | float | None, collected: int) -> int:
    """The number of cases ``--min-judged`` asks to judge out of ``collected`` (1 when not given)."""
    if spec is None:
        return 1
    if isinstance(spec, float):
        return max(1, -(-int(round(spec * collected * 1e9)) // 10**9))  # ceil, robust to 0.1 * 30 = 3.0000001
    return spec


def judged_count(statuses: Iterable[str]) -> int:
    return sum(1 for s in statuses if s in JUDGED)


def judged_reason(statuses: list[str], spec: int | float | None) -> str:
    """Why the cases of ``statuses`` do not make a verdict (``""``: they do)."""
    judged = judged_count(statuses)
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    seen = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no case"
    need = floor_of(spec, len(statuses))
    if judged == 0 and need > 0:  # ``--min-judged=0``: a run may judge nothing (an empty shard)
        return f"nothing judged: no case reached a verdict ({seen})"
    if judged < need:
        return f"too few judged: {judged} of {len(statuses)} cases reached a verdict, --min-judged asks {need} ({seen})"
    return ""


@dataclass
class Gate:
    """What this process knows of the gate: the options, the expectations that matched no
    collected case, the shard, and the verdict's reasons once the run is over."""

    strict: bool = True
    min_judged: int | float | None = None
    #: expectation entries that matched no collected case (``collection.arrange``)
    stale: list[dict[str, Any]] = field(default_factory=list)
    #: ``(index, count)`` of ``--shard``, 1-based, or ``None``
    shard: tuple[int, int] | None = None
    #: node ids of every collected case, all shards' (before the shard's deselection)
    collected: list[str] = field(default_factory=list)
    #: one line per reason the run fails as a gate (set by ``verdict``)
    reasons: list[str] = field(default_factory=list)
    judged: int = 0

    def header(self) -> dict[str, Any]:
        """The JSON report's ``gate`` and ``shard`` entries."""
        from pagedattn.runner.shard import collected_digest

        out: dict[str, Any] = {
            "gate": {
                "strict_expectations": self.strict,
                "min_judged": self.min_judged,
                "judged": self.judged,
                "reasons": list(self.reasons),
                "stale_expectations": [e["case"] for e in self.stale],
            }
        }
        if self.shard is not None:
            out["shard"] = {
                "index": self.shard[0],
                "count": self.shard[1],
                "collected": len(self.collected),
                "collected_sha256": collected_digest(self.collected),
                "collected_ids": list(self.collected),
            }
        return out


GATE_KEY = pytest.StashKey[Gate]()


def gate_of(config: pytest.Config) -> Gate:
    """This run's ``Gate`` (made from the options when first asked)."""
    stash = getattr(config, "stash", None)
    gate = stash.get(GATE_KEY, None) if stash is not None else None
    if gate is None:
        floor = config.getoption("--min-judged", None)
        shard = config.getoption("--shard", None)
        gate = Gate(
            strict=not config.getoption("--lenient-expectations", False),
            min_judged=floor if isinstance(floor, (int, float)) and not isinstance(floor, bool) else None,
            shard=shard if isinstance(shard, tuple) else None,
        )
        if stash is not None:  # a stand-in config of a unit test has none
            stash[GATE_KEY] = gate
    return gate


def verdict(gate: Gate, cases: Sequence[Mapping[str, Any]], collect_only: bool = False) -> int:
    """The gate's exit status for the run's ``cases`` (their report dicts): 0, 1 (an
    unexpected pass or a stale expectation under strict expectations) or ``NOTHING_JUDGED``;
    the reasons go to ``gate.reasons``."""
    statuses = [str(c.get("status")) for c in cases]
    gate.judged = judged_count(statuses)
    gate.reasons = []
    if collect_only:
        return 0
    status = 0
    if gate.strict:
        xpassed = [str(c.get("id")) for c in cases if c.get("status") == "xpassed"]
        if xpassed:
            gate.reasons.append(f"unexpected pass of {len(xpassed)} listed case(s): {', '.join(xpassed)}")
            status = 1
        if gate.stale:
            names = ", ".join(repr(e["case"]) for e in gate.stale)
            gate.reasons.append(f"expectation(s) matching no collected case: {names}")
            status = 1
    why = judged_reason(statuses, gate.min_judged)
    if why:
        gate.reasons.append(why)
        status = status or NOTHING_JUDGED
    return status
