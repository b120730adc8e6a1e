"""The contrib adapters for vLLM's and SGLang's Triton kernels, against stand-ins.

The packages are absent here, so ``tests/standins`` (pure torch, written from the
packages' signatures and argument conventions) stands in for them: these tests check the
adapters' mapping (layouts, index lists, windows, scales, sinks) and their declared
limits, not the real kernels' numerics (docs/variants.md).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
import torch

from pagedattn.adapters.loading import load_backend
from pagedattn.cases import CaseSpec
from pagedattn.cases.grid import grid
from pagedattn.oracle.verdict import check_attention
from tests.asserts import assert_equal

STANDINS = Path(__file__).parent / "standins"
ADAPTERS = {
    "vllm_unified": ("pagedattn.adapters.contrib.vllm", "VllmUnifiedBackend", "vllm"),
    "vllm_mla_decode": ("pagedattn.adapters.contrib.vllm", "VllmMLADecodeBackend", "vllm"),
    "sglang_decode": ("pagedattn.adapters.contrib.sglang", "SGLangDecodeBackend", "sglang"),
    "sglang_extend": ("pagedattn.adapters.contrib.sglang", "SGLangExtendBackend", "sglang"),
}


@pytest.fixture
def standins(monkeypatch):
    """The stand-in packages on ``sys.path`` for one test, forgotten afterwards."""
    monkeypatch.syspath_prepend(str(STANDINS))
    yield
    for name in list(sys.modules):
        if name.split(".")[0] in ("vllm", "sglang", "standin_attention"):
            del sys.modules[name]


def _backend(name: str, **kwargs):
    module, cls, _ = ADAPTERS[name]
    return getattr(importlib.import_module(module), cls)(**kwargs)


def _run(backend, case):
    """The adapter's output on ``case`` judged by the policy with the backend's declared terms."""
    caps = backend.capabilities
    out = backend.paged_attention(case)
    return check_attention(out, case, precision=caps.fp32_precision, tolerance_factor=caps.tolerance_factor)


def _claimed(backend, profile: str = "quick"):
    """``(id, case)`` for every case of the profile's grid the backend claims, in grid order."""
    out = []
    for spec in grid(profile):
        case = spec.build()
        if backend.capabilities.case_reason(case) is None:
            out.append((spec.id, case))
    return out


# ------------------------------------------------------------------ lazy imports
@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_adapter_module_imports_without_its_package_and_the_constructor_says_what_to_install(name, monkeypatch):
    module, cls, package = ADAPTERS[name]
    mod = importlib.import_module(module)  # never fails: the package is imported in the constructor
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == package else real(n, *a))
    with pytest.raises(ImportError, match=f"{package} is not installed: pip install {package}"):
        getattr(mod, cls)()


# ------------------------------------------------------------------ declared limits
def test_declared_limits(standins):
    vllm = _backend("vllm_unified")
    assert "batch_invariance" not in vllm.capabilities.invariances
    assert "2D launch or its 3D" in vllm.capabilities.invariance_reason("batch_invariance")
    assert vllm.capabilities.fp32_precision == "tf32" and "standin" in vllm.version
    decode = _backend("sglang_decode")
    assert decode.capabilities.decode_only and decode.capabilities.qk_precision == "input"
    assert decode.capabilities.declared_on == "decode_mha"
    prefill = CaseSpec("t", ((20, 20),), dtype=torch.float32).build()
    assert "decode-only" in decode.capabilities.case_reason(prefill)
    with pytest.raises(ValueError, match="query_lens"):
        decode.paged_attention(prefill)  # a direct caller gets a clear error, not a wrong answer
    extend = _backend("sglang_extend")
    assert {"alibi_slopes", "fp8_e4m3"}.isdisjoint(extend.capabilities.variants)
    with pytest.raises(ValueError, match="claims"):
        _backend("sglang_extend", claims="everything")


def test_vllm_block_table_covers_the_kernels_last_tile(standins):
    backend = _backend("vllm_unified")
    case = CaseSpec("t", ((33, 1), (5, 1)), block_size=16, dtype=torch.float32).build()
    bt = backend.block_table(case)
    # the kernel loads the table entry of every key of its last 32-key tile: keys 0..63
    assert bt.shape[1] * case.block_size >= 64 and bt.dtype == torch.int32
    assert_equal(
        bt[:, : case.block_tables.shape[1]], case.block_tables.to(torch.int32), "the padded table's first columns"
    )


def test_sglang_split_count_depends_only_on_the_request():
    from pagedattn.adapters.contrib.sglang import MAX_KV_SPLITS, split_count

    assert [split_count(n) for n in (1, 32, 33, 64, 10_000)] == [1, 1, 2, 2, MAX_KV_SPLITS]


# ------------------------------------------------------------- the claimed quick profile
def _representative(backend):
    """The first claimed case of each attention family of the quick grid and of each window
    size (built lazily: building the whole grid costs more than running a few)."""
    seen, out = set(), []
    for spec in grid("quick"):
        key = (spec.family, spec.sliding_window)
        if key in seen or spec.family in ("gather", "cache_write"):
            continue
        case = spec.build()
        if backend.capabilities.case_reason(case) is None:
            seen.add(key)
            out.append((spec.id, case))
    return out


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_adapter_passes_representative_claimed_cases_against_the_standin(name, standins):
    backend = _backend(name)
    cases = _representative(backend)
    assert len(cases) >= 5, f"{name} claims too little of the quick grid: {[c for c, _ in cases]}"
    failed = {case_id: r.budget_used for case_id, case in cases if not (r := _run(backend, case)).passed}
    assert not failed, f"{name} failed {failed}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_adapter_passes_every_claimed_quick_case_against_the_standin(name, standins):
    backend = _backend(name)
    cases = _claimed(backend)
    failed = {case_id: r.budget_used for case_id, case in cases if not (r := _run(backend, case)).passed}
    assert not failed, f"{name} failed {failed} of {len(cases)}"


def test_a_decode_only_kernel_serves_a_ragged_batch_through_decode_rows(standins):
    from pagedattn.adapters.layouts import to_decode_rows

    decode = _backend("sglang_decode")
    case = CaseSpec("t", ((20, 20), (37, 5), (9, 1)), block_size=4, sinks=True, dtype=torch.float32).build()
    assert decode.capabilities.case_reason(case) is not None  # multi-token: not claimed as such
    rows = to_decode_rows(case)
    assert decode.capabilities.case_reason(rows) is None
    out = decode.paged_attention(rows)  # row t of the flattened batch is token t of the original
    assert check_attention(out, case, precision="tf32").passed


# ------------------------------------------------------------- mapping bugs are caught
WINDOW = CaseSpec("t", ((40, 40), (50, 9)), block_size=4, sliding_window=8, dtype=torch.float32)
WINDOW_DECODE = CaseSpec("t", ((33, 1), (40, 1), (5, 1)), block_size=16, sliding_window=16, dtype=torch.float32)


@pytest.mark.parametrize(
    "name, spec, converter, wrong",
    [
        ("vllm_unified", WINDOW, "window_to_flash_attn", lambda w: (-1, -1) if w is None else (w, 0)),
        ("sglang_extend", WINDOW, "window_to_flashinfer", lambda w: -1 if w is None else w),
    ],
    ids=["vllm-window-as-W", "sglang-extend-window-as-W"],
)
def test_a_window_passed_as_W_instead_of_W_minus_1_fails(name, spec, converter, wrong, standins, monkeypatch):
    backend, case = _backend(name), spec.build()
    assert backend.capabilities.case_reason(case) is None and _run(backend, case).passed
    monkeypatch.setattr(sys.modules[ADAPTERS[name][0]], converter, wrong)
    result = _run(backend, case)
    assert not result.passed and result.budget_used > 10, result.budget_used


def test_a_decode_window_one_key_too_wide_fails(standins):
    backend, case = _backend("sglang_decode"), WINDOW_DECODE.build()
    assert _run(backend, case).passed
    # the adapter keeps the last W slots; keeping W + 1 (the window as FlashInfer's W - 1 read as W) fails
    wide = backend.paged_attention(case.replace(sliding_window=case.sliding_window + 1))
    assert not check_attention(wide, case, precision="tf32").passed


def test_sglang_extend_window_of_one_is_excluded_and_would_fail(standins):
    case = CaseSpec("t", ((20, 1), (9, 3)), block_size=3, sliding_window=1, dtype=torch.float32).build()
    honest, signature = _backend("sglang_extend"), _backend("sglang_extend", claims="signature")
    assert "W = 1" in honest.capabilities.case_reason(case)
    assert signature.capabilities.case_reason(case) is None
    assert not _run(signature, case).passed  # sliding_window_size 0 means "no window" to the kernel


# ------------------------------------------------------------------ loading a file
def test_an_adapter_file_imports_its_sibling_helpers(tmp_path):
    (tmp_path / "my_helpers.py").write_text("SCALE_NAME = 'scale'\n")
    (tmp_path / "my_adapter.py").write_text(
        "from my_helpers import SCALE_NAME\n"
        "from pagedattn import Capabilities\n"
        "from pagedattn.adapters.reference import ReferenceBackend\n\n"
        "class Backend(ReferenceBackend):\n"
        "    name = 'sibling-' + SCALE_NAME\n"
    )
    before = list(sys.path)
    try:
        backend = load_backend(f"{tmp_path / 'my_adapter.py'}:Backend")
    finally:
        sys.modules.pop("my_helpers", None)
    assert backend.name == "sibling-scale"
    assert sys.path == before, "the adapter's directory must leave sys.path once the file is loaded"


# ------------------------------------------------------------------ through the plugin
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_the_suite_runs_each_adapter_by_its_module_path(name, pytester, monkeypatch):
    """The route a user takes: ``--backend=package.module:Class``, the package on the path."""
    import json

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(STANDINS), os.environ.get("PYTHONPATH", "")]))
    module, cls, _ = ADAPTERS[name]
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--pyargs",
        "pagedattn.conformance",
        f"--backend={module}:{cls}",
        "--report-json=r.json",
        "-k",
        "decode or window or sinks",
    )
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["target"]["backend"] == name and "standin" in report["target"]["backend_version"]
    statuses = {c["status"] for c in report["cases"]}
    assert "passed" in statuses and "failed" not in statuses, result.stdout.str()[-3000:]
