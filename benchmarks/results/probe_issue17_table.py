# ruff: noqa
"""Issue 17, nineteenth stop: the block table read a page at a time, and small fp8 decode programs.

The decode's steps read the next tile's block-table entries with a mask a key at a time; on sm_90
(triton 3.9 on the CPU) that made each thread load every key's entry, 12 scalar loads and their
predicates in a 16-key step, where a mask a page at a time (``_table_entries``) shares one load
among a page's keys. This probe times, in one process from CUDA graphs (alternated, best of
three), the previous kernel (``old``: 439970b's tree as ``old_pagedattn``, carried in
``.dev/old24``) against this tree at its defaults, bf16 and e4m3 caches, and this tree's fp8
decode in small programs (one warp and 16-key tiles, two warps and 32-key tiles; one split a
program; with and without the split's whole tiles unmasked, ``FP8_DECODE_MASK_SPLIT``), and SDPA.
Every configuration is judged by the oracle first (both fp8 formats, a window and sinks, a
prefill beside them); the defaults' outputs must be bit-identical to the previous kernel's.

    PYTHONPATH=.dev/old24:. python benchmarks/results/probe_issue17_table.py OUT_JSON

Round 1 ran on 637ca76's tree (call 24h), round 2 (``PROBE_ROUND=2``) on dfe6db5's (call 24i); the
kernel changes they time (``_table_entries``, round 1's mask switches) were reverted after each, the
defaults being no faster (``NOTES.md``, nineteenth stop), so each needs its tree.
"""

import json
import os
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from bench_paged_attention import bench, contiguous_history, graph_replay, machine, paged_batch, sdpa  # noqa: E402

from pagedattn.cases import CaseSpec  # noqa: E402
from pagedattn.kernels import host  # noqa: E402
from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402
from pagedattn.oracle.verdict import check_attention  # noqa: E402

try:
    from old_pagedattn.kernels import triton_paged_attention as old_tpa  # noqa: E402
except ImportError:
    old_tpa = None

dev = "cuda"
Hq, Hkv, D, bs = 32, 8, 128, 16
ks, vs = 0.37, 1.9
one = {"FP8_DECODE_STAGES": 2, "FP8_DECODE_SPP": 1}
CONFIGS = {
    "w1n16": {**one, "FP8_DECODE_WARPS": 1, "FP8_DECODE_BLOCK_N": 16},
    "w1n16_ms": {**one, "FP8_DECODE_WARPS": 1, "FP8_DECODE_BLOCK_N": 16, "FP8_DECODE_MASK_SPLIT": True},
    "w1n16_ms_nocap": {
        **one,
        "FP8_DECODE_WARPS": 1,
        "FP8_DECODE_BLOCK_N": 16,
        "FP8_DECODE_MASK_SPLIT": True,
        "FP8_DECODE_MAXNREG": None,
    },
    "w2n32_ms": {**one, "FP8_DECODE_WARPS": 2, "FP8_DECODE_BLOCK_N": 32, "FP8_DECODE_MASK_SPLIT": True},
    "spp1_ms": {"FP8_DECODE_SPP": 1, "FP8_DECODE_MASK_SPLIT": True},
}
BF16_CONFIGS = {"bf16_ms": {"DECODE_MASK_SPLIT": True, "DECODE_SPLIT_LOOP": False}}
ROUND = int(os.environ.get("PROBE_ROUND", "1"))
if ROUND == 2:
    # round 2 (the table a page at a time kept, no mask switch): one-warp 16-key fp8 programs at
    # every batch, their splits a quarter (``s128``) or half (``s256``) of the bf16 tiers' so that
    # small batches keep as many warps in flight, large ones walking several splits a program in
    # the split loop (its rule's waves at sixteen programs an SM)
    small = {"FP8_DECODE_WARPS": 1, "FP8_DECODE_BLOCK_N": 16, "FP8_DECODE_STAGES": 2}
    loop = {"FP8_LOOP_MIN_PROGRAMS": 2048, "FP8_DECODE_WAVE": 2112, "FP8_LOOP_FILL": 0.8}
    CONFIGS = {
        "w1n16": {**small, "FP8_DECODE_SPP": 1},
        "s128": {**small, **loop, "FP8_SPLIT_SIZE": 128, "SPLIT_SHORT": 64, "SPLIT_LONG": 512, "FP8_DECODE_SPP": 4},
        "s256": {**small, **loop, "FP8_SPLIT_SIZE": 256, "SPLIT_SHORT": 128, "SPLIT_LONG": 1024, "FP8_DECODE_SPP": 2},
        "s128_spp1": {**small, "FP8_SPLIT_SIZE": 128, "SPLIT_SHORT": 64, "SPLIT_LONG": 512, "FP8_DECODE_SPP": 1},
    }
    BF16_CONFIGS = {}
SWITCHES = sorted({k for c in (*CONFIGS.values(), *BF16_CONFIGS.values()) for k in c})
DEFAULTS = {k: getattr(host, k) for k in SWITCHES}
POINTS = [(32, 4096), (8, 8192), (128, 4096), (1, 4096), (32, 32768), (8, 2048), (16, 4096)]
res = {"machine": machine(dev), "round": ROUND, "defaults": DEFAULTS, "configs": CONFIGS, "bf16_configs": BF16_CONFIGS}
res.update(points=[], verdicts={}, old=old_tpa is not None)
t0 = time.time()


def setcfg(**cfg):
    for k, v in {**DEFAULTS, **cfg}.items():
        setattr(host, k, v)


def log(msg):
    print(f"[{time.time() - t0:5.0f}s] {msg}", flush=True)


def dump():
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1, default=str)


for name, cfg in {"default": {}, **CONFIGS, **BF16_CONFIGS}.items():
    setcfg(**cfg)
    kvs = ((torch.bfloat16, torch.float8_e4m3fn), (torch.float16, torch.float8_e5m2))
    if name in BF16_CONFIGS or (name == "default" and ROUND == 1):
        kvs += ((torch.bfloat16, None),)
    for dt, kv in kvs:
        spec = CaseSpec(
            "p",
            ((700, 1), (300, 45), (2100, 1), (5000, 1), (17000, 1), (33, 1), (512, 1)),
            num_heads=8,
            num_kv_heads=2,
            head_dim=128,
            dtype=dt,
            kv_dtype=kv,
            k_scale=ks if kv is not None else 1.0,
            v_scale=vs if kv is not None else 1.0,
            sliding_window=4000,
            sinks=True,
        )
        key = f"{name}/{kv}/{dt}"
        try:
            case = spec.build().to(dev)
            out = tpa.paged_attention(
                case.query,
                case.key_cache,
                case.value_cache,
                case.block_tables,
                case.seq_lens,
                case.query_start_loc,
                scale=case.scale,
                k_scale=case.k_scale,
                v_scale=case.v_scale,
                sliding_window=case.sliding_window,
                sinks=case.sinks,
            )
            c = check_attention(out, case)
            res["verdicts"][key] = {"passed": c.passed, "warning": c.warning, "worst": str(c)[:300]}
        except Exception as e:
            res["verdicts"][key] = {"error": repr(e)[:400]}
        log(f"verdict {key}: {res['verdicts'][key]}")
setcfg()
dump()

for B, L in POINTS:
    q, k, v, tables, seq_lens, loc = paged_batch(B, L, 1, Hq, Hkv, D, bs, torch.bfloat16, dev)
    k8, v8 = (k.float() / ks).to(torch.float8_e4m3fn), (v.float() / vs).to(torch.float8_e4m3fn)
    row = {"B": B, "L": L, "us": {}, "shape": {}, "errors": {}}
    graphs, outs, keep = {}, {}, []

    def ours(name, mod, kk, vv, cfg, **kw):
        setcfg(**cfg)
        try:
            prep = mod.prepare(q, kk, vv, tables, seq_lens, loc, **kw)
            d = prep.plan.decode
            row["shape"][name] = (
                d.SPLIT_LOOP,
                d.SPLITS_PER_PROGRAM,
                d.BLOCK_N,
                d.num_warps,
                d.maxnreg,
                getattr(d, "MASK_SPLIT", None),
            )
            out = torch.empty_like(q)
            keep.extend([prep, out])
            graphs[name] = graph_replay(lambda: mod.run(prep, q, kk, vv, out=out), dev)
            outs[name] = out
        except Exception as e:
            row["errors"][name] = repr(e)[:300]
        setcfg()

    if old_tpa is not None:
        ours("old_bf16", old_tpa, k, v, {})
        ours("old_e4m3", old_tpa, k8, v8, {}, k_scale=ks, v_scale=vs)
    ours("bf16", tpa, k, v, {})
    for name, cfg in BF16_CONFIGS.items():
        ours(name, tpa, k, v, cfg)
    ours("e4m3", tpa, k8, v8, {}, k_scale=ks, v_scale=vs)
    for name, cfg in CONFIGS.items():
        ours(f"e4m3_{name}", tpa, k8, v8, cfg, k_scale=ks, v_scale=vs)
    kc, vc = contiguous_history(k, v, tables, L)
    qd = q.view(B, Hq, 1, D)
    keep.extend([kc, vc])
    graphs["sdpa"] = graph_replay(lambda: sdpa(qd, kc, vc), dev)
    for g in graphs.values():
        g()
    torch.cuda.synchronize()
    row["same_bits"] = {
        "bf16": bool(torch.equal(outs["bf16"], outs["old_bf16"])) if "old_bf16" in outs else None,
        "e4m3": bool(torch.equal(outs["e4m3"], outs["old_e4m3"])) if "old_e4m3" in outs else None,
        "bf16_ms": bool(torch.equal(outs["bf16_ms"], outs["bf16"])) if "bf16_ms" in outs else None,
        # a launch shape (splits a program) changes no bit
        "s128": bool(torch.equal(outs["e4m3_s128"], outs["e4m3_s128_spp1"])) if "e4m3_s128" in outs else None,
    }
    for rep in range(3):  # alternated: the best of each
        for name, g in graphs.items():
            row["us"].setdefault(name, []).append(1e3 * bench(g, dev))
    best = {n: min(t) for n, t in row["us"].items()}
    row["x_sdpa"] = {n: best["sdpa"] / t for n, t in best.items()}
    row["x_bf16"] = {n: best["bf16"] / t for n, t in best.items()}
    res["points"].append(row)
    log(f"B={B} L={L} " + " ".join(f"{n} {t:.1f}us ({row['x_bf16'][n]:.3f})" for n, t in best.items()))
    log(f"  shapes {row['shape']} same_bits {row['same_bits']} errors {row['errors']}")
    dump()
    del q, k, v, k8, v8, graphs, outs, keep
    torch.cuda.empty_cache()
log("probe done")
