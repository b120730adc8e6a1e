"""The Triton kernel's MLA decode (a shared latent cache), its tree-masked prefill and its value
width of its own, on the interpreter (or a GPU), judged by the oracle; and the MLA launch plan's
arithmetic, from sizes alone."""

import dataclasses

import pytest
import torch

from pagedattn.cases import CaseSpec
from pagedattn.cases.variant_families import MLA_SHAPE  # DeepSeek's: one latent kv head of 576, values its first 512
from pagedattn.kernels import launch_plan
from pagedattn.kernels.decode_splits import decode_split
from pagedattn.kernels.tuning import TUNING
from pagedattn.oracle import MLA, TREE_MASK, check_attention_lse
from pagedattn.runner.properties import single_sequence
from tests.asserts import assert_differs, assert_equal
from tests.triton_support import DEVICE, case_args, runs_kernel

MLA_CASES = [
    # 16 heads: one head block; histories under one split, over it (two and three splits)
    CaseSpec("t", ((300, 1), (40, 1), (700, 1)), num_heads=16, block_size=64, dtype=torch.bfloat16, **MLA_SHAPE),
    # 20 heads: two head blocks, the second padded; scattered pages of 16
    CaseSpec("t", ((280, 1), (3, 1)), num_heads=20, block_size=16, layout="permuted", dtype=torch.float16, **MLA_SHAPE),
    CaseSpec("t", ((90, 1), (1, 1)), num_heads=16, block_size=1, dtype=torch.float32, **MLA_SHAPE),
    # an fp8 latent cache (one scale for its shared rows)
    CaseSpec(
        "t",
        ((300, 1), (33, 1)),
        num_heads=16,
        block_size=64,
        kv_dtype=torch.float8_e4m3fn,
        k_scale=0.37,
        v_scale=0.37,
        dtype=torch.bfloat16,
        **MLA_SHAPE,
    ),
]

#: branching draft trees (a chain would equal causal) over histories, beside a decode row
TREE_CASES = [
    CaseSpec(
        "t", ((150, 24), (40, 9), (17, 1)), num_heads=4, num_kv_heads=2, head_dim=32, block_size=8, tree_mask=True
    ),
    CaseSpec(
        "t",
        ((90, 30), (45, 13)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        block_size=13,
        layout="permuted",
        tree_mask=True,
        sinks=True,
        dtype=torch.bfloat16,
    ),
    CaseSpec(
        "t",
        ((120, 10), (60, 6)),
        num_heads=4,
        head_dim=32,
        logits_soft_cap=5.0,
        query_gain=4.0,
        tree_mask=True,
        kv_dtype=torch.float8_e4m3fn,
        k_scale=0.37,
        v_scale=1.9,
        dtype=torch.float16,
    ),
]

#: separate caches whose value width is not the key's (as MLA prefill's 192 / 128, scaled down)
VALUE_WIDTH_CASES = [
    CaseSpec(
        "t",
        ((150, 40), (600, 1), (9, 1)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=48,
        head_dim_v=32,
        block_size=8,
        dtype=dt,
        sinks=True,
    )
    for dt in (torch.float32, torch.bfloat16)
] + [
    CaseSpec(
        "t",
        ((70, 20), (300, 1)),
        num_heads=4,
        head_dim=32,
        head_dim_v=80,
        kv_dtype=torch.float8_e5m2,
        k_scale=0.5,
        v_scale=2.0,
        dtype=torch.float16,
    )
]


def _run(case, tuning=TUNING, **kw):
    """The kernel on ``case`` with every variant it carries, and the lse."""
    from pagedattn.kernels import triton_paged_attention as tpa  # imports triton: only where a kernel runs

    prep = tpa.prepare(
        *case_args(case),
        scale=case.scale,
        logits_soft_cap=case.logits_soft_cap,
        sinks=case.sinks,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
        tree_mask=case.tree_mask,
        return_lse=True,
        tuning=tuning,
        **kw,
    )
    return prep, tpa.run(prep, case.query, case.key_cache, case.value_cache)


def _assert_within_policy(case, what, tuning=TUNING):
    __tracebackhide__ = True
    _, (out, lse) = _run(case, tuning)
    assert out.shape == (case.num_tokens, case.num_heads, case.head_dim_v), f"{what}: output shape {out.shape}"
    c1, c2 = check_attention_lse(out, lse, case)
    assert c1.passed and c2.passed and not (c1.warning or c2.warning), f"{what}:\n{c1}\n{c2}"
    return out, lse


pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")


@runs_kernel
@pytest.mark.parametrize("spec", MLA_CASES, ids=lambda s: s.id)
def test_mla_decode_within_policy(spec):
    case = spec.build().to(DEVICE)
    assert MLA in case.variants and case.shared_kv
    prep, _ = _run(case)
    assert prep.plan.mla, f"{spec.id}: a shared latent cache must take the MLA kernel"
    _assert_within_policy(case, spec.id)


@runs_kernel
def test_mla_splits_merge_within_policy_and_batch_invariant():
    """Short splits (32 keys: up to ten a history) merged by the program that completes the
    count; a sequence computes the same bits alone and beside others (its splits are a rule of
    its own length), and a second launch of the prepared batch the same bits (the counters
    were reset)."""
    t = dataclasses.replace(TUNING, split_short=32, mla_block_n=16)
    spec = CaseSpec("t", ((300, 1), (65, 1), (31, 1)), num_heads=16, block_size=16, dtype=torch.float16, **MLA_SHAPE)
    case = spec.build().to(DEVICE)
    assert decode_split(300, t) == 32
    out, lse = _assert_within_policy(case, f"{spec.id} in splits of 32", t)
    prep, (again, _) = _run(case, t)
    assert_equal(again, out, f"{spec.id}: a second launch")
    assert int(prep.done.abs().sum()) == 0, f"split counters left at {prep.done.tolist()}"
    alone = case.replace(
        query=case.query[:1],
        block_tables=case.block_tables[:1],
        seq_lens=case.seq_lens[:1],
        query_start_loc=case.query_start_loc[:2],
    )
    assert alone.shared_kv
    _, (out_alone, lse_alone) = _run(alone, t)
    assert_equal(out_alone[0], out[0], f"{spec.id}: the first sequence alone against in the batch")
    assert_equal(lse_alone[0], lse[0], f"{spec.id}: the first sequence's lse alone against in the batch")


#: MLA's multi-token sequences (multi-token prediction, tree verification) beside decodes
MLA_MULTI_CASES = [
    CaseSpec("t", ((200, 2), (100, 4), (70, 1)), num_heads=16, block_size=16, dtype=torch.bfloat16, **MLA_SHAPE),
    CaseSpec(
        "t",
        ((150, 9), (40, 5), (33, 1)),
        num_heads=16,
        block_size=16,
        layout="permuted",
        tree_mask=True,
        dtype=torch.float16,
        **MLA_SHAPE,
    ),
    # sinks join each row's denominator once, in the merge (or the one split's finish)
    CaseSpec(
        "t", ((120, 3), (300, 1), (20, 1)), num_heads=16, block_size=16, sinks=True, dtype=torch.bfloat16, **MLA_SHAPE
    ),
]


@runs_kernel
@pytest.mark.parametrize("spec", MLA_MULTI_CASES, ids=lambda s: s.id)
def test_mla_multi_token_within_policy(spec):
    """Several token tiles a sequence (tiles of 2 tokens) over splits of 32 keys, so tiles end
    inside splits, and a tile's later splits hold keys only some of its rows see."""
    t = dataclasses.replace(TUNING, split_short=32, mla_block_n=16, mla_multi_rows=32)
    case = spec.build().to(DEVICE)
    prep, _ = _run(case, t)
    assert prep.plan.mla and prep.plan.other is not None and prep.plan.other.grid[0] >= 2
    out, _ = _assert_within_policy(case, f"{spec.id} in splits of 32", t)
    if case.tree_mask is not None:
        _, (causal, _) = _run(case.replace(tree_mask=None), t)
        assert_differs(out, causal, f"{spec.id}: the tree-masked output against causal")


#: trees past one 64-bit word (a row's bits in three and two words), beside a short tree and a
#: decode: the key tiles (64 keys in the prefill, 32 in the MLA kernel) cross the words' edges
LONG_TREE_CASES = {
    "prefill": CaseSpec(
        "t",
        ((200, 150), (50, 9), (17, 1)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        tree_mask=True,
        dtype=torch.float16,
    ),
    "mla": CaseSpec(
        "t",
        ((170, 70), (40, 5), (33, 1)),
        num_heads=16,
        block_size=16,
        tree_mask=True,
        dtype=torch.bfloat16,
        **MLA_SHAPE,
    ),
}


@runs_kernel
@pytest.mark.parametrize("kernel", ["prefill", "mla"])
def test_trees_past_one_word_within_policy_and_batch_invariant(kernel):
    """A tree of more than 64 tokens reaches the kernels as several words a token; a masked tile
    loads the two words its keys fall in. The batch's words a row follow its longest tree, yet a
    sequence computes the same bits alone (one word a row) as beside the long tree: the width is
    a runtime value, the compiled loop the same."""
    case = LONG_TREE_CASES[kernel].build().to(DEVICE)
    prep, _ = _run(case)
    words = -(-case.query_lens[0] // 64)
    assert prep.tree_words is not None and tuple(prep.tree_words.shape) == (case.num_tokens, words)
    assert prep.plan.mla == (kernel == "mla")
    out, lse = _assert_within_policy(case, f"{kernel}: a tree of {case.query_lens[0]} tokens")
    _, (out_causal, _) = _run(case.replace(tree_mask=None))
    n = case.query_lens[0]
    assert_differs(out[:n], out_causal[:n], f"{kernel}: the long tree against causal")
    b = 1  # the short tree, alone
    lo, hi = case.query_start_loc_list[b], case.query_start_loc_list[b + 1]
    prep_alone, (out_alone, lse_alone) = _run(single_sequence(case, b))
    assert prep_alone.tree_words is not None and prep_alone.tree_words.shape[1] == 1
    assert_equal(out_alone, out[lo:hi], f"{kernel}: the short tree alone against beside a long one")
    assert_equal(lse_alone, lse[lo:hi], f"{kernel}: the short tree's lse alone against beside a long one")


@runs_kernel
def test_tree_tiles_past_64_keys_are_refused_before_a_launch():
    """A masked tile's keys must fall in two of a row's words: a tuning of wider tiles is refused
    at ``prepare``, naming the bound, rather than failing to compile."""
    case = TREE_CASES[1].build().to(DEVICE)  # 16-bit: the prefill_block_n tiles (fp32 has its own)
    with pytest.raises(ValueError, match="at most 64 keys"):
        _run(case, dataclasses.replace(TUNING, prefill_block_n=128))


def test_tree_words_hold_each_tokens_row():
    from pagedattn.kernels.triton_paged_attention import tree_words

    rows = [torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool), torch.ones(1, 1, dtype=torch.bool)]
    mask = torch.cat([m.reshape(-1) for m in rows])
    words = tree_words(mask, [3, 1], [0, 3, 4], torch.device("cpu"))
    assert words.tolist() == [[0b1], [0b11], [0b101], [0b1]], f"tree words {words.tolist()}"
    full = torch.ones(64, 64, dtype=torch.bool).tril().reshape(-1)
    last = tree_words(full, [64], [0, 64], torch.device("cpu"))[-1]
    assert last.tolist() == [-1], f"a 64-token row of ones is every bit of the word, got {last.tolist()}"
    # 100 tokens: two words a row; token 99 sees itself (bit 35 of word 1) and token 0 (bit 0 of word 0)
    tree = torch.eye(100, dtype=torch.bool)
    tree[:, 0] = True
    words = tree_words(
        torch.cat([tree.reshape(-1), torch.ones(1, dtype=torch.bool)]), [100, 1], [0, 100, 101], torch.device("cpu")
    )
    assert tuple(words.shape) == (101, 2)
    assert words[99].tolist() == [1, 1 << 35] and words[64].tolist() == [1, 1], words[[64, 99]].tolist()
    assert words[100].tolist() == [1, 0], f"the decode's row: {words[100].tolist()}"


@runs_kernel
def test_mla_reads_the_rotary_columns_and_the_latent_values():
    """Changing a history's rotary columns changes the scores (the output moves), and the
    latent values are the key's first columns: a zero latent cache with a zero query's rotary
    part gives zero."""
    spec = CaseSpec("t", ((200, 1),), num_heads=16, block_size=16, dtype=torch.float32, **MLA_SHAPE)
    case = spec.build().to(DEVICE)
    _, (out, _) = _run(case)
    k = case.key_cache.clone()
    k[..., 512:] *= 3.0
    _, (moved, _) = _run(case.with_caches(k))
    assert_differs(moved, out, "the output after scaling the rotary columns")
    k[..., :512] = 0.0
    _, (zero, _) = _run(case.with_caches(k))
    assert float(zero.abs().max()) == 0.0, "values are the latent columns: zero latents must give zero"


@runs_kernel
@pytest.mark.parametrize("spec", TREE_CASES, ids=lambda s: s.id)
def test_tree_masked_prefill_within_policy(spec):
    case = spec.build().to(DEVICE)
    assert TREE_MASK in case.variants
    masks = [case.tree_mask_of(b) for b in range(case.num_seqs)]
    branching = [b for b, m in enumerate(masks) if not torch.equal(m, torch.ones_like(m).tril())]
    assert branching, f"{spec.id}: every drawn tree is a chain (causal): draw another case"
    out, _ = _assert_within_policy(case, spec.id, dataclasses.replace(TUNING, prefill_block_n=16, prefill_rows=16))
    causal = case.replace(tree_mask=None)
    _, (out_causal, _) = _run(causal)
    b = branching[0]
    rows = slice(case.query_start_loc_list[b], case.query_start_loc_list[b + 1])
    assert_differs(out[rows], out_causal[rows], f"{spec.id}: sequence {b}'s branching tree against causal")


@runs_kernel
def test_a_chain_tree_gives_causal_bits():
    """A chain (every token sees all new tokens before it) is causal: the same bits, though the
    tree's masked tiles start at the history's end and causal's at the diagonal."""
    spec = CaseSpec("t", ((150, 40), (60, 9)), num_heads=4, num_kv_heads=2, head_dim=32, block_size=8)
    case = spec.build().to(DEVICE)
    chain = torch.cat([torch.ones(q, q, dtype=torch.bool).tril().reshape(-1) for q in case.query_lens])
    t = dataclasses.replace(TUNING, prefill_block_n=16, prefill_rows=16)
    _, (out_causal, lse_causal) = _run(case, t)
    _, (out_chain, lse_chain) = _run(case.replace(tree_mask=chain.to(DEVICE)), t)
    assert_equal(out_chain, out_causal, f"{spec.id}: a chain tree's output against causal")
    assert_equal(lse_chain, lse_causal, f"{spec.id}: a chain tree's lse against causal")


@runs_kernel
@pytest.mark.parametrize("spec", VALUE_WIDTH_CASES, ids=lambda s: s.id)
def test_value_width_of_its_own_within_policy(spec):
    case = spec.build().to(DEVICE)
    assert not case.shared_kv and case.head_dim_v != case.head_dim
    _assert_within_policy(case, spec.id)


@runs_kernel
@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(sliding_window=8), "sliding_window"),
        (dict(logits_soft_cap=5.0), "logits_soft_cap"),
        (dict(alibi_slopes=torch.zeros(16)), "alibi_slopes"),
    ],
    ids=["window", "softcap", "alibi"],
)
def test_mla_kernel_rejects_what_it_does_not_compute(kw, field):
    from pagedattn.kernels import triton_paged_attention as tpa

    case = MLA_CASES[2].build().to(DEVICE)
    kw = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    with pytest.raises(ValueError, match=rf"paged_attention\.{field}: must be None over a shared latent cache"):
        tpa.prepare(*case_args(case), scale=case.scale, **kw)


@runs_kernel
def test_tree_mask_checks_name_the_field():
    from pagedattn.kernels import triton_paged_attention as tpa

    case = TREE_CASES[0].build().to(DEVICE)
    args = case_args(case)
    with pytest.raises(ValueError, match=r"paged_attention\.tree_mask: must have sum_b q_b \* q_b = "):
        tpa.prepare(*args, tree_mask=case.tree_mask[:-1])
    bad = case.tree_mask.clone()
    bad[1] = True  # sequence 0's [0, 1]: above the diagonal
    with pytest.raises(ValueError, match=r"paged_attention\.tree_mask: must be False above the diagonal"):
        tpa.prepare(*args, tree_mask=bad)
    with pytest.raises(ValueError, match=r"paged_attention\.sliding_window: must be None with a tree_mask"):
        tpa.prepare(*args, tree_mask=case.tree_mask, sliding_window=4)
    strided = torch.stack([case.tree_mask, case.tree_mask], 1)[:, 0]
    with pytest.raises(ValueError, match=r"paged_attention\.tree_mask: must be contiguous"):
        tpa.prepare(*args, tree_mask=strided)


def test_mla_plan_arithmetic():
    """The MLA launches from sizes alone: head blocks of ``mla_block_h`` heads (the dot minimum at
    least), a split grid of the longest history's splits, the scratch at the value's width, the
    rotary part padded to a power of two; multi-token sequences in a launch of their own, in
    tiles of tokens; odd value widths refused."""
    t = TUNING
    lens = [300, 5000, 40000]
    plan = launch_plan.plan_launch(
        lens, [1, 1, 1], 128, 1, 576, 64, torch.bfloat16, False, head_dim_v=512, shared_kv=True
    )
    cfg = plan.decode
    assert plan.mla and plan.other is None and plan.decode_seqs == [0, 1, 2]
    assert (cfg.GROUP, cfg.GROUP_PAD, cfg.HEAD_BLOCKS) == (128, t.mla_block_h, -(-128 // t.mla_block_h))
    assert (cfg.HEAD_DIM, cfg.HEAD_DIM_V, cfg.HEAD_DIM_V_PAD, cfg.ROPE_PAD) == (576, 512, 512, 64)
    splits = [-(-n // decode_split(n, t)) for n in lens]
    assert plan.max_splits == max(splits) == plan.scratch_splits
    assert cfg.grid == (cfg.HEAD_BLOCKS, max(splits), 3)
    assert (cfg.BLOCK_N, cfg.num_warps, cfg.num_stages) == (t.mla_block_n, t.mla_warps, t.mla_stages)
    few = launch_plan.plan_launch([300], [1], 16, 1, 576, 64, torch.float16, False, head_dim_v=512, shared_kv=True)
    assert (few.decode.GROUP_PAD, few.decode.HEAD_BLOCKS) == (16, 1)
    two_kv = launch_plan.plan_launch([300], [1], 40, 2, 576, 64, torch.float16, False, head_dim_v=512, shared_kv=True)
    assert two_kv.decode.grid[0] == 2 * -(-20 // two_kv.decode.GROUP_PAD), "head blocks of each kv head's group"
    # multi-token sequences take a second launch: tiles of mla_multi_rows // GROUP_PAD tokens
    mixed = launch_plan.plan_launch(
        [300, 5000, 90], [1, 3, 9], 16, 1, 576, 64, torch.float16, False, head_dim_v=512, shared_kv=True
    )
    other = mixed.other
    block_q = t.mla_multi_rows // 16
    assert mixed.decode_seqs == [0] and mixed.other_seqs == [1, 2] and other.BLOCK_Q == block_q
    assert mixed.other_splits == -(-5000 // decode_split(5000, t)) and mixed.max_splits == 2
    assert other.grid == (-(-9 // block_q), mixed.other_splits, 2) and other.num_warps == t.mla_multi_warps
    with pytest.raises(ValueError, match=r"value_cache: must have a power-of-two head_dim_v"):
        launch_plan.plan_launch([300], [1], 16, 1, 576, 64, torch.float16, False, head_dim_v=500, shared_kv=True)
    with pytest.raises(ValueError, match=r"seq_lens.*2\*\*31"):
        launch_plan.plan_launch(
            [2**24] * 300, [1] * 300, 128, 1, 576, 64, torch.float16, False, head_dim_v=512, shared_kv=True
        )


def test_value_width_plan_arithmetic():
    """Separate caches of ``head_dim_v != head_dim``: the value's padded width is the
    accumulator's and the decode scratch's, the key's the score's."""
    plan = launch_plan.plan_launch([700, 90], [1, 33], 16, 4, 192, 16, torch.bfloat16, False, head_dim_v=128)
    for cfg in (plan.decode, plan.other):
        assert (cfg.HEAD_DIM, cfg.HEAD_DIM_PAD, cfg.HEAD_DIM_V, cfg.HEAD_DIM_V_PAD) == (192, 256, 128, 128)
    assert not plan.mla
    same = launch_plan.plan_launch([700], [1], 16, 4, 80, 16, torch.bfloat16, False)
    assert (same.decode.HEAD_DIM_V, same.decode.HEAD_DIM_V_PAD) == (80, 128)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU; test_triton_host checks run allocates nothing")
def test_mla_cuda_graph_replay_computes_what_run_computes():
    """MLA's two launches (decodes over several splits, a tree-masked multi-token sequence)
    captured once and replayed give the eager bits, after the query is refilled; the split
    counters are back at zero after each replay."""
    from pagedattn.kernels import triton_paged_attention as tpa

    spec = CaseSpec(
        "t",
        ((3000, 1), (700, 1), (900, 4)),
        num_heads=128,
        block_size=64,
        tree_mask=True,
        dtype=torch.bfloat16,
        **MLA_SHAPE,
    )
    case = spec.build().to(DEVICE)
    prep = tpa.prepare(*case_args(case), scale=case.scale, tree_mask=case.tree_mask, return_lse=True)
    q, k, v = case.query, case.key_cache, case.value_cache
    out = torch.empty(case.num_tokens, case.num_heads, case.head_dim_v, dtype=case.dtype, device=DEVICE)
    lse = torch.empty(case.num_tokens, case.num_heads, device=DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile outside the capture
        tpa.run(prep, q, k, v, out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tpa.run(prep, q, k, v, out=out, lse=lse)
    for step in range(3):
        q.copy_(torch.randn_like(q) * (step + 1))
        want_out, want_lse = tpa.run(prep, q, k, v)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_equal(out, want_out, f"{spec.id}, step {step}: out of the graph's replay against run")
        assert_equal(lse, want_lse, f"{spec.id}, step {step}: lse of the graph's replay against run")
        for name in ("done", "other_done"):
            counters = getattr(prep, name)
            assert int(counters.abs().sum()) == 0, f"step {step}: {name} left at {counters.tolist()}"
