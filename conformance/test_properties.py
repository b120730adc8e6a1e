"""Properties no anchor checks together: determinism, batch invariance, placement
invariance, input immutability, poisoned padding, and a fully written ``out=``."""

import pytest
import torch

from pagedattn.cases import grid

FAMILY = "properties"


def SPECS(profile):
    """Per dtype: the mixed batch (decode + continuation + prefill, permuted blocks) and
    the shared-prefix layout case; they exercise every property at once. In bf16, the
    combined variant cases too (capability-gated: unsupported where not claimed)."""
    return [
        s
        for s in grid(profile)
        if s.family == "mixed"
        or (s.family == "layout" and s.layout == "shared")
        or (s.family == "combined" and s.dtype == torch.bfloat16)
    ]


PROPERTIES = [
    "determinism",
    "batch_invariance",
    "placement_invariance",
    "immutability",
    "poisoned_padding",
    "out_argument",
]


@pytest.mark.parametrize("prop", PROPERTIES)
def test_property(pagedattn_suite, conformance_spec, prop, request):
    getattr(pagedattn_suite, prop)(request.node, conformance_spec)
