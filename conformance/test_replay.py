"""Replays a case saved by the search family (``--replay FILE``); collects nothing otherwise."""

FAMILY = "search-replay"


def test_search_replay(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
