"""Log-sum-exp output (the optional ``lse`` operation): ``paged_attention_lse(case)``
returns the output and ``[num_tokens, num_heads]`` float32, the natural log of each row's
softmax denominator (the sink included); both are judged, each against its own bound.

Runs only where the backend claims ``"lse"`` in ``Capabilities.operations`` (and the
variants a case uses)."""

FAMILY = "lse"


def test_lse(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention_lse(request.node, conformance_spec)
