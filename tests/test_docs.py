"""The adapter written only from docs/writing-an-adapter.md works with the suite."""

import re
from pathlib import Path

DOC = Path(__file__).parent.parent / "docs" / "writing-an-adapter.md"


def test_adapter_from_the_docs_passes_the_suite(pytester):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1, "the page should hold exactly one complete adapter"
    path = pytester.path / "my_adapter.py"
    path.write_text(blocks[0])
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--pyargs",
        "pagedattn.conformance.test_decode",
        "pagedattn.conformance.test_continuation",
        "pagedattn.conformance.test_layout",
        f"--backend={path}:FlashInferStyleBackend",
    )
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes["passed"] >= 40, result.stdout.str()[-3000:]
    assert "failed" not in outcomes


def test_readme_commands_are_what_ci_runs():
    readme = (DOC.parent.parent / "README.md").read_text()
    ci = (DOC.parent.parent / ".ci" / "run").read_text()
    test_cmd = re.findall(r"```sh\n(.*?)\n```", readme, flags=re.S)[1]
    assert test_cmd.strip() in ci.replace("pip install -q ", "pip install ").replace("  ", " ") or (
        test_cmd.replace("pip install ", "pip install -q ").strip() in ci
    ), f"README test command {test_cmd!r} is not what .ci/run runs"
    main_cmd = re.findall(r"```sh\n(.*?)\n```", readme, flags=re.S)[0]
    assert "pytest conformance --backend=" in main_cmd


# ------------------------------------------------------------------ docs/ci.md
CI_DOC = DOC.parent / "ci.md"
CI_WORKFLOW = DOC.parent / "ci" / "github-actions.yml"
#: options docs/ci.md names that other changes register; emptied once they are merged
PENDING: set[str] = set()


def _options(text):
    """The long options (``--name``) ``text`` names, values dropped."""
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


def _ci_commands():
    """docs/ci.md's shell commands and the workflow's ``run`` steps, continuation lines joined."""
    import yaml

    doc = [b.replace("\\\n", " ") for b in re.findall(r"```sh\n(.*?)```", CI_DOC.read_text(), flags=re.S)]
    steps = [s.get("run") for job in yaml.safe_load(CI_WORKFLOW.read_text())["jobs"].values() for s in job["steps"]]
    commands = [line.strip() for block in doc + [s for s in steps if s] for line in block.splitlines()]
    return [c for c in commands if c]


def test_ci_doc_and_workflow_use_only_options_that_exist():
    """Every option docs/ci.md and its workflow give pytest is one pytest, pytest-xdist or the
    plugin registers (read from ``pytest --help``), unless it is listed in ``PENDING``; every
    ``python -m pagedattn`` subcommand is one its usage names."""
    import subprocess
    import sys

    help_text = subprocess.run(
        [sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"], capture_output=True, text=True, check=True
    ).stdout
    registered = _options(help_text)
    assert {"--backend", "--report-json", "--search-examples", "--numprocesses"} <= registered
    commands = _ci_commands()
    pytest_runs = [c for c in commands if c.startswith("python -m pytest ")]
    assert len(pytest_runs) == 4, f"want the CPU and GPU jobs in the doc and the workflow: {pytest_runs}"
    used = set().union(*(_options(c) for c in pytest_runs)) | (_options(CI_DOC.read_text()) - PENDING)
    assert not used - registered, f"options that no plugin registers: {sorted(used - registered)}"
    assert not PENDING & registered, f"registered now: drop them from PENDING: {sorted(PENDING & registered)}"
    for c in pytest_runs:
        assert " -n 2 " in c and "--search-budget=none" in c and "--pyargs pagedattn.conformance " in c, c
    usage = subprocess.run([sys.executable, "-m", "pagedattn", "--help"], capture_output=True, text=True)
    reports = [c for c in commands if c.startswith("python -m pagedattn ")]
    assert len(reports) == 4 and all(c.split()[3] == "report" for c in reports), reports
    assert "report FILE" in usage.stdout + usage.stderr, usage
