# ruff: noqa
"""Issue 17, fourth round (one H200 call, one process for every timing): decode programs
ordered kv heads fastest (``host.DECODE_HEADS_FAST``), with 1024-key splits and, over an fp8
cache, 128-key tiles, timed beside the defaults and SDPA on a contiguous cache; the new path
checked against the oracle on the GPU. (A 2-stage decode, which would fit four programs an
SM, compiles single-buffered, ``cp.async.wait_group 0``, for sm_90: not timed.)

    PYTHONPATH=. python benchmarks/results/probe_issue17c.py OUT_JSON

Rows hold medians of ``do_bench`` in ``us`` and the ratio to SDPA in ``ratio`` (higher is
better); ``err`` is the max abs difference to SDPA in fp32 (fp8: over the dequantized
cache). ``PROBE_DRY=1`` rehearses it on the CPU interpreter with tiny shapes. It ran on tree
965fe83 plus the ``DECODE_HEADS_FAST`` switch, off by default then (``new`` = the 3-axis
grid); the default since, so on a later tree ``new`` and ``heads`` time the same kernel.
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

DEADLINE_S = 200 if not DRY else 10**6
dev = "cuda" if not DRY else "cpu"
SHRINK = 64 if DRY else 1
Hq, Hkv, D = (32, 8, 128) if not DRY else (4, 2, 32)
t0 = time.time()
KEYS = ("DECODE_HEADS_FAST", "DECODE_STAGES", "DECODE_BLOCK_N", "SPLIT_SIZE", "DECODE_WARPS")
DEFAULT = {k: getattr(host, k) for k in KEYS}
DEC = {
    "new": {},
    "heads": dict(DECODE_HEADS_FAST=True),
    "sp1024": dict(SPLIT_SIZE=1024),
    "heads_sp1024": dict(DECODE_HEADS_FAST=True, SPLIT_SIZE=1024),
}
FP8 = {
    "new": {},
    "heads": dict(DECODE_HEADS_FAST=True),
    "bn128": dict(DECODE_BLOCK_N=128),
    "heads_bn128": dict(DECODE_HEADS_FAST=True, DECODE_BLOCK_N=128),
    "heads_w8": dict(DECODE_HEADS_FAST=True, DECODE_WARPS=8),
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
CHECKS = [(name, cfg, i) for name in ("heads", "heads_sp1024") for cfg in [DEC[name]] for i in range(len(CASES))]
res: dict = {"machine": machine(dev), "defaults": DEFAULT, "checks": [], "decode": [], "fp8": [], "skipped": []}


def setcfg(**kw):
    for k, v in {**DEFAULT, **kw}.items():
        setattr(host, k, v)


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


POINTS = [(1, 2048), (1, 8192)] + [(b, l) for b in (8, 32, 64, 128) for l in (2048, 8192, 32768)]
if DRY:
    POINTS = [(1, 64), (2, 600)]
for B, L in POINTS:
    L //= 1 if not DRY else 1
    q, k, v, tables, seq_lens, loc = paged_batch(B, L, 1, Hq, Hkv, D, 16, torch.bfloat16, dev)
    kc, vc = contiguous_history(k, v, tables, L)
    qd = q.view(B, Hq, 1, D)
    ref = sdpa(qd.float(), kc.float(), vc.float()).view(B, Hq, D)
    row = {"what": f"decode B={B} L={L}", "B": B, "L": L, "us": {}, "err": {}}
    row["us"]["sdpa"] = 1e3 * bench(lambda: sdpa(qd, kc, vc), dev)
    out = torch.empty_like(q)
    for name, cfg in DEC.items():
        if "sp1024" in name and L >= host.LONG_FROM:
            continue
        timed(
            name,
            cfg,
            lambda: tpa.prepare(q, k, v, tables, seq_lens, loc),
            lambda p: tpa.run(p, q, k, v, out=out),
            row,
            ref,
        )
        if B == 1 and name in ("new", "heads") and not late("graph"):
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
