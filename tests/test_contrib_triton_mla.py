"""The contrib Triton adapters on MLA's latent cache, value caches of another width and tree
masks, against the stand-ins (tests/standins): the conventions of docs/variants.md ("vLLM and
SGLang Triton kernels: MLA and custom masks"), and that a wrong conversion fails.

The stand-ins compute from the kernels' documented conventions, so these tests check the
adapters' mapping (which columns are the values, the mask's layout, the page size), not the
kernels' numerics (the real kernels run with ``TRITON_INTERPRET=1`` or on a GPU).
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from pagedattn.adapters.capabilities import policy_for
from pagedattn.adapters.contrib.sglang import sglang_custom_mask
from pagedattn.cases import CaseSpec
from pagedattn.cases.grid import grid
from pagedattn.oracle.verdict import check_attention, check_attention_lse
from tests.test_contrib_triton import STANDINS

ADAPTERS = {
    "sglang_decode": ("pagedattn.adapters.contrib.sglang", "SGLangDecodeBackend"),
    "sglang_extend": ("pagedattn.adapters.contrib.sglang", "SGLangExtendBackend"),
    "vllm_mla_decode": ("pagedattn.adapters.contrib.vllm", "VllmMLADecodeBackend"),
}
#: DeepSeek V3's absorbed decode: 512 latent columns then 64 rotary ones, its softmax scale
MLA_DIM, MLA_DIM_V, MLA_SCALE = 576, 512, 0.1352


@pytest.fixture(autouse=True)
def standins(monkeypatch):
    """The stand-in packages on ``sys.path`` for each test, forgotten afterwards."""
    monkeypatch.syspath_prepend(str(STANDINS))
    yield
    for name in list(sys.modules):
        if name.split(".")[0] in ("vllm", "sglang", "standin_attention"):
            del sys.modules[name]


def _backend(name: str, **kwargs):
    module, cls = ADAPTERS[name]
    return getattr(importlib.import_module(module), cls)(**kwargs)


def _judge(backend, case, out=None):
    """The policy's verdict on ``out`` (the backend's output when None) with the backend's
    declared terms for this case."""
    out = backend.paged_attention(case) if out is None else out
    return check_attention(out, case, **policy_for(backend.capabilities, case))


def mla_case(seqs, num_heads=16, block_size=16, dtype=torch.float32, **kw):
    """A latent-cache case: one kv head of 576 columns, values its first 512 (a view)."""
    spec = CaseSpec(
        "t",
        seqs,
        num_heads=num_heads,
        num_kv_heads=1,
        head_dim=MLA_DIM,
        head_dim_v=MLA_DIM_V,
        mla=True,
        scale=MLA_SCALE,
        block_size=block_size,
        dtype=dtype,
        **kw,
    )
    case = spec.build()
    assert case.shared_kv and "mla" in case.variants
    return case


def head_dim_v_case(seqs, head_dim=96, head_dim_v=64, **kw):
    """Separate caches: keys of ``head_dim`` columns, values of ``head_dim_v``."""
    case = CaseSpec("t", seqs, head_dim=head_dim, head_dim_v=head_dim_v, dtype=torch.float32, **kw).build()
    assert not case.shared_kv and "head_dim_v" in case.variants
    return case


def tree_case(seqs, **kw):
    """A multi-token case with a random tree mask per sequence (history all visible), one of
    them no chain (a chain is causal attention, which a mask read as causal would pass)."""
    case = CaseSpec("t", seqs, tree_mask=True, dtype=torch.float32, **kw).build()
    masks = [case.tree_mask_of(b) for b in range(case.num_seqs)]
    assert any(not torch.equal(m, torch.ones_like(m).tril()) for m in masks if m is not None)
    return case


MLA_DECODE = ((37, 1), (5, 1), (64, 1), (130, 1))
TREE = ((20, 5), (9, 9), (40, 7))


# ------------------------------------------------------------------ claims
def test_claims():
    decode, extend, vllm = (_backend(n) for n in ADAPTERS)
    assert {"mla", "head_dim_v"} <= decode.capabilities.variants and "tree_mask" not in decode.capabilities.variants
    assert {"mla", "head_dim_v", "tree_mask"} <= extend.capabilities.variants
    assert {"mla", "head_dim_v"} <= vllm.capabilities.variants and vllm.capabilities.decode_only
    assert "lse" in vllm.capabilities.operations
    assert "batch_invariance" not in vllm.capabilities.invariances
    case = mla_case(MLA_DECODE, dtype=torch.float16)
    for backend in (decode, vllm):
        assert backend.capabilities.case_reason(case) is None
        # 16 query heads on one latent head: the grouped path, q.k through tl.dot, judged as fp32 products
        assert policy_for(backend.capabilities, case)["qk_precision"] == "fp32"


def test_vllm_fp8_latent_cache_with_its_own_v_scale_is_excluded():
    vllm = _backend("vllm_mla_decode")
    fp8 = mla_case(MLA_DECODE[:2], kv_dtype=torch.float8_e4m3fn, k_scale=0.37, v_scale=1.9)
    assert "k_scale" in vllm.capabilities.case_reason(fp8)
    same = mla_case(MLA_DECODE[:2], kv_dtype=torch.float8_e4m3fn, k_scale=0.37, v_scale=0.37)
    assert vllm.capabilities.case_reason(same) is None and _judge(vllm, same).passed


def test_vllm_mla_splits_as_its_backend_picks_them():
    from pagedattn.adapters.contrib.vllm import mla_num_kv_splits

    assert [mla_num_kv_splits(n, None) for n in (1, 511, 1024, 1536, 5000)] == [1, 1, 2, 4, 16]
    assert mla_num_kv_splits(100_000, 4) == 8


# ------------------------------------------------------------------ against the stand-ins
@pytest.mark.parametrize("name", ["sglang_decode", "vllm_mla_decode", "sglang_extend"])
@pytest.mark.parametrize("block_size", [1, 16])
def test_latent_cache_passes_against_the_standin(name, block_size):
    backend = _backend(name)
    case = mla_case(MLA_DECODE, block_size=block_size)
    assert backend.capabilities.case_reason(case) is None
    result = _judge(backend, case)
    assert result.passed, f"{name} on a latent cache, block size {block_size}: budget {result.budget_used}"


def test_latent_cache_prefill_passes_against_the_extend_standin():
    backend = _backend("sglang_extend")
    case = mla_case(((40, 40), (50, 9), (7, 1)), block_size=4)
    assert _judge(backend, case).passed


@pytest.mark.parametrize("name", ["sglang_decode", "vllm_mla_decode"])
def test_value_cache_of_another_width_passes_against_the_standin(name):
    backend = _backend(name)
    case = head_dim_v_case(((37, 1), (5, 1), (64, 1)), num_heads=8, num_kv_heads=2, block_size=4)
    assert _judge(backend, case).passed
    single = head_dim_v_case(((37, 1), (5, 1)), num_heads=2, num_kv_heads=2, block_size=4)  # one head per kv head
    assert _judge(backend, single).passed


def test_vllm_lse_against_the_standin():
    backend = _backend("vllm_mla_decode")
    case = mla_case(MLA_DECODE, logits_soft_cap=30.0)
    out, lse = backend.paged_attention_lse(case)
    checks = check_attention_lse(out, lse, case, **policy_for(backend.capabilities, case))
    assert all(c.passed for c in checks), [c.budget_used for c in checks]


def test_tree_mask_passes_against_the_extend_standin():
    backend = _backend("sglang_extend")
    case = tree_case(TREE, block_size=4, sinks=True)
    assert backend.capabilities.case_reason(case) is None
    assert _judge(backend, case).passed


def test_the_quick_profile_mla_and_tree_mask_cases_pass_against_the_standins():
    """Every claimed case of the quick grid's MLA and tree-mask families, and the decode forms
    of the multi-token ones on the decode-only kernels (as the suite judges them)."""
    from pagedattn.adapters.layouts import to_decode_rows

    backends = {name: _backend(name) for name in ADAPTERS}
    cases = [(spec.id, spec.build()) for spec in grid("quick") if spec.family in ("mla", "tree_mask")]
    assert cases, "the quick grid has no mla or tree_mask family"
    ran, failed = set(), {}
    for name, backend in backends.items():
        for case_id, case in cases:
            if backend.capabilities.decode_only and case.tree_mask is None and max(case.query_lens) > 1:
                case_id, case = f"{case_id}-as-decode", to_decode_rows(case)
            if backend.capabilities.case_reason(case) is None:
                ran.add(case_id.removesuffix("-as-decode"))
                if not (result := _judge(backend, case)).passed:
                    failed[f"{name}:{case_id}"] = result.budget_used
    assert not failed, f"failed {failed}"
    # on the interpreter bf16 is not claimed, and SGLang's extend kernel takes no fp8
    expected = {i for i, c in cases if c.dtype != torch.bfloat16 and "fp8" not in i}
    assert expected and expected <= ran, f"not run: {sorted(expected - ran)}"


# ------------------------------------------------------------------ wrong conversions fail
def _last_columns(buf, head_dim_v):
    return buf[..., buf.shape[-1] - head_dim_v :]


def test_sglang_values_from_the_wrong_columns_fail(monkeypatch):
    backend, case = _backend("sglang_decode"), mla_case(MLA_DECODE)
    assert _judge(backend, case).passed
    monkeypatch.setattr(sys.modules["pagedattn.adapters.contrib.sglang"], "mla_value_buffer", _last_columns)
    result = _judge(backend, case)
    assert not result.passed and result.budget_used > 10, result.budget_used


def test_vllm_values_from_the_wrong_columns_fail_where_the_kernel_reads_them(monkeypatch):
    """The grouped kernel takes MLA's values from the K tile (``is_mla``): ``v_buffer``'s data
    matters on the one-head-per-kv-head path, where a wrong view fails."""
    backend, case = _backend("vllm_mla_decode"), mla_case(MLA_DECODE, num_heads=1)
    assert _judge(backend, case).passed
    monkeypatch.setattr(sys.modules["pagedattn.adapters.contrib.vllm"], "mla_value_view", _last_columns)
    assert not _judge(backend, case).passed


def _transposed(case):
    """Each tree mask transposed (a token sees its descendants)."""
    mask, indptr = sglang_custom_mask(case)
    out = []
    for b, (q, n) in enumerate(zip(case.query_lens, case.seq_lens.tolist())):
        m = mask[indptr[b] : indptr[b + 1]].view(q, n).clone()
        m[:, n - q :] = m[:, n - q :].T.clone()
        out.append(m.flatten())
    return torch.cat(out), indptr


def _new_tokens_only(case):
    """FlashInfer-like misreading: ``[q, q]`` per request, no history columns."""
    masks = [case.tree_mask_of(b).flatten() for b in range(case.num_seqs)]
    sizes = torch.tensor([0] + [len(m) for m in masks]).cumsum(0).to(torch.int32)
    return torch.cat(masks), sizes


@pytest.mark.parametrize("wrong", [_transposed, _new_tokens_only], ids=["transposed", "without-history-columns"])
def test_a_wrong_custom_mask_fails(wrong, monkeypatch):
    backend, case = _backend("sglang_extend"), tree_case(TREE, block_size=4)
    assert _judge(backend, case).passed
    monkeypatch.setattr(sys.modules["pagedattn.adapters.contrib.sglang"], "sglang_custom_mask", wrong)
    result = _judge(backend, case)
    assert not result.passed and result.budget_used > 10, result.budget_used


@pytest.mark.parametrize("name", ["sglang_decode", "vllm_mla_decode"])
def test_head_blocks_that_straddle_two_kv_heads_are_excluded(name):
    """The grouped decode kernels' 16-head blocks: 40 heads on 2 kv heads puts heads 16-31 in one
    block with kv head 0, so heads 20-31 read the wrong kv head (seen on the real kernels under the
    interpreter); 32 on 2 and 48 on 3 are multiples of 16 and fine."""
    honest, signature = _backend(name), _backend(name, claims="signature")
    straddle = CaseSpec("t", ((40, 1),), num_heads=40, num_kv_heads=2, dtype=torch.float32).build()
    assert "straddles" in honest.capabilities.case_reason(straddle)
    assert signature.capabilities.case_reason(straddle) is None
    for heads, kv_heads in ((32, 2), (48, 3), (40, 1), (24, 3)):
        case = CaseSpec("t", ((40, 1),), num_heads=heads, num_kv_heads=kv_heads, dtype=torch.float32).build()
        assert honest.capabilities.case_reason(case) is None, (heads, kv_heads)
