"""Every planted bug fails the quick profile; the correct baseline passes.

The kill matrix (which family caught which bug) is recorded in docs/kill-matrix.md;
``python -m tests.kill_matrix`` regenerates it.
"""

import json
from pathlib import Path

import pytest

from tests.streamed import BUGS

STREAMED = Path(__file__).parent / "streamed.py"


def run_quick(pytester, factory: str) -> dict:
    # a subprocess: in-process, the checkout's pagedattn/ (on sys.path for the tests) would
    # shadow an installed package and its pagedattn.conformance
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-q", "--pyargs", "pagedattn.conformance",
        f"--backend={STREAMED}:{factory}", "--report-json=r.json",
    )  # fmt: skip
    report = json.loads((pytester.path / "r.json").read_text())
    report["ret"] = result.ret
    return report


def killers(report: dict) -> set[str]:
    """Families (properties by name) with at least one failed case."""
    out = set()
    for c in report["cases"]:
        if c["status"] == "failed":
            out.add(f"properties:{c['property']}" if c.get("property") else c["family"])
    return out


def test_correct_baseline_passes(pytester):
    report = run_quick(pytester, "correct")
    assert report["ret"] == 0 and not killers(report), killers(report)


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_fails_the_quick_profile(pytester, bug):
    report = run_quick(pytester, f"bug_{bug}")
    caught = killers(report)
    assert report["ret"] != 0 and caught, f"planted bug {bug!r} ({BUGS[bug]}) passed the quick profile"
