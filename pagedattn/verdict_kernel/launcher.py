"""The fused check's kernel launches, with Triton's host cost cut: compiled kernels kept and reused.

``_compiled`` imports the kernels (``pagedattn.verdict_kernel.kernel`` and ``.reductions``) where
the fused check first runs. ``_launch`` keeps the ``CompiledKernel`` each launch through the JIT
returns, keyed by what the JIT specializes on (``_plan``, ``_spec``, ``_key``), and launches the
matching ones as Triton's runner would, without the JIT's binding and lookup.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch

from pagedattn.verdict_kernel import MIN_TRITON, triton_problem

__all__ = ["MIN_TRITON", "triton_problem"]


class Kernels(NamedTuple):
    """The check's Triton kernels (``_build``)."""

    verdict: Any  # a block of rows: the bound, the ratios, each row's statistics
    moments: Any  # a sequence's ``[|v|, (v - c)^2, v - c]`` in float32 (``sequence_stats._value_moments``), key norms
    decode_sums: Any  # a long decode's value sums and largest key norm over its keys' slices
    reduce: Any  # the rows' statistics into one (``host.reduced``; a check's own in the verdict kernel's last program)


_kernel: Kernels | None = None


def _compiled() -> Kernels:
    global _kernel
    if _kernel is None:
        _kernel = _build()
    return _kernel


def _build() -> Kernels:
    from pagedattn.verdict_kernel import kernel, reductions

    return Kernels(
        kernel.verdict_kernel, reductions.moments_kernel, reductions.decode_sums_kernel, reductions.reduce_kernel
    )


#: compiled kernels by what Triton specializes them on (``_launch``), at most ``_MAX_RUNNERS``
_RUNNERS: dict[tuple, Any] = {}
_MAX_RUNNERS = 256
#: per kernel, its leading (non-constexpr) parameters' (do_not_specialize, ..._on_alignment)
_PLANS: dict[Any, list[tuple[bool, bool]]] = {}


def _plan(kernel: Any) -> list[tuple[bool, bool]]:
    """Which of ``kernel``'s parameters Triton specializes on value or alignment: each param's
    own flags (triton 3.6 and 3.9's ``KernelParam``); without them, every parameter is taken as
    specialized (a finer key: never a wrong kernel, only more JIT launches)."""
    plan = _PLANS.get(kernel)
    if plan is None:
        plan = [
            (bool(getattr(p, "do_not_specialize", False)), bool(getattr(p, "do_not_specialize_on_alignment", False)))
            for p in getattr(kernel, "params", [])
        ]
        _PLANS[kernel] = plan
    return plan


def _spec(arg: Any, dns: bool = False, dnsa: bool = False) -> Any:
    """What Triton's JIT specializes ``arg`` on, or more: a tensor's dtype and, unless ``dnsa``,
    its 16-byte alignment; an integer's width and, unless ``dns``, whether it is 1 and whether 16
    divides it; a bool's value; anything else's type (a float's, None's)."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype if dnsa else (arg.dtype, arg.data_ptr() % 16 == 0)
    if isinstance(arg, bool):
        return ("b", arg)
    if isinstance(arg, int):
        width = "i32" if -(2**31) <= arg < 2**31 else "i64" if -(2**63) <= arg < 2**63 else "u64"
        return width if dns else (width, arg == 1, arg % 16 == 0)
    return type(arg).__name__


def _key(args: tuple, flags: list[tuple[bool, bool]]) -> tuple:
    """``tuple(_spec(a, *f) for a, f in zip(args, flags))``, with the common types inline: a
    launch's key is ~45 arguments, and ``_spec`` for each would cost most of what the runner saves."""
    out: list[Any] = []
    add = out.append
    for a, f in zip(args, flags):
        kind = type(a)
        if kind is int:
            width = "i32" if -(2**31) <= a < 2**31 else "i64" if -(2**63) <= a < 2**63 else "u64"
            add(width if f[0] else (width, a == 1, a % 16 == 0))
        elif kind is float:
            add("float")
        elif isinstance(a, torch.Tensor):
            add(a.dtype if f[1] else (a.dtype, a.data_ptr() % 16 == 0))
        else:
            add(_spec(a, *f))
    return tuple(out)


def _launch(kernel: Any, grid: tuple[int, ...], args: tuple, consts: dict[str, Any], key: Any = None) -> None:
    """``kernel[grid](*args, **consts)``, with Triton's host cost cut where it can be.

    Triton's JIT binds, specializes and looks up a kernel's arguments on every launch: tens of
    microseconds of host time for the verdict kernel's ~47 arguments, a launch a block of rows,
    where the oracle's own pass is a few milliseconds of host-bound launches. The kernel it
    returns (a ``CompiledKernel``) is
    kept here by what the JIT specializes on (``_spec`` under the kernel's own do-not-specialize
    flags: the same key or a finer one, so a launch it serves is one the JIT would have given the
    same kernel), per device, and serves the launches that match; the others go through the JIT,
    and so does everything on the interpreter (which returns no compiled kernel) and on ROCm (whose
    Triton also specializes on a tensor's storage size). A kept kernel is launched as its runner
    does (``CompiledKernel.__getitem__`` in triton 3.6 and 3.9: the same call, the launch hooks
    and metadata read each time), less the runner's closure and its device and stream lookups:
    the stream is the device's current one, read from torch as Triton reads it. What is not
    redone: the JIT's debug and instrumentation options and its pre-run hooks, read at a key's
    first launch (none is set by this package). ``consts`` are the kernel's last parameters, in
    order (its constexprs). ``key``: the caller's own key for ``args`` (``_verdict_key``), which
    must decide the JIT's specialization as ``_key`` would, in place of ``_key``."""
    device = torch.cuda.current_device() if _cuda_available() else -1
    if key is None:
        plan = _plan(kernel)
        flags = plan if len(plan) >= len(args) else [(False, False)] * len(args)
        key = _key(args, flags)
    full = (kernel, device, tuple(consts.items()), key)
    kept = _RUNNERS.get(full)
    if kept is not None:
        compiled, direct = kept
        g = tuple(grid) + (1,) * (3 - len(grid))
        if direct:
            stream = torch._C._cuda_getCurrentRawStream(device)
            knobs = _knobs().runtime
            compiled.run(
                g[0],
                g[1],
                g[2],
                stream,
                compiled.function,
                compiled.packed_metadata,
                compiled.launch_metadata(g, stream, *args, *consts.values()),
                knobs.launch_enter_hook,
                knobs.launch_exit_hook,
                *args,
                *consts.values(),
            )
        else:
            compiled[g](*args, *consts.values())
        return
    names = list(getattr(kernel, "arg_names", []))
    assert not names or names[len(names) - len(consts) :] == list(consts), (names, list(consts))
    compiled = kernel[grid](*args, **consts)
    if torch.version.hip is None and hasattr(compiled, "function") and callable(getattr(compiled, "__getitem__", None)):
        if len(_RUNNERS) >= _MAX_RUNNERS:
            _RUNNERS.clear()
        # launched as its runner would be where it has the runner's pieces (triton 3.6, 3.9)
        direct = all(hasattr(compiled, a) for a in ("run", "packed_metadata", "launch_metadata")) and hasattr(
            torch._C, "_cuda_getCurrentRawStream"
        )
        _RUNNERS[full] = (compiled, direct)  # a compiled kernel (the interpreter returns none)


@functools.cache
def _cuda_available() -> bool:
    """``torch.cuda.is_available()``, asked once a process: its Python path costs ~20 us, at each
    of a check's launches, and the answer does not change within a process."""
    return torch.cuda.is_available()


def _knobs() -> Any:
    """``triton.knobs`` (the launch hooks), imported where a kept kernel is first launched."""
    from triton import knobs

    return knobs


def _pow2(n: int) -> int:
    """The power of two at or above ``n``, at least 16: a block's tile over ``n`` elements."""
    return 1 << max(4, (n - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
