"""What each attention variant costs the Triton kernel: decode and causal prefill with
no variant, a sliding window, soft-cap, ALiBi, sinks, an fp8 cache, the log-sum-exp,
and gpt-oss's window + sinks; medians of triton.testing.do_bench over ``run`` (the launches; ``prepare``, the checks
and the plan, happens once per batch in an engine and is timed in bench_paged_attention).

    python benchmarks/bench_attention_variants.py --out benchmarks/results/h200-variants.json
    python benchmarks/bench_attention_variants.py --cpu --out /tmp/cpu.json   # the harness, on the interpreter

Decode bandwidth counts the bytes a variant must read: K and V of the keys it sees
(a window of W reads W keys per sequence, an fp8 cache one byte per element) plus
Q and O.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if "--cpu" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_paged_attention import bench, machine, paged_batch  # noqa: E402

GPU = {"decode": (32, 4096), "prefill": 4096, "heads": (32, 8, 128), "block_size": 16, "window": 1024}
CPU = {"decode": (2, 96), "prefill": 48, "heads": (4, 2, 32), "block_size": 8, "window": 40}


def variants(cfg: dict, Hq: int, device: str) -> dict[str, dict]:
    """name -> keyword arguments of ``paged_attention`` (``kv``: an fp8 cache dtype)."""
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / Hq) for h in range(Hq)], device=device)
    sinks = torch.linspace(-1.0, 6.0, Hq, device=device)
    return {
        "none": {},
        f"window{cfg['window']}": {"sliding_window": cfg["window"]},
        "softcap50": {"logits_soft_cap": 50.0},
        "alibi": {"alibi_slopes": slopes},
        "sinks": {"sinks": sinks},
        "fp8_e4m3": {"kv": torch.float8_e4m3fn, "k_scale": 0.37, "v_scale": 1.9},
        "fp8_e5m2": {"kv": torch.float8_e5m2, "k_scale": 0.37, "v_scale": 1.9},
        "lse": {"return_lse": True},
        "window128+sinks": {"sliding_window": 128, "sinks": sinks},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="tiny sizes on the Triton interpreter")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = "cpu" if args.cpu else "cuda"
    from pagedattn.kernels.triton_paged_attention import prepare, run

    cfg = CPU if args.cpu else GPU
    Hq, Hkv, D = cfg["heads"]
    bs = cfg["block_size"]
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    B, L = cfg["decode"]
    P = cfg["prefill"]
    dec = paged_batch(B, L, 1, Hq, Hkv, D, bs, dtype, device)
    pre = paged_batch(1, P, P, Hq, Hkv, D, bs, dtype, device, gen_seed=1)
    rows = []
    for name, kw in variants(cfg, Hq, device).items():
        kw = dict(kw)
        kv = kw.pop("kv", None)
        row: dict = {"variant": name}
        for label, (q, k, v, tables, seq_lens, loc) in (("decode", dec), ("prefill", pre)):
            if kv is not None:
                k, v = (k.float() / kw["k_scale"]).to(kv), (v.float() / kw["v_scale"]).to(kv)
            # the launches alone: checks and planning happen once per batch (``prepare``)
            prep = prepare(q, k, v, tables, seq_lens, loc, **kw)
            t = bench(lambda: run(prep, q, k, v), device)  # noqa: B023
            row[f"{label}_ms"] = t
            if label == "decode":
                keys = min(L, kw.get("sliding_window") or L)
                nbytes = 2 * B * keys * Hkv * D * k.element_size() + 2 * B * Hq * D * q.element_size()
                row["decode_TBps"] = nbytes / t / 1e9
            else:
                W = kw.get("sliding_window")
                pairs = P * (P + 1) / 2 if W is None else sum(min(i + 1, W) for i in range(P))
                row["prefill_TFLOPs"] = 4 * pairs * Hq * D / t / 1e9
        rows.append(row)
        print(
            f"{name:18s} decode {row['decode_ms'] * 1e3:9.1f} us {row['decode_TBps']:6.2f} TB/s   "
            f"prefill {row['prefill_ms']:8.3f} ms {row['prefill_TFLOPs']:7.1f} TFLOP/s",
            flush=True,
        )
    result = {
        "machine": machine(device),
        "config": {
            "dtype": str(dtype),
            "Hq": Hq,
            "Hkv": Hkv,
            "D": D,
            "block_size": bs,
            "decode_B_L": [B, L],
            "prefill_L": P,
        },
        "rows": rows,
    }
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
