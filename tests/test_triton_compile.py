"""An ahead-of-time compile of both kernels for Hopper (sm_90) on this CPU: what the interpreter
accepts but the GPU compiler rejects, and what the machine code must hold."""

import json
import os
import subprocess
import sys

import pytest

from pagedattn.kernels import host

triton = pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")


_AOT = r"""
import json, re, sys, triton, torch
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from pagedattn.kernels import host
from pagedattn.kernels import triton_paged_attention as m

def compile_one(kernel, types, consts, num_warps=4, num_stages=2, ints=None, maxnreg=None):
    names = kernel.arg_names
    sig = {n: "constexpr" if n in consts else types.get(n, "*i32" if n.endswith("_ptr") else "i32") for n in names}
    # what the JIT specializes on a GPU: pointers from torch are 16-byte aligned, and an
    # int argument divisible by 16 is marked so (the pipeliner needs both to copy async)
    ints = ints or {}
    plain = set(m._PLAIN_INTS)  # not specialized by the JIT (no divisibility attribute)
    aligned = [i for i, n in enumerate(names)
               if n not in consts and (n.endswith("_ptr") or (n in ints and ints[n] % 16 == 0 and n not in plain))]
    src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(c),): v for c, v in consts.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    options = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)

results = []
defaults = {k: v for k, v in vars(host).items() if k.isupper()}
OFFSETS_I32 = m.OFFSETS_I32
for dtype, heads, kv, d, bs, kv_dtype, on, *switches in json.loads(sys.argv[1]):
    for k, v in defaults.items():
        setattr(host, k, v)
    m.OFFSETS_I32 = OFFSETS_I32
    for k, v in (switches[0] if switches else {}).items():  # host or kernel-module switches of a non-default path
        setattr(m if hasattr(m, k) and not hasattr(host, k) else host, k, v)
    plan = host.plan_launch([700, 90], [1, 33], heads, kv, d, bs, getattr(torch, dtype), False,
                            getattr(torch, kv_dtype or dtype))
    # the strides of contiguous tensors of this shape (the block table's width is left unmarked)
    pad, splits = plan.decode.HEAD_DIM_PAD, plan.scratch_splits
    ints = {"stride_qt": heads * d, "stride_qh": d, "stride_kb": bs * kv * d, "stride_ks": kv * d, "stride_kh": d,
            "stride_vb": bs * kv * d, "stride_vs": kv * d, "stride_vh": d, "stride_ot": heads * d, "stride_oh": d,
            "stride_lt": heads, "stride_pa_seq": splits * heads * pad, "stride_pa_split": heads * pad,
            "stride_pml_seq": splits * heads * 2, "stride_pml_split": heads * 2}
    t = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[dtype]
    tk = {"float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", None: t}[kv_dtype]
    types = {"q_ptr": "*" + t, "k_cache_ptr": "*" + tk, "v_cache_ptr": "*" + tk, "out_ptr": "*" + t,
             "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32", "done_ptr": "*i32", "alibi_ptr": "*fp32",
             "sinks_ptr": "*fp32",
             "lse_ptr": "*fp32", "scale": "fp32", "v_scale": "fp32", "soft_cap": "fp32"}
    flags = {"USE_WINDOW": on, "USE_SOFTCAP": on, "USE_ALIBI": on, "USE_SINKS": on, "WRITE_LSE": on,
             "KV_FP8": host.fp8_widening(getattr(torch, kv_dtype or dtype),
                                         dtype == "float16" or (dtype == "bfloat16" and m.F16_DOTS_FOR_FP8),
                                         native=True, even=d % 2 == 0),
             "F16_DOTS": kv_dtype is not None and dtype == "bfloat16" and m.F16_DOTS_FOR_FP8,
             "TABLE_AHEAD": True, "OFF_I32": m.OFFSETS_I32}
    keys = ("GROUP", "GROUP_PAD", "BLOCK_Q", "BLOCK_N", "HEAD_DIM", "HEAD_DIM_PAD", "BLOCK_SIZE", "UPCAST",
            "IEEE_FP32", "SPLIT_SIZE", "SPLIT_LONG", "LONG_FROM", "SPLIT_SHORT", "SHORT_UNDER", "EXP2", "MASK_SPLIT",
            "HEAVY_FIRST", "GRID_ORDER", "SPLIT_LOOP", "SPLIT_WHOLE", "FOLD_PARTS", "LOOP_PARTS")
    cfg_name = [dtype, heads, kv, d, bs, kv_dtype, on, *switches]
    for name, kernel, cfg in (("prefill", m._prefill_kernel, plan.other), ("decode", m._decode_kernel, plan.decode)):
        consts = {k: getattr(cfg, k) for k in keys if k in kernel.arg_names}
        consts.update({k: v for k, v in flags.items() if k in kernel.arg_names})
        c = compile_one(kernel, types, consts, cfg.num_warps, cfg.num_stages, ints, cfg.maxnreg)
        # the decode merge (after the counter's reset) must read the partials through L2
        merge = c.asm["ptx"].split("atom.global.gpu.acq_rel.exch")
        waits = [int(w) for w in re.findall(r"cp\.async\.wait_group\s+(\d+)", c.asm["ptx"])]
        results.append({"cfg": cfg_name + [name], "cubin": len(c.asm["cubin"]), "stages": cfg.num_stages,
                        "maxnreg": cfg.maxnreg, "loop_parts": bool(getattr(cfg, "LOOP_PARTS", False)),
                        "whole": bool(getattr(cfg, "SPLIT_WHOLE", False)),
                        "atomics": len(re.findall(r"\batom\.", c.asm["ptx"])),
                        "kv_fp8": flags["KV_FP8"],
                        "cvt_pairs": len(re.findall(r"cvt\.rn\.f16x2\.e\w+x2 t,", c.asm["ptx"])),
                        "deepest_wait": max(waits, default=0),
                        "mma": "mma" in c.asm["ptx"], "shared": c.metadata.shared,
                        "merge": None if name == "prefill" else
                                 {"found": len(merge) == 2, "cp_async": "cp.async" in merge[-1],
                                  "count_acq_rel": "atom.global.gpu.acq_rel.add" in merge[0],
                                  "cg_loads": merge[-1].count("ld.global.cg"),
                                  "cg_vector_loads": merge[-1].count("ld.global.cg.v")}})
print(json.dumps(results))
"""


#: the most dynamic shared memory a block may use on sm_90 (227 KB)
HOPPER_SHARED_MEMORY = 232448


#: an fp8 cache's split loop in the compile test's small batch (its own rule asks for
#: FP8_LOOP_MIN_PROGRAMS programs filling FP8_LOOP_FILL of their waves; the register cap for a
#: launch past DECODE_WAVE programs)
FP8_LOOP = {"FP8_LOOP_MIN_PROGRAMS": 0, "FP8_LOOP_FILL": 0, "DECODE_WAVE": 0, "SPLIT_SHORT": 64}


#: the first round's softmax, 2-stage prefill and sequences-first decode grid
FIRST_ROUND = {
    "EXP2_SOFTMAX": False,
    "PREFILL_MASK_SPLIT": False,
    "PREFILL_HEAVY_FIRST": False,
    "PREFILL_STAGES": 2,
    "DECODE_GRID": "sequences_first",
}


#: a register cap on decode without the split loop, the short-history split tier, a register cap
#: with 32-key prefill tiles, int64 cache offsets (a cache past 2**31 elements), the one-axis decode
#: grid (heads fastest)
SWITCHED = {
    "OFFSETS_I32": False,
    "DECODE_GRID": "heads_fast",
    "DECODE_MAXNREG": 128,
    "DECODE_SPLIT_LOOP": False,
    "SHORT_UNDER": 4096,
    "SPLIT_SHORT": 128,
    "PREFILL_MAXNREG": 128,
    "PREFILL_BLOCK_N": 32,
}


# (query dtype, heads, kv heads, head_dim, block size, fp8 cache dtype, every variant on[, host switches]).
# The default run compiles a representative third (the widest shared-memory tile, every
# variant with an fp8 cache, an odd head dim and block size, MQA at block size 1); the
# rest compile under -m slow, which CI runs as its second step.
HOPPER_CONFIGS = {
    "representative": [
        # every split of a sequence in one program, merged in its loop (no scratch, no count)
        ["float32", 8, 2, 256, 16, "float8_e4m3fn", True, {"DECODE_SPLITS_PER_PROGRAM": 8}],
        # an fp8 cache's split loop (four splits a program, folding the merge's parts of two in it: 700
        # keys in 11 splits of 64) at its register cap, every variant on
        ["bfloat16", 32, 8, 128, 16, "float8_e4m3fn", True, FP8_LOOP],
        # programs of whole parts of the merge (700 keys in 11 splits of 64: parts of 2, 2 a program)
        ["bfloat16", 32, 8, 128, 16, None, False, {"SPLIT_SHORT": 64, "DECODE_SPLITS_PER_PROGRAM": 2}],
        # the int64 cache offsets; decode programs of one split (no split loop)
        ["float16", 6, 2, 48, 13, None, False, {"OFFSETS_I32": False, "DECODE_SPLIT_LOOP": False}],
        ["bfloat16", 8, 1, 80, 1, None, False],
    ],
    "rest": [
        ["float32", 8, 2, 64, 16, None, False],
        ["float16", 32, 8, 128, 16, None, False],
        ["bfloat16", 32, 8, 128, 64, None, False],
        ["float32", 4, 4, 256, 3, None, False],
        ["float32", 8, 2, 256, 16, None, False],
        ["bfloat16", 8, 2, 256, 16, None, False],
        # the variants: window, soft-cap, ALiBi, sinks, lse; fp8 caches of both formats
        ["bfloat16", 32, 8, 128, 16, None, True],
        ["float16", 8, 2, 64, 16, "float8_e5m2", False],
        # the selectable paths issue 17's probe times (host switches over the defaults)
        ["bfloat16", 32, 8, 128, 16, None, True, FIRST_ROUND],
        ["bfloat16", 32, 8, 128, 16, "float8_e4m3fn", True, SWITCHED],
        # an fp8 cache widened by the compiler (no pairs), and only V read as pairs
        ["bfloat16", 32, 8, 128, 16, "float8_e4m3fn", False, {"FP8_PAIRS": False}],
        ["float16", 32, 8, 128, 16, "float8_e5m2", False, {"FP8_PAIRS_K": False}],
        ["float16", 32, 8, 128, 16, "float8_e5m2", False],  # the same with K's pairs: more conversions
        # the decode register cap of an fp8 cache in a launch past one wave (one split a program)
        ["bfloat16", 32, 8, 128, 16, "float8_e5m2", True, {"DECODE_WAVE": 0}],
        # an fp8 cache's decode of one split a program, uncapped (a launch within one wave)
        ["bfloat16", 32, 8, 128, 16, "float8_e4m3fn", True],
        # whole sequences a program past one wave at three programs an SM (DECODE_WHOLE_MAXNREG)
        ["bfloat16", 32, 8, 128, 16, None, True, {"DECODE_WAVE": 5, "DECODE_WAVE_CAPPED": 8}],
    ],
}


@pytest.mark.parametrize(
    "group", ["representative", pytest.param("rest", marks=pytest.mark.slow)], ids=["representative", "rest"]
)
def test_kernel_compiles_for_hopper_without_a_gpu(group):
    """Code the interpreter accepts but the GPU compiler rejects (tl.dot under 16, dtype
    mixes in dot) fails here, on a CPU machine, in CI."""
    configs = HOPPER_CONFIGS[group]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", _AOT, json.dumps(configs)], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, f"compiling for sm_90 failed:\n{proc.stderr[-4000:]}"
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 2 * len(configs)
    for r in results:
        assert r["cubin"] > 0, f"{r['cfg']}: no cubin: {r}"
        # the compiler accepts more shared memory than a launch gets: check the launch limit
        assert r["shared"] <= HOPPER_SHARED_MEMORY, f"{r['cfg']}: {r['shared']} B of shared memory cannot launch"
        if r["merge"] is not None and r["stages"] >= 3:
            # the decode loop keeps K and V tiles of later steps in flight (host-prefetched
            # table entries, TABLE_AHEAD); with the table loaded in the step that uses them,
            # triton waits for every copy at the top of each step (wait_group 0)
            assert r["deepest_wait"] >= 1, f"{r['cfg']}: the decode loop's K/V loads are not multi-buffered: {r}"
        if r["cfg"][-2] == {"SPLIT_SHORT": 64, "DECODE_SPLITS_PER_PROGRAM": 2} and r["cfg"][-1] == "decode":
            assert r["loop_parts"] and not r["whole"], f"{r['cfg']}: not a launch of whole parts: {r}"
        if r["cfg"][-2] == FP8_LOOP and r["cfg"][-1] == "decode":
            assert r["loop_parts"] and not r["whole"] and r["maxnreg"] == host.FP8_DECODE_MAXNREG, (
                f"{r['cfg']}: not the fp8 cache's capped loop of whole parts: {r}"
            )
        if r["cfg"][-2] == {"DECODE_WAVE": 5, "DECODE_WAVE_CAPPED": 8} and r["cfg"][-1] == "decode":
            assert r["whole"] and r["maxnreg"] == host.DECODE_WHOLE_MAXNREG, f"{r['cfg']}: not the capped launch: {r}"
        if r["whole"]:  # merged in the program's loop: no count, no merge of stored splits
            assert r["atomics"] == 0 and not r["merge"]["found"], f"{r['cfg']}: a whole-sequence program counts: {r}"
        elif r["merge"] is not None:
            # a pipelined load becomes cp.async.ca, which reads through the SM's L1 and can see
            # a line cached before another program's split was stored (partials share lines)
            assert r["merge"]["found"] and r["merge"]["cg_loads"] > 0 and not r["merge"]["cp_async"], (
                f"{r['cfg']}: the decode merge must load the partials with ld.global.cg, not cp.async: {r['merge']}"
            )
            # the count that releases a program's stored splits to the merging program (acq_rel)
            assert r["merge"]["count_acq_rel"], f"{r['cfg']}: the split count is not an acq_rel add: {r['merge']}"
            # the partials' rows are 16-aligned (stride_pa_seq specialized by the JIT): vector loads
            assert r["merge"]["cg_vector_loads"] > 0, f"{r['cfg']}: the merge's partial loads are scalar: {r['merge']}"
        # fp8 pairs (``_widen_pairs``, its conversion into its own register ``t``) where chosen, and only there
        pairs = r["cvt_pairs"]
        assert (pairs > 0) == (r["kv_fp8"] >= 2), f"{r['cfg']}: KV_FP8 {r['kv_fp8']}, {pairs} cvt pairs"
        if r["kv_fp8"] >= 4:  # K's pairs too: more conversions than the same kernel with V's alone
            v_only = [q for q in results if q["cfg"][:5] == r["cfg"][:5] and q["cfg"][-1] == r["cfg"][-1]]
            for q in v_only:
                if q["kv_fp8"] in (2, 3):
                    assert pairs > q["cvt_pairs"], f"{r['cfg']}: {pairs} cvt pairs, V's alone {q['cvt_pairs']}"
        if r["mma"] is not None:
            # half-precision dots must land on the tensor cores; IEEE fp32 dots cannot (FMA)
            assert r["mma"] == (r["cfg"][0] != "float32"), f"{r['cfg']}: unexpected tensor-core use: {r}"
