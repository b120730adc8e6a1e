"""The command line's vocabulary, free of torch: the plugin's ``pytest_addoption`` runs in
every pytest session of any project where pagedattn is installed, so it may import only this.

``PROFILES`` and ``DEFAULT_TIMEOUT_S`` are stated here once; ``pagedattn.cases.grid`` and
``pagedattn.runner.isolation`` (both import torch) take them from this module.
"""

from __future__ import annotations

import argparse
import math

#: the case grid's profiles (``--profile``)
PROFILES = ("quick", "standard", "thorough")
#: per-case time limit under ``--isolate`` when ``--case-timeout`` is not given
DEFAULT_TIMEOUT_S = 600.0
#: ``--case-timeout=none``: no per-case limit
NO_LIMIT = "none"


def case_timeout(text: str) -> float | str:
    """``--case-timeout``: positive finite seconds, or ``none``."""
    if text.strip().lower() == NO_LIMIT:
        return NO_LIMIT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected positive finite seconds or 'none', got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """``--search-budget``'s type: positive, finite seconds, or ``none`` (no time limit: infinity,
    the draws of ``--search-examples`` alone bound the search)."""
    if text.strip().lower() == NO_LIMIT:
        return math.inf
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value < math.inf:
        raise ValueError(f"must be positive, finite seconds or 'none', got {text!r}")
    return value
