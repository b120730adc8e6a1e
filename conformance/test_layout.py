"""Layout: permuted, interleaved and shared blocks, every block size, every head dim, block boundaries."""

FAMILY = "layout"


def test_layout(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
