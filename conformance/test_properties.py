"""Properties no anchor checks together: determinism, batch invariance, placement
invariance, input immutability, poisoned padding, and a fully written ``out=``."""

import pytest
import torch

from pagedattn.cases import grid
from pagedattn.runner.properties import PROPERTIES

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


@pytest.mark.parametrize("prop", list(PROPERTIES))
def test_property(pagedattn_suite, conformance_spec, prop, request):
    PROPERTIES[prop](pagedattn_suite, request.node, conformance_spec)
