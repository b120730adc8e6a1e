"""Mixed batches: decode, continuation and full prefill sequences in one launch."""

FAMILY = "mixed"


def test_mixed(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
