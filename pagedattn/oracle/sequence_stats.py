"""A sequence's own terms of the bound: its values' moments, a decode's value sums, its key reach.

``pagedattn.oracle.policy`` forms the bound a block of rows at a time; what a row needs from
the sequence beyond its block (the values' mean and squared deviations, the largest norm among
the keys it sees, how many keys it sees) is formed here, once a sequence where it can be, and
a block's product with those terms takes the storage of its spent scores (``_spent``). The
fused check (``pagedattn.verdict_kernel.host``) forms the same numbers in its kernels.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from pagedattn.oracle.error_model import U_FP32
from pagedattn.oracle.reference import Chunk

#: elements of a sequence's values whose deviations from their mean are squared at once
#: (``_value_moments``, the torch path): a float64 temporary of 1 MiB
_MOMENTS_SLICE = 1 << 17

#: ones by device, dtype and stream, at least as many as the longest history yet (``_centre``)
_ONES: dict[tuple[torch.device, torch.dtype, int], torch.Tensor] = {}


def _centre(v: torch.Tensor, by_product: bool | None = None) -> torch.Tensor:
    """The mean over the keys of ``v`` ``[Hkv, L, D]`` float64: ``[Hkv, 1, D]`` float64. On a GPU (or
    with ``by_product``) as a product with ones: CUDA's ``mean`` over a middle dimension holds a
    temporary twice ``v``'s size while it reduces (32 MB for 4000 keys of 4 heads of 128, which
    would put the check's peak over the oracle's)."""
    if not (v.device.type != "cpu" if by_product is None else by_product):
        return v.mean(dim=1, keepdim=True)
    # kept (a fill is a launch a sequence, on a host-bound check), per stream: another stream's
    # read of them would not be ordered after their fill, nor their release after its read
    stream = torch._C._cuda_getCurrentRawStream(v.device.index) if v.device.type == "cuda" else 0
    ones = _ONES.get((v.device, v.dtype, stream))
    if ones is None or ones.numel() < v.shape[1]:
        ones = torch.ones(max(v.shape[1], 2 * (0 if ones is None else ones.numel())), dtype=v.dtype, device=v.device)
        _ONES[(v.device, v.dtype, stream)] = ones
    return torch.bmm(ones[: v.shape[1]].expand(v.shape[0], 1, v.shape[1]), v).div_(v.shape[1])


def _value_moments(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``v`` ``[Hkv, L, D]`` float64 (a sequence's values from the first its rows see; rows of D
    contiguous): its mean over the keys ``c`` ``[Hkv, 1, D]`` and ``[|v|, (v - c)^2, v - c]``
    ``[Hkv, L, 3D]`` in float32, the right factor of the bound's product (its first 2D columns,
    with the weights) and of the expected error's (its last 2D, with the squared weights). Only
    the values the rows see: a decode under a window of W holds W of them, not the whole history
    (on the device path a decode has none: ``policy.direct_decode``)."""
    centre = _centre(v)
    vv = torch.empty(*v.shape[:2], 3 * v.shape[2], dtype=torch.float32, device=v.device)
    D = v.shape[2]
    vv[..., :D].copy_(v).abs_()  # |fl32(v)| = fl32(|v|): no float64 temporary
    # the difference in float64 (it may cancel), on the CPU a slice of keys at a time: a
    # history-sized float64 temporary would be fresh pages at every check (16 MB at 4000 keys);
    # on a device, where each slice is launches, in one pass
    step = max(1, _MOMENTS_SLICE // max(1, v.shape[0] * D)) if v.device.type == "cpu" else v.shape[1]
    for k0 in range(0, v.shape[1], step):
        dev = v[:, k0 : k0 + step] - centre
        vv[:, k0 : k0 + step, 2 * D :] = dev
        vv[:, k0 : k0 + step, D : 2 * D] = dev.square_()
    return centre, vv


class DecodeSums(NamedTuple):
    """A decode's sums over its keys, about its own output ``o``, each ``[1, Hq, D]`` float64
    (``p2``: ``[1, Hq, 1]``)."""

    abs_pv: torch.Tensor  # sum_j p_j |v_j|
    s2: torch.Tensor  # sum_j p_j (v_j - o)^2
    q2: torch.Tensor  # sum_j p_j^2 (v_j - o)^2
    q1: torch.Tensor  # sum_j p_j^2 (v_j - o)
    p2: torch.Tensor  # sum_j p_j^2
    w2: torch.Tensor | None  # sum_j w_j (v_j - o)^2, w the keys' weights given (None: none given)


def _decode_sums(c: Chunk, o: torch.Tensor, key_w: torch.Tensor | None = None) -> DecodeSums:
    """A decode's sums (``DecodeSums``) from its weights and values in float64, about its own
    output ``o`` ``[1, Hq, D]`` float64: the terms of ``s2`` and ``q2`` are nonnegative, so those
    sums are their values to within a float64 rounding a key, in any order (the verdict
    kernel's, ``pagedattn.verdict_kernel.host``, and torch's). The squared deviations are
    formed a slice of keys at a time, each at most the size of the values (the float32 moments
    this replaces were as large), or of one key a query head where the keys are fewer than the
    GQA group (a window under G keys: the size of the output). ``key_w`` ``[Hkv, G, 1, Lc]``
    float64: weights of the keys for ``w2``."""
    Hkv, G, n, Lc = c.probs.shape
    D = c.v.shape[2]
    p = c.probs.view(Hkv, G, Lc)
    pp = p.square()
    s1 = torch.bmm(p, c.v.abs())  # [Hkv, G, D]
    p2 = pp.sum(dim=-1, keepdim=True)  # [Hkv, G, 1]
    ov = o.view(Hkv, G, 1, D)
    q1 = torch.bmm(pp, c.v).sub_(p2 * ov.view(Hkv, G, D))  # sum_j p_j^2 v_j - o sum_j p_j^2
    step = max(1, Lc // G)
    s2 = torch.zeros(Hkv * G, 1, D, dtype=torch.float64, device=o.device)
    q2 = torch.zeros_like(s2)
    w2 = None if key_w is None else torch.zeros_like(s2)
    kw = None if key_w is None else key_w.view(Hkv, G, Lc)
    for k0 in range(0, Lc, step):
        dv = (c.v[:, None, k0 : k0 + step] - ov).square_().view(Hkv * G, -1, D)  # [Hkv * G, s, D]
        s2.baddbmm_(p[:, :, k0 : k0 + step].reshape(Hkv * G, 1, -1), dv)
        q2.baddbmm_(pp[:, :, k0 : k0 + step].reshape(Hkv * G, 1, -1), dv)
        if w2 is not None and kw is not None:
            w2.baddbmm_(kw[:, :, k0 : k0 + step].reshape(Hkv * G, 1, -1), dv)
        del dv
    return DecodeSums(
        s1.view(1, Hkv * G, D),
        s2.view(1, Hkv * G, D),
        q2.view(1, Hkv * G, D),
        q1.view(1, Hkv * G, D),
        p2.view(1, -1, 1),
        None if w2 is None else w2.view(1, Hkv * G, D),
    )


def _key_reach(norms: torch.Tensor, window: int | None) -> torch.Tensor:
    """The largest key norm each position of a sequence sees: ``[Hkv, L]`` float64 from its keys'
    norms ``[Hkv, L]`` float64 (``k_all.norm(dim=-1)``), position ``p`` seeing keys
    ``max(0, p - W + 1) .. p`` (``window`` ``W``; all up to ``p`` without one). Positions count from
    the norms' first key: from a later key ``f`` (``norms[:, f:]``), position ``p - f`` sees from
    ``f`` on, right for every row whose window starts at ``f`` or later. A sliding maximum in O(L)
    whatever ``W`` (van Herk / Gil-Werman): prefix and suffix maxima within segments of ``W`` keys,
    a window ending at ``p`` being a suffix of one segment and a prefix of the next."""
    L = norms.shape[1]
    if window is None or window >= L:
        return norms.cummax(dim=-1).values
    W = window
    segs = -(-L // W)
    x = torch.nn.functional.pad(norms, (0, segs * W - L)).view(-1, segs, W)  # norms >= 0: a 0 pad is never a max
    pre = x.cummax(dim=-1).values.view(-1, segs * W)[:, :L]
    suf = x.flip(-1).cummax(dim=-1).values.flip(-1).view(-1, segs * W)
    reach = pre.clone()  # positions below W - 1 see keys 0 .. p: a prefix of the first segment
    torch.maximum(suf[:, : L - W + 1], pre[:, W - 1 :], out=reach[:, W - 1 :])
    return reach


class _KeyMax:
    """The largest norm among the keys each row of a block sees, ``[Hkv, 1, n]`` float64 (``n``
    1: ``[Hkv, 1, 1]``): a single row sees its block's keys; a block of rows, each its own range of
    them, from a sliding maximum of the sequence's key norms formed once a sequence."""

    def __init__(self, window: int | None) -> None:
        self.window, self.seq, self.reach = window, -1, torch.empty(0)

    def __call__(self, c: Chunk) -> torch.Tensor:
        Hkv, _, n, _ = c.probs.shape
        if n == 1:
            return c.k.norm(dim=-1).amax(dim=-1).view(Hkv, 1, 1)
        if self.seq != c.seq:
            self.seq, self.reach = c.seq, _key_reach(c.k_all.norm(dim=-1), self.window)
        return self.reach[:, c.keys.stop - n : c.keys.stop].view(Hkv, 1, n)  # rows p0 .. p1


def _visible_keys_grow(c: Chunk, window: int | None) -> float | torch.Tensor:
    """``1 / (1 - (k + 3) u_fp32)`` (``1 + gamma_{k+3}``) for each row of the block, ``k`` the keys
    it sees (a float for a single row, ``[n, 1, 1]`` float64 otherwise): a float32 sum of
    nonnegative float32 products of float32-rounded factors, ``k`` of them nonzero, is within
    ``gamma_{k+3}`` of its value relatively (a hidden key's weight is 0: its product is 0 and adds
    exactly, whatever the order of the sum). A single row sees its block's Lc keys; row p,
    min(p + 1, W)."""
    _, _, n, Lc = c.probs.shape
    if n == 1:
        return 1.0 / (1.0 - (Lc + 3) * U_FP32)
    seen = torch.arange(c.keys.stop - n + 1, c.keys.stop + 1, dtype=torch.float64, device=c.probs.device)
    if window is not None:
        seen.clamp_(max=window)
    return seen.add_(3.0).mul_(-U_FP32).add_(1.0).reciprocal_().view(n, 1, 1)


def _spent(scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``scores``' shape in ``dtype`` (float32 or float64) in the storage of the block's
    float64 scores, spent once the oracle has its weights and smallest logits (a new one where the
    scores are not a contiguous float64 tensor at the start of their storage): the check's
    score-sized work then costs no memory beyond the oracle's."""
    if scores.dtype != torch.float64 or scores.storage_offset() != 0 or not scores.is_contiguous():
        return torch.empty(scores.shape, dtype=dtype, device=scores.device)
    return torch.empty(0, dtype=dtype, device=scores.device).set_(
        scores.untyped_storage(), 0, scores.shape, scores.stride()
    )
