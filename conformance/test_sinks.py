"""Attention sinks: a per-head logit that joins the softmax denominator and adds no value (``PagedCase.sinks``).

Runs only where the backend claims the variant (``Capabilities.variants``); elsewhere each
case is reported as unsupported, with the reason."""

FAMILY = "sinks"


def test_sinks(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
