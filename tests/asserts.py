"""Tensor assertions whose messages stand on their own: what was compared, how many
elements differ, and the first (or worst) of them with its index, value and expectation."""

from __future__ import annotations

import torch

#: a float64 round trip through one or two roundings (log2(e) and back): a few ulps of 2**-53
F64_ROUND_TRIP = 1e-15
#: a float64 mean or sum of a few thousand terms taken in another order (a product with ones)
F64_REORDERED_SUM = 1e-14
#: the fused check's error statistics (``rms_ratio``, ``rms_elements``) against the torch path's:
#: sums over the output of terms each within ``policy.FUSED_RTOL`` of the torch path's, taken in
#: another order (a row at a time, then the reduction): n u, 1e-11 at 1e5 elements, at worst; a
#: term left out of the kernel's expected error moves them 1e-9 or more
FUSED_RMS_RTOL = 1e-10


def _where(t: torch.Tensor, flat: int) -> tuple[int, ...]:
    """The index of flat element ``flat`` of ``t``."""
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), t.shape)) if t.dim() else ()


def _same_form(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    __tracebackhide__ = True
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"{what}: got {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}")


def assert_equal(got: torch.Tensor, want: torch.Tensor, what: str, nan_equal: bool = False) -> None:
    """``got`` equals ``want`` element for element, as ``torch.equal`` (with ``nan_equal``, a NaN
    matches a NaN at the same index)."""
    __tracebackhide__ = True
    _same_form(got, want, what)
    g, w = got.detach().cpu().reshape(-1), want.detach().cpu().reshape(-1)
    differ = g != w
    if nan_equal and g.is_floating_point():
        differ &= ~(g.isnan() & w.isnan())
    if differ.any():
        first = int(differ.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(differ.sum())} of {g.numel()} elements differ; the first at {_where(got, first)}: "
            f"got {g[first].item()!r}, expected {w[first].item()!r}"
        )


def assert_differs(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """``got`` differs from ``want`` in at least one element (or in shape or dtype)."""
    __tracebackhide__ = True
    if got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want):
        raise AssertionError(f"{what}: all {got.numel()} elements are equal, expected a difference")


def assert_close(got: torch.Tensor, want: torch.Tensor, rtol: float, what: str, atol: float = 0.0) -> None:
    """``|got - want| <= atol + rtol |want|`` everywhere (NaN never within it), else the worst
    element's index, value, expectation and its error over the allowance."""
    __tracebackhide__ = True
    _same_form(got, want, what)
    g = got.detach().cpu().double().reshape(-1)
    w = want.detach().cpu().double().reshape(-1)
    allowed = atol + rtol * w.abs()
    err = (g - w).abs()
    bad = ~(err <= allowed)  # NaN compares false: always bad
    if bad.any():
        ratio = torch.where(bad & err.isnan(), torch.inf, err / allowed.clamp_min(torch.finfo(torch.float64).tiny))
        worst = int(torch.where(bad, ratio, -1.0).argmax())
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {g.numel()} elements outside rtol={rtol:g} atol={atol:g}; the worst at "
            f"{_where(got, worst)}: got {g[worst].item()!r}, expected {w[worst].item()!r} "
            f"({ratio[worst].item():.3g}x the allowance)"
        )
