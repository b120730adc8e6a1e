# ruff: noqa
"""Issue 17 probe (one H200 call): the kernel before and after, tile configurations,
graph replay, fp8 paths and prefill tiles, each timed beside SDPA in one process, with
a correctness check of every timed configuration. Run from the worktree copy:

    PYTHONPATH=. python benchmarks/results/probe_issue17.py OLD_KERNEL_FILE OUT_JSON
"""

import importlib.util
import json
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from bench_paged_attention import bench, contiguous_history, graph_replay, machine, paged_batch, sdpa  # noqa: E402

from pagedattn.cases import CaseSpec  # noqa: E402
from pagedattn.kernels import host  # noqa: E402
from pagedattn.kernels import triton_paged_attention as new  # noqa: E402
from pagedattn.oracle import check_attention, check_attention_lse  # noqa: E402

spec = importlib.util.spec_from_file_location("old_tpa", sys.argv[1])
old = importlib.util.module_from_spec(spec)
sys.modules["old_tpa"] = old  # dataclasses look their module up
spec.loader.exec_module(old)
OUT = sys.argv[2]
dev = "cuda"
Hq, Hkv, D = 32, 8, 128
res: dict = {"machine": machine(dev), "decode": [], "fp8": [], "prefill": [], "checks": []}
DEFAULT = dict(
    DECODE_BLOCK_N=64,
    DECODE_WARPS=4,
    DECODE_STAGES=3,
    SPLIT_SIZE=512,
    SPLIT_LONG=1024,
    LONG_FROM=16384,
    PREFILL_BLOCK_N=64,
    PREFILL_STAGES=2,
    PREFILL_ROWS=128,
    TABLE_AHEAD=True,
)


def setcfg(**kw):
    for k, v in {**DEFAULT, **kw}.items():
        setattr(new if k == "TABLE_AHEAD" else host, k, v)


def log(*a):
    print(*a, flush=True)


t0 = time.time()
# 1. correctness of the new paths on the GPU (fused merge with every variant, fp16 dots for fp8)
setcfg()
cases = [
    CaseSpec("t", ((1100, 1), (600, 1), (5000, 1)), num_heads=8, sliding_window=77, sinks=True, dtype=torch.bfloat16),
    CaseSpec("t", ((3000, 1), (17, 1), (40, 7)), num_heads=8, soft_cap=20.0, alibi=True, dtype=torch.float16),
    CaseSpec(
        "t",
        ((2100, 1), (33, 1), (300, 20)),
        num_heads=8,
        head_dim=128,
        dtype=torch.bfloat16,
        kv_dtype=torch.float8_e4m3fn,
        k_scale=0.4,
        v_scale=1.7,
        layout="permuted",
    ),
    CaseSpec(
        "t",
        ((2100, 1), (70, 9)),
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        dtype=torch.bfloat16,
        kv_dtype=torch.float8_e5m2,
        sliding_window=1000,
        sinks=True,
        query_gain=8.0,
    ),
    CaseSpec(
        "t",
        ((4097, 1), (1, 1)),
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        dtype=torch.bfloat16,
        kv_dtype=torch.float8_e4m3fn,
        query_gain=300.0,
    ),
]
for cs in cases:
    case = cs.build().to(dev)
    kw = dict(
        scale=case.scale,
        sliding_window=case.sliding_window,
        logits_soft_cap=case.logits_soft_cap,
        alibi_slopes=case.alibi_slopes,
        sinks=case.sinks,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
    )
    args = [case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens, case.query_start_loc]
    out, lse = new.paged_attention(*args, **kw, return_lse=True)
    c1, c2 = check_attention_lse(out, lse, case)
    res["checks"].append(
        {
            "case": cs.id,
            "out": str(c1),
            "lse": str(c2),
            "passed": c1.passed and c2.passed,
            "warning": bool(c1.warning or c2.warning),
        }
    )
    log("CHECK", cs.id, "PASS" if c1.passed and c2.passed else "FAIL", c1, c2)

# 2. decode: old vs new, configurations, graph replay
# (the first round, with the table loaded in the step that uses it, ran: base, st4,
# bn128, bn128w8, sp1024, bn128sp1024, bn32st4, sp256; see NOTES.md)
CONFIGS = {
    "base": {},
    "no_table_ahead": dict(TABLE_AHEAD=False),
    "st4": dict(DECODE_STAGES=4),
    "st2": dict(DECODE_STAGES=2),
    "bn128": dict(DECODE_BLOCK_N=128),
    "sp1024": dict(SPLIT_SIZE=1024),
    "sp256": dict(SPLIT_SIZE=256),
    "bn32st4": dict(DECODE_BLOCK_N=32, DECODE_STAGES=4),
}
POINTS = [(1, 2048), (1, 8192), (1, 32768), (8, 2048), (8, 8192), (32, 4096), (64, 8192), (128, 2048), (128, 32768)]
for B, L in POINTS:
    q, k, v, tables, seq_lens, loc = paged_batch(B, L, 1, Hq, Hkv, D, 16, torch.bfloat16, dev)
    kc, vc = contiguous_history(k, v, tables, L)
    qd = q.view(B, Hq, 1, D)
    nbytes = 2 * B * L * Hkv * D * 2 + 2 * B * Hq * D * 2
    ref = sdpa(qd.float(), kc.float(), vc.float()).view(B, Hq, D) if B * L <= 1 << 20 else None
    row = {"B": B, "L": L, "bytes": nbytes, "ms": {}, "err": {}}
    row["ms"]["sdpa"] = bench(lambda: sdpa(qd, kc, vc), dev)
    row["ms"]["sdpa_graph"] = bench(graph_replay(lambda: sdpa(qd, kc, vc), dev), dev)
    setcfg()
    prep_o = old.prepare(q, k, v, tables, seq_lens, loc)
    row["ms"]["old"] = bench(lambda: old.run(prep_o, q, k, v), dev)
    for name, cfg in CONFIGS.items():
        setcfg(**cfg)
        prep = new.prepare(q, k, v, tables, seq_lens, loc)
        out = torch.full_like(q, float("nan"))
        row["ms"][name] = bench(lambda: new.run(prep, q, k, v, out=out), dev)
        if B <= 8 or name == "base":
            row["ms"][name + "_graph"] = bench(graph_replay(lambda: new.run(prep, q, k, v, out=out), dev), dev)
        if ref is not None:
            row["err"][name] = float((out.float() - ref).abs().max())
        if name == "base":  # the same bits on every launch (a race would move them)
            first = out.clone()
            same = all(torch.equal(new.run(prep, q, k, v), first) for _ in range(5))
            row["deterministic"] = same
    setcfg()
    tb = {kk: nbytes / t / 1e9 for kk, t in row["ms"].items()}
    row["TBps"] = tb
    res["decode"].append(row)
    log(
        f"DECODE B={B} L={L} sdpa {tb['sdpa']:.2f} (graph {tb['sdpa_graph']:.2f}) old {tb['old']:.2f} | "
        + " ".join(f"{kk} {x:.2f}" for kk, x in tb.items() if kk not in ("sdpa", "sdpa_graph", "old"))
        + f" | det {row.get('deterministic')} err {max(row['err'].values()) if row['err'] else None}"
    )
    del q, k, v, kc, vc
    torch.cuda.empty_cache()

# 3. fp8 decode at B=32 L=4k
B, L = 32, 4096
q, k, v, tables, seq_lens, loc = paged_batch(B, L, 1, Hq, Hkv, D, 16, torch.bfloat16, dev)
kc, vc = contiguous_history(k, v, tables, L)
qd = q.view(B, Hq, 1, D)
ks, vs = 0.37, 1.9
fp8 = {}
for name, dt in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
    fp8[name] = ((k.float() / ks).to(dt), (v.float() / vs).to(dt))
row = {"B": B, "L": L, "ms": {}, "err": {}}
setcfg()
row["ms"]["sdpa_bf16"] = bench(lambda: sdpa(qd, kc, vc), dev)
prep_o = old.prepare(q, k, v, tables, seq_lens, loc)
row["ms"]["old_bf16"] = bench(lambda: old.run(prep_o, q, k, v), dev)
k8, v8 = fp8["e4m3"]
prep_o8 = old.prepare(q, k8, v8, tables, seq_lens, loc, k_scale=ks, v_scale=vs)
row["ms"]["old_e4m3"] = bench(lambda: old.run(prep_o8, q, k8, v8), dev)
FP8_CONFIGS = {
    "base": {},
    "no_table_ahead": dict(TABLE_AHEAD=False),
    "bn128": dict(DECODE_BLOCK_N=128),
    "bn128w8": dict(DECODE_BLOCK_N=128, DECODE_WARPS=8),
    "st4": dict(DECODE_STAGES=4),
    "bn128sp1024": dict(DECODE_BLOCK_N=128, SPLIT_SIZE=1024),
    "bn256w8sp1024": dict(DECODE_BLOCK_N=256, DECODE_WARPS=8, SPLIT_SIZE=1024),
}
for name, cfg in FP8_CONFIGS.items():
    setcfg(**cfg)
    prep = new.prepare(q, k, v, tables, seq_lens, loc)
    row["ms"][f"new_bf16_{name}"] = bench(lambda: new.run(prep, q, k, v), dev)
    for fname, (k8, v8) in fp8.items():
        for f16 in (True, False):
            if not f16 and name not in ("base", "bn128"):
                continue
            new.F16_DOTS_FOR_FP8 = f16
            prep8 = new.prepare(q, k8, v8, tables, seq_lens, loc, k_scale=ks, v_scale=vs)
            tag = f"new_{fname}_{name}" + ("" if f16 else "_bf16dots")
            row["ms"][tag] = bench(lambda: new.run(prep8, q, k8, v8), dev)
            out = new.run(prep8, q, k8, v8)
            kcf, vcf = contiguous_history(k8.float() * ks, v8.float() * vs, tables, L)
            ref = sdpa(qd.float(), kcf, vcf).view(B, Hq, D)
            row["err"][tag] = float((out.float() - ref).abs().max())
            del kcf, vcf
    new.F16_DOTS_FOR_FP8 = True
setcfg()
row["speedup_vs_new_bf16_base"] = {kk: row["ms"]["new_bf16_base"] / t for kk, t in row["ms"].items()}
res["fp8"].append(row)
for kk, t in row["ms"].items():
    log(f"FP8 {kk:32s} {t * 1e3:8.1f} us  x{row['ms']['new_bf16_base'] / t:.2f} of new bf16  err {row['err'].get(kk)}")
del q, k, v, kc, vc, fp8
torch.cuda.empty_cache()

# 4. prefill: causal 8k and chunked 2k over 16k, tile configurations
PRE = {
    "base": {},
    "no_table_ahead": dict(TABLE_AHEAD=False),
    "bn128": dict(PREFILL_BLOCK_N=128),
    "st3": dict(PREFILL_STAGES=3),
    "bn128st3": dict(PREFILL_BLOCK_N=128, PREFILL_STAGES=3),
}
for new_t, cached in ((8192, 0), (2048, 16384)):
    L = new_t + cached
    q, k, v, tables, seq_lens, loc = paged_batch(1, L, new_t, Hq, Hkv, D, 16, torch.bfloat16, dev)
    kc, vc = contiguous_history(k, v, tables, L)
    qd = q.view(1, new_t, Hq, D).transpose(1, 2)
    flops = 4 * (new_t * cached + new_t * (new_t + 1) / 2) * Hq * D
    row = {"new": new_t, "cached": cached, "ms": {}, "err": {}}
    if cached == 0:
        row["ms"]["sdpa"] = bench(lambda: sdpa(qd, kc, vc, is_causal=True), dev)
        ref = sdpa(qd, kc, vc, is_causal=True)
    else:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(new_t, L)
        kr, vr = kc.repeat_interleave(Hq // Hkv, 1), vc.repeat_interleave(Hq // Hkv, 1)
        row["ms"]["sdpa"] = bench(
            lambda: torch.nn.functional.scaled_dot_product_attention(qd, kr, vr, attn_mask=mask), dev
        )
        ref = torch.nn.functional.scaled_dot_product_attention(qd, kr, vr, attn_mask=mask)
    ref = ref.transpose(1, 2).reshape(new_t, Hq, D).float()
    setcfg()
    prep_o = old.prepare(q, k, v, tables, seq_lens, loc)
    row["ms"]["old"] = bench(lambda: old.run(prep_o, q, k, v), dev)
    for name, cfg in PRE.items():
        setcfg(**cfg)
        try:
            prep = new.prepare(q, k, v, tables, seq_lens, loc)
            row["ms"][name] = bench(lambda: new.run(prep, q, k, v), dev)
            row["err"][name] = float((new.run(prep, q, k, v).float() - ref).abs().max())
        except Exception as e:  # e.g. out of shared memory: record it, go on
            row["err"][name] = repr(e)[:200]
    setcfg()
    row["TFLOPs"] = {kk: flops / t / 1e9 for kk, t in row["ms"].items()}
    res["prefill"].append(row)
    log(
        f"PREFILL new={new_t} cached={cached} "
        + " ".join(f"{kk} {x:.0f}" for kk, x in row["TFLOPs"].items())
        + f" err {row['err']}"
    )
    del q, k, v, kc, vc
    torch.cuda.empty_cache()

res["seconds"] = time.time() - t0
with open(OUT, "w") as f:
    json.dump(res, f, indent=1)
log(f"probe done in {res['seconds']:.0f} s")
