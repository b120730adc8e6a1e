"""The canonical problem's rules and vocabulary, stated once.

``PagedCase`` (at construction) and the Triton kernel's host checks (before a launch)
both call these functions, so a violation gets the same message and is blamed on the
same field whoever finds it: ``ProblemError("PagedCase", "seq_lens", "must ...")``
reads ``PagedCase.seq_lens: must ..., got ...``. Torch only; nothing else of ours.

The value checks (lengths, offsets, block ids in range, finite per-head tensors) read
the device once, in one transfer (``check_tensors``): a kernel's host checks may
afford one synchronization per batch, not one per rule. ``sync=False`` skips them.
"""

from __future__ import annotations

import numbers
from collections.abc import Collection

import torch

#: query dtypes a ``PagedCase`` accepts (float64 for the oracle's own tests)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
#: fp8 cache dtypes and the one name each goes by (variant, case id, report)
FP8_DTYPES = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}
#: the variant of an fp8 cache whose ``k_scale``/``v_scale`` are ``[num_kv_heads]`` tensors
PER_HEAD_SCALES = "fp8_per_head_scales"
#: the variant of a value cache that is a view of the key cache's leading columns (MLA's latent cache)
MLA = "mla"
#: the variant of a separate value cache whose head dim differs from the key's
HEAD_DIM_V = "head_dim_v"
#: the variant of a per-sequence mask over the new tokens (tree-masked speculative verification)
TREE_MASK = "tree_mask"
#: the variants that change the problem's shape (widths, shared rows, the mask), not the scores' formula
SHAPE_VARIANTS = (MLA, HEAD_DIM_V, TREE_MASK)
#: every attention variant a case can carry (``PagedCase.variants``): its field names
VARIANTS = (
    "sliding_window",
    "logits_soft_cap",
    "alibi_slopes",
    "sinks",
    "fp8_e4m3",
    "fp8_e5m2",
    PER_HEAD_SCALES,
    *SHAPE_VARIANTS,
)
#: the problem's tensors, always present
TENSOR_FIELDS = ("query", "key_cache", "value_cache", "block_tables", "seq_lens", "query_start_loc")
#: variant tensors, ``None`` when the variant is off: per head, and the tree mask
OPTIONAL_TENSOR_FIELDS = ("alibi_slopes", "sinks", "tree_mask")
#: the non-tensor fields (``k_scale``/``v_scale`` may be per-kv-head tensors: ``KV_SCALE_FIELDS``)
SCALAR_FIELDS = ("scale", "sliding_window", "logits_soft_cap", "k_scale", "v_scale")
#: the fp8 dequantization scales: a float (per tensor) or a ``[num_kv_heads]`` float32 tensor
KV_SCALE_FIELDS = ("k_scale", "v_scale")
_DIMS = {
    "query": ("num_tokens", "num_heads", "head_dim"),
    "key_cache": ("num_blocks", "block_size", "num_kv_heads", "head_dim"),
    "value_cache": ("num_blocks", "block_size", "num_kv_heads", "head_dim_v"),
}


class ProblemError(ValueError):
    """An input outside the canonical problem, or outside the rules of the other inputs
    the package validates (``Capabilities``, ``Exclusion``, the policy's keywords): the
    one error template, ``{owner}.{field}: must ..., got ...``. ``field`` names the
    argument at fault (the same one whichever caller found it)."""

    def __init__(self, owner: str, field: str, problem: str):
        super().__init__(f"{owner}.{field}: {problem}")
        self.owner = owner
        self.field = field
        self.problem = problem


def default_scale(head_dim: int) -> float:
    """The softmax scale a case takes when none is given: ``head_dim ** -0.5``."""
    return float(head_dim) ** -0.5


def dtype_text(dtypes: Collection[torch.dtype]) -> str:
    """``float32/float16/bfloat16``."""
    return "/".join(str(d).removeprefix("torch.") for d in dtypes)


def sliding_window_problem(w: object) -> str:
    """``""`` when ``w`` is a sliding window (an int >= 1) or ``None``; else what is wrong."""
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
        return f"must be an int >= 1 (keys seen, the query's own included) or None, got {w!r}"
    return ""


def positive_float_problem(x: object) -> str:
    """``""`` when ``x`` is a real number (a Python or NumPy int or float, not a bool, a
    string, a complex or a tensor) that is finite and > 0; else what is wrong."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return f"must be a finite float > 0, got {x!r} of type {type(x).__name__}"
    if not 0.0 < float(x) < float("inf"):
        return f"must be a finite float > 0, got {x!r}"
    return ""


def check_options(
    owner: str,
    kv_dtype: torch.dtype,
    *,
    scale: object = None,
    sliding_window: object = None,
    logits_soft_cap: object = None,
    k_scale: object = 1.0,
    v_scale: object = 1.0,
) -> None:
    """The non-tensor fields (no device read): ``scale`` (``None``: the default) and the
    variants' scalars. ``kv_dtype`` is the cache dtype (only fp8 takes scales). A
    ``k_scale``/``v_scale`` tensor (per kv head) is checked by ``check_tensors``; here only
    the rule that it needs an fp8 cache (whatever its values)."""
    problem = sliding_window_problem(sliding_window)
    if problem:
        raise ProblemError(owner, "sliding_window", problem)
    optional = {"scale": scale, "logits_soft_cap": logits_soft_cap}
    for name, x in {**optional, "k_scale": k_scale, "v_scale": v_scale}.items():
        if isinstance(x, torch.Tensor) and name in KV_SCALE_FIELDS:
            if kv_dtype not in FP8_DTYPES:
                raise ProblemError(
                    owner,
                    name,
                    f"must be a float (1.0) unless the cache is fp8 (per-head scales apply to fp8 caches "
                    f"only), got a tensor with a {kv_dtype} cache",
                )
            continue
        problem = "" if x is None and name in optional else positive_float_problem(x)
        if problem:
            raise ProblemError(owner, name, problem)
    for name, x in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not isinstance(x, torch.Tensor) and x != 1.0 and kv_dtype not in FP8_DTYPES:
            raise ProblemError(
                owner,
                name,
                f"must be 1.0 unless the cache is fp8 (scales apply to fp8 caches only), "
                f"got {x:g} with a {kv_dtype} cache",
            )


def check_per_head(owner: str, name: str, t: object, num_heads: int, device: torch.device) -> None:
    """A per-head variant tensor (``alibi_slopes``, ``sinks``): ``None`` or ``[num_heads]``
    float32 on ``device``. Whether it is finite is a value, read by ``check_tensors``."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise ProblemError(owner, name, f"must be a torch.Tensor or None, got {type(t).__name__}")
    if tuple(t.shape) != (num_heads,):
        raise ProblemError(owner, name, f"must have shape [num_heads] = ({num_heads},), got {tuple(t.shape)}")
    if t.dtype != torch.float32:
        raise ProblemError(owner, name, f"must be float32, got {t.dtype}")
    if t.device != device:
        raise ProblemError(owner, name, f"must be on the query's device {device} (one device for all), got {t.device}")


def check_kv_scale(owner: str, name: str, t: object, num_kv_heads: int, device: torch.device) -> None:
    """``k_scale``/``v_scale`` as a per-kv-head tensor: ``[num_kv_heads]`` float32 on
    ``device`` (a float passes: ``check_options`` judges it). Whether every entry is finite
    and > 0 is a value, read by ``check_tensors``."""
    if not isinstance(t, torch.Tensor):
        return
    if tuple(t.shape) != (num_kv_heads,):
        raise ProblemError(
            owner,
            name,
            f"must be a float or have shape [num_kv_heads] = ({num_kv_heads},), got {tuple(t.shape)}",
        )
    if t.dtype != torch.float32:
        raise ProblemError(owner, name, f"must be float32 (a per-kv-head scale), got {t.dtype}")
    if t.device != device:
        raise ProblemError(owner, name, f"must be on the query's device {device} (one device for all), got {t.device}")


def check_tensors(
    owner: str,
    query: object,
    key_cache: object,
    value_cache: object,
    block_tables: object,
    seq_lens: object,
    query_start_loc: object,
    *,
    alibi_slopes: object = None,
    sinks: object = None,
    k_scale: object = None,
    v_scale: object = None,
    tree_mask: object = None,
    query_dtypes: Collection[torch.dtype] = FLOAT_DTYPES,
    sync: bool = True,
) -> tuple[list[int], list[int]] | None:
    """Every rule of the problem's tensors; raises ``ProblemError``.

    Args:
        query: ``[num_tokens, num_heads, head_dim]``, one of ``query_dtypes``.
        key_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, the query dtype or
            an fp8 dtype.
        value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim_v]``, the key cache's
            dtype (``head_dim_v`` any width; a view of the key cache's columns allowed).
        block_tables: ``[num_seqs, max_blocks]`` int32; entries a sequence uses lie in
            ``[0, num_blocks)``, the others are padding (never read, never checked).
        seq_lens: ``[num_seqs]`` int32; query_start_loc: ``[num_seqs + 1]`` int32 from 0
            to ``num_tokens``, every sequence with ``1 <= q_b <= seq_lens[b]``.
        alibi_slopes, sinks: ``None`` or ``[num_heads]`` float32, finite.
        k_scale, v_scale: a float (not checked here) or ``[num_kv_heads]`` float32, finite
            and > 0 (per kv head).
        tree_mask: ``None`` or ``[sum_b q_b * q_b]`` bool, each sequence's ``[q_b, q_b]``
            mask row-major in sequence order, with a True diagonal and nothing above it.
        sync: read the values (one device-to-host transfer); ``False`` checks shapes,
            dtypes and devices only and returns ``None``.

    Returns:
        ``(seq_lens, query_start_loc)`` as lists (read in the one transfer), or ``None``
        without ``sync``.
    """
    named = dict(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=block_tables,
        seq_lens=seq_lens,
        query_start_loc=query_start_loc,
    )
    t: dict[str, torch.Tensor] = {}
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise ProblemError(owner, name, f"must be a torch.Tensor, got {type(x).__name__}")
        t[name] = x
    q, k, v = t["query"], t["key_cache"], t["value_cache"]
    for name, rank in zip(TENSOR_FIELDS, (3, 4, 4, 2, 1, 1)):
        if t[name].dim() != rank:
            raise ProblemError(owner, name, f"must have rank {rank}, got shape {tuple(t[name].shape)}")
    if q.dtype not in query_dtypes:
        raise ProblemError(owner, "query", f"must be {dtype_text(query_dtypes)}, got {q.dtype}")
    if k.dtype != q.dtype and k.dtype not in FP8_DTYPES:
        raise ProblemError(
            owner, "key_cache", f"must be the query dtype {q.dtype} or {dtype_text(FP8_DTYPES)}, got {k.dtype}"
        )
    if v.dtype != k.dtype:
        raise ProblemError(owner, "value_cache", f"must have the key_cache dtype {k.dtype}, got {v.dtype}")
    for name in ("block_tables", "seq_lens", "query_start_loc"):
        if t[name].dtype != torch.int32:
            raise ProblemError(owner, name, f"must be int32, got {t[name].dtype}")
    dev = q.device
    for name, x in t.items():
        if x.device != dev:
            raise ProblemError(owner, name, f"must be on the query's device {dev} (one device for all), got {x.device}")
    if dev.type == "meta":
        # the checks below read the lengths and tables, and the oracle reads everything
        raise ProblemError(owner, "query", "must hold values (use cpu or cuda), got the meta device, which holds none")

    # shapes
    if k.shape[:3] != v.shape[:3]:
        raise ProblemError(
            owner,
            "value_cache",
            f"must have the key_cache's [num_blocks, block_size, num_kv_heads] = {tuple(k.shape[:3])}, "
            f"got {tuple(v.shape[:3])}",
        )
    T, Hq, D = q.shape
    N, bs, Hkv, Dk = k.shape
    if Dk != D:
        raise ProblemError(owner, "key_cache", f"must have the query head_dim {D}, got head_dim {Dk}")
    for name, dims in _DIMS.items():
        for i, dim in enumerate(dims):
            if t[name].shape[i] < 1:
                raise ProblemError(
                    owner, name, f"must have {dim} (dimension {i}) >= 1, got shape {tuple(t[name].shape)}"
                )
    if Hq % Hkv != 0:
        raise ProblemError(owner, "query", f"must have num_heads a multiple of num_kv_heads {Hkv}, got {Hq}")
    B = t["seq_lens"].shape[0]
    if B < 1:
        raise ProblemError(owner, "seq_lens", "must hold at least one sequence, got none")
    if t["block_tables"].shape[0] != B:
        raise ProblemError(
            owner,
            "block_tables",
            f"must have a row per sequence ({B} in seq_lens), got {t['block_tables'].shape[0]} rows",
        )
    if t["query_start_loc"].shape[0] != B + 1:
        raise ProblemError(
            owner, "query_start_loc", f"must have num_seqs + 1 = {B + 1} entries, got {t['query_start_loc'].shape[0]}"
        )
    heads = {"alibi_slopes": alibi_slopes, "sinks": sinks}
    for name, x in heads.items():
        check_per_head(owner, name, x, Hq, dev)
    scales = {"k_scale": k_scale, "v_scale": v_scale}
    for name, x in scales.items():
        check_kv_scale(owner, name, x, Hkv, dev)
    check_tree_mask(owner, tree_mask, dev)
    if not sync:
        return None
    return _check_values(
        owner,
        t,
        N,
        bs,
        {n: x for n, x in heads.items() if isinstance(x, torch.Tensor)},
        {n: x for n, x in scales.items() if isinstance(x, torch.Tensor)},
        tree_mask if isinstance(tree_mask, torch.Tensor) else None,
    )


def check_tree_mask(owner: str, t: object, device: torch.device) -> None:
    """``tree_mask``'s type: ``None`` or a 1-D bool tensor on ``device``. Its length and its
    entries (a True diagonal, nothing above it) are values, read by ``check_tensors``."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise ProblemError(owner, "tree_mask", f"must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dim() != 1 or t.dtype != torch.bool:
        raise ProblemError(
            owner,
            "tree_mask",
            f"must be [sum_b q_b * q_b] bool (each sequence's mask over its new tokens, flattened), "
            f"got {t.dtype} of shape {tuple(t.shape)}",
        )
    if t.device != device:
        raise ProblemError(
            owner, "tree_mask", f"must be on the query's device {device} (one device for all), got {t.device}"
        )


def tree_mask_offsets(query_lens: list[int]) -> list[int]:
    """``[num_seqs + 1]``: where each sequence's ``[q_b, q_b]`` mask starts in a packed tree
    mask (``sum_{b' < b} q_b'^2``), and the total length last."""
    out = [0]
    for q in query_lens:
        out.append(out[-1] + q * q)
    return out


def _check_tree_mask_values(owner: str, mask: list[int], query_lens: list[int]) -> None:
    """The tree mask's length and entries (host copies): every sequence's ``[q_b, q_b]`` matrix
    has a True diagonal (a token sees itself) and no True above it (a token's ancestors come
    before it)."""
    offsets = tree_mask_offsets(query_lens)
    if len(mask) != offsets[-1]:
        raise ProblemError(
            owner,
            "tree_mask",
            f"must have sum_b q_b * q_b = {offsets[-1]} entries (query lengths {query_lens}), got {len(mask)}",
        )
    for b, q in enumerate(query_lens):
        m = torch.tensor(mask[offsets[b] : offsets[b + 1]], dtype=torch.bool).view(q, q)
        diag = m.diagonal()
        if not bool(diag.all()):
            i = int((~diag).nonzero()[0, 0])
            raise ProblemError(
                owner,
                "tree_mask",
                f"must have a True diagonal (a token sees itself), got [{i}, {i}] False for sequence {b}",
            )
        above = m.triu(1)
        if bool(above.any()):
            i, j = (int(x) for x in above.nonzero()[0])
            raise ProblemError(
                owner,
                "tree_mask",
                f"must be False above the diagonal (a token's ancestors come before it), "
                f"got [{i}, {j}] True for sequence {b}",
            )


def _check_values(
    owner: str,
    t: dict[str, torch.Tensor],
    num_blocks: int,
    block_size: int,
    heads: dict[str, torch.Tensor],
    scales: dict[str, torch.Tensor] | None = None,
    tree_mask: torch.Tensor | None = None,
) -> tuple[list[int], list[int]]:
    """The value rules, from one device-to-host transfer: the lengths, the offsets, per
    sequence whether a block id it uses is out of range (computed where the table lives),
    whether each per-head tensor is finite, and whether each per-kv-head scale is finite
    and > 0."""
    scales = scales or {}
    tables, seq_lens, loc_t = t["block_tables"], t["seq_lens"], t["query_start_loc"]
    B, M = tables.shape
    T = t["query"].shape[0]
    need_t = (seq_lens.long() + block_size - 1) // block_size  # [B]
    used = torch.arange(M, device=tables.device)[None, :] < need_t[:, None]  # [B, M]
    bad = used & ((tables < 0) | (tables >= num_blocks))  # [B, M]
    finite = [torch.isfinite(x).all().long().reshape(1) for x in heads.values()]
    positive = [(torch.isfinite(x) & (x > 0)).all().long().reshape(1) for x in scales.values()]
    mask = [] if tree_mask is None else [tree_mask.long()]
    values = torch.cat([seq_lens.long(), loc_t.long(), bad.any(dim=1).long(), *finite, *positive, *mask]).tolist()
    lens, loc, bad_rows = values[:B], values[B : 2 * B + 1], values[2 * B + 1 : 3 * B + 1]
    flags = 3 * B + 1 + len(heads) + len(scales)
    for name, ok in zip(heads, values[3 * B + 1 :]):
        if not ok:
            raise ProblemError(owner, name, "must be finite, got NaN or infinity")
    for name, ok in zip(scales, values[3 * B + 1 + len(heads) :]):
        if not ok:
            # the error path may read the device again: the entries, for the message
            got = ", ".join(f"{x:g}" for x in scales[name].tolist())
            raise ProblemError(owner, name, f"must be finite and > 0 for every kv head, got [{got}]")
    if loc[0] != 0:
        raise ProblemError(owner, "query_start_loc", f"must start at 0, got {loc[0]}")
    if loc[-1] != T:
        raise ProblemError(owner, "query_start_loc", f"must end at num_tokens = {T}, got {loc[-1]}")
    for b in range(B):
        q_b, s_b = loc[b + 1] - loc[b], lens[b]
        if q_b < 0:
            raise ProblemError(
                owner, "query_start_loc", f"must never decrease, got [{b}]={loc[b]} > [{b + 1}]={loc[b + 1]}"
            )
        if q_b < 1:
            raise ProblemError(
                owner, "query_start_loc", f"must give every sequence >= 1 new token, got {q_b} for sequence {b}"
            )
        if s_b < q_b:
            raise ProblemError(
                owner,
                "seq_lens",
                f"must be >= the query length (q_b <= seq_len), got seq_lens[{b}]={s_b} below its query length {q_b}",
            )
        need = -(-s_b // block_size)
        if need > M:
            raise ProblemError(
                owner,
                "block_tables",
                f"must have a column per block used: sequence {b} needs "
                f"{need} blocks for seq_len {s_b} at block_size {block_size}, got {M} columns",
            )
        if bad_rows[b]:
            # the error path may read the device again: the exact entry, for the message
            i = int(bad[b].nonzero()[0, 0])
            raise ProblemError(
                owner,
                "block_tables",
                f"must hold block ids in [0, num_blocks={num_blocks}) where "
                f"used, got [{b}, {i}] = {int(tables[b, i])} outside [0, num_blocks={num_blocks})",
            )
    if tree_mask is not None:
        _check_tree_mask_values(owner, values[flags:], [loc[b + 1] - loc[b] for b in range(B)])
    return lens, loc


def check_slot_mapping(
    owner: str, pool: torch.Tensor, slot_mapping: object, new: object = None, *, sync: bool = True
) -> None:
    """The operations besides attention: a gather (``new`` is ``None``) reads
    ``pool.view(-1, ...)[slot_mapping]``, a cache write stores ``new[i]`` at every
    ``slot_mapping[i] >= 0`` (a slot < 0 is skipped). Raises ``ProblemError``.

    Args:
        pool: ``[num_blocks, block_size, num_kv_heads, head_dim]`` (the caller's own tensor).
        slot_mapping: ``[n]`` int32/int64 on the pool's device; every slot is
            ``< num_blocks * block_size``, and ``>= 0`` for a gather.
        new: ``[n, num_kv_heads, head_dim]`` in the pool's dtype and device (a write).
        sync: read the slots' bounds (one device-to-host transfer); ``False`` checks
            shapes, dtypes and devices only.
    """
    if not isinstance(slot_mapping, torch.Tensor):
        raise ProblemError(owner, "slot_mapping", f"must be a torch.Tensor, got {type(slot_mapping).__name__}")
    if slot_mapping.dim() != 1 or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ProblemError(
            owner,
            "slot_mapping",
            f"must be [n] int32 or int64, got {slot_mapping.dtype} of shape {tuple(slot_mapping.shape)}",
        )
    if slot_mapping.device != pool.device:
        raise ProblemError(
            owner, "slot_mapping", f"must be on the pool's device {pool.device}, got {slot_mapping.device}"
        )
    if new is not None:
        want = (slot_mapping.shape[0], *pool.shape[2:])
        if not isinstance(new, torch.Tensor):
            raise ProblemError(owner, "new", f"must be a torch.Tensor, got {type(new).__name__}")
        if tuple(new.shape) != want or new.dtype != pool.dtype or new.device != pool.device:
            raise ProblemError(
                owner,
                "new",
                f"must be {pool.dtype} of shape {want} on {pool.device}, "
                f"got {new.dtype} {tuple(new.shape)} on {new.device}",
            )
    if not sync or slot_mapping.numel() == 0:
        return
    n_slots = pool.shape[0] * pool.shape[1]
    lo, hi = torch.stack([slot_mapping.min(), slot_mapping.max()]).tolist()
    if hi >= n_slots or (new is None and lo < 0):
        bound = f"[0, num_blocks * block_size = {n_slots})" if new is None else f"< num_blocks * block_size = {n_slots}"
        raise ProblemError(owner, "slot_mapping", f"must hold slots {bound}, got slots from {lo} to {hi}")


def check_problem(
    owner: str,
    query: object,
    key_cache: object,
    value_cache: object,
    block_tables: object,
    seq_lens: object,
    query_start_loc: object,
    scale: object = None,
    *,
    sliding_window: object = None,
    logits_soft_cap: object = None,
    alibi_slopes: object = None,
    sinks: object = None,
    k_scale: object = 1.0,
    v_scale: object = 1.0,
    tree_mask: object = None,
    query_dtypes: Collection[torch.dtype] = FLOAT_DTYPES,
) -> tuple[list[int], list[int]]:
    """The whole problem: ``check_tensors`` then ``check_options`` (fields as in
    ``PagedCase``), and the combinations no case takes. Returns ``(seq_lens,
    query_start_loc)`` as lists."""
    read = check_tensors(
        owner,
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        k_scale=k_scale,
        v_scale=v_scale,
        tree_mask=tree_mask,
        query_dtypes=query_dtypes,
    )
    assert read is not None  # sync=True reads the values
    assert isinstance(key_cache, torch.Tensor)  # checked above
    check_options(
        owner,
        key_cache.dtype,
        scale=scale,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    check_tree_combination(owner, tree_mask, sliding_window=sliding_window, alibi_slopes=alibi_slopes)
    return read


def check_tree_combination(owner: str, tree_mask: object, *, sliding_window: object, alibi_slopes: object) -> None:
    """No window and no ALiBi beside a tree mask: a tree's positions follow its depth, which
    either would read; engines do not combine them with tree verification, so the case carries
    no positions."""
    if tree_mask is None:
        return
    for name, x in (("sliding_window", sliding_window), ("alibi_slopes", alibi_slopes)):
        if x is not None:
            raise ProblemError(
                owner,
                name,
                "must be None with a tree_mask (positions follow tree depth, which the case does not carry)",
            )


def is_leading_view(key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Whether ``value_cache`` is ``key_cache[..., :head_dim_v]``: the same storage, the same
    first element and strides (MLA's latent cache, whose values are its keys' leading
    columns). A copy of those columns is not a view: the same values, another layout."""
    return (
        value_cache.shape[-1] <= key_cache.shape[-1]
        and value_cache.shape[:-1] == key_cache.shape[:-1]
        and value_cache.data_ptr() == key_cache.data_ptr()
        and value_cache.stride() == key_cache.stride()
        and value_cache.dtype == key_cache.dtype
    )
