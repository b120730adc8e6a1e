"""Variants together, as real models ship them: window + sinks (gpt-oss), soft-cap +
window (Gemma 2), fp8 + window + sinks.

Runs only where the backend claims the variant (``Capabilities.variants``); elsewhere each
case is reported as unsupported, with the reason."""

FAMILY = "combined"


def test_combined(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
