"""The search family finds, shrinks, saves and replays a bug that needs a specific case."""

import re
import shutil
from pathlib import Path

HERE = Path(__file__).parent


def test_search_finds_shrinks_and_replays(pytester, monkeypatch):
    monkeypatch.setenv("CI", "1")  # derandomized, as in CI
    shutil.copy(HERE / "bad_backends.py", pytester.path / "bad_backends.py")
    backend = f"--backend={pytester.path / 'bad_backends.py'}:OffForWideGroups"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--pyargs", "pagedattn.conformance.test_search", backend, "--search-examples=300"
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    shrunk = re.search(r"AssertionError: CaseSpec\(.*?num_heads=(\d+), num_kv_heads=(\d+)", out)
    assert shrunk, out[-3000:]
    assert int(shrunk.group(1)) // int(shrunk.group(2)) >= 4, "the shrunk case must keep a failing GQA group"
    seqs = re.search(r"AssertionError: CaseSpec\(family='search', seqs=\(\((\d+), (\d+)\),\)", out)
    assert seqs and int(seqs.group(1)) == 31, f"expected a shrink to one sequence of 31 tokens: {out[-2000:]}"
    replay = re.search(r"replay: (pytest .*)", out).group(1).split()
    again = pytester.runpytest_subprocess("-p", "no:cacheprovider", *replay[1:])
    again.assert_outcomes(failed=1)


def test_search_passes_a_correct_backend(pytester, monkeypatch):
    monkeypatch.setenv("CI", "1")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--pyargs", "pagedattn.conformance.test_search", "--backend=reference"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*search*mixed*1*0*"])
