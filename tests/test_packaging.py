"""Packaging: the wheel installs (not editable) into a fresh virtualenv and runs the suite;
``python -m pagedattn`` tells a newcomer what will run; xdist workers spread over GPUs."""

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from pagedattn.plugin import worker_device

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize(
    "device, worker, count, expected",
    [
        ("cuda", "gw0", 4, "cuda:0"),
        ("cuda", "gw5", 4, "cuda:1"),
        ("cuda", "gw3", 8, "cuda:3"),
        ("cuda", "gw2", 1, "cuda"),  # one GPU: every worker shares it
        ("cuda:1", "gw0", 4, "cuda:1"),  # an explicit index wins
        ("cpu", "gw1", 4, "cpu"),
        ("cuda", None, 4, "cuda"),  # a serial run
    ],
)
def test_worker_device_assignment(device, worker, count, expected):
    assert worker_device(device, worker, count) == expected


def test_python_m_pagedattn_lists_what_runs_here():
    proc = subprocess.run([sys.executable, "-m", "pagedattn"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("pagedattn ") and "torch " in out and "triton " in out and "device: " in out
    for name in ("reference", "sdpa", "tlsim", "triton"):
        assert f"  {name} " in out, out
    assert "runs here" in out
    # what each backend claims of the variants, on its own line
    assert "variants alibi_slopes, fp8_e4m3, fp8_e5m2, logits_soft_cap, sinks, sliding_window" in out
    assert (
        "variants alibi_slopes, fp8_e4m3, fp8_e5m2, fp8_per_head_scales, head_dim_v, mla, sliding_window, tree_mask"
        in out
    )  # sdpa
    assert "variants: no per-head fp8 scales" in out  # tlsim and triton say why they do not claim it


def _source_copy(tmp_path: Path) -> Path:
    """The source tree without build leftovers: building in the checkout itself would leave
    an egg-info there that shadows the installed metadata (entry points) for the checkout."""
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".tox", "build", "dist", "*.egg-info", "__pycache__", ".pagedattn", ".hypothesis"
        ),
    )
    return src


@pytest.mark.slow  # builds a wheel and a venv: CI runs it in its second step (-m slow)
def test_wheel_installs_and_runs_the_suite(tmp_path):
    dist = tmp_path / "dist"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(_source_copy(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next(dist.glob("pagedattn_conformance-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = str(env_dir / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "PYTHONPATH", "TRITON"))}
    # torch from this machine's local CPU build (pip finds it on disk); the rest from the index or cache
    for args in (["torch==2.13.0"], ["numpy", "pytest", "hypothesis"], ["--no-deps", str(wheel)]):
        proc = subprocess.run(
            [py, "-m", "pip", "install", "-q", *args], capture_output=True, text=True, env=env, timeout=900
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    run = subprocess.run(
        [
            py,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--pyargs",
            "pagedattn.conformance",
            "--backend=reference",
            "--profile=quick",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "pagedattn conformance: reference" in run.stdout
    where = subprocess.run(
        [py, "-c", "import pagedattn, pagedattn.conformance as c; print(c.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert str(env_dir) in where.stdout, f"not the installed copy: {where.stdout}"


def test_sdist_builds(tmp_path):
    pytest.importorskip("build", reason="sdist building needs the 'build' package (test extra)")
    src = _source_copy(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # setuptools >= 69.3 names it pagedattn_conformance-*, older ones pagedattn-conformance-*
    sdists = list(tmp_path.glob("pagedattn?conformance-*.tar.gz"))
    assert len(sdists) == 1, f"want one pagedattn-conformance sdist, found {sorted(p.name for p in tmp_path.iterdir())}"
    sdist = sdists[0]
    import tarfile

    names = tarfile.open(sdist).getnames()
    assert any(n.endswith("conformance/test_decode.py") for n in names)
    assert any(n.endswith("pagedattn/py.typed") for n in names)


class _NeedsAbsentPackage:
    """A contrib adapter whose third-party package is absent: its constructor says so."""

    def __init__(self):
        raise ImportError("flashinfer is not installed: pip install flashinfer-python")


class _FakeEntryPoint:
    name = "absentpkg"
    value = "tests.test_packaging:_NeedsAbsentPackage"

    def load(self):
        return _NeedsAbsentPackage


def test_python_m_pagedattn_lists_an_absent_package_as_not_installed(monkeypatch):
    from pagedattn import __main__ as main
    from pagedattn.adapters import loading

    known = dict(loading.available_backends(), absentpkg=_FakeEntryPoint())
    monkeypatch.setattr(loading, "available_backends", lambda: known)
    lines = main.report()
    assert any(
        line.split() == "absentpkg not installed: flashinfer is not installed: pip install flashinfer-python".split()
        for line in lines
    ), lines
    assert any(line.split()[:3] == ["reference", "runs", "here:"] for line in lines)


def test_python_m_pagedattn_report_prints_a_report_table(tmp_path, capsys):
    from pagedattn import __main__ as main
    from pagedattn.runner.case_record import CaseRecord, Status
    from pagedattn.runner.record_book import RecordBook

    book = RecordBook(str(tmp_path / "r.json"), header={"target": {"backend": "x", "runs_on": "x (cpu)"}})
    book.records["a"] = CaseRecord(
        "a", "decode-a-fp32", "decode", "fp32", status=Status.PASSED, metrics={"budget_used": 0.25}
    )
    book.records["b"] = CaseRecord(
        "b",
        "decode-b-fp32",
        "decode",
        "fp32",
        status=Status.CRASHED,
        message="decode-b-fp32 [attention]: the backend process was killed by SIGSEGV",
        replay="pytest conformance --replay x.pt",
    )
    book.records["c"] = CaseRecord("c", "decode-c-fp32", "decode", "fp32")  # not_run
    book.running.add("b")
    book.flush()
    assert main.main(["report", str(tmp_path / "r.json")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(line.split() == ["decode", "fp32", "1", "0", "0", "0", "1", "1", "0.25", "-"] for line in out), out
    assert "3 cases: 1 crashed, 1 not_run, 1 passed" in out
    assert any(line.startswith("the run did not finish; it died while running b") for line in out)
    assert "  replay: pytest conformance --replay x.pt" in out
    (tmp_path / "bad.json").write_text("{")
    assert main.main(["report", str(tmp_path / "bad.json")]) == 2


def test_pagedattn_version_names_the_package_version(capsys):
    from pagedattn import __main__ as main
    from pagedattn import __version__

    assert main.main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"pagedattn {__version__}", f"`pagedattn --version` printed {out!r}"
    assert main.main(["--bogus"]) == 2, "an unknown argument is a usage error"
