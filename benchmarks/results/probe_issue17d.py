# ruff: noqa
"""Issue 17, fourth round, second H200 call (one process for every timing): int32 cache
offsets and unsigned key division (``OFFSETS_I32``, ``UNSIGNED_INDICES``: the prefill loop
401 instructions instead of 509 on sm_90), with and without kv-heads-fastest decode programs
(``DECODE_HEADS_FAST``) and 1024-key splits; prefill, decode, fp8, and the cache layout's
share of the decode gap (per-head pages, HND, read through strides; identity tables), all
beside SDPA on a contiguous cache. The new paths are checked against the oracle on the GPU.

    PYTHONPATH=. python benchmarks/results/probe_issue17c.py OUT_JSON

Rows hold medians of ``do_bench`` in ``us`` and the ratio to SDPA in ``ratio`` (higher is
better); ``err`` is the max abs difference to SDPA in fp32 (fp8: over the dequantized
cache). ``PROBE_DRY=1`` rehearses it on the CPU interpreter with tiny shapes.
"""

import json
import os
import sys
import time

DRY = os.environ.get("PROBE_DRY") == "1"
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"

import torch

sys.path.insert(0, "benchmarks")
from bench_paged_attention import bench, contiguous_history, graph_replay, machine, paged_batch, sdpa  # noqa: E402

from pagedattn.cases import CaseSpec  # noqa: E402
from pagedattn.kernels import host  # noqa: E402
from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402
from pagedattn.oracle import check_attention_lse  # noqa: E402

DEADLINE_S = 300 if not DRY else 10**6
dev = "cuda" if not DRY else "cpu"
SHRINK = 64 if DRY else 1
Hq, Hkv, D = (32, 8, 128) if not DRY else (4, 2, 32)
t0 = time.time()
KEYS = (
    "DECODE_HEADS_FAST",
    "DECODE_STAGES",
    "DECODE_BLOCK_N",
    "SPLIT_SIZE",
    "DECODE_WARPS",
    "PREFILL_BLOCK_N",
    "PREFILL_MAXNREG",
    "PREFILL_STAGES",
)
# UNSIGNED_INDICES was a switch when this probe ran (tree 965fe83 + the switches); the unsigned
# key division is unconditional since, so on a later tree "i32" and "iu" time the same kernel
MODULE_KEYS = ("OFFSETS_I32", "UNSIGNED_INDICES")
DEFAULT = {k: getattr(host, k) for k in KEYS} | {k: getattr(tpa, k, None) for k in MODULE_KEYS}
IU = dict(OFFSETS_I32=True, UNSIGNED_INDICES=True)
PRE = {
    "new": {},
    "i32": dict(OFFSETS_I32=True),
    "iu": IU,
    "iu_bn32_nreg128": dict(IU, PREFILL_BLOCK_N=32, PREFILL_MAXNREG=128),
    "iu_bn128": dict(IU, PREFILL_BLOCK_N=128, PREFILL_STAGES=2),
}
DEC = {
    "new": {},
    "heads": dict(DECODE_HEADS_FAST=True),
    "iu": IU,
    "iu_heads": dict(IU, DECODE_HEADS_FAST=True),
    "iu_heads_sp1024": dict(IU, DECODE_HEADS_FAST=True, SPLIT_SIZE=1024),
}
FP8 = {
    "new": {},
    "iu": IU,
    "iu_heads": dict(IU, DECODE_HEADS_FAST=True),
    "iu_bn128": dict(IU, DECODE_BLOCK_N=128),
    "iu_heads_bn128": dict(IU, DECODE_HEADS_FAST=True, DECODE_BLOCK_N=128),
}
CASES = [
    CaseSpec("t", ((1100, 1), (600, 1), (5000, 1)), num_heads=8, sliding_window=77, sinks=True, dtype=torch.bfloat16),
    CaseSpec(
        "t", ((3000, 1), (17, 1), (40, 7)), num_heads=8, logits_soft_cap=20.0, alibi_slopes=True, dtype=torch.float16
    ),
    CaseSpec(
        "t",
        ((2100, 1), (33, 1), (300, 20)),
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        dtype=torch.bfloat16,
        kv_dtype=torch.float8_e4m3fn,
        k_scale=0.4,
        v_scale=1.7,
        layout="permuted",
    ),
    CaseSpec(
        "t",
        ((9000, 1), (999, 1), (17000, 1)),
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        dtype=torch.bfloat16,
        sinks=True,
        layout="permuted",
    ),
    CaseSpec("t", ((1200, 1), (999, 1)), num_heads=8, num_kv_heads=2, head_dim=64, dtype=torch.float32),
]
if DRY:
    CASES = [
        CaseSpec("t", ((70, 1), (40, 1)), num_heads=8, num_kv_heads=2, head_dim=64, dtype=torch.float16, sinks=True)
    ]
CASES.append(
    CaseSpec(
        "t",
        ((300, 70), (97, 1), (40, 13)),
        num_heads=6,
        num_kv_heads=2,
        head_dim=48,
        block_size=13,
        dtype=torch.float16,
        sliding_window=50,
    )
)
CASES.append(
    CaseSpec(
        "t",
        ((2600, 700), (1500, 1)),
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        dtype=torch.bfloat16,
        sinks=True,
        layout="permuted",
    )
)
if DRY:
    CASES = CASES[:1]
CHECKS = [("iu_heads", DEC["iu_heads"], i) for i in range(len(CASES))] + [
    ("iu_heads_sp1024", DEC["iu_heads_sp1024"], 0),
    ("iu_bn32_nreg128", PRE["iu_bn32_nreg128"], len(CASES) - 1),
    ("iu_bn128", PRE["iu_bn128"], len(CASES) - 1),
    ("iu_heads_bn128", FP8["iu_heads_bn128"], 2 if not DRY else 0),
]
res: dict = {
    "machine": machine(dev),
    "defaults": DEFAULT,
    "checks": [],
    "prefill": [],
    "decode": [],
    "layout": [],
    "fp8": [],
    "skipped": [],
}


def setcfg(**kw):
    for k, v in {**DEFAULT, **kw}.items():
        if k in MODULE_KEYS and not hasattr(tpa, k):
            continue  # a switch of the tree the probe ran on, gone since (see MODULE_KEYS)
        setattr(tpa if k in MODULE_KEYS else host, k, v)


def log(*a):
    print(f"[{time.time() - t0:5.0f}s]", *a, flush=True)


def late(what):
    if time.time() - t0 > DEADLINE_S:
        res["skipped"].append(what)
        return True
    return False


def save():
    res["seconds"] = time.time() - t0
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1, default=str)


def case_call(case):
    return tpa.paged_attention(
        case.query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.seq_lens,
        case.query_start_loc,
        scale=case.scale,
        sliding_window=case.sliding_window,
        logits_soft_cap=case.logits_soft_cap,
        alibi_slopes=case.alibi_slopes,
        sinks=case.sinks,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
        return_lse=True,
    )


for cname, cfg, i in CHECKS:
    setcfg(**cfg)
    try:
        case = CASES[i].build().to(dev)
        c1, c2 = check_attention_lse(*case_call(case), case)
        ok, warn, text = c1.passed and c2.passed, bool(c1.warning or c2.warning), f"{c1} | {c2}"
    except Exception as e:
        ok, warn, text = False, False, repr(e)[:300]
    res["checks"].append({"config": cname, "case": CASES[i].id, "passed": ok, "warning": warn, "detail": text})
    log(
        "CHECK",
        cname,
        CASES[i].id,
        "PASS" if ok and not warn else ("WARN" if ok else "FAIL"),
        text.splitlines()[0][:140],
    )
setcfg()
save()


def timed(name, cfg, make_prep, call, row, ref):
    if late(f"{row['what']} {name}"):
        return
    setcfg(**cfg)
    try:
        prep = make_prep()
        row["us"][name] = 1e3 * bench(lambda: call(prep), dev)
        row["err"][name] = float((call(prep).float() - ref).abs().max())
        first = call(prep).clone()
        row.setdefault("det", {})[name] = all(torch.equal(call(prep), first) for _ in range(2))
    except Exception as e:
        row["err"][name] = repr(e)[:300]
    setcfg()


for new_t, cached in ((8192 // SHRINK, 0), (2048 // SHRINK, 16384 // SHRINK)):
    L = new_t + cached
    q, k, v, tables, seq_lens, loc = paged_batch(1, L, new_t, Hq, Hkv, D, 16, torch.bfloat16, dev)
    kc, vc = contiguous_history(k, v, tables, L)
    qd = q.view(1, new_t, Hq, D).transpose(1, 2)
    flops = 4 * (new_t * cached + new_t * (new_t + 1) / 2) * Hq * D
    row = {"what": f"prefill new={new_t} cached={cached}", "flops": flops, "us": {}, "err": {}}
    if cached == 0:
        row["us"]["sdpa"] = 1e3 * bench(lambda: sdpa(qd, kc, vc, is_causal=True), dev)
        ref = sdpa(qd, kc, vc, is_causal=True)
    else:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(new_t, L)
        kr, vr = kc.repeat_interleave(Hq // Hkv, 1), vc.repeat_interleave(Hq // Hkv, 1)
        row["us"]["sdpa"] = 1e3 * bench(
            lambda: torch.nn.functional.scaled_dot_product_attention(qd, kr, vr, attn_mask=mask), dev
        )
        ref = torch.nn.functional.scaled_dot_product_attention(qd, kr, vr, attn_mask=mask)
        del kr, vr
    ref = ref.transpose(1, 2).reshape(new_t, Hq, D).float()
    out = torch.empty_like(q)
    for name, cfg in PRE.items():
        timed(
            name,
            cfg,
            lambda: tpa.prepare(q, k, v, tables, seq_lens, loc),
            lambda p: tpa.run(p, q, k, v, out=out),
            row,
            ref,
        )
    row["TFLOPs"] = {kk: flops / t / 1e6 for kk, t in row["us"].items()}
    row["ratio"] = {kk: row["us"]["sdpa"] / t for kk, t in row["us"].items()}
    res["prefill"].append(row)
    log(
        f"PREFILL new={new_t} cached={cached} TFLOP/s " + " ".join(f"{kk} {x:.0f}" for kk, x in row["TFLOPs"].items()),
        "ratio",
        " ".join(f"{kk} {x:.3f}" for kk, x in row["ratio"].items()),
        "err",
        row["err"],
    )
    del q, k, v, kc, vc, ref
    save()

# the layout's share of the decode gap at B=32, L=4k: the same values read from pages whose
# rows hold every kv head (NHD, the default), from per-head pages (HND, through strides),
# and through identity tables
B, L = (32, 4096) if not DRY else (2, 64)
q, k, v, tables, seq_lens, loc = paged_batch(B, L, 1, Hq, Hkv, D, 16, torch.bfloat16, dev)
kc, vc = contiguous_history(k, v, tables, L)
qd = q.view(B, Hq, 1, D)
ref = sdpa(qd.float(), kc.float(), vc.float()).view(B, Hq, D)
kh = k.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)  # [N, bs, Hkv, D] viewed over [N, Hkv, bs, D] storage
vh = v.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
ident = torch.arange(tables.numel(), dtype=torch.int32, device=dev).view_as(tables)
k_id, v_id = torch.empty_like(k), torch.empty_like(v)
k_id[ident.flatten().long()] = k[tables.flatten().long()]
v_id[ident.flatten().long()] = v[tables.flatten().long()]
row = {"what": f"layout B={B} L={L}", "us": {}, "err": {}}
row["us"]["sdpa"] = 1e3 * bench(lambda: sdpa(qd, kc, vc), dev)
out = torch.empty_like(q)
for lname, (kk_, vv_, tt_) in {
    "nhd_perm": (k, v, tables),
    "hnd_perm": (kh, vh, tables),
    "nhd_ident": (k_id, v_id, ident),
}.items():
    for name in ("new", "iu_heads"):
        timed(
            f"{lname}_{name}",
            DEC[name],
            lambda: tpa.prepare(q, kk_, vv_, tt_, seq_lens, loc),
            lambda p: tpa.run(p, q, kk_, vv_, out=out),
            row,
            ref,
        )
row["ratio"] = {kk: row["us"]["sdpa"] / t for kk, t in row["us"].items()}
res["layout"].append(row)
log(
    "LAYOUT " + " ".join(f"{kk} {x:.3f}" for kk, x in row["ratio"].items()),
    "err",
    max((x for x in row["err"].values() if not isinstance(x, str)), default=None),
    [x for x in row["err"].values() if isinstance(x, str)][:1],
)
del q, k, v, kc, vc, kh, vh, k_id, v_id, ref
save()

POINTS = [(1, 2048), (1, 8192)] + [(b, l) for b in (8, 32, 64, 128) for l in (2048, 8192, 32768)]
if DRY:
    POINTS = [(1, 64), (2, 600)]
for B, L in POINTS:
    L //= 1 if not DRY else 1
    q, k, v, tables, seq_lens, loc = paged_batch(B, L, 1, Hq, Hkv, D, 16, torch.bfloat16, dev)
    kc, vc = contiguous_history(k, v, tables, L)
    qd = q.view(B, Hq, 1, D)
    # the fp32 reference of the largest point would need 64 GB: bf16 there (err is a sanity figure)
    ref = (sdpa(qd.float(), kc.float(), vc.float()) if B * L <= 2**21 else sdpa(qd, kc, vc).float()).view(B, Hq, D)
    row = {"what": f"decode B={B} L={L}", "B": B, "L": L, "us": {}, "err": {}}
    row["us"]["sdpa"] = 1e3 * bench(lambda: sdpa(qd, kc, vc), dev)
    out = torch.empty_like(q)
    for name, cfg in DEC.items():
        if "sp1024" in name and L >= host.LONG_FROM or (B == 1 and "iu" not in name and name != "new"):
            continue
        timed(
            name,
            cfg,
            lambda: tpa.prepare(q, k, v, tables, seq_lens, loc),
            lambda p: tpa.run(p, q, k, v, out=out),
            row,
            ref,
        )
        if B == 1 and name in ("new", "iu") and not late("graph"):
            setcfg(**cfg)
            prep = tpa.prepare(q, k, v, tables, seq_lens, loc)
            row["us"][name + "_graph"] = 1e3 * bench(graph_replay(lambda: tpa.run(prep, q, k, v, out=out), dev), dev)
            setcfg()
    row["ratio"] = {kk: row["us"]["sdpa"] / t for kk, t in row["us"].items()}
    res["decode"].append(row)
    log(
        f"DECODE B={B} L={L} sdpa {row['us']['sdpa']:.1f}us "
        + " ".join(f"{kk} {x:.3f}" for kk, x in row["ratio"].items() if kk != "sdpa"),
        "det",
        all(row.get("det", {}).values()),
        "err",
        max((x for x in row["err"].values() if not isinstance(x, str)), default=None),
        [x for x in row["err"].values() if isinstance(x, str)][:1],
    )
    del q, k, v, kc, vc, ref
    if dev == "cuda":
        torch.cuda.empty_cache()
    save()

B, L = (32, 4096) if not DRY else (2, 64)
q, k, v, tables, seq_lens, loc = paged_batch(B, L, 1, Hq, Hkv, D, 16, torch.bfloat16, dev)
kc, vc = contiguous_history(k, v, tables, L)
qd = q.view(B, Hq, 1, D)
ks, vs = 0.37, 1.9
k8, v8 = (k.float() / ks).to(torch.float8_e4m3fn), (v.float() / vs).to(torch.float8_e4m3fn)
row = {"what": f"fp8 B={B} L={L}", "B": B, "L": L, "us": {}, "err": {}}
row["us"]["sdpa_bf16"] = 1e3 * bench(lambda: sdpa(qd, kc, vc), dev)
ref = sdpa(qd.float(), kc.float(), vc.float()).view(B, Hq, D)
kcf, vcf = contiguous_history(k8.float() * ks, v8.float() * vs, tables, L)
ref8 = sdpa(qd.float(), kcf, vcf).view(B, Hq, D)
out = torch.empty_like(q)
for name, cfg in FP8.items():
    timed(
        f"bf16_{name}",
        cfg,
        lambda: tpa.prepare(q, k, v, tables, seq_lens, loc),
        lambda p: tpa.run(p, q, k, v, out=out),
        row,
        ref,
    )
    timed(
        f"e4m3_{name}",
        cfg,
        lambda: tpa.prepare(q, k8, v8, tables, seq_lens, loc, k_scale=ks, v_scale=vs),
        lambda p: tpa.run(p, q, k8, v8, out=out),
        row,
        ref8,
    )
base = row["us"].get("bf16_new")
row["speedup_vs_bf16_new"] = {kk: base / t for kk, t in row["us"].items()} if base else {}
res["fp8"].append(row)
for kk, t in row["us"].items():
    log(f"FP8 {kk:18s} {t:8.1f} us  x{(base or float('nan')) / t:.2f} of bf16_new  err {row['err'].get(kk)}")
save()
log(f"probe done in {time.time() - t0:.0f} s")
