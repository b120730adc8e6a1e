"""The pytest plugin, run with pytester: loading routes, errors, properties, replay, reports."""

import json
import os
import re

import pytest

from pagedattn.runner.warmup import claim_dir
from tests.helpers import N_DECODE, N_DECODE_FP32, import_session_modules, run_inprocess

import_session_modules()  # before the in-process runs below (see its docstring)

DECODE = "pagedattn.conformance.test_decode"
PROPS = "pagedattn.conformance.test_properties"


def _run(pytester, *args):
    """A run in a fresh Python process, as a user starts it (the loading routes, -n 2)."""
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pyargs", *args)


def _run_here(pytester, *args):
    """A run in this process: the same plugin, options and output, without the 2-3 s of a
    new interpreter importing torch (the checks of a run's verdicts, errors and reports)."""
    return run_inprocess(pytester, "-p", "no:cacheprovider", "--pyargs", *args)


def _replay_path(result) -> str:
    """The saved case of the first replay line a failing run printed."""
    line = next(l for l in result.stdout.lines if "replay: pytest" in l)
    found = re.search(r"--replay (\S+)", line)
    assert found, f"no --replay argument in the replay line: {line}"
    return found.group(1)


#: the default run loads the suite by an entry point and from a file's factory (the two ends of
#: the loader); the other routes are `slow` (CI's second step)
_OTHER_ROUTES = [pytest.param(r, marks=pytest.mark.slow) for r in ("module-class", "file-instance", "file-class")]


@pytest.mark.parametrize("route", ["entry", *_OTHER_ROUTES, "file-factory"])
def test_every_loading_route_runs_the_suite(pytester, bad, route):
    backend = {
        "entry": "reference",
        "module-class": "bad_backends:Correct",
        "file-instance": f"{bad}:instance",
        "file-class": f"{bad}:Correct",
        "file-factory": f"{bad}:factory",
    }[route]
    pytester.syspathinsert()
    result = _run(pytester, DECODE, f"--backend={backend}")
    result.assert_outcomes(passed=N_DECODE)
    result.stdout.fnmatch_lines(["*pagedattn conformance*", f"*decode*fp32*{N_DECODE_FP32}*0*0*0*"])


def test_header_names_backend_and_versions(pytester):
    result = _run_here(pytester, DECODE, "--backend=sdpa")
    claims = (
        "*claims: operations attention, gather, write_cache; "
        "variants alibi_slopes, fp8_e4m3, fp8_e5m2, fp8_per_head_scales, head_dim_v, mla, sliding_window, tree_mask"
    )
    result.stdout.fnmatch_lines(
        [
            "pagedattn *: backend sdpa torch *",
            "*runs on: sdpa (cpu)*",
            "*torch *, triton *",
            "*guard: none: a crash or a hang of the backend ends the run*--isolate*",
            claims,
            "pagedattn: * cases in * configurations*",
        ]
    )


def test_unknown_backend_lists_the_available_ones(pytester):
    result = _run_here(pytester, DECODE, "--backend=nosuch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown backend. Available: *reference*sdpa*"])


def test_broken_import_shows_its_cause(pytester):
    pytester.makepyfile(broken="import definitely_not_a_module\nB = 1\n")
    result = _run_here(pytester, DECODE, f"--backend={pytester.path / 'broken.py'}:B")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*importing*failed*", "*ModuleNotFoundError*definitely_not_a_module*"])


def test_not_a_backend_is_an_error(pytester, bad):
    result = _run_here(pytester, DECODE, f"--backend={bad}:not_a_backend")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*is not a backend: missing name, capabilities, paged_attention*"])


def test_missing_backend_option_is_a_usage_error(pytester):
    result = _run_here(pytester, DECODE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*needs --backend=NAME*"])


@pytest.mark.parametrize(
    "cls, prop, text",
    [
        ("Nondeterministic", "determinism", "the same input twice gave different bits"),
        ("BatchDependent", "batch_invariance", "alone differs in its bits"),
        ("PlacementDependent", "placement_invariance", "permuting the physical blocks changed"),
        ("Mutating", "immutability", "the backend modified key_cache"),
        ("ReadsPadding", "poisoned_padding", "non-finite where the reference is finite"),
        ("PartlyWritesOut", "out_argument", "elements of `out` were never written"),
        ("WritesNaNIntoOut", "out_argument", "non-finite where the reference is finite"),
    ],
)
def test_each_property_catches_its_bug(pytester, bad, cls, prop, text):
    result = _run_here(pytester, PROPS, f"--backend={bad}:{cls}", "-k", prop)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, f"{cls} was not caught by {prop}: {outcomes}"
    result.stdout.fnmatch_lines([f"*{text}*", "*replay: pytest *--replay *"])


def test_a_raising_backend_fails_its_cases_and_is_reported(pytester, bad):
    """In process as isolated: one short line per case (type, message, the backend's own
    frame), a replay, and the full traceback in the JSON (and with --tb=long)."""
    result = _run_here(pytester, DECODE, f"--backend={bad}:Raises", "--report-json=r.json", "--tb=long")
    result.assert_outcomes(failed=N_DECODE)
    report = json.loads((pytester.path / "r.json").read_text())
    assert {c["status"] for c in report["cases"]} == {"failed"}
    for c in report["cases"]:
        assert c["message"].startswith(
            f"{c['id']} [attention]: the backend raised RuntimeError: kernel launch "
            "failed: too many resources requested (at bad_backends.py:"
        )
        assert "\n  replay: pytest " in c["message"] and c["replay"] in c["message"]
        assert 'raise RuntimeError("kernel launch failed' in c["traceback"]
    result.stdout.fnmatch_lines(["*Traceback (most recent call last)*", "*raise RuntimeError(*"])  # --tb=long


def test_declined_invariance_is_unsupported_and_probed(pytester, bad):
    reason = "invariance 'batch_invariance' not claimed (decode and mixed batches take different kernels)"
    result = _run_here(
        pytester,
        PROPS,
        f"--backend={bad}:DeclinesBatchInvariance",
        "-k",
        "invariance or determinism",
        "--report-json=r.json",
        "--probe-unclaimed=1",
    )
    assert result.ret == 0
    report = json.loads((pytester.path / "r.json").read_text())
    batch = [c for c in report["cases"] if c["property"] == "batch_invariance" and "mixed" in c["id"]]
    assert batch and {c["status"] for c in batch} == {"unsupported"} and {c["reason"] for c in batch} == {reason}
    others = [c for c in report["cases"] if c["property"] != "batch_invariance" and "mixed" in c["id"]]
    assert others and {c["status"] for c in others} == {"passed"}
    probed = [c for c in batch if "probe" in c]
    assert len(probed) == 1 and probed[0]["probe"].startswith("would not hold: batch invariance: sequence")
    result.stdout.fnmatch_lines(["*limit: invariance 'batch_invariance' not claimed*", f"*unsupported: {reason}*"])


def test_replay_reproduces_a_failure(pytester, bad):
    result = _run_here(pytester, DECODE, f"--backend={bad}:WrongScale")
    result.assert_outcomes(failed=N_DECODE)
    path = _replay_path(result)
    again = _run_here(pytester, DECODE, f"--backend={bad}:WrongScale", "--replay", path)
    again.assert_outcomes(failed=1)
    fixed = _run_here(pytester, DECODE, f"--backend={bad}:Correct", "--replay", path)
    fixed.assert_outcomes(passed=1)


def test_json_report_schema(pytester):
    result = _run_here(
        pytester,
        DECODE,
        "pagedattn.conformance.test_gather",
        "--backend=reference",
        "--report-json=r.json",
        "--junitxml=j.xml",
    )
    assert result.ret == 0
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["schema"] == "pagedattn-report/2"
    assert report["complete"] is True and report["counts"]["passed"] == len(report["cases"])
    # JUnit carries the same records: one status property and the record per test case
    junit = (pytester.path / "j.xml").read_text()
    assert junit.count('name="pagedattn_status" value="passed"') == len(report["cases"])
    assert junit.count('name="pagedattn" value=') == len(report["cases"])
    assert set(report["target"]) >= {"backend", "backend_version", "runs_on", "device", "torch", "triton", "profile"}
    assert report["target"]["backend"] == "reference"
    case = next(c for c in report["cases"] if c["family"] == "decode")
    assert set(case) >= {
        "id",
        "family",
        "dtype",
        "status",
        "metrics",
        "nodeid",
        "configuration",
        "operation",
        "message",
        "replay",
        "traceback",
        "duration_s",
    }
    assert case["configuration"].endswith("|plain|attention")
    assert set(case["metrics"]["worst"]) == {
        "seq",
        "token",
        "position",
        "head",
        "channel",
        "value",
        "reference",
        "bound",
    }
    rows = {(r["family"], r["dtype"]): r for r in report["summary"]}
    assert rows[("decode", "fp32")]["passed"] == N_DECODE_FP32 and rows[("gather", "bf16")]["passed"] == 4


def test_xdist_gives_the_serial_outcome(pytester):
    import torch

    from pagedattn.runner import report

    args = (DECODE, "pagedattn.conformance.test_properties", "--backend=reference")
    # the controller starts its workers before it imports torch (Run.device, the header):
    # what it has imported when xdist is about to start them, the header written (not -q)
    pytester.makeconftest(
        """
import sys
def pytest_xdist_setupnodes(config, specs):
    open("controller-torch.txt", "w").write(str("torch" in sys.modules))
"""
    )
    serial = _run_here(pytester, *args, "--report-json=serial.json")
    parallel = _run(pytester, *args, "-n", "2", "--report-json=par.json")
    assert serial.ret == parallel.ret == 0
    assert (pytester.path / "controller-torch.txt").read_text() == "False"

    def outcome(name):
        report = json.loads((pytester.path / name).read_text())
        return sorted((c["nodeid"], c["status"]) for c in report["cases"]), report["summary"], report["target"]

    s_cases, s_summary, s_target = outcome("serial.json")
    p_cases, p_summary, p_target = outcome("par.json")
    assert s_cases == p_cases and len(s_cases) > 20
    assert s_summary == p_summary
    # the controller's default device, picked late, is the serial run's
    assert (
        s_target["device"] == p_target["device"] == report.device_name("cuda" if torch.cuda.is_available() else "cpu")
    )


@pytest.mark.slow  # an xdist run's processes, 9-16 s: CI's second step
def test_the_controller_imports_in_the_background_where_a_core_is_spare(pytester):
    """-n 1 on a host of 2 cores or more: the controller's background imports start after the
    worker (``plugin.pytest_sessionstart``: nothing imported when xdist sets up its nodes) and
    end by the run's end. (That the imports come from the thread, not the main thread, and the
    plugin's own join are not observed here.)"""
    from pagedattn.runner.workers import usable_cores

    pytester.makeconftest(
        """
import json, sys
def pytest_xdist_setupnodes(config, specs):
    open("at-setup.json", "w").write(json.dumps([m for m in ("torch", "hypothesis") if m in sys.modules]))
def pytest_unconfigure(config):
    from pagedattn.runner.session import RUN_KEY
    run = config.stash.get(RUN_KEY, None)
    if run is not None and run.controller:
        thread = run.preload
        if thread is not None:
            thread.join(60)  # (the plugin joins it too; this hook may run first)
        open("preload.json", "w").write(json.dumps([thread is not None, thread is not None and thread.is_alive()]))
"""
    )
    result = _run(pytester, DECODE, "--backend=reference", "-n", "1", "--report-json=r.json")
    assert result.ret == 0, result.stdout.str()
    assert json.loads((pytester.path / "at-setup.json").read_text()) == []
    started, alive = json.loads((pytester.path / "preload.json").read_text())
    assert started == (usable_cores() >= 2) and not alive  # the plugin's own rule for -n 1
    assert json.loads((pytester.path / "r.json").read_text())["target"]["device"].startswith(("cpu", "cuda"))


LSE = "pagedattn.conformance.test_lse"
WINDOW = "pagedattn.conformance.test_sliding_window"


@pytest.mark.parametrize(
    "cls, text",
    [
        ("LseNotATuple", "paged_attention_lse must return (out, lse)"),
        ("LseHeadsFirst", "log-sum-exp output rejected: shape"),
        ("LseIgnoresSinks", "log-sum-exp outside the error bound"),
    ],
)
def test_the_lse_family_judges_the_lse(pytester, bad, cls, text):
    result = _run_here(pytester, LSE, f"--backend={bad}:{cls}", "--report-json=r.json")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, f"{cls} passed the lse family: {outcomes}"
    result.stdout.fnmatch_lines([f"*{text}*"])
    if cls == "LseIgnoresSinks":  # only the sink case is wrong; the rest pass, the output everywhere
        report = json.loads((pytester.path / "r.json").read_text())
        failed = [c for c in report["cases"] if c["status"] == "failed"]
        assert all("sinks" in c["id"] for c in failed)
        assert all(c["checks"]["output"]["status"] == "passed" for c in failed)


def test_lse_base_passes_and_unclaimed_variants_are_unsupported(pytester, bad):
    result = _run_here(pytester, LSE, f"--backend={bad}:LseBase", "--report-json=r.json")
    assert result.ret == 0
    report = json.loads((pytester.path / "r.json").read_text())
    statuses = {c["id"]: c["status"] for c in report["cases"]}
    assert all(s == "unsupported" for i, s in statuses.items() if "sinks" in i or "alibi" in i or "win" in i)
    assert sum(s == "passed" for s in statuses.values()) >= 5
    result.stdout.fnmatch_lines(["*unsupported: variant sinks not claimed*"])


def test_a_claimed_variant_is_verified_and_its_failure_replays(pytester, bad):
    result = _run_here(pytester, WINDOW, f"--backend={bad}:WindowOffByOne")
    assert result.parseoutcomes().get("failed", 0) >= 1
    path = _replay_path(result)
    again = _run_here(pytester, WINDOW, f"--backend={bad}:WindowOffByOne", "--replay", path)
    again.assert_outcomes(failed=1)
    fixed = _run_here(pytester, WINDOW, f"--backend={bad}:Correct", "--replay", path)
    # the saved case keeps its window: a backend that does not claim it reports it unsupported
    fixed.assert_outcomes(skipped=1)
    fixed.stdout.fnmatch_lines(["*variant sliding_window not claimed*"])


@pytest.mark.slow  # an xdist run's processes, 9-16 s: CI's second step
def test_jit_runs_one_configuration_per_worker_warmed_once_and_import_once(pytester, bad, monkeypatch):
    """Under -n 2 --isolate: the backend file is imported only in the isolation children
    (never in the controller or a worker), each configuration runs on one worker, and
    ``warmup`` runs once per configuration, before its cases."""
    log, warm = pytester.path / "imports.log", pytester.path / "warm.log"
    monkeypatch.setenv("PAGEDATTN_TEST_WARMLOG", str(warm))
    source = (pytester.path / "bad_backends.py").read_text()
    (pytester.path / "bad_backends.py").write_text(
        f"import os\nwith open({str(log)!r}, 'a') as _f:\n"
        "    _f.write(f\"{os.getpid()} {os.environ.get('PYTEST_XDIST_WORKER')}\\n\")\n" + source
    )
    result = _run(pytester, DECODE, f"--backend={bad}:WarmsUp", "-n", "2", "--isolate", "--report-json=r.json")
    result.assert_outcomes(passed=N_DECODE)
    result.stdout.fnmatch_lines(["*--dist loadgroup (each configuration on one worker)*"])
    imports = [line.split() for line in log.read_text().splitlines()]
    assert len(imports) == 2 and len({pid for pid, _ in imports}) == 2, imports  # one isolation child per worker
    assert {w for _, w in imports} == {"gw0", "gw1"}  # none in the controller or in a worker itself
    report = json.loads((pytester.path / "r.json").read_text())
    configurations = {c["configuration"] for c in report["cases"]}
    assert report["configurations"] == len(configurations) > 1
    spread = [k for k in configurations if len({c["worker"] for c in report["cases"] if c["configuration"] == k}) > 1]
    if report["grouping_lost"] is None:
        assert spread == [], spread  # each configuration on one worker
    else:  # pytest >= 9.2 drops xdist's group (pytest-xdist#1386): the run says so, in both reports
        assert "pytest-xdist#1386" in report["grouping_lost"]
        result.stdout.fnmatch_lines(["*warning: --dist loadgroup did not group the cases by configuration*"])
    warmed = [line.split()[1] for line in warm.read_text().splitlines()]
    if report["grouping_lost"] is None:
        assert sorted(warmed) == sorted(configurations)  # each once
    else:  # once per configuration on each worker that ran it
        assert set(warmed) == configurations and all(warmed.count(k) <= 2 for k in configurations), warmed


def _report(nodeid, when, outcome, facts=None, longrepr=None, **extra):
    rep = pytest.TestReport(
        nodeid,
        ("x.py", 0, nodeid),
        {},
        outcome,
        longrepr,
        when,
        user_properties=[("pagedattn", facts)] if facts is not None else [],
    )
    for k, v in extra.items():
        setattr(rep, k, v)
    return rep


def test_the_record_book_decides_every_status_from_reports_and_facts(tmp_path):
    """The one owner of the records: pytest's outcome and the suite's facts decide the
    status (a ``status`` fact is ignored); the file is valid JSON at every step."""
    from pagedattn.runner.case_record import base_record
    from pagedattn.runner.record_book import RecordBook

    path = tmp_path / "r.json"
    book = RecordBook(str(path), header={"schema": "test"})
    book.rerun = lambda rec: f"pytest {rec.nodeid} --isolate"
    ids = {
        s: f"m.py::test_decode[decode-{s}-fp32]@fp32|kv=fp32|d64|bs16|plain|attention"
        for s in ("pass", "warn", "skip", "fail", "hang", "crash", "xfail", "never")
    }
    for nodeid in ids.values():
        book.collected(nodeid)
    book.flush()
    assert {c["status"] for c in json.loads(path.read_text())["cases"]} == {"not_run"}
    for name in ("pass", "warn", "skip", "fail", "hang", "crash", "xfail"):
        book.start(ids[name])
        assert json.loads(path.read_text())["cases"][list(ids).index(name)]["status"] == "crashed"  # written ahead
    book.update(_report(ids["pass"], "call", "passed", {"status": "failed", "metrics": {"budget_used": 0.5}}))
    book.update(_report(ids["warn"], "call", "passed", {"metrics": {"status": "warned", "budget_used": 1.5}}))
    book.update(_report(ids["skip"], "call", "skipped", {}, ("x.py", 1, "Skipped: unsupported: dtype not claimed")))
    book.update(_report(ids["fail"], "call", "failed", {"message": "decode-fail [attention]: bad", "replay": "r"}))
    book.update(_report(ids["hang"], "call", "failed", {"fault": "timed_out", "message": "slow", "replay": "r"}))
    book.update(_report(ids["crash"], "???", "failed", None, "worker 'gw0' crashed while running"))
    book.update(_report(ids["xfail"], "call", "skipped", {}, ("x.py", 1, "xfail"), wasxfail="known"))
    book.stop("never run: the run ended before this case")
    book.flush()
    got = {c["id"]: c for c in json.loads(path.read_text())["cases"]}
    status = {i.split("-")[1]: c["status"] for i, c in got.items()}
    assert status == {
        "pass": "passed",
        "warn": "warned",
        "skip": "unsupported",
        "fail": "failed",
        "hang": "timed_out",
        "crash": "crashed",
        "xfail": "xfailed",
        "never": "not_run",
    }
    assert got["decode-skip-fp32"]["reason"] == "dtype not claimed"
    assert got["decode-never-fp32"]["reason"] == "never run: the run ended before this case"
    assert (
        got["decode-crash-fp32"]["replay"].endswith("--isolate")
        and "rerun with --isolate" in (got["decode-crash-fp32"]["message"])
    )
    assert got["decode-pass-fp32"]["replay"] is None  # the rerun command set at its start is dropped
    # a warned case keeps no trace of the "process died" placeholder written at its start
    assert got["decode-warn-fp32"]["message"] == "" and got["decode-pass-fp32"]["message"] == ""
    assert got["decode-pass-fp32"]["nodeid"] == "m.py::test_decode[decode-pass-fp32]"  # no xdist group suffix
    assert got["decode-pass-fp32"]["configuration"] == "fp32|kv=fp32|d64|bs16|plain|attention"
    rec = base_record("::test_property[mixed-gqa2-bs16-d64-bf16-L50-B4-permuted-fp8_e4m3-determinism]")
    assert json.loads(path.read_text())["complete"] and path.read_text().startswith("{\n")  # the final one indented
    assert (rec.family, rec.dtype) == ("properties", "bf16/fp8_e4m3")
    # a record known only by its node id (a case a killed run never reached) names its operation
    assert base_record("::test_cache_write[cache_write-gqa2-bs1-d64-fp32]").operation == "write_cache"
    assert base_record("::test_gather[gather-gqa2-bs1-d64-fp32]").operation == "gather"
    assert base_record("::test_decode[decode-x-fp32]@fp32|kv=fp32|d64|bs16|plain|lse").operation == "lse"
    assert base_record("::test_decode[decode-x-fp32]").operation == "attention"


@pytest.mark.slow  # an xdist run's processes, 9-16 s: CI's second step
def test_warmup_ahead_compiles_each_kernel_class_once_across_workers(pytester, bad, monkeypatch):
    """``--warmup-ahead=on`` under -n 2: each worker's background thread compiles later kernel
    classes (``pagedattn.runner.warmup``); across both workers no class twice, and the report counts
    what they did. The verdicts are the serial run's."""
    warm = pytester.path / "warm.log"
    monkeypatch.setenv("PAGEDATTN_TEST_WARMLOG", str(warm))
    uid = f"pagedattn-test-{os.getpid()}"
    result = _run(
        pytester,
        DECODE,
        f"--backend={bad}:WarmsUpAhead",
        "-n",
        "2",
        f"--testrunuid={uid}",
        "--warmup-ahead=on",
        "--report-json=r.json",
    )
    result.assert_outcomes(passed=N_DECODE)
    assert not claim_dir(uid).exists(), "the controller left the workers' claim files"
    lines = [line.split() for line in warm.read_text().splitlines()] if warm.exists() else []
    assert lines, "no warm-up ran ahead"
    assert {thread for _, thread, *_ in lines} == {"pagedattn-warmup-ahead"}
    classes = [tuple(rest) for _, _, *rest in lines]
    assert len(classes) == len(set(classes)), f"a kernel class compiled twice: {classes}"
    stats = json.loads((pytester.path / "r.json").read_text())["target"]["warmup_ahead"]
    assert stats["compiled"] == len(lines) and stats["failed"] == 0
    result.stdout.fnmatch_lines([f"*warm-up ahead: {len(lines)} kernel classes compiled beside the cases*"])


@pytest.mark.parametrize(
    "how", [["--warmup-ahead=auto"], ["--warmup-ahead=on", "--isolate"]], ids=["auto-on-cpu", "isolated"]
)
def test_warmup_ahead_is_off_on_the_cpu_by_default_and_under_isolate(pytester, bad, monkeypatch, how):
    warm = pytester.path / "warm.log"
    monkeypatch.setenv("PAGEDATTN_TEST_WARMLOG", str(warm))
    result = _run_here(pytester, DECODE, f"--backend={bad}:WarmsUpAhead", "--device=cpu", *how, "--report-json=r.json")
    result.assert_outcomes(passed=N_DECODE)
    assert not warm.exists()
    assert json.loads((pytester.path / "r.json").read_text())["target"]["warmup_ahead"] is None


def test_the_record_book_writes_only_changed_cases_anew_and_the_same_json(tmp_path):
    """A flush in progress re-encodes only the records changed since the last one; the file
    is exactly the report encoded whole (non-finite metrics as strings included)."""
    from pagedattn.runner.case_record import clean
    from pagedattn.runner.record_book import RecordBook

    path = tmp_path / "r.json"
    book = RecordBook(str(path), header=lambda: {"schema": "test", "cases_seen": len(book.case_dicts())})
    ids = [f"m.py::test_decode[decode-{n}-fp32]@fp32|kv=fp32|d64|bs16|plain|attention" for n in range(4)]
    for nodeid in ids:
        book.collected(nodeid)
    for n, nodeid in enumerate(ids):
        book.start(nodeid)
        assert path.read_text() == json.dumps(clean(book.report()))
        encoded = dict(book._texts)
        book.update(_report(nodeid, "call", "passed", {"metrics": {"budget_used": float("nan") if n == 1 else 0.5}}))
        book.flush()
        assert path.read_text() == json.dumps(clean(book.report()))
        changed = {k for k in ids if book._texts[k] != encoded[k]}
        assert changed == {nodeid}, changed  # only the case that finished
    assert json.loads(path.read_text())["cases"][1]["metrics"]["budget_used"] == "nan"


def test_warmup_ahead_starts_after_deselection_and_not_when_only_collecting(pytester, bad, monkeypatch):
    warm = pytester.path / "warm.log"
    monkeypatch.setenv("PAGEDATTN_TEST_WARMLOG", str(warm))
    only = _run_here(
        pytester, DECODE, f"--backend={bad}:WarmsUpAhead", "--device=cpu", "--collect-only", "--warmup-ahead=on"
    )
    assert only.ret == 0 and not warm.exists()
    result = _run_here(
        pytester, DECODE, f"--backend={bad}:WarmsUpAhead", "--device=cpu", "--warmup-ahead=on", "-k", "bf16"
    )
    assert result.ret == 0
    configurations = {line.split()[2] for line in warm.read_text().splitlines()}
    assert configurations and all(c.startswith("bf16") for c in configurations), configurations


def test_a_process_killed_by_its_warmup_ahead_says_so_in_the_crashed_case(pytester, bad):
    """A compile that kills the process lands under whichever case runs then: its crash
    message says the warm-up ahead was on, and how to put the crash on its own case."""
    result = _run(
        pytester,
        DECODE,
        f"--backend={bad}:DiesWarmingUpAhead",
        "--device=cpu",
        "--warmup-ahead=on",
        "--report-json=r.json",
    )
    assert result.ret != 0
    report = json.loads((pytester.path / "r.json").read_text())
    crashed = [c for c in report["cases"] if c["status"] == "crashed"]
    assert len(crashed) == 1 and "warm-up ahead was compiling beside it" in crashed[0]["message"], crashed
    assert "--warmup-ahead=off" in crashed[0]["message"]


def test_a_worker_crash_says_the_warmup_ahead_was_on_only_where_it_was(tmp_path):
    """Under xdist the report's owner learns from each worker's reports (``AHEAD_KEY``)
    whether that worker's warm-up ahead is compiling beside its cases: a crash of that
    worker carries the hint, a crash of a worker whose walk is over (or never ran) does not;
    a start placeholder goes when its case finishes, hint or not."""
    from types import SimpleNamespace

    from pagedattn.runner.case_record import AHEAD_KEY
    from pagedattn.runner.record_book import CRASH_HINT, RecordBook
    from pagedattn.runner.recording import Recorder
    from pagedattn.runner.session import Run

    book = RecordBook(str(tmp_path / "r.json"), header={"schema": "test"})
    recorder = Recorder.__new__(Recorder)
    recorder.book, recorder.run, recorder.ahead_workers = book, Run(), {}
    ids = [f"m.py::test_decode[decode-{n}-fp32]@fp32|kv=fp32|d64|bs16|plain|attention" for n in range(4)]
    for nodeid in ids:
        book.collected(nodeid)

    def report(nodeid, worker, ahead, *args):
        rep = _report(nodeid, *args)
        rep.node = SimpleNamespace(gateway=SimpleNamespace(id=worker))
        if ahead is not None:
            rep.user_properties.append((AHEAD_KEY, ahead))
        return rep

    book.start(ids[0])
    recorder.pytest_runtest_logreport(report(ids[0], "gw0", True, "call", "passed", {"metrics": {"status": "warned"}}))
    assert book.records[ids[0]].status.value == "warned" and "died" not in book.records[ids[0]].message
    recorder.pytest_runtest_logreport(report(ids[1], "gw1", False, "call", "passed", {"metrics": {}}))
    for nodeid in ids[2:]:
        book.start(nodeid)
    recorder.pytest_runtest_logreport(report(ids[2], "gw1", None, "???", "failed", None, "worker 'gw1' crashed"))
    assert book.records[ids[2]].status.value == "crashed" and CRASH_HINT not in book.records[ids[2]].message
    recorder.pytest_runtest_logreport(report(ids[3], "gw0", None, "???", "failed", None, "worker 'gw0' crashed"))
    assert book.records[ids[3]].status.value == "crashed" and book.records[ids[3]].message.endswith(CRASH_HINT)


def test_a_serial_crash_carries_the_hint_only_while_the_walk_is_on(tmp_path):
    """In one process the plugin sets the hint when the walk starts and the walk's end
    clears it: a crash after the walk is worded like any other."""
    from pagedattn.runner import warmup as ahead
    from pagedattn.runner.record_book import CRASH_HINT, RecordBook

    book = RecordBook(str(tmp_path / "r.json"), header={"schema": "test"})
    book.crash_hint = CRASH_HINT
    walk = ahead.WarmupAhead(object(), "cpu", [], on_end=lambda: setattr(book, "crash_hint", ""))
    walk.start()
    walk._thread.join(10)
    assert not walk.walking() and book.crash_hint == ""
    book.collected("m.py::test_decode[decode-x-fp32]")
    book.start("m.py::test_decode[decode-x-fp32]")
    assert CRASH_HINT not in book.records["m.py::test_decode[decode-x-fp32]"].message


@pytest.mark.slow  # an xdist run's processes, 9-16 s: CI's second step
def test_workers_killed_by_their_warmup_ahead_lose_no_case(pytester, bad):
    """Under -n 2 every worker's warm-up kills it after its second case (xdist replaces it,
    and the replacement dies the same way): every case is still accounted for, passed or
    crashed, each crash worded with the hint (the worker's reports said its walk was on);
    the dead workers' claims (zombies until reaped) hold no case up."""
    result = _run(
        pytester,
        DECODE,
        f"--backend={bad}:DiesWarmingUpAhead",
        "-n",
        "2",
        "--device=cpu",
        "--warmup-ahead=on",
        "--report-json=r.json",
    )
    assert result.ret != 0
    report = json.loads((pytester.path / "r.json").read_text())
    statuses = [c["status"] for c in report["cases"]]
    assert len(statuses) == N_DECODE and set(statuses) <= {"passed", "crashed"} and "crashed" in statuses
    for case in report["cases"]:
        if case["status"] == "crashed":
            assert "warm-up ahead was compiling beside it" in case["message"], case["message"]


def test_a_usage_error_is_not_reported_as_a_death(pytester):
    """A backend that cannot be loaded is a usage error, with a report being written: the
    watch that speaks when the process dies (a segfault) stays silent, where it used to say
    the process died and to rerun with --isolate."""
    result = _run(pytester, DECODE, "--backend=nosuch_module.nowhere:B", f"--report-json={pytester.path / 'r.json'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*importing*failed*"])
    assert "died" not in result.stderr.str() and "--isolate" not in result.stderr.str(), result.stderr.str()


@pytest.mark.parametrize(
    "backend, workers, says",
    [
        ("nosuch_module.nowhere:B", [], "importing 'nosuch_module.nowhere' failed"),
        # under -n 2 the controller finds the unknown module before it starts the workers ...
        ("nosuch_module.nowhere:B", ["-n", "2"], "no module named 'nosuch_module'"),
        # ... and what only the workers can find (an attribute) comes back from their failed start
        # (two workers importing torch: 11 s on 2 cores, in CI's second step)
        pytest.param(
            "pagedattn.adapters.reference:Nope", ["-n", "2"], "has no attribute 'Nope'", marks=pytest.mark.slow
        ),
    ],
    ids=["serial", "controller", "workers"],
)
def test_a_backend_that_cannot_load_is_a_usage_error_in_the_report_too(pytester, backend, workers, says):
    """A CI job reading the JSON report sees why no case ran: exit status 4 there and from
    pytest, the error in ``error`` and on the terminal in one line, serial or under -n 2 (where
    the workers load the backend: it used to be every worker's traceback and exit status 5)."""
    result = _run(pytester, DECODE, f"--backend={backend}", *workers, f"--report-json={pytester.path / 'r.json'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["exit_status"] == 4 and report["error"].startswith("usage error: --backend="), report["error"]
    assert says in report["error"], report["error"]
    assert says in result.stdout.str() + result.stderr.str()
    assert report["counts"]["passed"] == 0 and report["complete"]
    from pagedattn.__main__ import print_report

    assert print_report(str(pytester.path / "r.json")) == 1  # a CI job gating on the report fails too


def test_a_workers_failed_start_is_told_in_one_line():
    """What a pytest-xdist worker's failed start leaves (its traceback) as the report's error: the
    usage error's message, with the exception of an import it wraps, else the last line."""
    from pagedattn.runner.recording import _startup_failure

    tb = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in f\n'
        "_pytest.config.exceptions.UsageError: --backend=m:B: importing 'm' failed:\n"
        'Traceback (most recent call last):\n  File "m.py", line 1\nImportError: libfoo.so: cannot open\n'
    )
    assert (
        _startup_failure(tb) == "usage error: --backend=m:B: importing 'm' failed: ImportError: libfoo.so: cannot open"
    )
    assert (
        _startup_failure("Traceback:\nRuntimeError: CUDA error") == "a worker failed to start: RuntimeError: CUDA error"
    )
    assert _startup_failure("") == "a worker failed to start: no reason given"
    # an import failing with a bare exception, chained under the usage error: the exception's name
    bare = (
        "_pytest.config.exceptions.UsageError: --backend=b:B: importing 'b' failed:\n"
        "Traceback (most recent call last):\nImportError\n\n"
        "During handling of the above exception, another exception occurred:\n"
        "pytest.UsageError: --backend=b:B: importing 'b' failed:\n"
    )
    assert _startup_failure(bare) == "usage error: --backend=b:B: importing 'b' failed: ImportError"


def test_the_spec_is_checked_only_where_the_workers_see_what_the_controller_sees():
    from pagedattn.runner.workers import workers_share_this_process

    assert workers_share_this_process(None) and workers_share_this_process(["popen", "4*popen"])
    for tx in ("popen//chdir=/tmp", "2*popen//python=python3.12", "ssh=host//python=python3", "socket=1.2.3.4:8888"):
        assert not workers_share_this_process(["popen", tx]), tx


def test_a_workers_failed_start_is_the_runs_error_only_where_no_worker_started():
    """pytest-xdist replaces a worker that went down (a crash mid-run, at the end of a run), and
    the replacement may fail to start (its backend: a GPU still held by the dead worker). With no
    worker started, that failure is the run's error and a usage error exits 4; where another
    worker collected and ran cases, it is a warning (``worker_start_failure``) and the verdicts and
    exit status are the cases'. A healthy worker's finish does not erase a failure seen before."""
    from types import SimpleNamespace

    from pagedattn.runner.record_book import RecordBook
    from pagedattn.runner.recording import Recorder, finish
    from pagedattn.runner.session import Run
    from pagedattn.runner.status import Status

    config = SimpleNamespace(getoption=lambda name, default=None: "load")
    tb = "Traceback (most recent call last):\n_pytest.config.exceptions.UsageError: --backend=m:B: CUDA error\n"

    def node(worker, info=None):
        out = {"pagedattn_info": info, "pagedattn_broken": ""} if info else {}
        return SimpleNamespace(gateway=SimpleNamespace(id=worker), workerinput={"workerid": worker}, workeroutput=out)

    def session(status):
        opts = SimpleNamespace(getoption=lambda name, default=None: False)
        return SimpleNamespace(config=opts, exitstatus=status, shouldstop=False, shouldfail=False)

    # no worker started: every one failed, and so did their replacements
    run = Run(spec="m:B", controller=True)
    book = RecordBook()
    rec = Recorder(config, run, book)
    for worker in ("gw0", "gw1", "gw2"):
        rec.pytest_testnodedown(node(worker), tb)
    done = session(pytest.ExitCode.NO_TESTS_COLLECTED)
    finish(done, run, book)
    assert run.broken == "usage error: --backend=m:B: CUDA error" and done.exitstatus == pytest.ExitCode.USAGE_ERROR

    # gw0 collected and ran its cases; its replacement-to-be gw2 failed to start; gw1 finished well
    run = Run(spec="m:B", controller=True)
    book = RecordBook()
    rec = Recorder(config, run, book)
    rec.pytest_xdist_node_collection_finished(node("gw0"), ["t.py::a"])
    book.records["t.py::a"].status = Status.PASSED  # as its report would have made it
    rec.pytest_testnodedown(node("gw0"), "Traceback (most recent call last):\nFatal Python error: Aborted")
    assert not run.start_failure, "a worker that collected and then went down did not fail to start"
    rec.pytest_testnodedown(node("gw2"), tb)
    rec.pytest_testnodedown(node("gw1", info={"name": "m", "capabilities": {}}), None)
    assert run.start_failure.startswith("usage error: ") and not run.broken
    done = session(pytest.ExitCode.OK)
    finish(done, run, book)
    assert not run.broken and done.exitstatus == pytest.ExitCode.OK

    # a constructor crash a worker reported (its ``pagedattn_broken``) is not erased by a later one
    run = Run(spec="m:B", controller=True)
    rec = Recorder(config, run, RecordBook())
    rec.pytest_xdist_node_collection_finished(node("gw0"), ["t.py::a"])
    out = {"pagedattn_info": {"name": "m"}, "pagedattn_broken": "constructing the backend crashed"}
    rec.pytest_testnodedown(SimpleNamespace(gateway=SimpleNamespace(id="gw0"), workerinput={}, workeroutput=out), None)
    rec.pytest_testnodedown(node("gw1", info={"name": "m"}), None)
    assert run.broken == "constructing the backend crashed"


def test_a_backend_spec_is_checked_without_importing_the_backend(tmp_path):
    """``spec_problem`` (the controller's check before it starts the workers) names an unknown
    entry point, a missing file and an unknown top-level module, and imports nothing to do so."""
    import sys

    from pagedattn.runner.backend_spec import spec_problem

    assert spec_problem("reference") is None and spec_problem("pagedattn.adapters.reference:ReferenceBackend") is None
    assert "unknown backend. Available:" in spec_problem("nosuch")
    assert "does not exist" in spec_problem(str(tmp_path / "nofile.py") + ":B")
    assert "no module named 'nosuch_top'" in spec_problem("nosuch_top.sub:B")
    import types

    sys.modules["spec_injected_mod"] = types.ModuleType("spec_injected_mod")  # a plugin's: no __spec__
    try:
        assert spec_problem("spec_injected_mod:B") is None
    finally:
        del sys.modules["spec_injected_mod"]
    (tmp_path / "spec_probe_mod.py").write_text("raise SystemExit('imported')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert spec_problem("spec_probe_mod:B") is None and "spec_probe_mod" not in sys.modules
    finally:
        sys.path.remove(str(tmp_path))


def test_a_constructor_that_exits_is_not_reported_as_a_death(pytester):
    """A backend whose constructor raises ``SystemExit`` (or a Ctrl-C while it is being built)
    ends the process without a session finish: the watch is released at unconfigure and stays
    silent; only a real death (a segfault, an abort) skips that and is reported."""
    pytester.makepyfile(exits="class B:\n    def __init__(self):\n        raise SystemExit(3)\n")
    pytester.syspathinsert()
    result = _run(pytester, DECODE, "--backend=exits:B", f"--report-json={pytester.path / 'r.json'}")
    assert result.ret != 0
    assert "died" not in result.stderr.str() and "--isolate" not in result.stderr.str(), result.stderr.str()
