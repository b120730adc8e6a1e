# ruff: noqa
"""Issue 17, sixth round, in one process: an fp8 cache's tiles widened by one ``cvt`` a pair.

The fp8 decode loop's sm_90 code (triton 3.6) held 688 instructions a 64-key step against bf16's
476: the compiler extracted each byte of the loaded V words and reassembled pairs (96 PRMT, 33
LOP3, 32 shifts). ``host.FP8_PAIRS`` reads V as 16-bit pairs and widens each with one
``cvt.rn.f16x2.e4m3x2`` (538 instructions a step). This times, at each point, from a CUDA graph:
the bf16 cache (the default tiles), and an e4m3 cache with the compiler's widening
(``plain``), the pairs (``pairs``, the new default), K as pairs too (``pairs_k``), the pairs with
128-key tiles (``pairs_t128``), with 1024-key splits (``pairs_s1024``), with both
(``pairs_t128_s1024``); e5m2 with the pairs. ``PROBE_ROUND=2``: K as pairs too (``pairs_k``)
with tiles, splits, stages and warps. ``PROBE_ROUND=3``: 32-key decode tiles at 3 to 5 stages for
both caches (more programs an SM), and SDPA on a contiguous cache for the bf16 decode target.
``PROBE_ROUND=4``: the bf16 decode grid (B 8 to 128, L 2k to 32k, and B=1) at the default tiles and
32-key tiles at 3 and 4 stages beside SDPA; fp8 (without pairs, V's, K's and V's) at three points. Each fp8 output is compared with SDPA in fp32 on
the dequantized cache (``err``, max abs), and checked by ``check_attention`` on a smaller case of
every configuration (``verdict``). Ratios are to the bf16 cache at the same point.

    PYTHONPATH=. python benchmarks/results/probe_issue17h.py OUT_JSON
    PROBE_ROUND=2 PYTHONPATH=. python benchmarks/results/probe_issue17h.py OUT_JSON

Round 1 ran on 3635c97 (``results/h200-probe-issue17h.json``, ``h200-call-17h.log``), round 2 on
7a0e408 (``h200-probe-issue17h2.json``, ``h200-call-17i.log``). Rounds 3 (82c952d, ``h2...3.json``)
and 4 (ea13af4, ``...h4.json``) are void: ``setcfg`` then restored only the fp8 switches, so a
bf16 configuration's 32-key tiles and stages stayed set for every graph built after it (the
"bf16" baseline after the first point, and every fp8 graph). Fixed; round 4 ran again on the
fixed probe (``h200-probe-issue17h4b.json``, ``h200-call-17l.log``).
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

from pagedattn.cases.spec import CaseSpec  # noqa: E402
from pagedattn.kernels import host  # noqa: E402
from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402
from pagedattn.oracle import check_attention  # noqa: E402

dev = "cuda" if not DRY else "cpu"
Hq, Hkv, D = (32, 8, 128) if not DRY else (4, 2, 32)
DEFAULTS = {
    k: getattr(host, k)
    for k in (
        "FP8_PAIRS",
        "FP8_PAIRS_K",
        "FP8_DECODE_BLOCK_N",
        "FP8_SPLIT_SIZE",
        "FP8_DECODE_STAGES",
        "FP8_DECODE_WARPS",
        "DECODE_BLOCK_N",
        "DECODE_STAGES",
    )
}
BF16_CONFIGS: dict = {}  # bf16 cache configurations beside the default (rounds 3 and 4)
CONFIGS = {
    "plain": {"FP8_PAIRS": False},
    "pairs": {"FP8_PAIRS_K": False},
    "pairs_k": {"FP8_PAIRS_K": True},
}
if os.environ.get("PROBE_ROUND", "1") == "1":
    CONFIGS.update(
        {
            "pairs_t128": {"FP8_DECODE_BLOCK_N": 128},
            "pairs_s1024": {"FP8_SPLIT_SIZE": 1024},
            "pairs_t128_s1024": {"FP8_DECODE_BLOCK_N": 128, "FP8_SPLIT_SIZE": 1024},
            "plain_t128": {"FP8_PAIRS": False, "FP8_DECODE_BLOCK_N": 128},
        }
    )
elif os.environ.get("PROBE_ROUND") == "4":  # the decode grid for bf16 (32-key tiles), fp8 at two points
    CONFIGS = {"plain": {"FP8_PAIRS": False}, "pairs": {"FP8_PAIRS_K": False}, "pairs_k": {"FP8_PAIRS_K": True}}
    BF16_CONFIGS = {f"bf16_t32_st{st}": {"DECODE_BLOCK_N": 32, "DECODE_STAGES": st} for st in (3, 4)}
elif os.environ.get("PROBE_ROUND") == "3":  # 32-key tiles: more programs an SM, for both caches
    CONFIGS = {"pairs_k": {"FP8_PAIRS_K": True}}
    for st in (3, 4, 5):
        CONFIGS[f"pairs_k_t32_st{st}"] = {"FP8_PAIRS_K": True, "FP8_DECODE_BLOCK_N": 32, "FP8_DECODE_STAGES": st}
    BF16_CONFIGS = {f"bf16_t32_st{st}": {"DECODE_BLOCK_N": 32, "DECODE_STAGES": st} for st in (3, 4, 5)}
else:  # the second round: K as pairs too, with tiles, splits, stages and warps
    for name, cfg in {
        "t128": {"FP8_DECODE_BLOCK_N": 128},
        "s1024": {"FP8_SPLIT_SIZE": 1024},
        "t128_s1024": {"FP8_DECODE_BLOCK_N": 128, "FP8_SPLIT_SIZE": 1024},
        "st2": {"FP8_DECODE_STAGES": 2},
        "st4": {"FP8_DECODE_STAGES": 4},
        "st5": {"FP8_DECODE_STAGES": 5},
        "w8": {"FP8_DECODE_WARPS": 8},
        "t128_st4": {"FP8_DECODE_BLOCK_N": 128, "FP8_DECODE_STAGES": 4},
        "t128_w8": {"FP8_DECODE_BLOCK_N": 128, "FP8_DECODE_WARPS": 8},
        "s1024_st4": {"FP8_SPLIT_SIZE": 1024, "FP8_DECODE_STAGES": 4},
    }.items():
        CONFIGS[f"pairs_k_{name}"] = {"FP8_PAIRS_K": True, **cfg}
res = {"machine": machine(dev), "defaults": DEFAULTS, "configs": CONFIGS, "points": [], "verdicts": {}}
res["fp8_native"] = tpa._fp8_native(torch.device(dev), tpa.interpreter_active())  # the pairs can run here
t0 = time.time()


def setcfg(**cfg):
    for k, v in {**DEFAULTS, **cfg}.items():
        setattr(host, k, v)


def dump():
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1, default=str)


def log(msg):
    print(f"[{time.time() - t0:5.0f}s] {msg}", flush=True)


# every configuration judged by the oracle first (a decode and a prefill sequence, window + sinks,
# both fp8 formats, fp16 and bf16 queries): a wrong configuration's speed means nothing
for name, cfg in CONFIGS.items():
    setcfg(**cfg)
    for dt, kv in ((torch.bfloat16, torch.float8_e4m3fn), (torch.float16, torch.float8_e5m2)):
        spec = CaseSpec(
            "p",
            ((700, 1), (300, 45), (2100, 1)),
            num_heads=8,
            num_kv_heads=2,
            head_dim=128,
            dtype=dt,
            kv_dtype=kv,
            k_scale=0.37,
            v_scale=1.9,
            sliding_window=1000,
            sinks=True,
        )
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
            res["verdicts"][f"{name}/{kv}"] = {"passed": c.passed, "warning": c.warning, "worst": str(c)[:300]}
        except Exception as e:
            res["verdicts"][f"{name}/{kv}"] = {"error": repr(e)[:400]}
        log(f"verdict {name} {kv}: {res['verdicts'][f'{name}/{kv}']}")
setcfg()
dump()

POINTS = [(32, 4096), (8, 8192), (64, 2048), (1, 4096), (1, 32768)] if not DRY else [(2, 64)]
FP8_POINTS = None  # every point
if os.environ.get("PROBE_ROUND") == "4" and not DRY:
    POINTS = [(B, L) for B in (8, 32, 64, 128) for L in (2048, 4096, 8192, 32768)]
    POINTS += [(1, L) for L in (2048, 4096, 8192, 32768)]
    FP8_POINTS = {(32, 4096), (8, 8192), (1, 4096)}
elif BF16_CONFIGS and not DRY:
    POINTS += [(128, 2048), (32, 8192), (8, 32768), (1, 2048)]
ks, vs = 0.37, 1.9
for B, L in POINTS:
    q, k, v, tables, seq_lens, loc = paged_batch(B, L, 1, Hq, Hkv, D, 16, torch.bfloat16, dev)
    qd = q.view(B, Hq, 1, D)
    fp8_here = FP8_POINTS is None or (B, L) in FP8_POINTS
    k8 = v8 = k5 = v5 = None
    if fp8_here:
        k8, v8 = (k.float() / ks).to(torch.float8_e4m3fn), (v.float() / vs).to(torch.float8_e4m3fn)
        k5, v5 = (k.float() / ks).to(torch.float8_e5m2), (v.float() / vs).to(torch.float8_e5m2)
        kcf, vcf = contiguous_history(k8.float() * ks, v8.float() * vs, tables, L)
        ref8 = sdpa(qd.float(), kcf, vcf).view(B, Hq, D)
        del kcf, vcf
    row = {"B": B, "L": L, "us": {}, "err": {}}
    keep = []

    def graph(cfg, kk, vv):
        setcfg(**cfg)
        prep = tpa.prepare(q, kk, vv, tables, seq_lens, loc, **({} if kk is k else {"k_scale": ks, "v_scale": vs}))
        out = torch.empty_like(q)
        keep.extend([prep, out])
        g = graph_replay(lambda: tpa.run(prep, q, kk, vv, out=out), dev)
        setcfg()
        return g, out

    graphs = {"bf16": graph({}, k, v)}
    for name, cfg in BF16_CONFIGS.items():
        graphs[name] = graph(cfg, k, v)
    if BF16_CONFIGS:  # the decode target's reference: SDPA on the same history made contiguous
        kc, vc = contiguous_history(k, v, tables, L)
        graphs["sdpa"] = (graph_replay(lambda: sdpa(qd, kc, vc), dev), None)
    if fp8_here:
        for name, cfg in CONFIGS.items():
            graphs[f"e4m3_{name}"] = graph(cfg, k8, v8)
        graphs["e5m2_pairs"] = graph({}, k5, v5)
    for name, (g, out) in graphs.items():
        g()
        if name.startswith("e4m3"):
            row["err"][name] = float((out.float() - ref8).abs().max())
    for rep in range(2):  # alternated, twice: the best of each
        for name, (g, out) in graphs.items():
            row["us"].setdefault(name, []).append(1e3 * bench(g, dev))
    best = {n: min(t) for n, t in row["us"].items()}
    row["x_bf16"] = {n: best["bf16"] / t for n, t in best.items()}
    res["points"].append(row)
    log(f"B={B} L={L} " + " ".join(f"{n} {best[n]:.1f}us x{row['x_bf16'][n]:.2f}" for n in best))
    log(f"   err {row['err']}")
    if "sdpa" in best:
        row["x_sdpa"] = {n: best["sdpa"] / t for n, t in best.items()}
        log("   of sdpa " + " ".join(f"{n} {x:.3f}" for n, x in row["x_sdpa"].items()))
    dump()
    del q, k, v, k8, v8, k5, v5, graphs, keep
    if BF16_CONFIGS:
        del kc, vc
    if dev == "cuda":
        torch.cuda.empty_cache()
log("probe done")
