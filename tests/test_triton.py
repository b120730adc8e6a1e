"""The Triton kernel: host-side checks and launch arithmetic (anywhere), the kernel on
the interpreter or a GPU, and an ahead-of-time compile for Hopper on this CPU."""

import json
import os
import subprocess
import sys

import pytest
import torch

from pagedattn.cases import CaseSpec
from pagedattn.kernels import triton_paged_attention as tpa
from pagedattn.oracle import check_attention

triton = pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _args(case):
    return [case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens, case.query_start_loc]


BASE = CaseSpec("t", ((9, 3), (5, 1)), num_heads=4, num_kv_heads=2, head_dim=16, block_size=4)


def _bad(field, fn):
    case = BASE.build()
    args = dict(zip(["query", "key_cache", "value_cache", "block_tables", "seq_lens", "query_start_loc"], _args(case)))
    fn(args)
    return args


def _i32(*xs):
    return torch.tensor(xs, dtype=torch.int32)


def _strided(t):
    """The same values with a non-unit stride in the last dimension."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


BAD = {
    "query-rank": ("query", "rank 3", lambda a: a.update(query=a["query"][0])),
    "dtype-mix": ("key_cache", "share a dtype", lambda a: a.update(key_cache=a["key_cache"].half())),
    "int-query": ("query", "dtype must be", lambda a: a.update(query=a["query"].int())),
    "tables-int64": ("block_tables", "int32", lambda a: a.update(block_tables=a["block_tables"].long())),
    "head-dim": ("key_cache", "head_dim", lambda a: a.update(query=a["query"][..., :8].contiguous())),
    "gqa": ("query", "multiple of num_kv_heads", lambda a: a.update(query=a["query"][:, :3].contiguous())),
    "strided-d": ("query", "contiguous", lambda a: a.update(query=_strided(a["query"]))),
    "strided-table": ("block_tables", "contiguous", lambda a: a.update(block_tables=_strided(a["block_tables"]))),
    "block-oob": ("block_tables", "outside [0, num_blocks=", lambda a: a["block_tables"].__setitem__((0, 0), 10**6)),
    "block-negative": ("block_tables", "outside [0, num_blocks=", lambda a: a["block_tables"].__setitem__((1, 0), -1)),
    "over-capacity": ("seq_lens", "needs", lambda a: a.update(seq_lens=_i32(999, 5))),
    "loc-end": ("query_start_loc", "end at num_tokens", lambda a: a.update(query_start_loc=_i32(0, 1, 2))),
    "short-seq": ("seq_lens", "below its query length", lambda a: a.update(seq_lens=_i32(2, 5))),
    "rows": ("block_tables", "rows", lambda a: a.update(block_tables=a["block_tables"][:1])),
    "device": ("seq_lens", "one device for all", lambda a: a.update(seq_lens=a["seq_lens"].to("meta"))),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BAD))
def test_check_paged_inputs_names_field_and_bound(name):
    field, text, fn = BAD[name]
    args = _bad(field, fn)
    with pytest.raises(ValueError) as info:
        tpa.check_paged_inputs(**args)
    msg = str(info.value)
    assert msg.startswith(f"paged_attention: {field}:") and text in msg, f"{name}: {msg}"


def test_bad_input_fails_before_any_launch(monkeypatch):
    monkeypatch.setattr(tpa, "_build_kernel", lambda: pytest.fail("kernel built for invalid input"))
    monkeypatch.setattr(tpa, "_kernel", None)
    args = _bad("block_tables", BAD["block-oob"][2])
    with pytest.raises(ValueError, match="block_tables"):
        tpa.paged_attention(**args)


def test_bad_scale_and_out():
    args = _bad("query", lambda a: None)
    with pytest.raises(ValueError, match="scale"):
        tpa.check_paged_inputs(**args, scale=-1.0)
    with pytest.raises(ValueError, match="out"):
        tpa.check_paged_inputs(**args, out=torch.empty(3))


@pytest.mark.parametrize(
    "heads, kv, d, bs, max_q, rows, group_pad, block_q, d_pad",
    [
        (32, 8, 128, 16, 1, 16, 4, 4, 128),  # decode, GQA 4
        (8, 8, 48, 13, 70, 16, 1, 16, 64),  # MHA, head_dim padded to a power of two
        (8, 1, 80, 1, 5, 16, 8, 2, 128),  # MQA
        (12, 4, 8, 2, 3, 16, 4, 4, 16),  # GQA 3 padded to 4; head_dim padded up to the dot minimum
        (32, 1, 256, 128, 1, 32, 32, 1, 256),  # a group wider than the row budget
    ],
)
def test_launch_config(heads, kv, d, bs, max_q, rows, group_pad, block_q, d_pad):
    cfg = tpa.launch_config(5, max_q, heads, kv, d, bs, torch.float16, interpreter=False)
    assert (cfg.GROUP_PAD, cfg.BLOCK_Q, cfg.HEAD_DIM_PAD, cfg.rows) == (group_pad, block_q, d_pad, rows)
    assert cfg.grid == (5, -(-max_q // block_q), kv)
    assert min(cfg.rows, cfg.BLOCK_N, cfg.HEAD_DIM_PAD) >= tpa.MIN_DOT, "tl.dot needs >= 16 on the GPU"
    assert not cfg.UPCAST


def test_launch_config_is_batch_invariant():
    a = tpa.launch_config(1, 1, 8, 2, 64, 16, torch.float32, False)
    b = tpa.launch_config(7, 900, 8, 2, 64, 16, torch.float32, False)
    assert (a.BLOCK_Q, a.BLOCK_N, a.GROUP_PAD) == (b.BLOCK_Q, b.BLOCK_N, b.GROUP_PAD)


def test_bf16_upcast_only_on_the_interpreter():
    assert tpa.launch_config(1, 1, 4, 2, 64, 16, torch.bfloat16, interpreter=True).UPCAST
    assert not tpa.launch_config(1, 1, 4, 2, 64, 16, torch.bfloat16, interpreter=False).UPCAST
    assert not tpa.launch_config(1, 1, 4, 2, 64, 16, torch.float16, interpreter=True).UPCAST


KERNEL_CASES = [
    CaseSpec("t", ((70, 1), (1, 1), (17, 1)), dtype=dt) for dt in (torch.float32, torch.float16, torch.bfloat16)
] + [
    CaseSpec("t", ((33, 33), (40, 7)), num_heads=6, num_kv_heads=2, head_dim=80, block_size=3, layout="permuted",
             scale=0.3, dtype=dt)
    for dt in (torch.float32, torch.bfloat16)
]  # fmt: skip


@pytest.mark.parametrize("spec", KERNEL_CASES, ids=lambda s: s.id)
def test_kernel_within_policy(spec):
    case = spec.build().to(DEVICE)
    out = tpa.paged_attention(*_args(case), scale=case.scale)
    check = check_attention(out, case)
    assert check.passed and not check.warning, str(check)


def test_out_is_fully_written_and_returned():
    case = KERNEL_CASES[3].build().to(DEVICE)
    out = torch.full_like(case.query, float("nan"))
    got = tpa.paged_attention(*_args(case), scale=case.scale, out=out)
    assert got is out and not torch.isnan(out).any()


def test_noncontiguous_cache_strides_are_honoured():
    case = KERNEL_CASES[0].build().to(DEVICE)
    # a [N, 2, bs, Hkv, D] combined pool viewed as two strided caches (FlashInfer style)
    both = torch.stack([case.key_cache, case.value_cache], dim=1)
    k, v = both[:, 0], both[:, 1]
    assert not k.is_contiguous()
    out = tpa.paged_attention(case.query, k, v, case.block_tables, case.seq_lens, case.query_start_loc)
    assert check_attention(out, case).passed


_AOT = r"""
import json, sys, triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from pagedattn.kernels import triton_paged_attention as m
import torch
kernel = m._build_kernel()
names = kernel.arg_names
results = []
for dtype, heads, kv, d, bs, max_q in json.loads(sys.argv[1]):
    cfg = m.launch_config(2, max_q, heads, kv, d, bs, getattr(torch, dtype), interpreter=False)
    consts = {k: getattr(cfg, k) for k in ("GROUP", "GROUP_PAD", "BLOCK_Q", "BLOCK_N", "HEAD_DIM", "HEAD_DIM_PAD",
                                            "BLOCK_SIZE", "UPCAST", "IEEE_FP32")}
    t = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[dtype]
    ptr = {"q_ptr": t, "k_cache_ptr": t, "v_cache_ptr": t, "out_ptr": t}
    sig = {}
    for n in names:
        sig[n] = ("*" + ptr[n]) if n in ptr else ("*i32" if n.endswith("_ptr") else
                 "constexpr" if n in consts else "fp32" if n == "scale" else "i32")
    src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(c),): v for c, v in consts.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    results.append({"cfg": [dtype, heads, kv, d, bs, max_q], "cubin": len(compiled.asm["cubin"]),
                    "shared": compiled.metadata.shared, "mma": "mma" in compiled.asm["ptx"]})
print(json.dumps(results))
"""


def test_kernel_compiles_for_hopper_without_a_gpu():
    """Code the interpreter accepts but the GPU compiler rejects (tl.dot under 16, dtype
    mixes in dot) fails here, on a CPU machine, in CI."""
    configs = [
        ["float32", 8, 2, 64, 16, 1],
        ["float16", 32, 8, 128, 16, 1],
        ["bfloat16", 32, 8, 128, 16, 64],
        ["bfloat16", 8, 1, 80, 1, 5],
        ["float16", 6, 2, 48, 13, 9],
        ["float32", 4, 4, 256, 3, 33],
    ]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-c", _AOT, json.dumps(configs)], capture_output=True, text=True,
                          env=env, timeout=600)  # fmt: skip
    assert proc.returncode == 0, f"compiling for sm_90 failed:\n{proc.stderr[-4000:]}"
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(configs)
    for r in results:
        assert r["cubin"] > 0, f"{r['cfg']}: no cubin: {r}"
        # half-precision dots must land on the tensor cores; IEEE fp32 dots cannot (FMA)
        assert r["mma"] == (r["cfg"][0] != "float32"), f"{r['cfg']}: unexpected tensor-core use: {r}"
