"""A replay file is checked when loaded: a query holding a non-finite value (which no
generator draws) is one usage error naming the file and the field."""

import pytest
import torch

from pagedattn.cases import grid, save_case


@pytest.mark.parametrize(
    "poison", [float("nan"), pytest.param(float("inf"), marks=pytest.mark.slow)], ids=["nan", "inf"]
)
def test_a_replay_whose_query_is_not_finite_is_a_usage_error(pytester, bad, poison):
    spec = grid("quick", "decode")[0]
    case = spec.build()
    path = str(pytester.path / "damaged.pt")
    save_case(case.replace(query=torch.full_like(case.query, poison)), path, id=spec.id, family="decode")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--report-json=r.json", "--pyargs", "pagedattn.conformance.test_decode",
        f"--backend={bad}:Correct", "--replay", path,
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR, f"exit status {result.ret}, want 4 (usage error)"
    stderr = result.stderr.str()
    n = case.query.numel()
    assert f"--replay={path}: query holds {n} non-finite value(s) of {n}" in stderr, stderr[-2000:]
    assert "INTERNALERROR" not in stderr, stderr[-2000:]
