"""A float64 emulation of a kernel whose soft-cap tanh is approximate (PTX ``tanh.approx.f32``,
as FlashInfer's), for the tests of ``Capabilities.tanh_precision="approx"``.

Every capped score ``c tanh(s / c)`` is raised by the relative error ``rel`` of its magnitude:
``c tanh(s / c) (1 + rel sign(tanh))``, i.e. by ``rel |score|`` (away from zero when positive,
towards it when negative). That is the
worst sign pattern for the log-sum-exp (the errors add up, none cancels), and at
``rel = 2**-11`` it is the PTX ISA's largest relative error of ``tanh.approx.f32``. The rest
is exact (float64), rounded once to the output dtype, so the test sees the tanh term alone.

Usable as a backend (``--backend=tests/planted/approx_tanh.py:declared`` or ``:undeclared``): causal,
sliding window and soft-cap, attention and log-sum-exp.
"""

from __future__ import annotations

import torch

from pagedattn import Capabilities
from pagedattn.oracle import PagedCase
from pagedattn.oracle.reference import gather_history

#: the PTX ISA's largest relative error of tanh.approx.f32
PTX_TANH_REL = 2.0**-11
#: planted soft-cap mistakes that the approximate-tanh term must not hide
BUGS = ("cap_after_mask", "cap_ignored")


def approx_softcap_attention(
    case: PagedCase, rel: float = PTX_TANH_REL, bug: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [T, Hq, D] in the query dtype, lse [T, Hq] float32)`` of ``case`` (causal,
    optional sliding window and soft-cap; no ALiBi, sinks or fp8), with every capped
    score's tanh off by the relative error ``rel`` (see the module docstring). ``bug``:
    ``"cap_after_mask"`` (the masked keys' ``-inf`` capped to ``-c``: they get weight) or
    ``"cap_ignored"``."""
    if bug is not None and bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}, expected one of {BUGS}")
    T, H, D = case.num_tokens, case.num_heads, case.head_dim
    out = torch.empty(T, H, D, dtype=case.dtype, device=case.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=case.device)
    cap, window = case.logits_soft_cap, case.sliding_window
    loc = case.query_start_loc_list
    for b, L in enumerate(case.seq_lens_list):
        k, v = gather_history(case, b)  # [L, Hkv, D]
        k = k.double().repeat_interleave(case.gqa_ratio, 1).transpose(0, 1)  # [Hq, L, D]
        v = v.double().repeat_interleave(case.gqa_ratio, 1).transpose(0, 1)
        q = case.query[loc[b] : loc[b + 1]].double().transpose(0, 1)  # [Hq, n, D]
        n = q.shape[1]
        s = (q @ k.transpose(1, 2)) * case.scale  # [Hq, n, L]
        pos = torch.arange(L - n, L, device=s.device)[:, None]  # [n, 1] absolute positions
        j = torch.arange(L, device=s.device)[None, :]  # [1, L]
        visible = j <= pos
        if window is not None:
            visible &= j > pos - window
        if bug == "cap_after_mask":
            s = s.masked_fill(~visible, float("-inf"))
        if cap is not None and bug != "cap_ignored":
            t = torch.tanh(s / cap)
            s = cap * t * (1.0 + rel * torch.sign(t))
        s = s.masked_fill(~visible, float("-inf")) if bug != "cap_after_mask" else s
        m = s.amax(-1, keepdim=True)  # [Hq, n, 1]
        p = torch.exp(s - m)
        denom = p.sum(-1, keepdim=True)
        out[loc[b] : loc[b + 1]] = ((p @ v) / denom).transpose(0, 1).to(case.dtype)
        lse[loc[b] : loc[b + 1]] = (m + torch.log(denom))[..., 0].transpose(0, 1).float()
    return out, lse


class ApproxTanhBackend:
    """The emulation behind the adapter contract, declaring its tanh (``approx``) or not."""

    def __init__(self, declare: bool = True, rel: float = PTX_TANH_REL):
        self.rel = rel
        self.name = "approx-tanh-" + ("declared" if declare else "undeclared")
        self.capabilities = Capabilities(
            operations=frozenset({"attention", "lse"}),
            variants=frozenset({"sliding_window", "logits_soft_cap"}),
            tanh_precision="approx" if declare else "ieee",
            notes={"tanh_precision": "every capped score off by 2**-11 relative"} if declare else {},
        )

    def paged_attention(self, case: PagedCase) -> torch.Tensor:
        return approx_softcap_attention(case, self.rel)[0]

    def paged_attention_lse(self, case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
        return approx_softcap_attention(case, self.rel)


def declared() -> ApproxTanhBackend:
    return ApproxTanhBackend(declare=True)


def undeclared() -> ApproxTanhBackend:
    return ApproxTanhBackend(declare=False)
