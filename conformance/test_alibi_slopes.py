"""ALiBi: head ``h`` adds ``alibi_slopes[h] * (j - p)`` to the score of key ``j`` (``PagedCase.alibi_slopes``).

Runs only where the backend claims the variant (``Capabilities.variants``); elsewhere each
case is reported as unsupported, with the reason."""

FAMILY = "alibi_slopes"


def test_alibi_slopes(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
