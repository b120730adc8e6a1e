"""Decode: one new token per sequence, attending to its whole paged history."""

FAMILY = "decode"


def test_decode(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
