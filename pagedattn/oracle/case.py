"""The canonical paged-attention problem (vLLM conventions), validated at construction.

A ``PagedCase`` is what every backend receives and what the oracle reads. Its
invariants are checked once, here, so that neither the oracle nor an adapter
has to second-guess its input: a case that exists is a valid case. The rules
themselves live in ``pagedattn.validation``, which the Triton kernel's host checks share.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from pagedattn.validation import (
    FP8_DTYPES,
    HEAD_DIM_V,
    KV_SCALE_FIELDS,
    MLA,
    OPTIONAL_TENSOR_FIELDS,
    PER_HEAD_SCALES,
    SCALAR_FIELDS,
    TENSOR_FIELDS,
    TREE_MASK,
    ProblemError,
    check_problem,
    default_scale,
    is_leading_view,
    tree_mask_offsets,
)


@dataclass(frozen=True, eq=False)
class PagedCase:
    """One paged-attention problem over a ragged batch.

    Args:
        query: ``[num_tokens, num_heads, head_dim]`` float32/float16/bfloat16 (float64
            accepted). The new tokens of all sequences, packed in sequence order;
            ``num_tokens = sum(query_lens)``.
        key_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, floating.
            The paged pool of keys.
        value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim_v]``, the key cache's
            dtype. ``head_dim_v`` is ``head_dim`` unless the variant ``head_dim_v`` (a value
            width of its own, as MLA prefill's 192/128) or ``mla``: ``value_cache`` a view of
            ``key_cache[..., :head_dim_v]``, MLA's latent cache whose values are its keys'
            leading columns (``shared_kv``; DeepSeek's absorbed decode: one kv head of 576,
            the value its first 512).
        block_tables: ``[num_seqs, max_blocks_per_seq]`` int32. Entry ``[b, i]`` is the
            physical block holding tokens ``i*block_size .. (i+1)*block_size - 1`` of
            sequence ``b``. Entries past ``ceil(seq_lens[b] / block_size)`` are padding
            and may hold anything (they are never read, nor validated).
        seq_lens: ``[num_seqs]`` int32. Total tokens of each sequence, new ones included.
        query_start_loc: ``[num_seqs + 1]`` int32. Cumulative query lengths: the new
            tokens of sequence ``b`` are ``query[query_start_loc[b]:query_start_loc[b+1]]``.
        scale: softmax scale; ``None`` (default) means ``head_dim ** -0.5``.
        sliding_window: ``W >= 1`` or ``None``: the query at position ``p`` sees keys
            ``max(0, p - W + 1) .. p`` only (``W`` keys, itself included). FlashAttention's
            ``window_size=(W - 1, 0)`` and FlashInfer's ``window_left=W - 1`` are this
            window (``pagedattn.adapters.conventions`` converts).
        logits_soft_cap: ``c > 0`` or ``None``: every scaled score ``s`` becomes
            ``c * tanh(s / c)`` (before ALiBi, before masking).
        alibi_slopes: ``[num_heads]`` float32 or ``None``: head ``h`` adds
            ``alibi_slopes[h] * (j - p)`` to the score of key ``j`` for the query at ``p``.
        sinks: ``[num_heads]`` float32 or ``None``: a per-head logit that joins the softmax
            denominator (``exp(sinks[h] - max)``) and contributes no value.
        k_scale, v_scale: dequantization scales of an fp8 cache: the key that enters the
            score is ``float(key_cache[...]) * k_scale`` (values likewise). Either a float
            (per tensor) or a ``[num_kv_heads]`` float32 tensor, finite and > 0 (per kv head:
            kv head ``g``'s keys are ``float(key_cache[..., g, :]) * k_scale[g]``; the
            variant ``fp8_per_head_scales``). Only an fp8 cache
            (``float8_e4m3fn``/``float8_e5m2``) may carry a float other than 1.0, or a tensor.
        tree_mask: ``[sum_b q_b * q_b]`` bool or ``None`` (the variant ``tree_mask``,
            speculative decoding's tree verification): sequence ``b``'s ``[q_b, q_b]`` matrix,
            row-major, from ``tree_mask_offsets()[b]``; entry ``[i, j]`` is True when new token
            ``i`` sees new token ``j`` (an ancestor, or itself). The diagonal is True and
            nothing above it is (a tree in topological order). Every new token sees the whole
            history before the new tokens. Not with ``sliding_window`` or ``alibi_slopes``.

    The ``q_b`` new tokens of sequence ``b`` sit at absolute positions
    ``seq_lens[b] - q_b .. seq_lens[b] - 1``; their keys and values are already in the
    cache. Causal masking is bottom-right aligned: the query at position ``p`` sees keys
    ``0 .. p``. Every sequence has at least one new token (``0 < q_b <= seq_lens[b]``):
    a sequence with nothing to compute does not belong in an attention batch, and
    allowing it would make every kernel special-case empty rows.

    Query head ``h`` reads kv head ``h // (num_heads // num_kv_heads)``. The output is
    ``[num_tokens, num_heads, head_dim_v]`` in the query dtype.

    The score of key ``j`` for the query at ``p`` (head ``h``), in this order::

        s = scale * (q . k_j * k_scale)              # k_j as stored, dequantized
        s = c * tanh(s / c)                          # logits_soft_cap
        s = s + alibi_slopes[h] * (j - p)            # ALiBi
        s = -inf unless p - W < j <= p               # causal (and sliding window); with a tree
                                                     # mask: j < context_len or mask[i, j - context_len]
        o = sum_j exp(s_j - lse) * v_j * v_scale,  lse = log(exp(sinks[h]) + sum_j exp(s_j))

    ``lse`` is the natural log of the softmax denominator actually used (the sink
    included), so ``o`` and ``lse`` merge with other partial results exactly.

    Raises:
        ProblemError: (a ``ValueError``) ``PagedCase.<field>: must ..., got ...``, naming
            the field and the bound it breaks (``pagedattn.validation`` states the rules).
    """

    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    # None at construction means head_dim ** -0.5; after construction it is always a float
    scale: float = None  # type: ignore[assignment]
    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    alibi_slopes: torch.Tensor | None = None
    sinks: torch.Tensor | None = None
    k_scale: float | torch.Tensor = 1.0
    v_scale: float | torch.Tensor = 1.0
    tree_mask: torch.Tensor | None = None
    # host copies of query_start_loc and seq_lens, taken by validation
    _loc: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)
    _seq_lens: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # validation reads the lengths on the host once; keep them, so that the many
        # per-sequence lookups of the oracle and the suite never synchronize a device again
        seq_lens, loc = check_problem(
            "PagedCase",
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_tables,
            self.seq_lens,
            self.query_start_loc,
            self.scale,
            sliding_window=self.sliding_window,
            logits_soft_cap=self.logits_soft_cap,
            alibi_slopes=self.alibi_slopes,
            sinks=self.sinks,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            tree_mask=self.tree_mask,
        )
        object.__setattr__(self, "_loc", tuple(loc))
        object.__setattr__(self, "_seq_lens", tuple(seq_lens))
        if self.scale is None:
            object.__setattr__(self, "scale", default_scale(self.head_dim))
        else:
            object.__setattr__(self, "scale", float(self.scale))
        for f in KV_SCALE_FIELDS:
            if not isinstance(getattr(self, f), torch.Tensor):
                object.__setattr__(self, f, float(getattr(self, f)))
        if self.logits_soft_cap is not None:
            object.__setattr__(self, "logits_soft_cap", float(self.logits_soft_cap))

    # ----------------------------------------------------------------- sizes
    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.query.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.query.shape[1])

    @property
    def num_kv_heads(self) -> int:
        return int(self.key_cache.shape[2])

    @property
    def head_dim(self) -> int:
        return int(self.query.shape[2])

    @property
    def head_dim_v(self) -> int:
        """The value's (and output's) head dim: ``head_dim`` unless the case says otherwise."""
        return int(self.value_cache.shape[3])

    @property
    def shared_kv(self) -> bool:
        """Whether ``value_cache`` is ``key_cache[..., :head_dim_v]`` (a view, narrower than the
        keys): MLA's latent cache, whose values are its keys' leading columns."""
        return self.head_dim_v < self.head_dim and is_leading_view(self.key_cache, self.value_cache)

    @property
    def block_size(self) -> int:
        return int(self.key_cache.shape[1])

    @property
    def num_blocks(self) -> int:
        return int(self.key_cache.shape[0])

    @property
    def gqa_ratio(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def dtype(self) -> torch.dtype:
        """The query (and output) dtype."""
        return self.query.dtype

    @property
    def kv_dtype(self) -> torch.dtype:
        """The cache dtype: the query dtype, or an fp8 dtype."""
        return self.key_cache.dtype

    @property
    def variants(self) -> frozenset[str]:
        """The attention variants this case uses (names from ``VARIANTS``)."""
        out = set()
        if self.sliding_window is not None:
            out.add("sliding_window")
        if self.logits_soft_cap is not None:
            out.add("logits_soft_cap")
        if self.alibi_slopes is not None:
            out.add("alibi_slopes")
        if self.sinks is not None:
            out.add("sinks")
        if self.kv_dtype in FP8_DTYPES:
            out.add(FP8_DTYPES[self.kv_dtype])
        if self.per_head_scales:
            out.add(PER_HEAD_SCALES)
        if self.shared_kv:
            out.add(MLA)
        elif self.head_dim_v != self.head_dim:
            out.add(HEAD_DIM_V)
        if self.tree_mask is not None:
            out.add(TREE_MASK)
        return frozenset(out)

    @property
    def per_head_scales(self) -> bool:
        """Whether ``k_scale`` or ``v_scale`` is a per-kv-head tensor."""
        return any(isinstance(getattr(self, f), torch.Tensor) for f in KV_SCALE_FIELDS)

    def kv_head_scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k_scale, v_scale)`` per kv head, each ``[num_kv_heads]`` float64 on the case's
        device (a float repeated): the one form for code that takes both kinds."""
        out = []
        for f in KV_SCALE_FIELDS:
            x = getattr(self, f)
            if isinstance(x, torch.Tensor):
                out.append(x.to(torch.float64))
            else:
                out.append(torch.full((self.num_kv_heads,), x, dtype=torch.float64, device=self.device))
        return out[0], out[1]

    def max_k_scale(self) -> float:
        """The largest key scale (``k_scale`` itself when it is a float): a bound's upper bound."""
        return _largest(self.k_scale)

    def max_v_scale(self) -> float:
        """The largest value scale (``v_scale`` itself when it is a float)."""
        return _largest(self.v_scale)

    @property
    def device(self) -> torch.device:
        return self.query.device

    # ---------------------------------------------------------- per sequence
    @property
    def seq_lens_list(self) -> list[int]:
        return list(self._seq_lens)

    @property
    def query_start_loc_list(self) -> list[int]:
        return list(self._loc)

    @property
    def query_lens(self) -> list[int]:
        loc = self._loc
        return [loc[b + 1] - loc[b] for b in range(self.num_seqs)]

    @property
    def context_lens(self) -> list[int]:
        """Tokens of each sequence that were cached before this step."""
        return [s - q for s, q in zip(self.seq_lens_list, self.query_lens)]

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_list)

    def tree_mask_offsets(self) -> list[int]:
        """``[num_seqs + 1]``: where each sequence's ``[q_b, q_b]`` mask starts in ``tree_mask``
        (``sum_{b' < b} q_b'^2``), the total last; defined with or without a mask."""
        return tree_mask_offsets(self.query_lens)

    def tree_mask_of(self, seq: int) -> torch.Tensor | None:
        """``[q_b, q_b]`` bool: which new tokens of ``seq`` each of its new tokens sees (``None``
        without a tree mask: causal)."""
        if self.tree_mask is None:
            return None
        off = self.tree_mask_offsets()
        q = self.query_lens[seq]
        return self.tree_mask[off[seq] : off[seq + 1]].view(q, q)

    def num_blocks_used(self, seq: int) -> int:
        return -(-self.seq_lens_list[seq] // self.block_size)

    def slot_mapping(self, seq: int) -> torch.Tensor:
        """``[seq_lens[seq]]`` int64 on the case's device: the flat slot
        (``block * block_size + offset``) of every history token of ``seq``.

        Reads only the block-table entries the sequence uses.
        """
        n = self.seq_lens_list[seq]
        blocks = self.block_tables[seq, : self.num_blocks_used(seq)].to(torch.int64)
        pos = torch.arange(n, device=self.block_tables.device)
        return blocks[pos // self.block_size] * self.block_size + pos % self.block_size

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor field that is set, by name (the optional ones only when present)."""
        out = {f: getattr(self, f) for f in TENSOR_FIELDS}
        out.update({f: getattr(self, f) for f in OPTIONAL_TENSOR_FIELDS if getattr(self, f) is not None})
        out.update({f: getattr(self, f) for f in KV_SCALE_FIELDS if isinstance(getattr(self, f), torch.Tensor)})
        return out

    def options(self) -> dict:
        """The non-tensor fields (scale and the variants' parameters), by name; a per-head
        ``k_scale``/``v_scale`` is a tensor (``tensors()``), not here."""
        return {f: getattr(self, f) for f in SCALAR_FIELDS if not isinstance(getattr(self, f), torch.Tensor)}

    def to(self, device: torch.device | str) -> PagedCase:
        """The same case with every tensor on ``device`` (a copy of a valid case: not
        validated again, and the device is not read)."""
        return self._with_tensors({f: t.to(device) for f, t in self.tensors().items()})

    def replace(self, **changes) -> PagedCase:
        """A new case with ``changes`` applied (validated: the changes may break a rule). A
        shared (MLA) case given a new ``key_cache`` alone keeps its values the key's leading
        columns (``with_caches``)."""
        if "key_cache" in changes and "value_cache" not in changes and self.shared_kv:
            changes["value_cache"] = changes["key_cache"][..., : self.head_dim_v]
        return dataclasses.replace(self, **changes)

    def with_caches(self, key_cache: torch.Tensor, value_cache: torch.Tensor | None = None) -> PagedCase:
        """This case over other caches (validated). ``value_cache=None``: the values of a shared
        (MLA) case are the new key cache's leading ``head_dim_v`` columns, a view as before;
        of any other case, required."""
        if value_cache is not None:
            return self.replace(key_cache=key_cache, value_cache=value_cache)
        if not self.shared_kv:
            raise ProblemError(
                "PagedCase.with_caches", "value_cache", "must be given unless the case's values are a view of its keys"
            )
        return self.replace(key_cache=key_cache)  # ``replace`` keeps the values a view of the new keys

    def clone(self) -> PagedCase:
        """A deep copy: every tensor cloned (a copy of a valid case: not validated again)."""
        return self._with_tensors({f: t.clone() for f, t in self.tensors().items()})

    def _with_tensors(self, tensors: dict[str, torch.Tensor]) -> PagedCase:
        """This case with the same-valued ``tensors`` in place of its own, bypassing
        ``__post_init__``: the values (and their host copies) are this case's."""
        new = object.__new__(PagedCase)
        for f in dataclasses.fields(self):
            object.__setattr__(new, f.name, tensors.get(f.name, getattr(self, f.name)))
        if self.shared_kv:  # the values stay a view of the (new) keys, not a copy beside them
            object.__setattr__(new, "value_cache", new.key_cache[..., : self.head_dim_v])
        return new

    def __repr__(self) -> str:
        return (
            f"PagedCase(num_seqs={self.num_seqs}, seq_lens={self.seq_lens_list}, "
            f"query_lens={self.query_lens}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"{'' if self.head_dim_v == self.head_dim else f'head_dim_v={self.head_dim_v}, '}"
            f"block_size={self.block_size}, num_blocks={self.num_blocks}, "
            f"dtype={self.dtype}, scale={self.scale:.6g}{self._variant_repr()}, device={self.device})"
        )

    def _variant_repr(self) -> str:
        parts = []
        if self.shared_kv:
            parts.append("shared_kv=True")
        if self.tree_mask is not None:
            parts.append(f"tree_mask=[{int(self.tree_mask.sum())} of {self.tree_mask.numel()} True]")
        if self.sliding_window is not None:
            parts.append(f"sliding_window={self.sliding_window}")
        if self.logits_soft_cap is not None:
            parts.append(f"logits_soft_cap={self.logits_soft_cap:g}")
        if self.alibi_slopes is not None:
            parts.append("alibi_slopes=[" + ", ".join(f"{x:.3g}" for x in self.alibi_slopes.tolist()) + "]")
        if self.sinks is not None:
            parts.append("sinks=[" + ", ".join(f"{x:.3g}" for x in self.sinks.tolist()) + "]")
        if self.kv_dtype != self.dtype:
            scales = ", ".join(f"{f}={_scale_text(getattr(self, f))}" for f in KV_SCALE_FIELDS)
            parts.append(f"kv_dtype={self.kv_dtype}, {scales}")
        return "".join(", " + p for p in parts)


def _largest(x: float | torch.Tensor) -> float:
    return float(x.max()) if isinstance(x, torch.Tensor) else x


def _scale_text(x: float | torch.Tensor) -> str:
    """A scale for ``repr``: ``0.37``, or per kv head ``[0.5, 1, 2, 0.25]``."""
    if isinstance(x, torch.Tensor):
        return "[" + ", ".join(f"{v:g}" for v in x.tolist()) + "]"
    return f"{x:g}"
