"""The FlashInfer and FlashAttention adapters, checked against stand-ins of their packages.

CI has neither package, so ``tests/standins/`` holds pure-torch stand-ins written from
their documentation (same signatures, layouts and semantics, quirks included: base-2 lse,
``window_left = W - 1``, sinks honoured by one wrapper only, ALiBi slopes from a cache,
FlashAttention's page rule). With them on ``sys.path`` the adapters run the conformance
suite on the CPU; what they claim must pass, and a mapping bug planted in the adapter
must fail. How the real kernels fare is in the docs' conformance matrix.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

from pagedattn import PagedCase
from pagedattn.adapters.capabilities import Capabilities
from pagedattn.cases.grid import grid
from pagedattn.oracle.verdict import check_attention, check_attention_lse

STANDINS = Path(__file__).parent / "standins"
PACKAGES = ("flashinfer", "flash_attn")

# Backends for the suite's subprocess: the adapters as shipped, with the device claim
# moved to the CPU (the stand-ins run there) and, for FlashAttention, its page rule
# lowered in the stand-in and in the claim so that the suite's small pages run.
FACTORIES = """
import dataclasses

from pagedattn.adapters.contrib.flash_attn import FlashAttnBackend
from pagedattn.adapters.contrib.flashinfer import FlashInferBackend


def _on_cpu(backend, **changes):
    backend.capabilities = dataclasses.replace(backend.capabilities, devices=frozenset({"cpu"}), **changes)
    return backend


def flashinfer_cpu():
    return _on_cpu(FlashInferBackend())


def flash_attn_cpu():
    import flash_attn

    flash_attn.PAGE_BLOCK_MULTIPLE = 1
    return _on_cpu(FlashAttnBackend(), block_sizes=None)
"""


@pytest.fixture
def standins(monkeypatch):
    """The stand-in packages importable in this process (and fresh: no module left behind)."""
    monkeypatch.syspath_prepend(str(STANDINS))
    for name in list(sys.modules):
        if name.split(".")[0] in PACKAGES:
            monkeypatch.delitem(sys.modules, name)
    yield
    for name in list(sys.modules):
        if name.split(".")[0] in PACKAGES:
            del sys.modules[name]


def _suite(pytester, monkeypatch, factory: str, *modules: str, extra: tuple[str, ...] = ()) -> dict:
    """Runs the conformance modules against ``factory`` in a subprocess; the JSON report."""
    monkeypatch.setenv("PYTHONPATH", str(STANDINS))
    (pytester.path / "standin_backends.py").write_text(FACTORIES)
    targets = [f"pagedattn.conformance.{m}" for m in modules] if modules else ["pagedattn.conformance"]
    args = ["--pyargs", *targets]
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        *args,
        f"--backend={pytester.path / 'standin_backends.py'}:{factory}",
        "--device=cpu",
        "--report-json=r.json",
        *extra,
    )
    report = json.loads((pytester.path / "r.json").read_text())
    report["_stdout"] = result.stdout.str()[-4000:]
    return report


def _statuses(report: dict, family: str | None = None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for c in report["cases"]:
        if family is None or c["family"] == family:
            out.setdefault(c["status"], []).append(c["id"])
    return out


def _assert_claims_pass(report: dict, families: set[str]) -> None:
    __tracebackhide__ = True
    claimed = set(report["target"]["capabilities"].get("invariances", ()))
    # A suite that does not yet report an unclaimed invariance as unsupported still runs it;
    # its verdict says nothing about a claim (the stand-ins need not be batch invariant)
    cases = [c for c in report["cases"] if c.get("property") not in {"batch_invariance"} - claimed]
    bad = [(c["id"], c.get("property"), c["status"]) for c in cases if c["status"] in ("failed", "error", "crashed")]
    assert not bad, f"claimed cases failed: {bad}\n{report['_stdout']}"
    ran = {c["family"] for c in report["cases"] if c["status"] == "passed"}
    assert families <= ran, f"families {sorted(families - ran)} ran no passing case; passed in {sorted(ran)}"


def _decode_case(seq_lens, query_lens, *, dtype=torch.bfloat16, heads=(4, 2), head_dim=64, block_size=16, **variants):
    """A small case with shuffled physical blocks; ``variants`` go to ``PagedCase``."""
    g = torch.Generator().manual_seed(0)
    Hq, Hkv = heads
    blocks = [-(-L // block_size) for L in seq_lens]
    perm = torch.randperm(sum(blocks) + 2, generator=g).to(torch.int32)
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    at = 0
    for b, n in enumerate(blocks):
        tables[b, :n] = perm[at : at + n]
        at += n
    pool = (sum(blocks) + 2, block_size, Hkv, head_dim)
    kv_dtype = variants.pop("kv_dtype", dtype)
    key = torch.randn(pool, generator=g).to(kv_dtype)
    value = torch.randn(pool, generator=g).to(kv_dtype)
    return PagedCase(
        query=torch.randn(sum(query_lens), Hq, head_dim, generator=g).to(dtype),
        key_cache=key,
        value_cache=value,
        block_tables=tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor([0, *query_lens], dtype=torch.int32).cumsum(0).to(torch.int32),
        **variants,
    )


# ------------------------------------------------------------------ without the packages
@pytest.mark.parametrize(
    ("module", "cls", "message"),
    [
        ("flashinfer", "FlashInferBackend", "flashinfer is not installed: pip install flashinfer-python"),
        ("flash_attn", "FlashAttnBackend", "flash_attn is not installed: pip install flash-attn"),
    ],
)
def test_adapter_module_imports_without_its_package_and_says_what_to_install(monkeypatch, module, cls, message):
    # The module itself imports (lazily); only the constructor needs the package
    monkeypatch.setitem(sys.modules, module, None)  # ``import flashinfer`` now raises ImportError
    adapter = importlib.import_module(f"pagedattn.adapters.contrib.{module}")
    with pytest.raises(ImportError) as info:
        getattr(adapter, cls)()
    assert str(info.value) == message, f"constructor said {str(info.value)!r}, expected {message!r}"


# ------------------------------------------------------------------ claims and routing
def test_flashinfer_claims_state_its_limits_as_data(standins):
    from pagedattn.adapters.contrib.flashinfer import FlashInferBackend

    caps: Capabilities = FlashInferBackend().capabilities
    assert "device 'cpu' not claimed" in (caps.case_reason(_decode_case([9], [1])) or "")
    caps = dataclasses.replace(caps, devices=frozenset({"cpu"}))  # the cases below are built on the CPU
    half = dict(dtype=torch.bfloat16)
    fp32 = _decode_case([9], [1], dtype=torch.float32)
    assert "dtype float32 not claimed" in (caps.case_reason(fp32) or ""), caps.case_reason(fp32)
    cap_alibi = _decode_case([9], [1], logits_soft_cap=5.0, alibi_slopes=torch.full((4,), 0.5), **half)
    reason = caps.case_reason(cap_alibi)
    assert reason and "before the soft-cap" in reason, f"ALiBi + soft-cap should be excluded, got {reason!r}"
    sinks_cap = _decode_case([9], [1], logits_soft_cap=5.0, sinks=torch.zeros(4), **half)
    assert "has no soft-cap" in (caps.case_reason(sinks_cap) or ""), caps.case_reason(sinks_cap)
    assert caps.invariance_reason("batch_invariance") and "decode wrapper" in caps.invariance_reason(
        "batch_invariance"
    ), caps.invariance_reason("batch_invariance")
    assert caps.invariance_reason("determinism") is None and caps.invariance_reason("placement_invariance") is None
    # its soft-cap is tanh.approx.f32: judged by the declared term, and the header says so
    assert caps.tanh_precision == "approx" and "tanh.approx.f32" in caps.notes["tanh_precision"], caps.notes
    assert any("tanh_precision 'approx'" in line for line in caps.limit_lines()), caps.limit_lines()


def test_flash_attn_claims_its_documented_page_rule_and_the_standin_enforces_it(standins):
    import flash_attn

    from pagedattn.adapters.contrib.flash_attn import FlashAttnBackend

    backend = FlashAttnBackend()
    caps = dataclasses.replace(backend.capabilities, devices=frozenset({"cpu"}))
    small, paged = _decode_case([9, 40], [1, 7]), _decode_case([9, 300], [1, 7], block_size=256)
    reason = caps.case_reason(small) or ""
    assert "block_size 16 not claimed" in reason and "a multiple of 256 with a block_table" in reason, reason
    assert caps.case_reason(paged) is None, caps.case_reason(paged)
    assert "variant sinks not claimed" in (caps.case_reason(paged.replace(sinks=torch.zeros(4))) or "")
    with pytest.raises(RuntimeError, match="divisible by 256"):
        backend.paged_attention(small)
    out, lse = backend.paged_attention_lse(paged)
    checks = check_attention_lse(out, lse, paged)
    assert all(c.passed for c in checks), f"flash_attn on 256-token pages: {checks}"
    assert flash_attn.PAGE_BLOCK_MULTIPLE == 256


@pytest.mark.parametrize(
    ("seq_lens", "query_lens", "variants", "route"),
    [
        ([9, 40], [1, 1], {}, "decode"),
        ([9, 40], [1, 7], {}, "prefill"),
        ([9, 40], [9, 40], {}, "prefill"),
        ([9, 40], [1, 1], {"sinks": torch.tensor([0.5, -1.0, 2.0, 0.0])}, "sink"),
    ],
    ids=["decode", "mixed", "prefill", "sinks-decode"],
)
def test_flashinfer_routes_as_engines_do_and_matches_the_oracle(standins, seq_lens, query_lens, variants, route):
    from pagedattn.adapters.contrib.flashinfer import FlashInferBackend

    backend = FlashInferBackend()
    case = _decode_case(seq_lens, query_lens, **variants)
    assert backend.route(case) == route
    out, lse = backend.paged_attention_lse(case)
    check = check_attention(out, case)
    assert check.passed, f"{route}: {check}"
    checks = check_attention_lse(out, lse, case)
    assert all(c.passed for c in checks), f"{route} lse: {checks}"


@pytest.mark.parametrize("query_lens", [[1, 1], [1, 7]], ids=["decode-first", "mixed-first"])
def test_flashinfer_warmup_compiles_every_wrapper_the_configuration_routes_to(standins, monkeypatch, query_lens):
    """The suite warms a configuration up on its first case; later cases of it may route to
    the other wrapper (a pure-decode batch or a mixed one), so the warm-up plans both."""
    import flashinfer

    from pagedattn.adapters.contrib.flashinfer import FlashInferBackend

    planned = []
    for name in ("BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper"):
        cls = getattr(flashinfer, name)
        monkeypatch.setattr(cls, "plan", _spy(cls.plan, planned, name))
    backend = FlashInferBackend()
    case = _decode_case([9, 40], query_lens)
    backend.warmup(case)
    assert sorted(planned) == ["BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper"]
    assert backend._decode_rows(case).query_lens == [1, 1]
    out = backend.paged_attention(case)  # the warm-up left nothing behind that changes a result
    assert check_attention(out, case).passed


def _spy(fn, log, name):
    def plan(self, *args, **kwargs):
        log.append(name)
        return fn(self, *args, **kwargs)

    return plan


def test_flashinfer_alibi_lse_is_moved_to_the_absolute_origin_and_the_slope_cache_restored(standins):
    import flashinfer.utils

    from pagedattn.adapters.contrib.flashinfer import FlashInferBackend

    slopes = torch.tensor([0.0625, 0.25, 0.5, 0.125])
    case = _decode_case([9, 40], [1, 7], alibi_slopes=slopes)
    before = dict(flashinfer.utils._cache_buf)
    out, lse = FlashInferBackend().paged_attention_lse(case)
    checks = check_attention_lse(out, lse, case)
    assert all(c.passed for c in checks), f"ALiBi lse: {checks}"
    assert flashinfer.utils._cache_buf == before, "the adapter left its slopes in FlashInfer's cache"


def test_flashinfer_uses_tensor_cores_where_the_cuda_core_decode_has_no_group_size(standins):
    from pagedattn.adapters.contrib.flashinfer import FlashInferBackend

    case = _decode_case([9, 40], [1, 1], heads=(6, 1))  # GQA 6: no CUDA-core kernel
    check = check_attention(FlashInferBackend().paged_attention(case), case)
    assert check.passed, check


# ------------------------------------------------------------------ the suite, on stand-ins
def test_flashinfer_passes_what_it_claims_on_the_standin(pytester, monkeypatch):
    # the lse and window families run in-process below; the whole profile in the slow test
    report = _suite(pytester, monkeypatch, "flashinfer_cpu", "test_decode", "test_mixed", "test_sinks")
    _assert_claims_pass(report, {"decode", "mixed", "sinks"})


def test_flash_attn_passes_what_it_claims_on_the_standin(pytester, monkeypatch):
    # bf16 only here (fp16 maps identically); the whole profile runs in the slow test below
    report = _suite(
        pytester,
        monkeypatch,
        "flash_attn_cpu",
        "test_decode",
        "test_mixed",
        "test_sliding_window",
        extra=("-k", "bf16"),
    )
    _assert_claims_pass(report, {"decode", "mixed", "sliding_window"})


def _family_verdicts(family: str, operation: str) -> list[bool]:
    """Runs the adapter on every quick-profile case of ``family`` it claims (on the CPU): passed or not."""
    from pagedattn.adapters.contrib.flashinfer import FlashInferBackend

    backend = FlashInferBackend()
    caps = dataclasses.replace(backend.capabilities, devices=frozenset({"cpu"}))
    verdicts = []
    for spec in grid("quick", family):
        case = spec.build()
        if caps.case_reason(case, operation) is None:
            if operation == "lse":
                verdicts.append(all(c.passed for c in check_attention_lse(*backend.paged_attention_lse(case), case)))
            else:
                verdicts.append(check_attention(backend.paged_attention(case), case).passed)
    assert verdicts, f"no {family} case is claimed"
    return verdicts


def test_the_window_family_passes_and_catches_window_left_w_instead_of_w_minus_1(standins, monkeypatch):
    assert all(_family_verdicts("sliding_window", "attention")), "the adapter as shipped fails a window case"
    import pagedattn.adapters.contrib.flashinfer as adapter

    monkeypatch.setattr(adapter, "window_to_flashinfer", lambda w: -1 if w is None else w)  # the planted bug
    assert not all(_family_verdicts("sliding_window", "attention")), "window_left = W passed every window case"


def test_the_lse_family_passes_and_catches_a_base2_lse_handed_back_as_natural(standins, monkeypatch):
    assert all(_family_verdicts("lse", "lse")), "the adapter as shipped fails an lse case"
    import pagedattn.adapters.contrib.flashinfer as adapter

    monkeypatch.setattr(adapter, "lse_from_log2", lambda lse2: lse2)  # the planted bug
    assert not all(_family_verdicts("lse", "lse")), "a base-2 lse passed every lse case"


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["flashinfer_cpu", "flash_attn_cpu"])
def test_adapter_passes_its_whole_quick_profile_on_the_standin(pytester, monkeypatch, factory):
    report = _suite(pytester, monkeypatch, factory)
    _assert_claims_pass(
        report, {"decode", "prefill", "continuation", "gqa", "layout", "mixed", "sliding_window", "lse"}
    )
