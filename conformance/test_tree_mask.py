"""Tree-masked verification (speculative decoding).

Each sequence's new tokens see its whole history and the new tokens its ``tree_mask`` allows
(their ancestors and themselves).

Runs only where the backend claims the variant ``tree_mask`` (``Capabilities.variants``);
elsewhere each case is reported as unsupported, with the reason."""

FAMILY = "tree_mask"


def test_tree_mask(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
