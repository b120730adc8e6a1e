"""fp8 KV cache: keys and values stored as ``float8_e4m3fn``/``float8_e5m2`` and dequantized by ``k_scale``/``v_scale``.

Runs only where the backend claims the variant (``Capabilities.variants``); elsewhere each
case is reported as unsupported, with the reason."""

FAMILY = "fp8"


def test_fp8(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
