"""Logits soft-cap: every scaled score ``s`` becomes ``c * tanh(s / c)`` before masking (``PagedCase.logits_soft_cap``).

Runs only where the backend claims the variant (``Capabilities.variants``); elsewhere each
case is reported as unsupported, with the reason."""

FAMILY = "logits_soft_cap"


def test_logits_soft_cap(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
