"""A result is owned before the backend is called again: a nondeterministic backend that
returns a view of one buffer it rewrites on every call (a CUDA graph's static output) fails
determinism, batch invariance and placement invariance, in process and under --isolate
(where the child's tensors arrive by value, never in memory the child can still write)."""

import json

import pytest
import torch
from pagedattn.conformance.test_properties import SPECS

from pagedattn.runner.suite import owned

PROPS = "pagedattn.conformance.test_properties"
PROP_SPECS = [s.id for s in SPECS("quick") if s.family == "mixed" and s.dtype == torch.float32]
INVARIANCES = {"determinism", "batch_invariance", "placement_invariance"}


@pytest.mark.parametrize("mode", [[], ["--isolate"]], ids=["plain", "isolate"])
def test_a_reused_output_buffer_fails_the_invariances(pytester, bad, mode):
    args = ["-p", "no:cacheprovider", "--report-json=r.json", "--pyargs", PROPS, "-k", "mixed and fp32"]
    result = pytester.runpytest_subprocess(*args, f"--backend={bad}:ReusesOutputBuffer", *mode)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, f"exit status {result.ret}, want 1 (the invariances fail)"
    cases = json.loads((pytester.path / "r.json").read_text())["cases"]
    assert len(cases) == len({c["nodeid"] for c in cases}) == 6 * len(PROP_SPECS), [c["nodeid"] for c in cases]
    statuses = {c["property"]: c["status"] for c in cases}
    failed = {p for p, s in statuses.items() if s == "failed"}
    assert failed == INVARIANCES, f"failed properties {sorted(failed)}, want {sorted(INVARIANCES)}: {statuses}"
    for c in cases:
        if c["status"] == "failed":
            assert c["replay"].startswith("pytest ") and "--replay" in c["replay"], f"no replay for {c['nodeid']}"
    determinism = next(c for c in cases if c["property"] == "determinism")
    assert "different bits" in determinism["message"], determinism["message"]


def test_owned_copies_tensors_in_results_and_keeps_the_rest():
    buffer = torch.zeros(4)
    out, lse = owned((buffer[:2], buffer[2:]))
    buffer.fill_(1.0)
    assert out.tolist() == [0.0, 0.0] and lse.tolist() == [0.0, 0.0], "owned() returned views of the buffer"
    assert owned("not a tensor") == "not a tensor"
