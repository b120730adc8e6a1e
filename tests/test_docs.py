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
