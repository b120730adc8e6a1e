"""GQA and MQA: query head h reads kv head h // (num_heads // num_kv_heads); ratios 1, 2, 4, 8 and one kv head."""

FAMILY = "gqa"


def test_gqa(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
