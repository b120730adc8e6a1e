"""Sliding window: the query at position ``p`` sees keys ``p - W + 1 .. p`` only (``PagedCase.sliding_window``).

Runs only where the backend claims the variant (``Capabilities.variants``); elsewhere each
case is reported as unsupported, with the reason."""

FAMILY = "sliding_window"


def test_sliding_window(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
