"""Search: hypothesis draws whole cases (ragged lengths, heads, layouts, dtypes, scales,
and the attention variants the backend claims) within ``--search-budget`` seconds,
``hypothesis.target`` pushes toward the largest budget used, and a failure shrinks to a
minimal case that is saved, with the command that replays it.

Split into items ``test_search[seed0]`` ... (their number per profile) that xdist spreads;
each has its own fixed seed and its share of the budget and of ``--search-examples``.
Regressions found once are pinned in ``pagedattn.runner.search.PINNED``; the bookkeeping
lives in ``pagedattn.runner.search``.
"""

import pytest

from pagedattn.runner.search_plan import budget_seconds, search_items

FAMILY = "search"


def pytest_generate_tests(metafunc):
    if "search_item" in metafunc.fixturenames:
        config = metafunc.config
        xdist = config.pluginmanager.hasplugin("xdist")
        items = search_items(config.getoption("--profile"), config.getoption("--search-examples"))
        marks = [[pytest.mark.xdist_group(item.id)] if xdist else [] for item in items]
        metafunc.parametrize(
            "search_item", [pytest.param(i, marks=m, id=f"seed{i.index}") for i, m in zip(items, marks)]
        )


def test_search(pagedattn_suite, search_item, request):
    # hypothesis is imported here, not when the suite is collected: ~1 s of every xdist
    # worker's start, before any case runs (the budget's clock starts inside SearchRun.run)
    from pagedattn.runner.search import SearchRun

    budget = budget_seconds(request.config.getoption("--search-budget"), pagedattn_suite.device)
    SearchRun(pagedattn_suite, request.node, search_item, budget).run()
