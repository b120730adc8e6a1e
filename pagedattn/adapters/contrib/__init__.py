"""Adapters for third-party kernels (FlashInfer, FlashAttention, vLLM's and SGLang's Triton kernels).

Each module imports its third-party package lazily, inside the backend's constructor, so
importing a module here never fails; the constructor raises ``ImportError`` with a clear
message (what to install) when the package is absent. Their entry points
(``pagedattn.backends`` group in pyproject.toml) let ``--backend=<name>`` find them, and
``python -m pagedattn`` lists one whose package is absent as "not installed".

In CI, where the packages are absent, ``tests/standins/<package>/`` holds pure-torch
stand-ins written by us from each package's public signatures and documented semantics
(never its code); the contrib tests put them on ``sys.path``.
"""
