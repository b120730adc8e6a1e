"""Known failures (``--expectations FILE``): each entry a case pattern and a reason.

A matching case is marked ``xfail`` with its reason (non-strict: it runs, and a pass is
reported as an unexpected pass); an entry that matched no case of the run is reported as
stale. Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest


def load_expectations(path: str | None) -> list[dict[str, Any]]:
    """The known failures of ``path``: ``[{"case": pattern, "reason": text}]``. A pattern
    (``*`` and ``?`` wildcards) matches a case id or a test name such as
    ``test_property[mixed-*-determinism]``."""
    if not path:
        return []
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise pytest.UsageError(f"--expectations={path}: cannot read it as JSON: {exc}") from None
    entries = data.get("expected_failures") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise pytest.UsageError(f"--expectations={path}: needs a top-level 'expected_failures' list")
    for i, e in enumerate(entries):
        if not (isinstance(e, dict) and isinstance(e.get("case"), str) and str(e.get("reason", "")).strip()):
            raise pytest.UsageError(f"--expectations={path}: entry {i} needs a 'case' pattern and a 'reason'")
    return entries


def glob_match(pattern: str, text: str) -> bool:
    """Whether ``text`` matches ``pattern`` as a whole: ``*`` (any run) and ``?`` (any one
    character) are the only wildcards; brackets are literal, as in test names ``test_x[id]``.

    Greedy matching that remembers only the last ``*``: at most ``len(pattern) * len(text)``
    steps whatever the pattern (a backtracking regex takes exponential time on many stars)."""
    p = t = 0
    star, resume = -1, 0  # the last star's position in the pattern; where its run ends in the text
    while t < len(text):
        if p < len(pattern) and pattern[p] == "*":
            star, resume = p, t
            p += 1
        elif p < len(pattern) and pattern[p] in ("?", text[t]):
            p += 1
            t += 1
        elif star >= 0:  # let the last star take one more character
            resume += 1
            p, t = star + 1, resume
        else:
            return False
    return all(c == "*" for c in pattern[p:])


def matches(entry: dict[str, Any], case_id: str, test_name: str) -> bool:
    """Whether an expectation entry names this case (by its id or its test name)."""
    return glob_match(entry["case"], case_id) or glob_match(entry["case"], test_name)


def expected_failure(entries: Iterable[dict[str, Any]], case_id: str, test_name: str) -> str | None:
    """The reason of the first entry that names this case, or ``None``."""
    return next((str(e["reason"]) for e in entries if matches(e, case_id, test_name)), None)


def stale_expectations(entries: Iterable[dict[str, Any]], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Expectation entries that matched no case of this run (``results``: the records' dicts)."""
    return [
        e for e in entries if not any(matches(e, r.get("id", ""), r.get("nodeid", "").split("::")[-1]) for r in results)
    ]
