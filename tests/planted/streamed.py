"""A correct streamed paged-attention kernel in torch, and the same kernel with one
realistic mistake at a time (``bug=...``), for calibrating the policy and proving
that the suite catches broken kernels.

The baseline walks each sequence's history a tile of keys at a time, reading every
key through the block table (``block * block_size + offset`` into the flat pool),
with an online softmax in fp32, vectorized over the sequence's query rows and heads.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from pagedattn import Capabilities
from pagedattn.oracle import VARIANTS, PagedCase
from pagedattn.oracle.reference import index_rows

#: Bugs the policy must catch at fp32 by the numbers alone.
PRECISION_BUGS = ("exp_bf16", "acc_fp16", "query_bf16", "drop_key", "scale_1pct", "no_rescale")
#: Precision slips of a half-precision flash kernel, each at 2x a correct one's RMS error or
#: more: the statistical criterion's business (``docs/tolerance.md``), caught at half precision.
HALF_PRECISION_SLIPS = ("acc_input", "lsum_input", "p_fp8", "qk_reduced_input")
#: Roundings a kernel may declare (``Capabilities``), each legitimate under its declaration:
#: the emulation's ``bug=`` name and the declaration that covers it.
DECLARED_FORMS = {
    "qk_products_input": {"qk_precision": "input"},
    "scale_folded": {"qk_precision": "scaled_query"},
    "partials_input": {"partials_precision": "input"},
}

#: Every planted bug, with the mistake it models.
BUGS = {
    "no_rescale": "accumulators not rescaled by exp(m_old - m_new) in the online softmax",
    "tail_unmasked": "decode reads whole blocks: keys past seq_len in the last block are not masked",
    "wrong_gqa": "query head h reads kv head h % num_kv_heads instead of h // group",
    "causal_off_by_one": "causal mask j < p instead of j <= p (a token does not see itself)",
    "causal_ignores_past": "causal mask relative to the new tokens only (top-left aligned)",
    "scale_ignored": "explicit scale ignored: head_dim ** -0.5 always",
    "contiguous_blocks": "blocks assumed physically contiguous after the first one",
    "block_size_16": "block size hard-coded to 16",
    "one_key_past": "reads one key past the visible history",
    "last_block_misaddressed": "the last (partial) block read from the previous table entry",
    "first_seq_len": "the first sequence's length used for every sequence",
    "exp_bf16": "exponent evaluated in bf16 inside an fp32 kernel",
    "acc_fp16": "running weighted-V sum kept in fp16",
    "query_bf16": "query rounded to bf16 before the dot",
    "drop_key": "the first key of every sequence dropped",
    "scale_1pct": "scale off by 1%",
    "nondeterministic": "reduction order differs from call to call (racing split accumulation)",
    "batch_dependent_order": "tile size (reduction order) chosen from the batch size",
    "writes_cache": "the kernel writes into the key cache",
    "partly_unwritten": "the last token's output of each launch left unwritten",
    # the variants
    "window_off_by_one": "sliding window keeps keys p-W .. p (W + 1 keys) instead of p-W+1 .. p",
    "softcap_after_mask": "soft-cap applied after the mask: a masked -inf score becomes -cap and leaks in",
    "alibi_sign": "ALiBi bias slope * (p - j) instead of slope * (j - p)",
    "sink_dropped_in_split": "the sink is lost when the history is split (decode histories over 512 keys)",
    "fp8_scale_ignored": "fp8 k_scale and v_scale treated as 1.0",
    "per_head_scale_per_tensor": "per-head fp8 scales applied per tensor: kv head 0's scales used for every head",
    "lse_log2": "the log-sum-exp returned in base 2 (FlashInfer's convention) where natural log is asked",
    "mla_value_columns": "MLA's value read from the latent row's last head_dim_v columns instead of its first",
    "mla_rope_dropped": "MLA's score over the compressed columns only: the rotary part dropped",
    "tree_as_causal": "a tree mask read as causal: every earlier draft token seen, not only the ancestors",
    # half-precision slips (flash-style weights, tiles of 64)
    "acc_input": "the output accumulator kept in the input dtype across tiles",
    "lsum_input": "the running softmax denominator kept in the input dtype",
    "p_fp8": "with an fp8 cache, the weights cast to the cache's fp8 dtype before P.V",
    "qk_reduced_input": "q.k reduced wholly in the input dtype (products and every partial sum)",
}

#: declared roundings, for the emulation (not bugs: ``DECLARED_FORMS`` says what covers each)
_FORMS = {
    "qk_products_input": "q.k products rounded to the input dtype, summed in fp32, the score rounded once",
    "scale_folded": "scale * log2(e) folded into the query, rounded to the input dtype; exp2",
    "partials_input": "split-K partial outputs stored in the input dtype before the fp32 merge",
}

#: the history length above which the model splits a decode row (as the Triton kernel does)
SPLIT_KEYS = 512
#: keys per split-K partial (``partials_input``)
PARTIAL_KEYS = 256
#: the slips and forms that round to a half dtype: the tile and weights of a flash kernel
_FLASH = set(HALF_PRECISION_SLIPS) | set(_FORMS)


def _input_products(q: torch.Tensor, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[Hq, n, t, D]`` float32: every product ``q_i k_i`` rounded to ``dtype``."""
    return (q[:, :, None, :] * k[:, None, :, :]).to(dtype).float()


def _pairwise_sum(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The last dimension of ``x`` summed pairwise, every partial sum rounded to ``dtype``."""
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = torch.nn.functional.pad(x, (0, 1))
        x = (x[..., 0::2] + x[..., 1::2]).to(dtype).float()
    return x[..., 0]


#: the `nondeterministic` bug's own random order: a run in the tests' process (tests/test_planted_bugs.py)
#: leaves torch's global generator where it was
_ORDER_RNG = torch.Generator().manual_seed(0)


def _slots(case: PagedCase, b: int, j: torch.Tensor, bug: str | None) -> torch.Tensor:
    """Flat pool slot of key positions ``j`` of sequence ``b``, through the block table."""
    bs = 16 if bug == "block_size_16" else case.block_size
    table = case.block_tables[b].long()
    logical = j // bs
    if bug == "contiguous_blocks":
        blocks = table[0] + logical
    elif bug == "last_block_misaddressed":
        last = case.num_blocks_used(b) - 1
        blocks = table[torch.where(logical == last, (logical - 1).clamp_min(0), logical)]
    else:
        blocks = table[logical.clamp(max=table.shape[0] - 1)]
    return (blocks * bs + j % bs).clamp(0, case.num_blocks * case.block_size - 1)


def streamed_attention(
    case: PagedCase,
    tile: int = 16,
    round_weights: bool = False,
    bug: str | None = None,
    out: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[T, Hq, D]`` in the query dtype. ``round_weights`` rounds ``p`` to the input dtype
    before the weighted-V product, as flash-style kernels do (legitimate). Every variant
    of ``PagedCase``; the log-sum-exp goes to ``lse_out`` (``[T, Hq]`` float32) if given."""
    bugs = set(bug.split("+")) if bug else set()  # "a+b": several at once
    if bugs - set(BUGS) - set(_FORMS):
        raise ValueError(f"unknown bug {bug!r}")
    if bugs & _FLASH:  # a flash kernel: tiles of 64, weights rounded to the input dtype
        tile, round_weights = 64, True
    if "batch_dependent_order" in bugs:
        tile = tile if case.num_seqs == 1 else max(1, tile // 2)
    if out is None:
        out = torch.empty(case.num_tokens, case.num_heads, case.head_dim_v, dtype=case.dtype, device=case.device)
    dev = case.device
    loc = case.query_start_loc.tolist()
    lens = case.seq_lens_list
    scale = case.head_dim**-0.5 if "scale_ignored" in bugs else case.scale * (1.01 if "scale_1pct" in bugs else 1.0)
    k_scale, v_scale = (1.0, 1.0) if "fp8_scale_ignored" in bugs else (case.k_scale, case.v_scale)
    if "per_head_scale_per_tensor" in bugs:
        k_scale, v_scale = (float(x[0]) if isinstance(x, torch.Tensor) else x for x in (k_scale, v_scale))
    window, cap = case.sliding_window, case.logits_soft_cap
    slopes = case.alibi_slopes.float()[:, None, None] if case.alibi_slopes is not None else None
    weights_dtype = case.dtype
    k_flat = case.key_cache.reshape(-1, case.num_kv_heads, case.head_dim)
    v_flat = case.value_cache.reshape(-1, case.num_kv_heads, case.head_dim_v)
    if "mla_value_columns" in bugs and case.shared_kv:
        v_flat = k_flat[..., case.head_dim - case.head_dim_v :]
    if "mla_rope_dropped" in bugs and case.shared_kv:
        k_flat = torch.cat([k_flat[..., : case.head_dim_v], torch.zeros_like(k_flat[..., case.head_dim_v :])], -1)
    if "wrong_gqa" in bugs:
        kv_of_head = torch.arange(case.num_heads, device=dev) % case.num_kv_heads
    else:
        kv_of_head = torch.arange(case.num_heads, device=dev) // case.gqa_ratio
    # per-head scales: each query head takes its kv head's, [Hq, 1, 1] (a float stays a float)
    k_scale, v_scale = (x[kv_of_head].view(-1, 1, 1) if isinstance(x, torch.Tensor) else x for x in (k_scale, v_scale))
    scale = scale * k_scale  # folded into the score scale, as kernels do
    for b in range(case.num_seqs):
        L = lens[0] if "first_seq_len" in bugs else lens[b]
        n = loc[b + 1] - loc[b]
        q = case.query[loc[b] : loc[b + 1]]
        if "query_bf16" in bugs:
            q = q.to(torch.bfloat16)
        if "scale_folded" in bugs:
            q_scale = scale.view(1, -1, 1) if isinstance(scale, torch.Tensor) else scale  # q is [n, Hq, D]
            q = (q.float() * (q_scale * math.log2(math.e))).to(case.dtype)
        q = q.float().transpose(0, 1)  # [Hq, n, D]
        pos = torch.arange(L - n, L, device=dev)  # absolute positions of the new tokens
        if "causal_ignores_past" in bugs:
            pos = torch.arange(n, device=dev)
        n_keys = L
        if "tail_unmasked" in bugs and n == 1:
            n_keys = case.num_blocks_used(b) * case.block_size
        order = torch.arange(0, n_keys, tile).tolist()
        if "nondeterministic" in bugs:
            order = [order[i] for i in torch.randperm(len(order), generator=_ORDER_RNG).tolist()]
        m = torch.full((case.num_heads, n, 1), float("-inf"), device=dev)
        l_sum = torch.zeros(case.num_heads, n, 1, device=dev)
        if case.sinks is not None and not ("sink_dropped_in_split" in bugs and n == 1 and L > SPLIT_KEYS):
            m = case.sinks.float()[:, None, None].expand(-1, n, 1).clone()  # the sink seeds the softmax
            l_sum = torch.ones(case.num_heads, n, 1, device=dev)
        acc = torch.zeros(case.num_heads, n, case.head_dim_v, device=dev)
        tree = case.tree_mask_of(b) if "tree_as_causal" not in bugs else None  # [n, n] bool
        partials: list[tuple[torch.Tensor, torch.Tensor]] = []  # partials_input: (o_s, lse_s)
        for j0 in order:
            j = torch.arange(j0, min(n_keys, j0 + tile), device=dev)
            slots = _slots(case, b, j, bug)
            k = index_rows(k_flat, slots).float()[:, kv_of_head].transpose(0, 1)  # [Hq, t, D]
            v = index_rows(v_flat, slots).float()[:, kv_of_head].transpose(0, 1)
            if bugs & {"qk_products_input", "qk_reduced_input"}:
                products = _input_products(q, k, case.dtype)
                if "qk_products_input" in bugs:
                    s = products.sum(-1).to(case.dtype).float() * scale
                else:
                    s = _pairwise_sum(products, case.dtype) * scale
            elif "scale_folded" in bugs:
                s = (q @ k.transpose(1, 2)) * math.log(2.0)  # exp2 of the folded score, as exp
            else:
                s = (q @ k.transpose(1, 2)) * scale  # [Hq, n, t]
            if cap is not None and "softcap_after_mask" not in bugs:
                s = cap * torch.tanh(s / cap)
            if slopes is not None:
                rel = (pos[:, None] - j[None, :]) if "alibi_sign" in bugs else (j[None, :] - pos[:, None])
                s = s + slopes * rel.float()[None]
            if "causal_off_by_one" in bugs:
                visible = j[None, :] < pos[:, None]
                visible[:, 0] |= j[0] == 0  # keep key 0 so no row is empty
            elif "one_key_past" in bugs:
                visible = j[None, :] <= pos[:, None] + 1
            elif "tail_unmasked" in bugs and n == 1:
                visible = torch.ones(1, len(j), dtype=torch.bool, device=dev)
            else:
                visible = j[None, :] <= pos[:, None]
            if tree is not None:  # a new key is seen by its descendants only
                new = (j - (L - n)).clamp(min=0)
                visible = visible & ((j[None, :] < L - n) | tree[:, new])
            if "drop_key" in bugs:
                visible = visible & (j[None, :] != 0) if L > 1 else visible
            if window is not None:
                reach = window + (1 if "window_off_by_one" in bugs else 0)
                visible = visible & (j[None, :] > pos[:, None] - reach)
            s = s.masked_fill(~visible[None], float("-inf"))
            if cap is not None and "softcap_after_mask" in bugs:
                s = cap * torch.tanh(s / cap)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            x = s - m_safe
            p = torch.exp(x.to(torch.bfloat16)).float() if "exp_bf16" in bugs else torch.exp(x)
            alpha = torch.ones_like(m) if "no_rescale" in bugs else torch.exp(m - m_safe)
            l_sum = l_sum * alpha + p.sum(-1, keepdim=True)
            if "lsum_input" in bugs:
                l_sum = l_sum.to(case.dtype).float()
            pv = p.to(weights_dtype).float() if round_weights else p
            if "p_fp8" in bugs and case.kv_dtype != case.dtype:
                pv = p.to(case.kv_dtype).float()
            acc = acc * alpha + pv @ v
            if "acc_fp16" in bugs:
                acc = acc.half().float()
            if "acc_input" in bugs:
                acc = acc.to(case.dtype).float()
            m = m_new
            if "partials_input" in bugs and (j0 + tile) % PARTIAL_KEYS == 0 and j0 + tile < n_keys:
                partials.append(_close_partial(acc, l_sum, m, case.dtype))
                m = torch.full_like(m, float("-inf"))
                l_sum, acc = torch.zeros_like(l_sum), torch.zeros_like(acc)
        if partials:  # the last split, then the merge in fp32 (the sink seeded the first split)
            partials.append(_close_partial(acc, l_sum, m, case.dtype))
            lses = torch.stack([lse for _, lse in partials])  # [S, Hq, n, 1]
            m = lses.amax(0)
            w = torch.exp(lses - m)
            l_sum = w.sum(0)
            acc = (w * torch.stack([o for o, _ in partials])).sum(0)
        result = (acc * (v_scale / l_sum)).transpose(0, 1).to(case.dtype)
        if lse_out is not None:
            lse = (m + torch.log(l_sum))[..., 0].transpose(0, 1)  # [n, Hq]
            lse_out[loc[b] : loc[b + 1]] = lse / math.log(2.0) if "lse_log2" in bugs else lse
        if "partly_unwritten" in bugs:
            result = result[:-1] if b == case.num_seqs - 1 else result
        out[loc[b] : loc[b] + result.shape[0]] = result
    if "writes_cache" in bugs:
        last = int(case.block_tables[0, case.num_blocks_used(0) - 1])
        case.key_cache[last, (lens[0] - 1) % case.block_size] = 0  # "stores the new token's K"
    return out


def _close_partial(
    acc: torch.Tensor, l_sum: torch.Tensor, m: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """A split's partial output stored in ``dtype`` and its log-sum-exp in fp32; an empty
    split (every key masked) weighs nothing."""
    safe = l_sum.clamp_min(1e-30)
    return (acc / safe).to(dtype).float(), torch.where(l_sum > 0, m + torch.log(safe), float("-inf"))


class PlantedBackend:
    """The streamed kernel behind the adapter contract, with at most one bug."""

    capabilities = Capabilities(operations=frozenset({"attention", "lse"}), variants=frozenset(VARIANTS))

    def __init__(self, bug: str | None = None):
        self.bug = bug
        self.name = f"planted-{bug}" if bug else "planted-correct"

    def paged_attention(self, case: PagedCase, out: torch.Tensor | None = None) -> torch.Tensor:
        return streamed_attention(case, 16, bug=self.bug, out=out)

    def paged_attention_lse(self, case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
        lse = torch.empty(case.num_tokens, case.num_heads, dtype=torch.float32, device=case.device)
        return streamed_attention(case, 16, bug=self.bug, lse_out=lse), lse


class DecodeOnlyBackend(PlantedBackend):
    """The streamed kernel as a decode-only kernel (one query token per sequence): the suite
    judges it on the decode forms of the multi-token cases."""

    capabilities = dataclasses.replace(PlantedBackend.capabilities, decode_only=True)

    def __init__(self, bug: str | None = None):
        super().__init__(bug)
        self.name = f"decode-only-{self.name}"


def correct() -> PlantedBackend:
    return PlantedBackend(None)


def decode_only_contiguous_blocks() -> DecodeOnlyBackend:
    """A decode-only kernel that takes a sequence's blocks as contiguous after its first one:
    the quick grid's pure-decode cases all have their blocks in order; the decode forms of its
    permuted, interleaved and shared layouts do not."""
    return DecodeOnlyBackend("contiguous_blocks")


for _bug in BUGS:  # one zero-argument factory per bug, for --backend=tests/planted/streamed.py:bug_<name>
    globals()[f"bug_{_bug}"] = lambda _b=_bug: PlantedBackend(_b)
