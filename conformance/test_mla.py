"""Multi-head latent attention (MLA, absorbed form), as DeepSeek V2/V3 decode.

One latent kv head whose values are its keys' leading columns (``value_cache`` a view of
``key_cache[..., :head_dim_v]``).

Runs only where the backend claims the variant ``mla`` (``Capabilities.variants``); elsewhere
each case is reported as unsupported, with the reason."""

FAMILY = "mla"


def test_mla(pagedattn_suite, conformance_spec, request):
    pagedattn_suite.attention(request.node, conformance_spec)
