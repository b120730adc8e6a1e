"""Cache write: pool[slot_mapping] = new, slots < 0 skipped, bit-exact, nothing else touched."""

FAMILY = "cache_write"


def test_cache_write(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.cache_write(request.node, conformance_spec)
