"""An ahead-of-time compile of both kernels for Hopper (sm_90) on this CPU: what the interpreter
accepts but the GPU compiler rejects, and what the machine code must hold."""

import json
import os
import subprocess
import sys

import pytest

from pagedattn.kernels.tuning import TUNING

triton = pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")


_AOT = r"""
import dataclasses, json, re, sys, triton, torch
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from pagedattn.kernels import launch_plan
from pagedattn.kernels import triton_paged_attention as m
from pagedattn.kernels.triton_decode import _PLAIN_INTS
from pagedattn.kernels.tuning import TUNING

def compile_one(kernel, types, consts, num_warps=4, num_stages=2, ints=None, maxnreg=None):
    names = kernel.arg_names
    sig = {n: "constexpr" if n in consts else types.get(n, "*i32" if n.endswith("_ptr") else "i32") for n in names}
    # what the JIT specializes on a GPU: pointers from torch are 16-byte aligned, and an
    # int argument divisible by 16 is marked so (the pipeliner needs both to copy async)
    ints = ints or {}
    plain = set(_PLAIN_INTS)  # not specialized by the JIT (no divisibility attribute)
    aligned = [i for i, n in enumerate(names)
               if n not in consts and (n.endswith("_ptr") or (n in ints and ints[n] % 16 == 0 and n not in plain))]
    src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(c),): v for c, v in consts.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    options = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)

results = []
fields = {f.name for f in dataclasses.fields(TUNING)}
chosen_shape = launch_plan.decode_launch_shape
for dtype, heads, kv, d, bs, kv_dtype, on, *switches in json.loads(sys.argv[1]):
    # a path the plan does not take for this small batch: tuning fields, a decode launch shape
    # (decode_shape), the one-axis decode grid (FLAT_GRID), kernel flags (OFF_I32, KV_FP8)
    over = dict(switches[0]) if switches else {}
    tuning = dataclasses.replace(TUNING, **{k: over.pop(k) for k in list(over) if k in fields})
    shape = over.pop("decode_shape", None)
    dv = over.pop("head_dim_v", d)  # a value width of its own
    launch_plan.decode_launch_shape = (lambda *a, s=tuple(shape or ()), **kw: s) if shape else chosen_shape
    plan = launch_plan.plan_launch([700, 90], [1, 33], heads, kv, d, bs, getattr(torch, dtype), False,
                                   getattr(torch, kv_dtype or dtype), tuning=tuning, head_dim_v=dv)
    plan = dataclasses.replace(plan, decode=dataclasses.replace(plan.decode, FLAT_GRID=over.pop("FLAT_GRID", False)))
    # the strides of contiguous tensors of this shape (the block table's width is left unmarked)
    pad, splits = plan.decode.HEAD_DIM_V_PAD, plan.scratch_splits
    ints = {"stride_qt": heads * d, "stride_qh": d, "stride_kb": bs * kv * d, "stride_ks": kv * d, "stride_kh": d,
            "stride_vb": bs * kv * dv, "stride_vs": kv * dv, "stride_vh": dv, "stride_ot": heads * dv,
            "stride_oh": dv,
            "stride_lt": heads, "stride_pa_seq": splits * heads * pad, "stride_pa_split": heads * pad,
            "stride_pml_seq": splits * heads * 2, "stride_pml_split": heads * 2}
    t = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[dtype]
    tk = {"float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", None: t}[kv_dtype]
    types = {"q_ptr": "*" + t, "k_cache_ptr": "*" + tk, "v_cache_ptr": "*" + tk, "out_ptr": "*" + t,
             "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32", "done_ptr": "*i32", "alibi_ptr": "*fp32",
             "sinks_ptr": "*fp32", "tree_words_ptr": "*i64",
             "lse_ptr": "*fp32", "scale": "fp32", "v_scale": "fp32", "soft_cap": "fp32",
             "qk_scales_ptr": "*fp32", "v_scales_ptr": "*fp32"}
    f16_dots = kv_dtype is not None and dtype == "bfloat16"  # run's rule: bf16 queries over an fp8 cache
    flags = {"USE_WINDOW": on, "USE_SOFTCAP": on, "USE_ALIBI": on, "USE_SINKS": on, "WRITE_LSE": on,
             "KV_FP8": launch_plan.fp8_widening(getattr(torch, kv_dtype or dtype), dtype == "float16" or f16_dots,
                                                native=True, even=d % 2 == 0),
             "F16_DOTS": f16_dots, "OFF_I32": True, "USE_TREE": on,
             "PER_HEAD_SCALES": on and kv_dtype is not None}
    assert set(over) <= {"OFF_I32", "KV_FP8"}, over
    flags.update(over)
    keys = ("GROUP", "GROUP_PAD", "BLOCK_Q", "BLOCK_N", "HEAD_DIM", "HEAD_DIM_PAD", "HEAD_DIM_V", "HEAD_DIM_V_PAD",
            "BLOCK_SIZE", "UPCAST",
            "SPLIT_SIZE", "SPLIT_LONG", "LONG_FROM", "SPLIT_SHORT", "SHORT_UNDER", "FLAT_GRID", "SPLIT_LOOP",
            "SPLIT_WHOLE", "FOLD_PARTS", "LOOP_PARTS")
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
#: fp8_loop_min_programs programs filling fp8_loop_fill of their waves; the register cap for a
#: launch past decode_wave programs)
FP8_LOOP = {"fp8_loop_min_programs": 0, "fp8_loop_fill": 0, "decode_wave": 0, "split_short": 64}
#: programs of whole parts of the merge (700 keys in 11 splits of 64: parts of 2, 2 a program)
WHOLE_PARTS = {"split_short": 64, "decode_shape": [True, 2, False]}
#: int64 cache offsets (a cache past 2**31 elements), the one-axis decode grid (past 65535
#: sequences), decode programs of one split, 128-key splits of short histories, 32-key prefill tiles
OTHER_PATHS = {
    "OFF_I32": False,
    "FLAT_GRID": True,
    "decode_shape": [False, 1, False],
    "short_under": 4096,
    "split_short": 128,
    "prefill_block_n": 32,
}
#: whole sequences a program past one wave at three programs an SM (decode_whole_maxnreg)
WHOLE_CAPPED = {"decode_wave": 5, "decode_wave_capped": 8}


# (query dtype, heads, kv heads, head_dim, block size, fp8 cache dtype, every variant on[, paths]):
# paths the plan does not take for the script's small batch: tuning fields, a decode launch
# shape (decode_shape), the one-axis grid (FLAT_GRID), kernel flags (OFF_I32, KV_FP8), a value
# width of its own (head_dim_v).
# The default run compiles a representative third (the widest shared-memory tile, every
# variant with an fp8 cache, an odd head dim and block size, MQA at block size 1); the
# rest compile under -m slow, which CI runs as its second step.
HOPPER_CONFIGS = {
    "representative": [
        # every split of a sequence in one program (700 keys in 3 splits of 256), merged in its
        # loop (no scratch, no count)
        ["float32", 8, 2, 256, 16, "float8_e4m3fn", True, {"decode_shape": [True, 3, False]}],
        # an fp8 cache's split loop (four splits a program, folding the merge's parts of two in it: 700
        # keys in 11 splits of 64) at its register cap, every variant on
        ["bfloat16", 32, 8, 128, 16, "float8_e4m3fn", True, FP8_LOOP],
        ["bfloat16", 32, 8, 128, 16, None, False, WHOLE_PARTS],
        # MLA prefill's value width of its own (keys of 192, values of 128)
        ["bfloat16", 16, 16, 192, 16, None, False, {"head_dim_v": 128}],
        # the int64 cache offsets; decode programs of one split (no split loop)
        ["float16", 6, 2, 48, 13, None, False, {"OFF_I32": False, "decode_shape": [False, 1, False]}],
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
        ["bfloat16", 32, 8, 128, 16, "float8_e4m3fn", True, OTHER_PATHS],
        # an fp8 cache widened by the compiler (an odd offset), and read as pairs (e5m2, fp16 queries)
        ["bfloat16", 32, 8, 128, 16, "float8_e4m3fn", False, {"KV_FP8": 1}],
        ["float16", 32, 8, 128, 16, "float8_e5m2", False],
        # the decode register cap of an fp8 cache in a launch past one wave (one split a program)
        ["bfloat16", 32, 8, 128, 16, "float8_e5m2", True, {"decode_wave": 0}],
        # an fp8 cache's decode of one split a program, uncapped (a launch within one wave)
        ["bfloat16", 32, 8, 128, 16, "float8_e4m3fn", True],
        ["bfloat16", 32, 8, 128, 16, None, True, WHOLE_CAPPED],
    ],
}


def _aot_problem() -> str:
    """Why the compile script cannot run with the installed Triton ("" where it can): it builds
    ``ASTSource(..., constexprs=...)``, which older Triton (3.2) does not take."""
    import inspect

    from triton.compiler import ASTSource

    if "constexprs" not in inspect.signature(ASTSource.__init__).parameters:
        return f"triton {triton.__version__}'s ASTSource takes no constexprs= (the compile script's API)"
    return ""


@pytest.mark.skipif(bool(_aot_problem()), reason=_aot_problem() or "compiles here")
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
            # the decode loop keeps K and V tiles of later steps in flight (the table entries
            # loaded a step ahead); with the table loaded in the step that uses them, triton
            # waits for every copy at the top of each step (wait_group 0)
            assert r["deepest_wait"] >= 1, f"{r['cfg']}: the decode loop's K/V loads are not multi-buffered: {r}"
        if r["cfg"][-2] == WHOLE_PARTS and r["cfg"][-1] == "decode":
            assert r["loop_parts"] and not r["whole"], f"{r['cfg']}: not a launch of whole parts: {r}"
        if r["cfg"][-2] == FP8_LOOP and r["cfg"][-1] == "decode":
            assert r["loop_parts"] and not r["whole"] and r["maxnreg"] == TUNING.fp8_decode_maxnreg, (
                f"{r['cfg']}: not the fp8 cache's capped loop of whole parts: {r}"
            )
        if r["cfg"][-2] == WHOLE_CAPPED and r["cfg"][-1] == "decode":
            assert r["whole"] and r["maxnreg"] == TUNING.decode_whole_maxnreg, f"{r['cfg']}: not the capped launch: {r}"
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
        if r["mma"] is not None:
            # half-precision dots must land on the tensor cores; IEEE fp32 dots cannot (FMA)
            assert r["mma"] == (r["cfg"][0] != "float32"), f"{r['cfg']}: unexpected tensor-core use: {r}"


_AOT_MLA = r"""
import json, re, sys, triton, torch
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from pagedattn.kernels import launch_plan
from pagedattn.kernels.triton_mla_decode import _PLAIN_INTS_MLA, _mla_decode_kernel as kernel

results = []
for dtype, heads, bs, lse in json.loads(sys.argv[1]):
    # a decode and a multi-token sequence (tree-masked): both launches
    plan = launch_plan.plan_launch([700, 90], [1, 4], heads, 1, 576, bs, getattr(torch, dtype), False,
                                   head_dim_v=512, shared_kv=True)
    for name, cfg, splits in (("decode", plan.decode, plan.max_splits), ("multi", plan.other, plan.other_splits)):
        t = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[dtype]
        consts = {"GROUP": cfg.GROUP, "BLOCK_H": cfg.GROUP_PAD, "BLOCK_Q": cfg.BLOCK_Q, "BLOCK_N": cfg.BLOCK_N,
                  "HEAD_DIM": cfg.HEAD_DIM, "HEAD_DIM_V": cfg.HEAD_DIM_V, "ROPE_PAD": cfg.ROPE_PAD,
                  "BLOCK_SIZE": cfg.BLOCK_SIZE, "SPLIT_SIZE": cfg.SPLIT_SIZE, "SPLIT_LONG": cfg.SPLIT_LONG,
                  "LONG_FROM": cfg.LONG_FROM, "SPLIT_SHORT": cfg.SPLIT_SHORT, "SHORT_UNDER": cfg.SHORT_UNDER,
                  "UPCAST": False, "KV_FP8": False, "OFF_I32": True, "WRITE_LSE": lse, "USE_SINKS": lse,
                  "PER_HEAD_SCALES": lse,
                  "MULTI": name == "multi",
                  "USE_TREE": name == "multi"}
        ints = {"stride_qt": heads * 576, "stride_qh": 576, "stride_kb": bs * 576, "stride_ks": 576,
                "stride_kh": 576, "stride_pa_row": splits * heads * 512, "stride_pa_split": heads * 512,
                "stride_pml_row": splits * heads * 2, "stride_pml_split": heads * 2, "stride_ot": heads * 512,
                "stride_oh": 512}
        names = kernel.arg_names
        types = {"q_ptr": "*" + t, "cache_ptr": "*" + t, "out_ptr": "*" + t, "part_acc_ptr": "*fp32",
                 "part_ml_ptr": "*fp32", "lse_ptr": "*fp32", "scale": "fp32", "v_scale": "fp32",
                 "tree_words_ptr": "*i64", "sinks_ptr": "*fp32",
                 "qk_scales_ptr": "*fp32", "v_scales_ptr": "*fp32"}
        sig = {n: "constexpr" if n in consts else types.get(n, "*i32" if n.endswith("_ptr") else "i32")
               for n in names}
        aligned = [i for i, n in enumerate(names) if n not in consts and (n.endswith("_ptr") or (
            n in ints and ints[n] % 16 == 0 and n not in _PLAIN_INTS_MLA))]
        src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(c),): v for c, v in consts.items()},
                        attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
        c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=cfg.launch_options)
        ptx = c.asm["ptx"]
        merge = ptx.split("atom.global.gpu.acq_rel.exch")
        results.append({"cfg": [dtype, heads, bs, lse, name], "cubin": len(c.asm["cubin"]),
                        "shared": c.metadata.shared, "mma": "mma" in ptx, "merge_found": len(merge) == 2,
                        "merge_cp_async": "cp.async" in merge[-1], "cg_loads": merge[-1].count("ld.global.cg"),
                        "count_acq_rel": "atom.global.gpu.acq_rel.add" in merge[0]})
print(json.dumps(results))
"""

#: (query dtype, query heads, block size, lse): DeepSeek's 16 and 128 heads at vLLM's and FlashMLA's block sizes
MLA_HOPPER_CONFIGS = [["bfloat16", 128, 64, True], ["float16", 16, 16, False]]


@pytest.mark.skipif(bool(_aot_problem()), reason=_aot_problem() or "compiles here")
def test_mla_kernel_compiles_for_hopper_without_a_gpu():
    """The MLA kernel for sm_90, its decode and its multi-token (tree-masked) launch: the 512- and
    64-wide dots on the tensor cores, the tiles within a launch's shared memory, and the decode
    merge's discipline (the split count an acq_rel add, the partials read through L2 with .cg
    loads and no cp.async)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", _AOT_MLA, json.dumps(MLA_HOPPER_CONFIGS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, f"compiling the MLA kernel for sm_90 failed:\n{proc.stderr[-4000:]}"
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 2 * len(MLA_HOPPER_CONFIGS)
    for r in results:
        assert r["cubin"] > 0, f"{r['cfg']}: no cubin: {r}"
        assert r["shared"] <= HOPPER_SHARED_MEMORY, f"{r['cfg']}: {r['shared']} B of shared memory cannot launch"
        assert r["mma"], f"{r['cfg']}: the MLA dots are not on the tensor cores: {r}"
        assert r["merge_found"] and r["cg_loads"] > 0 and not r["merge_cp_async"], (
            f"{r['cfg']}: the MLA merge must load the partials with ld.global.cg, not cp.async: {r}"
        )
        assert r["count_acq_rel"], f"{r['cfg']}: the split count is not an acq_rel add: {r}"
