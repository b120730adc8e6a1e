"""Gather: pool[slot_mapping] through the block tables, bit-exact (NaN payloads included)."""

FAMILY = "gather"


def test_gather(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.gather(request.node, conformance_spec)
