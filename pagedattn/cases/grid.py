"""The named grid of cases, per profile: its families, its axes, and ``grid`` which assembles it.

``quick`` is the CPU default: every family, dtype and edge present, with sizes a
Python-level kernel model and the Triton interpreter get through in minutes.
``standard`` adds longer histories and larger batches; ``thorough`` adds long
contexts (to 32k tokens) meant for a GPU. Each family's cases are built in
``pagedattn.cases.core_families`` or ``pagedattn.cases.variant_families``.
"""

from __future__ import annotations

import torch

from pagedattn.cases.spec import CaseSpec
from pagedattn.runner.options import PROFILES
from pagedattn.validation import ProblemError

#: the core families, then one family per attention variant (capability-gated) and their
#: combinations; ``lse`` checks the log-sum-exp output (an optional operation)
CORE_FAMILIES = ("gather", "cache_write", "decode", "prefill", "continuation", "gqa", "layout", "mixed")
VARIANT_FAMILIES = (
    "sliding_window",
    "logits_soft_cap",
    "alibi_slopes",
    "sinks",
    "fp8",
    "lse",
    "combined",
    "mla",
    "tree_mask",
)
FAMILIES = CORE_FAMILIES + VARIANT_FAMILIES
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HEAD_DIMS = (48, 64, 80, 96, 112, 128, 256)
BLOCK_SIZES = (1, 2, 3, 13, 16, 32, 128)
#: the axes of the search's free draws (``strategies``; small head dims keep CPU runs short),
#: here so that the search's plan needs no hypothesis to be collected
FREE_HEAD_DIMS = HEAD_DIMS[:4]
FREE_BLOCK_SIZES = (1, 2, 3, 4, 8, 13, 16, 32)
FREE_GQA_RATIOS = (1, 2, 4, 8)


def grid(profile: str = "quick", family: str | None = None) -> list[CaseSpec]:
    """The named cases of ``profile`` (each profile includes the smaller ones),
    optionally of one ``family``. Ids are unique and stable."""
    # the families' modules take their axes from this one: imported once it is initialised
    from pagedattn.cases import core_families, variant_families

    if profile not in PROFILES:
        raise ProblemError("grid", "profile", f"must be one of {PROFILES}, got {profile!r}")
    builders = {**core_families.BUILDERS, **variant_families.BUILDERS}
    families = FAMILIES if family is None else (family,)
    specs = [s for f in families for s in builders[f](profile)]
    ids = [s.id for s in specs]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise AssertionError(f"grid({profile!r}) has duplicate ids: {sorted(dup)}")
    return specs
