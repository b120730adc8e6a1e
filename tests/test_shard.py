"""A fleet, not one machine: ``--shard I/N`` splits the run by configuration, every case in
exactly one shard, and ``python -m pagedattn report`` merges the shards' reports into one
verdict (conflicts, missing shards and cases no shard ran fail it)."""

import argparse
import json

import pytest

from pagedattn.__main__ import main as pagedattn_main
from pagedattn.runner.shard import assign, collected_digest, shard_spec
from tests.helpers import import_session_modules, run_inprocess

import_session_modules()  # before the in-process runs below (see its docstring)

ARGS = ("pagedattn.conformance.test_decode", "pagedattn.conformance.test_gather", "--backend=reference")


def _run(pytester, name, *args):
    result = run_inprocess(pytester, "-p", "no:cacheprovider", "--pyargs", *ARGS, f"--report-json={name}", *args)
    return result, json.loads((pytester.path / name).read_text())


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
def test_every_configuration_goes_to_exactly_one_shard(count):
    keys = [f"k{i % 11}" for i in range(60)] + ["lone"]
    shard_of = assign(keys, count)
    assert set(shard_of) == set(keys) and set(shard_of.values()) <= set(range(1, count + 1))
    load = [sum(1 for k in keys if shard_of[k] == s) for s in range(1, count + 1)]
    assert sum(load) == len(keys) and max(load) - min(load) <= 6, load  # 6: the largest configuration
    assert assign(list(reversed(keys)), count) == shard_of  # the order of collection does not matter


def test_the_shard_option_is_checked():
    assert shard_spec("2/3") == (2, 3) and shard_spec(" 1 / 1 ") == (1, 1)
    for text, says in (("0/2", "in 1..2"), ("3/2", "in 1..2"), ("1/0", "at least 1"), ("a/b", "I/N")):
        with pytest.raises(argparse.ArgumentTypeError, match=says.replace(".", r"\.")):
            shard_spec(text)


def test_a_bad_shard_is_a_usage_error_naming_the_option(pytester):
    result = run_inprocess(pytester, "-p", "no:cacheprovider", "--pyargs", *ARGS, "--shard=3/2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--shard*the shard index I must be in 1..2*"])


def test_two_shards_are_the_whole_run_and_merge_into_its_verdict(pytester, capsys):
    whole, full = _run(pytester, "all.json", "--collect-only")  # the unsharded run's cases, none run
    one, first = _run(pytester, "s1.json", "--shard=1/2")
    two, second = _run(pytester, "s2.json", "--shard=2/2")
    assert whole.ret == one.ret == two.ret == 0, one.stdout.str()[-2000:]
    assert {c["status"] for c in full["cases"]} == {"not_run"} and "shard" not in full
    assert first["exit_status"] == second["exit_status"] == 0, (first["exit_status"], second["exit_status"])
    ids = sorted(c["nodeid"] for c in full["cases"])
    a, b = {c["nodeid"] for c in first["cases"]}, {c["nodeid"] for c in second["cases"]}
    assert a and b and not a & b and sorted(a | b) == ids
    configs = [{c["configuration"] for c in r["cases"]} for r in (first, second)]
    assert not configs[0] & configs[1], "a configuration split between shards"
    for index, report in ((1, first), (2, second)):
        shard = report["shard"]
        assert (shard["index"], shard["count"], shard["collected"]) == (index, 2, len(ids))
        assert sorted(shard["collected_ids"]) == ids and shard["collected_sha256"] == collected_digest(ids)
    one.stdout.fnmatch_lines([f"*shard 1/2: {len(a)} of {len(ids)} collected cases*"])

    s1, s2 = str(pytester.path / "s1.json"), str(pytester.path / "s2.json")
    assert pagedattn_main(["report", s1, s2]) == 0
    out = capsys.readouterr().out
    assert f"{len(ids)} cases: {len(ids)} passed" in out and "FAILED" not in out, out

    # one shard alone: the other is named missing, and its cases not run
    assert pagedattn_main(["report", s1]) == 1
    out = capsys.readouterr().out
    assert "FAILED: shard(s) 2/2 missing: no report given" in out, out
    assert f"FAILED: not run: {len(b)} collected case(s) in no shard's report" in out, out

    # a case dropped from its shard's report is not run in the merge; a conflict fails too
    lost = second["cases"].pop()
    second["cases"][0] = dict(second["cases"][0], status="failed")
    changed = pytester.path / "s2x.json"
    changed.write_text(json.dumps(second))
    dup = dict(first, cases=first["cases"] + [dict(second["cases"][0], status="passed")])
    (pytester.path / "s1x.json").write_text(json.dumps(dup))
    assert pagedattn_main(["report", str(pytester.path / "s1x.json"), str(changed)]) == 1
    out = capsys.readouterr().out
    assert f"FAILED: not run: 1 collected case(s) in no shard's report: {lost['nodeid']}" in out, out
    assert f"FAILED: conflict: {second['cases'][0]['nodeid']} is passed in" in out, out
    assert "but failed in" in out

    # the same shard twice
    assert pagedattn_main(["report", s1, s1]) == 1
    assert "FAILED: shard 1/2 given twice" in capsys.readouterr().out


@pytest.mark.slow  # two -n 2 runs in fresh processes, 10-20 s
def test_under_xdist_the_workers_tell_the_shard_and_the_stale_entries(pytester, capsys):
    """Only the workers see the collection before deselection: the controller's report still
    lists every collected case, and an expectation matching no collected case still fails."""
    import xml.etree.ElementTree as ET

    (pytester.path / "exp.json").write_text(
        json.dumps({"expected_failures": [{"case": "prefill-*", "reason": "matches no case of the suite"}]})
    )
    runs = {}
    for index in (1, 2):
        name = f"s{index}.json"
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "--pyargs", *ARGS, "-n", "2", f"--shard={index}/2", f"--report-json={name}",
            "--expectations=exp.json", f"--junitxml=j{index}.xml",
        )  # fmt: skip
        assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-2000:]
        result.stdout.fnmatch_lines(["*FAILED (pagedattn gate)*matching no collected case: 'prefill-*'*"])
        runs[index] = json.loads((pytester.path / name).read_text())
        cases = ET.parse(pytester.path / f"j{index}.xml").getroot().findall(".//testcase")
        assert len(cases) == len(runs[index]["cases"])
    ids = sorted(runs[1]["shard"]["collected_ids"])
    assert ids and ids == sorted(runs[2]["shard"]["collected_ids"])
    assert sorted(c["nodeid"] for r in runs.values() for c in r["cases"]) == ids
    assert pagedattn_main(["report", str(pytester.path / "s1.json"), str(pytester.path / "s2.json")]) == 1
    out = capsys.readouterr().out
    assert f"FAILED: {pytester.path / 's1.json'}: expectation(s) matching no collected case: 'prefill-*'" in out, out
