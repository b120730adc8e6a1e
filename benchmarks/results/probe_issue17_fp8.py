# ruff: noqa
"""Issue 17, ninth stop: the fp8 decode's launch switches, beside FlashInfer's fp8 decode.

Target 4 asks an e4m3 cache's decode for 1.6x the bf16 cache's speed at B=32, L=4k. This
probe times, in one process from CUDA graphs (alternated, best of two), at a few points of
the decode grid (Hq=32, Hkv=8, D=128, page 16, permuted tables, bf16 queries):

- ours over the bf16 cache (``bf16``) and over an e4m3 cache at the defaults (``e4m3``) and
  under host switches (``e4m3_<name>``: the split loop, whole sequences a program, register
  caps, longer splits, stages, tiles): every configuration is judged by the oracle first
  (decode sequences of several splits, a window and sinks, a prefill beside them), and its
  output at each point compared bit for bit with the defaults' (a launch shape must not
  change the bits; split sizes and tiles may);
- FlashInfer 0.5.3's decode over the same pages, bf16 and e4m3, with tensor cores
  (``fi_tc``, ``fi8_tc``) and without (``fi``, ``fi8``); its fp8 runs take the scales as
  vLLM passes them (``k_scale`` folded into the softmax scale, ``v_scale`` an extra multiply
  of the output), and once without (``fi8_tc_noscale``), the kernel alone;
- SDPA on the bf16 history made contiguous (``sdpa``).

Needs the wheels of h200_call_17fi.sh (FlashInfer rows are skipped with the reason otherwise).

    PYTHONPATH=/tmp/fi:. [PROBE_ROUND=2|3] python benchmarks/results/probe_issue17_fp8.py OUT_JSON

Round 1 (the default) ran on d732e31 (``h200-probe-issue17-fp8.json``); round 2 times the rule
that came of it against the loop forced at 1 to 4 splits a program (``-fp8r2.json``); round 3
the rule at up to four splits a program (``-fp8r3.json``).
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

dev = "cuda" if torch.cuda.is_available() else "cpu"
DRY = dev != "cuda"
Hq, Hkv, D, bs = 32, 8, 128, 16
ks, vs = 0.37, 1.9
SWITCHES = (
    "FP8_DECODE_SPLIT_LOOP",
    "FP8_DECODE_MAXNREG",
    "FP8_SPLIT_SIZE",
    "FP8_DECODE_STAGES",
    "FP8_DECODE_BLOCK_N",
    "FP8_DECODE_WARPS",
    "DECODE_SPLIT_LOOP",
    "DECODE_SPLITS_PER_PROGRAM",
)
DEFAULTS = {k: getattr(host, k) for k in SWITCHES}
CONFIGS = {
    "loop": {"FP8_DECODE_SPLIT_LOOP": True},
    "loop_r168": {"FP8_DECODE_SPLIT_LOOP": True, "FP8_DECODE_MAXNREG": 168},
    "loop_nocap": {"FP8_DECODE_SPLIT_LOOP": True, "FP8_DECODE_MAXNREG": None},
    "loop_spp2": {"DECODE_SPLIT_LOOP": True, "DECODE_SPLITS_PER_PROGRAM": 2},
    "s1024": {"FP8_SPLIT_SIZE": 1024},
    "s1024_loop": {"FP8_SPLIT_SIZE": 1024, "FP8_DECODE_SPLIT_LOOP": True},
    "st4": {"FP8_DECODE_STAGES": 4},
    "st4_loop_nocap": {"FP8_DECODE_STAGES": 4, "FP8_DECODE_SPLIT_LOOP": True, "FP8_DECODE_MAXNREG": None},
    "n128w8": {"FP8_DECODE_BLOCK_N": 128, "FP8_DECODE_WARPS": 8, "FP8_DECODE_MAXNREG": None},
    "n128w8_loop": {
        "FP8_DECODE_BLOCK_N": 128,
        "FP8_DECODE_WARPS": 8,
        "FP8_DECODE_MAXNREG": None,
        "FP8_DECODE_SPLIT_LOOP": True,
    },
}
SAME_SPLITS = {
    "loop",
    "loop_r168",
    "loop_nocap",
    "loop_spp2",
    "st4",
    "st4_loop_nocap",
}  # tiles of 128 keys sum in another order
POINTS = [(32, 4096), (8, 8192), (64, 2048), (128, 4096), (1, 4096)] if not DRY else [(2, 600)]
FI_RUNS = ("fi_tc", "fi", "fi8_tc", "fi8_tc_noscale", "fi8")
ROUND = int(os.environ.get("PROBE_ROUND", "1"))
if ROUND == 2:
    # round 2, the rule (FP8_DECODE_SPP, FP8_LOOP_MIN_PROGRAMS) at its defaults (``e4m3``) against
    # one split a program (``spp1``, the eighth stop's default) and the loop forced at 2, 3 and 4
    # splits a program, around the threshold of 512 programs
    CONFIGS = {
        "spp1": {"FP8_DECODE_SPP": 1},
        "spp2": {"FP8_LOOP_MIN_PROGRAMS": 0},
        "spp3": {"FP8_DECODE_SPP": 3, "FP8_LOOP_MIN_PROGRAMS": 0},
        "spp4": {"FP8_DECODE_SPP": 4, "FP8_LOOP_MIN_PROGRAMS": 0},
        "spp2_nocap": {"FP8_LOOP_MIN_PROGRAMS": 0, "FP8_DECODE_MAXNREG": None},
    }
    SWITCHES += ("FP8_DECODE_SPP", "FP8_LOOP_MIN_PROGRAMS")
    DEFAULTS = {k: getattr(host, k) for k in SWITCHES}
    SAME_SPLITS = set(CONFIGS)
    POINTS = (
        [
            (32, 4096),
            (8, 8192),
            (16, 4096),
            (8, 4096),
            (16, 2048),
            (8, 2048),
            (4, 32768),
            (32, 32768),
            (64, 2048),
            (128, 4096),
            (1, 4096),
            (1, 32768),
        ]
        if not DRY
        else [(2, 600)]
    )
    FI_RUNS = ("fi_tc", "fi8_tc")
if ROUND == 3:
    # round 3, the rule at up to four splits a program (the default, ``e4m3``) against its round-2
    # form (two at most, ``spp2``), one split a program (``spp1``) and four forced (``spp4``)
    CONFIGS = {
        "spp1": {"FP8_DECODE_SPP": 1},
        "spp2": {"FP8_DECODE_SPP": 2},
        "spp4": {"FP8_LOOP_MIN_PROGRAMS": 0},
    }
    SWITCHES += ("FP8_DECODE_SPP", "FP8_LOOP_MIN_PROGRAMS")
    DEFAULTS = {k: getattr(host, k) for k in SWITCHES}
    SAME_SPLITS = set(CONFIGS)
    POINTS = (
        [
            (32, 4096),
            (8, 8192),
            (16, 4096),
            (8, 4096),
            (16, 2048),
            (8, 2048),
            (4, 32768),
            (32, 32768),
            (64, 2048),
            (128, 4096),
            (64, 1024),
            (48, 4096),
            (1, 4096),
        ]
        if not DRY
        else [(2, 600)]
    )
    FI_RUNS = ("fi_tc", "fi8_tc")
BF16_CONFIGS: dict = {}
if ROUND == 4:
    # round 4 (nineteenth stop): small programs, after the minimal decode of
    # proto_decode_swapped.py ran an fp8 cache fastest on one warp with 16-key tiles at 128
    # registers (1.50x its best bf16 form, B=32 L=4k); here the kernel under the same switches,
    # one split a program, and its bf16 decode in the same form
    one = {"FP8_DECODE_STAGES": 2, "FP8_DECODE_SPP": 1}
    CONFIGS = {
        "w1n16": {**one, "FP8_DECODE_WARPS": 1, "FP8_DECODE_BLOCK_N": 16},
        "w1n16_r112": {**one, "FP8_DECODE_WARPS": 1, "FP8_DECODE_BLOCK_N": 16, "FP8_DECODE_MAXNREG": 112},
        "w1n32_nocap": {**one, "FP8_DECODE_WARPS": 1, "FP8_DECODE_BLOCK_N": 32, "FP8_DECODE_MAXNREG": None},
        "w2n32": {**one, "FP8_DECODE_WARPS": 2, "FP8_DECODE_BLOCK_N": 32},
    }
    BF16_CONFIGS = {
        "bf16_w1n16": {"DECODE_WARPS": 1, "DECODE_BLOCK_N": 16, "DECODE_STAGES": 2, "DECODE_SPLIT_LOOP": False},
    }
    SWITCHES += ("FP8_DECODE_SPP", "DECODE_WARPS", "DECODE_BLOCK_N", "DECODE_STAGES")
    DEFAULTS = {k: getattr(host, k) for k in SWITCHES}
    SAME_SPLITS = set()
    POINTS = [(32, 4096), (8, 8192), (128, 4096), (1, 4096), (32, 32768)] if not DRY else [(2, 600)]
    FI_RUNS = ()
res = {"machine": machine(dev), "round": ROUND, "defaults": DEFAULTS, "configs": CONFIGS, "points": [], "verdicts": {}}
t0 = time.time()
try:
    import flashinfer

    res["flashinfer"] = flashinfer.__version__
except Exception as e:  # the rows say why
    flashinfer = None
    res["flashinfer_error"] = repr(e)[:400]


def setcfg(**cfg):
    for k, v in {**DEFAULTS, **cfg}.items():
        setattr(host, k, v)


def log(msg):
    print(f"[{time.time() - t0:5.0f}s] {msg}", flush=True)


def dump():
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1, default=str)


log(f"flashinfer {res.get('flashinfer') or res.get('flashinfer_error')}")
# every configuration judged by the oracle first
for name, cfg in {"default": {}, **CONFIGS, **BF16_CONFIGS}.items():
    setcfg(**cfg)
    kvs = ((torch.bfloat16, torch.float8_e4m3fn), (torch.float16, torch.float8_e5m2))
    if name in BF16_CONFIGS:
        kvs = ((torch.bfloat16, None), (torch.float16, None))
    for dt, kv in kvs:
        spec = CaseSpec(
            "p",
            ((700, 1), (300, 45), (2100, 1), (5000, 1), (17000, 1)),
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
        key = f"{name}/{kv}"
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

ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
for B, L in POINTS:
    q, k, v, tables, seq_lens, loc = paged_batch(B, L, 1, Hq, Hkv, D, bs, torch.bfloat16, dev)
    k8, v8 = (k.float() / ks).to(torch.float8_e4m3fn), (v.float() / vs).to(torch.float8_e4m3fn)
    row = {"B": B, "L": L, "us": {}, "shape": {}, "same_bits": {}, "errors": {}}
    graphs, outs, keep = {}, {}, []

    def ours(name, kk, vv, cfg, **kw):
        setcfg(**cfg)
        try:
            prep = tpa.prepare(q, kk, vv, tables, seq_lens, loc, **kw)
            d = prep.plan.decode
            row["shape"][name] = (d.SPLIT_LOOP, d.SPLITS_PER_PROGRAM, d.SPLIT_WHOLE, d.BLOCK_N, d.SPLIT_SIZE, d.maxnreg)
            out = torch.empty_like(q)
            keep.extend([prep, out])
            graphs[name] = graph_replay(lambda: tpa.run(prep, q, kk, vv, out=out), dev)
            outs[name] = out
        except Exception as e:
            row["errors"][name] = repr(e)[:300]
        setcfg()

    ours("bf16", k, v, {})
    for name, cfg in BF16_CONFIGS.items():
        ours(name, k, v, cfg)
    ours("e4m3", k8, v8, {}, k_scale=ks, v_scale=vs)
    for name, cfg in CONFIGS.items():
        ours(f"e4m3_{name}", k8, v8, cfg, k_scale=ks, v_scale=vs)
    if not DRY:
        kc, vc = contiguous_history(k, v, tables, L)
        qd = q.view(B, Hq, 1, D)
        keep.extend([kc, vc])
        graphs["sdpa"] = graph_replay(lambda: sdpa(qd, kc, vc), dev)
    if flashinfer is not None:
        nb = -(-L // bs)
        indptr = torch.arange(0, (B + 1) * nb, nb, dtype=torch.int32, device=dev)
        indices = tables[:, :nb].reshape(-1).contiguous()
        last = torch.full((B,), L - (nb - 1) * bs, dtype=torch.int32, device=dev)
        for name, tc, kk, vv, scaled in (
            ("fi_tc", True, k, v, False),
            ("fi", False, k, v, False),
            ("fi8_tc", True, k8, v8, True),
            ("fi8_tc_noscale", True, k8, v8, False),
            ("fi8", False, k8, v8, True),
        ):
            if name not in FI_RUNS:
                continue
            try:
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
                w.plan(indptr, indices, last, Hq, Hkv, D, bs, q_data_type=torch.bfloat16, kv_data_type=kk.dtype)
                fo = torch.empty_like(q)
                kw = {"k_scale": ks, "v_scale": vs} if scaled else {}
                fn = lambda w=w, fo=fo, kk=kk, vv=vv, kw=kw: w.run(q, (kk, vv), out=fo, **kw)
                fn()
                torch.cuda.synchronize()
                keep.extend([w, fo])
                graphs[name] = graph_replay(fn, dev)
                outs[name] = fo
            except Exception as e:
                row["errors"][name] = repr(e)[:300]
                torch.cuda.synchronize()
    for g in graphs.values():
        g()
    if not DRY:
        torch.cuda.synchronize()
    for name, out in outs.items():
        if name.startswith("e4m3_") and name[5:] in SAME_SPLITS:
            row["same_bits"][name] = bool(torch.equal(out, outs["e4m3"]))
    for ref, names in (("bf16", ("fi_tc", "fi")), ("e4m3", ("fi8_tc", "fi8"))):
        for n in names:
            if n in outs and ref in outs:
                row.setdefault("max_abs_diff", {})[n] = float((outs[n].float() - outs[ref].float()).abs().max())
    for rep in range(2):  # alternated, twice: the best of each
        for name, g in graphs.items():
            row["us"].setdefault(name, []).append(1e3 * bench(g, dev))
    best = {n: min(t) for n, t in row["us"].items()}
    if "sdpa" in best:
        row["x_sdpa"] = {n: best["sdpa"] / t for n, t in best.items()}
    row["x_bf16"] = {n: best["bf16"] / t for n, t in best.items() if "bf16" in best}
    if "fi_tc" in best and "fi8_tc" in best:
        row["fi8_tc_over_fi_tc"] = best["fi_tc"] / best["fi8_tc"]
    res["points"].append(row)
    log(f"B={B} L={L} " + " ".join(f"{n} {t:.1f}us ({row['x_bf16'][n]:.3f})" for n, t in best.items()))
    log(f"  shapes {row['shape']} same_bits {row['same_bits']} diff {row.get('max_abs_diff')} errors {row['errors']}")
    dump()
    del q, k, v, k8, v8, graphs, outs, keep
    if not DRY:
        torch.cuda.empty_cache()
log("probe done")
