"""The conformance suite's fixtures live in the pagedattn.plugin pytest plugin
(registered by the package's pytest11 entry point); nothing is defined here so
that `pytest conformance` and `pytest --pyargs pagedattn.conformance` agree."""
