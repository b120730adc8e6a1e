"""Causal prefill: every token of the sequence is new; bottom-right causal mask."""

FAMILY = "prefill"


def test_prefill(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
