"""The pytest harness: what a conformance case does (suite, properties, search), which
cases a run has (collection), one record per case and the reports built from them,
fault isolation and background warm-up. Empty on purpose: the plugin imports only the
torch-free modules it needs, so that every pytest session stays light."""
