"""Search: hypothesis draws whole cases (ragged lengths, heads, layouts, dtypes, scales,
and the attention variants the backend claims),
``hypothesis.target`` pushes toward the largest budget used, and a failure shrinks to a
minimal case that is saved, with the command that replays it.

Derandomized when the ``CI`` environment variable is set; ``--search-examples N``
sets the number of draws (default per profile). Regressions found once are pinned
with ``@example`` below.
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings, target

from pagedattn.cases import CaseSpec
from pagedattn.cases.strategies import case_specs
from pagedattn.suite import record

FAMILY = "search"
EXAMPLES = {"quick": 25, "standard": 100, "thorough": 300}

# Cases that once exposed a bug in a kernel under test, kept forever.
PINNED = [
    # a single-token history at block size 1 (empty tiles after the first)
    CaseSpec("search", ((1, 1), (2, 2)), num_heads=2, num_kv_heads=1, head_dim=48, block_size=1, tag="pinned1"),
    # MQA, odd head_dim and block size, continuation ending one past a block boundary
    CaseSpec(
        "search",
        ((27, 5),),
        num_heads=8,
        num_kv_heads=1,
        head_dim=80,
        block_size=13,
        dtype=torch.bfloat16,
        layout="permuted",
        tag="pinned2",
    ),  # fmt: skip
]


def test_search(pagedattn_suite, request):
    suite = pagedattn_suite
    n = request.config.getoption("--search-examples") or EXAMPLES[suite.profile]
    dtypes = sorted(suite.caps.dtypes & {torch.float32, torch.float16, torch.bfloat16}, key=str)
    reason = suite.caps.unsupported_reason(device=suite.device) or (
        None if dtypes else "the backend claims none of fp32/fp16/bf16"
    )
    if reason:
        record(request.node, id="search", family="search", dtype="mixed", operation="attention",
               status="unsupported", reason=reason)  # fmt: skip
        pytest.skip(f"unsupported: {reason}")
    worst = {"budget": 0.0}

    @settings(
        max_examples=n,
        deadline=None,
        derandomize=bool(os.environ.get("CI")),
        suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    # the variants the backend claims join the draws (each shrinks towards off)
    @given(spec=case_specs(suite.profile, family="search", dtypes=dtypes, variants=suite.caps.variants))
    @example(spec=PINNED[0])
    @example(spec=PINNED[1])
    def search(spec):
        assume(spec.dtype in dtypes)
        check = suite.search_case(request.node, spec)
        if check is None:  # not claimed by the backend
            assume(False)
        worst["budget"] = max(worst["budget"], check.budget_used)
        target(min(check.budget_used, 1e9), label="budget_used")

    search()
