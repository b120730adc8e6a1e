"""Partial continuation (chunked prefill): new tokens over an already cached prefix."""

FAMILY = "continuation"


def test_continuation(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
