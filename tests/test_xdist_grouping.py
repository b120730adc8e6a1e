"""``--dist loadgroup`` with the pytest and pytest-xdist installed here: it groups the cases by
configuration, or the header says plainly that it will not, and why (pytest >= 9.2 ignores the
group pytest-xdist <= 3.8 appends to a node id: pytest-xdist#1386)."""

import json

import pytest

from pagedattn.cases import grid
from pagedattn.runner.workers import loadgroup_problem


@pytest.mark.parametrize(
    "pytest_version, xdist_version, groups",
    [("9.0.3", "3.8.0", True), ("9.2.0", "3.8.0", False), ("10.1", "3.8.1", False), ("9.2.0", "3.9.0", True)],
)
def test_the_pairs_that_cannot_group_are_named(pytest_version, xdist_version, groups):
    problem = loadgroup_problem(pytest_version, xdist_version)
    assert (problem == "") == groups, problem
    if not groups:
        assert f"pytest {pytest_version}" in problem and "pytest-xdist#1386" in problem, problem


def test_the_installed_pair_groups_or_the_header_says_it_will_not(pytester):
    args = ["-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "--pyargs", "pagedattn.conformance.test_decode"]
    result = pytester.runpytest_subprocess(*args, "--backend=reference", "--report-json=r.json")
    assert result.ret == 0, result.stdout.str()[-3000:]
    report = json.loads((pytester.path / "r.json").read_text())
    assert len(report["cases"]) == len(grid("quick", "decode"))
    workers = {}
    for c in report["cases"]:
        workers.setdefault(c["configuration"], set()).add(c["worker"])
    problem = loadgroup_problem()
    if not problem:
        result.stdout.fnmatch_lines(["*--dist loadgroup (each configuration on one worker)*"])
        sizes = [sum(c["configuration"] == k for c in report["cases"]) for k in workers]
        assert max(sizes) > 1, f"no configuration with two cases to keep together: {sizes}"
        assert all(len(w) == 1 for w in workers.values()), f"a configuration on two workers: {workers}"
        assert report["grouping_lost"] is None
    else:
        result.stdout.fnmatch_lines([f"*--dist loadgroup (not grouped: *{problem}*"])
        assert "pytest-xdist#1386" in report["grouping_lost"]
