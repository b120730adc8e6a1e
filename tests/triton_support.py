"""Shared helpers of the ``test_triton_*`` modules (no tests here): the device, the cases
several modules run, the plan's arguments, a marker for kernel runs, and the assertions
that compare the kernel's bits."""

import importlib.util

import pytest
import torch

from pagedattn.adapters.triton import MIN_INTERPRETER_TRITON
from pagedattn.cases import CaseSpec
from pagedattn.kernels import launch_plan
from pagedattn.kernels.tuning import TUNING

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _interpreter_too_old() -> str:
    """Why the kernel cannot run here ("" where it can): the interpreter of older Triton cannot
    run it; the backend reports that as unsupported (tests/test_bundled_backends.py), and the
    direct runs are skipped with it."""
    if DEVICE != "cpu" or importlib.util.find_spec("triton") is None:
        return ""
    import triton  # after the conftest decided the interpreter

    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < MIN_INTERPRETER_TRITON:
        return f"triton {triton.__version__}'s interpreter cannot run the kernel (needs >= 3.6)"
    return ""


runs_kernel = pytest.mark.skipif(bool(_interpreter_too_old()), reason=_interpreter_too_old() or "runs here")

# a matrix's members past the default run's representatives (5-10 s each on the interpreter):
# CI's second step runs them (-m slow); on a GPU run them all with -m "slow or not slow"
SLOW = pytest.mark.slow


def case_args(case):
    """The kernel's positional tensors of ``case``."""
    return [case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens, case.query_start_loc]


BASE = CaseSpec("t", ((9, 3), (5, 1)), num_heads=4, num_kv_heads=2, head_dim=16, block_size=4)


def bad_args(field, fn):
    """``BASE``'s arguments by name, changed by ``fn`` (to break ``field``)."""
    case = BASE.build()
    args = dict(
        zip(["query", "key_cache", "value_cache", "block_tables", "seq_lens", "query_start_loc"], case_args(case))
    )
    fn(args)
    return args


def plan_of(
    seq_lens,
    query_lens,
    heads=32,
    kv=8,
    d=128,
    bs=16,
    dtype=torch.bfloat16,
    interpreter=False,
    kv_dtype=None,
    sliding_window=None,
    tuning=TUNING,
):
    """``plan_launch`` of a batch, with the shapes most tests use as defaults."""
    return launch_plan.plan_launch(
        seq_lens, query_lens, heads, kv, d, bs, dtype, interpreter, kv_dtype, sliding_window, tuning=tuning
    )


KERNEL_CASES = (
    [CaseSpec("t", ((70, 1), (1, 1), (17, 1)), dtype=dt) for dt in (torch.float32, torch.float16, torch.bfloat16)]
    + [
        CaseSpec(
            "t",
            ((33, 33), (40, 7)),
            num_heads=6,
            num_kv_heads=2,
            head_dim=80,
            block_size=3,
            layout="permuted",
            scale=0.3,
            dtype=dt,
        )
        for dt in (torch.float32, torch.bfloat16)
    ]
    + [
        # fp8 caches: V widened through split/join, bf16 queries on fp16 dots (see _query_rows)
        CaseSpec(
            "t",
            ((300, 1), (45, 1), (40, 9)),
            num_heads=8,
            num_kv_heads=2,
            head_dim=64,
            dtype=dt,
            kv_dtype=kv,
            k_scale=0.5,
            v_scale=2.0,
            query_gain=40.0,
            layout="permuted",
        )
        for dt, kv in ((torch.bfloat16, torch.float8_e4m3fn), (torch.float16, torch.float8_e5m2))
    ]
)


def attention(case, tuning=TUNING, **kw):
    """The kernel on ``case`` (``prepare`` then ``run``) under ``tuning``; ``kw``: ``prepare``'s
    other arguments (scale, variants, ``return_lse``)."""
    from pagedattn.kernels import triton_paged_attention as tpa  # imports triton: only where a kernel runs

    prep = tpa.prepare(*case_args(case), tuning=tuning, **kw)
    return tpa.run(prep, case.query, case.key_cache, case.value_cache)


def force_decode_shape(monkeypatch, shape):
    """Plan every decode launch at ``shape`` (``decode_launch_shape``'s: the split loop, splits a
    program, the whole-sequence register cap) instead of the batch's: a launch shape changes no
    bit, so a small case can take any."""
    monkeypatch.setattr(launch_plan, "decode_launch_shape", lambda *a, **kw: shape)


def force_flat_grid(monkeypatch):
    """Plan every decode grid on one axis, as past ``GRID_YZ_MAX`` programs on the second or third."""
    monkeypatch.setattr(launch_plan, "decode_grid", lambda n, groups, heads: (True, (heads * groups * n, 1, 1)))
