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
import os
import sys
from pathlib import Path

import pytest
import torch

from pagedattn import PagedCase
from pagedattn.adapters import layouts
from pagedattn.adapters.capabilities import Capabilities
from pagedattn.cases.grid import grid
from pagedattn.oracle import bits_equal
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
from pagedattn.adapters.contrib.flashinfer_mla import FlashInferMLABackend


def _on_cpu(backend, **changes):
    backend.capabilities = dataclasses.replace(backend.capabilities, devices=frozenset({"cpu"}), **changes)
    return backend


def flashinfer_cpu():
    return _on_cpu(FlashInferBackend())


def flashinfer_mla_cpu():
    return _on_cpu(FlashInferMLABackend())


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
    # the stand-ins, then this checkout's pagedattn (not whichever one is installed)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(STANDINS), str(STANDINS.parent.parent)]))
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


def _shuffled_tables(seq_lens, block_size, g) -> tuple[torch.Tensor, int]:
    """``[B, max blocks]`` int32 tables over a permuted pool with two spare blocks, and the pool's size."""
    blocks = [-(-L // block_size) for L in seq_lens]
    perm = torch.randperm(sum(blocks) + 2, generator=g).to(torch.int32)
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    at = 0
    for b, n in enumerate(blocks):
        tables[b, :n] = perm[at : at + n]
        at += n
    return tables, sum(blocks) + 2


def _decode_case(seq_lens, query_lens, *, dtype=torch.bfloat16, heads=(4, 2), head_dim=64, block_size=16, **variants):
    """A small case with shuffled physical blocks; ``variants`` go to ``PagedCase``."""
    g = torch.Generator().manual_seed(0)
    Hq, Hkv = heads
    tables, num_blocks = _shuffled_tables(seq_lens, block_size, g)
    pool = (num_blocks, block_size, Hkv, head_dim)
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


#: DeepSeek V3's softmax scale: 192 ** -0.5 (the head dim before absorption) times YaRN's mscale squared
MLA_SCALE = 0.1352


def _mla_case(seq_lens, query_lens, *, dtype=torch.bfloat16, heads=16, block_size=16):
    """Absorbed-form MLA: latent cache ``[N, bs, 1, 576]``, the value cache its first 512 columns."""
    g = torch.Generator().manual_seed(0)
    tables, num_blocks = _shuffled_tables(seq_lens, block_size, g)
    latent = torch.randn(num_blocks, block_size, 1, 576, generator=g).to(dtype)
    return PagedCase(
        query=torch.randn(sum(query_lens), heads, 576, generator=g).to(dtype),
        key_cache=latent,
        value_cache=latent[..., :512],
        block_tables=tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor([0, *query_lens], dtype=torch.int32).cumsum(0).to(torch.int32),
        scale=MLA_SCALE,
    )


def _tree_masks(query_lens, seed=0) -> torch.Tensor:
    """A tree mask per sequence (diagonal True, nothing above it, about half the ancestors), concatenated."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for q in query_lens:
        m = torch.tril(torch.rand(q, q, generator=g) < 0.5)
        m.fill_diagonal_(True)
        parts.append(m.reshape(-1))
    return torch.cat(parts)


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


def _family_verdicts(family: str, operation: str, mla: bool = False) -> list[bool]:
    """Runs the adapter (``flashinfer_mla`` if ``mla``) on every quick-profile case of ``family`` it
    claims (on the CPU): passed or not."""
    from pagedattn.adapters.contrib.flashinfer import FlashInferBackend
    from pagedattn.adapters.contrib.flashinfer_mla import FlashInferMLABackend

    backend = FlashInferMLABackend() if mla else FlashInferBackend()
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


# ------------------------------------------------------------------ MLA (flashinfer_mla)
MLA_FAMILY = "mla"
TREE_FAMILY = "tree_mask"


def test_flashinfer_mla_claims_the_latent_split_and_nothing_else(standins):
    from pagedattn.adapters.contrib.flashinfer_mla import FlashInferMLABackend

    caps = dataclasses.replace(FlashInferMLABackend().capabilities, devices=frozenset({"cpu"}))
    case = _mla_case([9, 40], [1, 1])
    assert caps.case_reason(case) is None, caps.case_reason(case)
    assert "head_dim" in (caps.case_reason(_decode_case([9], [1])) or ""), caps.case_reason(_decode_case([9], [1]))
    fp32 = _mla_case([9], [1], dtype=torch.float32)
    assert "dtype float32 not claimed" in (caps.case_reason(fp32) or ""), caps.case_reason(fp32)
    capped = case.replace(logits_soft_cap=5.0)
    assert "logits_soft_cap" in (caps.case_reason(capped) or ""), caps.case_reason(capped)
    reason = caps.invariance_reason("batch_invariance") or ""
    assert "MLAPlan" in reason, f"batch invariance should be declined with its reason, got {reason!r}"
    assert caps.partials_precision == "input", caps.partials_precision


def test_the_flashinfer_backend_leaves_mla_to_the_mla_wrapper(standins):
    from pagedattn.adapters.contrib.flashinfer import FlashInferBackend

    caps = dataclasses.replace(FlashInferBackend().capabilities, devices=frozenset({"cpu"}))
    assert not {"mla", "head_dim_v"} & caps.variants and "tree_mask" in caps.variants, sorted(caps.variants)
    wide = dataclasses.replace(caps, head_dims=None)  # the variant alone keeps an MLA case out
    reason = wide.case_reason(_mla_case([9], [1])) or ""
    assert "variant mla not claimed" in reason, f"the paged wrappers should not claim an MLA case, got {reason!r}"


@pytest.mark.parametrize(
    ("seq_lens", "query_lens", "block_size"),
    [([9, 40], [1, 1], 16), ([33, 70], [2, 2], 64), ([5, 130, 17], [1, 7, 17], 1)],
    ids=["decode-bs16", "mtp2-bs64", "mixed-bs1"],
)
def test_flashinfer_mla_matches_the_oracle_through_views_of_the_latent_cache(
    standins, monkeypatch, seq_lens, query_lens, block_size
):
    import flashinfer.mla

    from pagedattn.adapters.contrib.flashinfer_mla import FlashInferMLABackend

    seen: dict[str, torch.Tensor] = {}
    cls = flashinfer.mla.BatchMLAPagedAttentionWrapper
    run = cls.run

    def spy(self, q_nope, q_pe, ckv_cache, kpe_cache, *args, **kwargs):
        seen.update(q_pe=q_pe, ckv=ckv_cache, kpe=kpe_cache)
        return run(self, q_nope, q_pe, ckv_cache, kpe_cache, *args, **kwargs)

    monkeypatch.setattr(cls, "run", spy)
    case = _mla_case(seq_lens, query_lens, block_size=block_size)
    before = case.clone()
    out, lse = FlashInferMLABackend().paged_attention_lse(case)
    assert out.shape == (case.num_tokens, case.num_heads, 512) and out.dtype == case.dtype, (out.shape, out.dtype)
    check = check_attention(out, case)
    assert check.passed, f"MLA {seq_lens}/{query_lens}: {check}"
    checks = check_attention_lse(out, lse, case)
    assert all(c.passed for c in checks), f"MLA lse: {checks}"
    # views, not copies: the kernels read the latent cache through its strides
    base, size = case.key_cache.data_ptr(), case.key_cache.element_size()
    assert seen["ckv"].data_ptr() == base and seen["kpe"].data_ptr() == base + 512 * size, "ckv/kpe were copied"
    assert seen["q_pe"].data_ptr() == case.query.data_ptr() + 512 * size, "q_pe was copied"
    for name, t in before.tensors().items():
        assert bits_equal(t, case.tensors()[name]), f"the adapter changed the case's {name}"


def _kpe_first(case):
    """Planted: the rotary part read from the front of each latent row, the compressed part after it."""
    a = layouts.to_flashinfer_mla(case)
    rows = case.key_cache[:, :, 0]
    a["kpe_cache"], a["ckv_cache"] = rows[..., :64], rows[..., 64:]
    return a


def _query_halves_swapped(case):
    """Planted: q_pe taken from the query's first 64 columns."""
    a = layouts.to_flashinfer_mla(case)
    a["q_pe"], a["q_nope"] = case.query[..., :64], case.query[..., 64:]
    return a


def _default_scale(case):
    """Planted: 576 ** -0.5 (the absorbed head dim's default) instead of the model's scale."""
    return {**layouts.to_flashinfer_mla(case), "sm_scale": 576**-0.5}


@pytest.mark.parametrize("planted", [_kpe_first, _query_halves_swapped, _default_scale], ids=lambda f: f.__name__)
def test_the_mla_family_passes_and_catches_a_latent_layout_slip(standins, monkeypatch, planted):
    assert all(_family_verdicts(MLA_FAMILY, "attention", mla=True)), "the MLA adapter as shipped fails an mla case"
    import pagedattn.adapters.contrib.flashinfer_mla as adapter

    monkeypatch.setattr(adapter, "to_flashinfer_mla", planted)
    assert not all(_family_verdicts(MLA_FAMILY, "attention", mla=True)), f"{planted.__name__} passed every mla case"


def test_the_mla_lse_is_converted_from_base_2(standins, monkeypatch):
    assert all(_family_verdicts(MLA_FAMILY, "lse", mla=True)), "the MLA adapter as shipped fails an mla lse"
    import pagedattn.adapters.contrib.flashinfer_mla as adapter

    monkeypatch.setattr(adapter, "lse_from_log2", lambda lse2: lse2)  # the planted bug
    assert not all(_family_verdicts(MLA_FAMILY, "lse", mla=True)), "a base-2 MLA lse passed every mla case"


# ------------------------------------------------------------------ tree masks (prefill custom_mask)
@pytest.mark.parametrize(
    ("seq_lens", "query_lens", "variants"),
    [
        ([9, 40], [1, 1], {}),
        ([9, 40], [4, 6], {}),
        ([12, 40], [5, 3], {"logits_soft_cap": 5.0}),
        ([12, 40], [5, 3], {"kv_dtype": torch.float8_e4m3fn, "k_scale": 0.37, "v_scale": 1.9}),
    ],
    ids=["decode", "tree", "tree-softcap", "tree-fp8"],
)
def test_flashinfer_tree_mask_runs_the_masked_prefill_and_matches_the_oracle(
    standins, monkeypatch, seq_lens, query_lens, variants
):
    import flashinfer

    from pagedattn.adapters.contrib.flashinfer import FlashInferBackend

    planned: list[dict] = []
    cls = flashinfer.BatchPrefillWithPagedKVCacheWrapper
    plan = cls.plan

    def spy(self, *args, **kwargs):
        planned.append(kwargs)
        return plan(self, *args, **kwargs)

    monkeypatch.setattr(cls, "plan", spy)
    backend = FlashInferBackend()
    case = _decode_case(seq_lens, query_lens, tree_mask=_tree_masks(query_lens), **variants)
    assert backend.route(case) == "prefill", backend.route(case)
    out, lse = backend.paged_attention_lse(case)
    check = check_attention(out, case)
    assert check.passed, f"tree mask {query_lens} {variants}: {check}"
    checks = check_attention_lse(out, lse, case)
    assert all(c.passed for c in checks), f"tree mask lse: {checks}"
    kwargs = planned[-1]
    mask = kwargs.get("custom_mask")
    assert kwargs.get("causal") is False and mask is not None and mask.dtype == torch.bool, kwargs
    assert mask.numel() == sum(q * n for q, n in zip(query_lens, seq_lens)), mask.numel()


def test_flashinfer_excludes_a_tree_mask_with_sinks(standins):
    from pagedattn.adapters.contrib.flashinfer import FlashInferBackend

    caps = dataclasses.replace(FlashInferBackend().capabilities, devices=frozenset({"cpu"}))
    case = _decode_case([12, 40], [5, 3], tree_mask=_tree_masks([5, 3]), sinks=torch.zeros(4))
    reason = caps.case_reason(case) or ""
    assert "drops a custom mask" in reason, f"sinks + tree mask should be excluded, got {reason!r}"


def _causal_instead(tree_mask, query_lens, seq_lens):
    """Planted: the causal mask handed over in place of the tree."""
    chains = torch.cat([torch.ones(q, q, dtype=torch.bool).tril().reshape(-1) for q in query_lens])
    return layouts.tree_mask_to_flashinfer(chains, query_lens, seq_lens)


def _transposed(tree_mask, query_lens, seq_lens):
    """Planted: each sequence's tree read column-major (token j sees i instead of i sees j)."""
    parts, at = [], 0
    for q in query_lens:
        parts.append(tree_mask[at : at + q * q].view(q, q).T.reshape(-1))
        at += q * q
    return layouts.tree_mask_to_flashinfer(torch.cat(parts), query_lens, seq_lens)


def _history_hidden(tree_mask, query_lens, seq_lens):
    """Planted: the mask over the new tokens' columns only, the cached history hidden."""
    mask = layouts.tree_mask_to_flashinfer(tree_mask, query_lens, seq_lens)
    starts = layouts.flashinfer_mask_indptr(query_lens, seq_lens).tolist()
    for b, (q, n) in enumerate(zip(query_lens, seq_lens)):
        mask[starts[b] : starts[b + 1]].view(q, n)[:, : n - q] = False
    return mask


@pytest.mark.parametrize("planted", [_causal_instead, _transposed, _history_hidden], ids=lambda f: f.__name__)
def test_the_tree_mask_family_passes_and_catches_a_mask_slip(standins, monkeypatch, planted):
    assert all(_family_verdicts(TREE_FAMILY, "attention")), "the adapter as shipped fails a tree-mask case"
    import pagedattn.adapters.contrib.flashinfer as adapter

    monkeypatch.setattr(adapter, "tree_mask_to_flashinfer", planted)
    assert not all(_family_verdicts(TREE_FAMILY, "attention")), f"{planted.__name__} passed every tree-mask case"


@pytest.mark.parametrize(
    ("seq_lens", "query_lens", "bitorder", "passes"),
    [([12], [5], "little", True), ([12], [5], "big", False), ([12, 40], [5, 3], "little", False)],
    ids=["one-request-little", "one-request-big", "two-requests-little"],
)
def test_packed_custom_mask_bits_and_offsets_as_0_5_3_reads_them(standins, seq_lens, query_lens, bitorder, passes):
    """Why the adapter hands FlashInfer the bool mask: packed bits must be little-endian, and
    for packed bits 0.5.3's plan() keeps the per-request offsets in elements, which its kernel
    reads as bytes (a second request reads past its bits)."""
    import flashinfer
    from flashinfer.quantization import segment_packbits

    case = _decode_case(seq_lens, query_lens, tree_mask=_tree_masks(query_lens))
    custom = layouts.tree_mask_to_flashinfer(case.tree_mask, query_lens, seq_lens)
    indptr = layouts.flashinfer_mask_indptr(query_lens, seq_lens)
    packed, _ = segment_packbits(custom, indptr, bitorder=bitorder)
    if bitorder == "little":  # our converter packs what FlashInfer's segment_packbits does
        ours, _ = layouts.pack_mask_bits(custom, query_lens, seq_lens)
        assert torch.equal(ours, packed), "pack_mask_bits differs from segment_packbits(bitorder='little')"
    a = layouts.to_flashinfer(case)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(torch.zeros(8, dtype=torch.uint8), "NHD")
    wrapper.plan(
        a["qo_indptr"],
        a["kv_indptr"],
        a["kv_indices"],
        a["kv_last_page_len"],
        case.num_heads,
        case.num_kv_heads,
        case.head_dim,
        case.block_size,
        packed_custom_mask=packed,
        causal=False,
        sm_scale=case.scale,
        q_data_type=case.dtype,
    )
    check = check_attention(wrapper.run(a["q"], a["kv_cache"]), case)
    assert check.passed == passes, f"{bitorder} bits over {len(query_lens)} request(s): passed={check.passed}, {check}"


def test_flashinfer_mla_and_tree_masks_pass_what_they_claim_on_the_standin(pytester, monkeypatch):
    report = _suite(pytester, monkeypatch, "flashinfer_mla_cpu", extra=("-k", "mla"))
    _assert_claims_pass(report, {MLA_FAMILY})
    report = _suite(pytester, monkeypatch, "flashinfer_cpu", extra=("-k", "tree"))
    _assert_claims_pass(report, {TREE_FAMILY})


# ------------------------------------------------------------------ a stand-in quirk, on the real package
@pytest.mark.parametrize(
    ("seq_lens", "query_lens", "packed_passes"),
    [([12], [5], True), ([12, 40], [5, 3], False)],
    ids=["one-request", "two-requests"],
)
def test_the_real_prefill_wrapper_reads_packed_mask_offsets_as_the_standin_does(seq_lens, query_lens, packed_passes):
    """On a GPU with FlashInfer installed: the bool mask passes; packed bits pass for one request
    and not for two (0.5.3's plan() keeps a packed mask's offsets in elements). Skipped elsewhere."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA and FlashInfer: checks a stand-in quirk against the real package")
    flashinfer = pytest.importorskip("flashinfer", reason="flashinfer is not installed: pip install flashinfer-python")
    if "standin" in getattr(flashinfer, "__version__", ""):
        pytest.skip("the stand-in is on sys.path, not the real package")
    case = _decode_case(seq_lens, query_lens, tree_mask=_tree_masks(query_lens)).to("cuda")
    custom = layouts.tree_mask_to_flashinfer(case.tree_mask, query_lens, seq_lens)
    packed, _ = layouts.pack_mask_bits(custom, query_lens, seq_lens)
    a = layouts.to_flashinfer(case)
    verdicts = {}
    for name, mask in (("custom_mask", custom), ("packed_custom_mask", packed)):
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda"), "NHD"
        )
        wrapper.plan(
            a["qo_indptr"],
            a["kv_indptr"],
            a["kv_indices"],
            a["kv_last_page_len"],
            case.num_heads,
            case.num_kv_heads,
            case.head_dim,
            case.block_size,
            causal=False,
            sm_scale=case.scale,
            q_data_type=case.dtype,
            **{name: mask},
        )
        verdicts[name] = check_attention(wrapper.run(a["q"], a["kv_cache"]), case).passed
    assert verdicts == {"custom_mask": True, "packed_custom_mask": packed_passes}, verdicts
