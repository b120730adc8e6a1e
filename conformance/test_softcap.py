"""Logits soft-cap: every scaled score ``s`` becomes ``c * tanh(s / c)`` before masking (``PagedCase.logits_soft_cap``).

Runs only where the backend claims the variant (``Capabilities.variants``); elsewhere each
case is reported as unsupported, with the reason."""

FAMILY = "softcap"


def test_softcap(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
