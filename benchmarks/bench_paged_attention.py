"""Benchmark the Triton paged-attention kernel against SDPA, in one call.

GPU (default when CUDA is there): decode over B x L, block sizes and head dims,
causal prefill (8k and 32k tokens; FlashInfer's fa3 prefill on the same pages beside SDPA
where FlashInfer is installed), chunked prefill and a mixed batch; bf16, Hq=32, Hkv=8,
D=128, block size 16, randomly permuted block tables; median of triton.testing.do_bench
(which flushes L2 between runs). Writes a JSON file with the machine, versions,
every figure and the floor it is compared with; ``--plot`` turns that JSON into
PNG plots (matplotlib, on any machine); ``--parts`` runs some of decode, prefill, mixed.

CPU (``--cpu``): the same code paths on tiny sizes, through the Triton interpreter,
so the harness itself never rots (tests/test_benchmarks.py runs it).

    python benchmarks/bench_paged_attention.py --out benchmarks/results/h200.json
    python benchmarks/bench_paged_attention.py --plot benchmarks/results/h200.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

if "--cpu" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F  # noqa: E402

GPU_GRID = {
    "decode_B": [1, 8, 32, 64, 128],
    "decode_L": [2048, 4096, 8192, 32768],
    "variants": [(16, 64), (1, 128), (64, 128), (16, 128)],  # (block_size, head_dim) at B=32, L=4096
    "prefill_L": [8192, 32768],
    "chunk": (2048, 16384),  # new tokens over cached
    "mixed": (64, 4096, 2048),  # decode seqs, their history, one prefill of this length
    "heads": (32, 8, 128),
}
CPU_GRID = {
    "decode_B": [1, 2],
    "decode_L": [64, 600],
    "variants": [(1, 64), (16, 32)],
    "prefill_L": [96],
    "chunk": (16, 80),
    "mixed": (2, 64, 32),
    "heads": (4, 2, 32),
}


def bench(fn, device: str) -> float:
    """Median milliseconds of ``fn``."""
    if device == "cuda":
        import triton

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graph_replay(fn, device: str):
    """``fn`` captured once in a CUDA graph, returned as a function that replays it (on
    the CPU, ``fn`` itself: the harness runs, there is nothing to capture)."""
    if device != "cuda":
        return fn
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile and warm up outside the capture
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def host_us(fn, repeat: int = 20) -> float:
    """Median wall-clock microseconds of ``fn`` on the host (it synchronizes itself or not)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def paged_batch(B, L, q_len, Hq, Hkv, D, bs, dtype, device, gen_seed=0):
    """Random tensors of one batch with permuted blocks; every sequence has L tokens."""
    g = torch.Generator(device="cpu").manual_seed(gen_seed)
    nb = -(-L // bs)
    N = B * nb
    perm = torch.randperm(N, generator=g)
    tables = perm.view(B, nb).to(torch.int32).to(device)
    k = torch.randn(N, bs, Hkv, D, dtype=dtype, device=device)
    v = torch.randn(N, bs, Hkv, D, dtype=dtype, device=device)
    q = torch.randn(B * q_len, Hq, D, dtype=dtype, device=device)
    seq_lens = torch.full((B,), L, dtype=torch.int32, device=device)
    loc = torch.arange(0, (B + 1) * q_len, q_len, dtype=torch.int32, device=device)
    return q, k, v, tables, seq_lens, loc


def contiguous_history(k, v, tables, L):
    """[B, Hkv, L, D] K and V made contiguous (what SDPA reads)."""
    B = tables.shape[0]
    kc = k[tables.long()].reshape(B, -1, k.shape[2], k.shape[3])[:, :L].transpose(1, 2).contiguous()
    vc = v[tables.long()].reshape(B, -1, v.shape[2], v.shape[3])[:, :L].transpose(1, 2).contiguous()
    return kc, vc


def sdpa(q, k, v, **kw):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1], **kw)


def decode_point(B, L, bs, D, Hq, Hkv, dtype, device, kernel):
    q, k, v, tables, seq_lens, loc = paged_batch(B, L, 1, Hq, Hkv, D, bs, dtype, device)
    elt = k.element_size()
    nbytes = 2 * B * L * Hkv * D * elt + 2 * B * Hq * D * elt
    kc, vc = contiguous_history(k, v, tables, L)
    qd = q.view(B, Hq, 1, D)
    t_paged = bench(lambda: kernel(q, k, v, tables, seq_lens, loc), device)
    t_sdpa = bench(lambda: sdpa(qd, kc, vc), device)
    from pagedattn.kernels.triton_paged_attention import prepare, run

    prep = prepare(q, k, v, tables, seq_lens, loc)
    t_run = bench(lambda: run(prep, q, k, v), device)
    t_prepare = bench(lambda: prepare(q, k, v, tables, seq_lens, loc), device)
    prepare_us = host_us(lambda: prepare(q, k, v, tables, seq_lens, loc))
    # what an engine replays: ``run`` captured once in a CUDA graph (out given: no allocation)
    out = torch.empty_like(q)
    t_graph = bench(graph_replay(lambda: run(prep, q, k, v, out=out), device), device)
    t_sdpa_graph = bench(graph_replay(lambda: sdpa(qd, kc, vc), device), device)

    flat = tables.reshape(-1).long()
    nb = tables.shape[1]

    def gather_then_sdpa():
        # the best plain-torch gather: one index_select per pool, then SDPA on strided views
        kg = k.index_select(0, flat).view(B, nb * bs, Hkv, D)[:, :L].transpose(1, 2)
        vg = v.index_select(0, flat).view(B, nb * bs, Hkv, D)[:, :L].transpose(1, 2)
        return sdpa(qd, kg, vg)

    t_gather = bench(gather_then_sdpa, device)
    err = None
    if B * L <= 1 << 18:  # a sanity check of the timed kernel (the suite does the real checking)
        ref = sdpa(qd.float(), kc.float(), vc.float()).view(B, Hq, D)
        err = float((kernel(q, k, v, tables, seq_lens, loc).float() - ref).abs().max())
        err = max(err, float((out.float() - ref).abs().max()))  # the graph's replays wrote ``out``
    return {
        "B": B,
        "L": L,
        "block_size": bs,
        "head_dim": D,
        "bytes": nbytes,
        "prepare_host_us": prepare_us,
        "ms": {
            "triton_paged": t_run,
            "triton_paged_graph": t_graph,
            "triton_paged_with_checks": t_paged,
            "triton_prepare": t_prepare,
            "sdpa_contiguous": t_sdpa,
            "sdpa_contiguous_graph": t_sdpa_graph,
            "gather_then_sdpa": t_gather,
        },
        "TBps": {
            "triton_paged": nbytes / t_run / 1e9,
            "triton_paged_graph": nbytes / t_graph / 1e9,
            "triton_paged_with_checks": nbytes / t_paged / 1e9,
            "sdpa_contiguous": nbytes / t_sdpa / 1e9,
            "sdpa_contiguous_graph": nbytes / t_sdpa_graph / 1e9,
            "gather_then_sdpa": nbytes / t_gather / 1e9,
        },
        "max_abs_err_vs_fp32_sdpa": err,
    }


def flashinfer_prefill(q, k, v, tables, L: int, device: str):
    """FlashInfer's paged prefill with its fa3 backend (Hopper's warp-specialized kernels),
    planned causal for one sequence of ``L`` new tokens over the same pages (``k``, ``v``
    [N, page, Hkv, D], NHD, as a tuple: no copy): a function of no arguments, ``None`` without
    FlashInfer or a GPU, or the error's text where it cannot plan."""
    if device != "cuda":
        return None
    try:
        import flashinfer
    except ImportError:
        return None
    per, page = tables.shape[1], k.shape[1]
    i32 = dict(dtype=torch.int32, device=device)
    try:
        workspace = torch.zeros(256 * 1024 * 1024, dtype=torch.uint8, device=device)
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa3")
        wrapper.plan(
            torch.tensor([0, q.shape[0]], **i32),
            torch.tensor([0, per], **i32),
            tables.reshape(-1),
            torch.tensor([L - (per - 1) * page], **i32),
            q.shape[1],
            k.shape[2],
            k.shape[3],
            page,
            causal=True,
            q_data_type=q.dtype,
        )
    except Exception as e:  # a JIT or planning failure is a figure missing, not a harness failure
        return f"{type(e).__name__}: {e}"[:300]
    return lambda: wrapper.run(q, (k, v))


def prefill_point(new, cached, Hq, Hkv, D, dtype, device, kernel, label):
    L = new + cached
    q, k, v, tables, seq_lens, loc = paged_batch(1, L, new, Hq, Hkv, D, 16 if device == "cuda" else 8, dtype, device)
    kc, vc = contiguous_history(k, v, tables, L)
    qd = q.view(1, new, Hq, D).transpose(1, 2)
    # causal FLOPs: 2 matmuls x 2 FLOP x the visible (query, key) pairs
    pairs = new * cached + new * (new + 1) / 2
    flops = 4 * pairs * Hq * D
    from pagedattn.kernels.triton_paged_attention import prepare, run

    prep = prepare(q, k, v, tables, seq_lens, loc)
    t_paged = bench(lambda: run(prep, q, k, v), device)
    if cached == 0:
        t_sdpa = bench(lambda: sdpa(qd, kc, vc, is_causal=True), device)
    else:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(new, L)
        t_sdpa = bench(
            lambda: F.scaled_dot_product_attention(
                qd, kc.repeat_interleave(Hq // Hkv, 1), vc.repeat_interleave(Hq // Hkv, 1), attn_mask=mask
            ),
            device,
        )
    ms = {"triton_paged": t_paged, "sdpa_contiguous": t_sdpa}
    row: dict = {"kind": label, "new": new, "cached": cached, "flops": flops}
    fi = flashinfer_prefill(q, k, v, tables, L, device) if cached == 0 else None
    if isinstance(fi, str):
        row["flashinfer_error"] = fi
    elif fi is not None:
        ms["flashinfer_fa3"] = bench(fi, device)
        row["flashinfer_max_abs_diff"] = float((fi().float() - run(prep, q, k, v).float()).abs().max())
    row["ms"] = ms
    row["TFLOPs"] = {name: flops / t / 1e9 for name, t in ms.items()}
    return row


def mixed_point(n_decode, L, prefill, Hq, Hkv, D, dtype, device, kernel):
    bs = 16
    q_d, k_d, v_d, t_d, s_d, _ = paged_batch(n_decode, L, 1, Hq, Hkv, D, bs, dtype, device)
    q_p, k_p, v_p, t_p, s_p, _ = paged_batch(1, prefill, prefill, Hq, Hkv, D, bs, dtype, device, 1)
    k = torch.cat([k_d, k_p])
    v = torch.cat([v_d, v_p])
    width = max(t_d.shape[1], t_p.shape[1])
    tables = torch.zeros(n_decode + 1, width, dtype=torch.int32, device=device)
    tables[:n_decode, : t_d.shape[1]] = t_d
    tables[n_decode, : t_p.shape[1]] = t_p + k_d.shape[0]
    seq_lens = torch.cat([s_d, s_p])
    q = torch.cat([q_d, q_p])
    loc = torch.tensor([0] + [1] * n_decode + [prefill], device=device).cumsum(0).to(torch.int32)
    t = bench(lambda: kernel(q, k, v, tables, seq_lens, loc), device)
    return {"decode_seqs": n_decode, "decode_L": L, "prefill": prefill, "ms": {"triton_paged": t}}


def copy_bandwidth(device: str) -> float:
    n = (1 << 30) if device == "cuda" else (1 << 22)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    t = bench(lambda: b.copy_(a), device)
    return 2 * n / t / 1e9


def machine(device: str) -> dict:
    import triton

    info = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        try:
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
            ).stdout.strip()
        except OSError:
            info["driver"] = "unknown"
    else:
        info["cpu"] = platform.processor() or platform.machine()
        info["note"] = "Triton interpreter: figures test the harness, not the kernel's speed"
    return info


def run(device: str, out: str | None, parts: tuple[str, ...] = ("decode", "prefill", "mixed")) -> dict:
    from pagedattn.kernels.triton_paged_attention import paged_attention as kernel

    grid = GPU_GRID if device == "cuda" else CPU_GRID
    Hq, Hkv, D = grid["heads"]
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    # the kernel's tuning as measured
    from pagedattn.kernels.tuning import TUNING

    kernel_cfg = dataclasses.asdict(TUNING)
    result = {
        "machine": machine(device),
        "config": {"dtype": str(dtype), "Hq": Hq, "Hkv": Hkv, "D": D},
        "kernel": kernel_cfg,
    }
    result["copy_TBps"] = copy_bandwidth(device)
    if "decode" in parts:
        decode = []
        for L in grid["decode_L"]:
            for B in grid["decode_B"]:
                p = decode_point(B, L, 16 if device == "cuda" else 8, D, Hq, Hkv, dtype, device, kernel)
                decode.append(p)
                print(
                    f"decode B={B:4d} L={L:6d}: paged {p['TBps']['triton_paged']:.2f} TB/s "
                    f"(with checks {p['TBps']['triton_paged_with_checks']:.2f}), "
                    f"sdpa {p['TBps']['sdpa_contiguous']:.2f}, gather+sdpa {p['TBps']['gather_then_sdpa']:.2f}",
                    flush=True,
                )
        result["decode"] = decode
        result["decode_variants"] = [
            decode_point(32 if device == "cuda" else 2, grid["decode_L"][1], bs, d, Hq, Hkv, dtype, device, kernel)
            for bs, d in grid["variants"]
        ]
    if "prefill" in parts:
        result["prefill"] = [
            prefill_point(L, 0, Hq, Hkv, D, dtype, device, kernel, "causal_prefill") for L in grid["prefill_L"]
        ] + [prefill_point(*grid["chunk"], Hq, Hkv, D, dtype, device, kernel, "chunked_prefill")]
    if "mixed" in parts:
        result["mixed"] = mixed_point(*grid["mixed"], Hq, Hkv, D, dtype, device, kernel)
    result["targets"] = check_targets(result)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    print_table(result)
    return result


def check_targets(result: dict) -> list[dict]:
    """Each performance target with its floor, the figure, and whether it is met."""
    rows = []

    def row(target, value, floor):
        rows.append({"target": target, "value": value, "floor": floor, "met": value >= floor})

    for p in result.get("decode", []):
        tb = p["TBps"]
        if p["B"] >= 8:
            row(
                f"decode B={p['B']} L={p['L']}: >= 0.95 of SDPA on contiguous (TB/s)",
                tb["triton_paged"],
                0.95 * tb["sdpa_contiguous"],
            )
        else:
            row(
                f"decode B={p['B']} L={p['L']}: graph replay >= 0.8 of SDPA on contiguous (TB/s)",
                tb["triton_paged_graph"],
                0.8 * tb["sdpa_contiguous"],
            )
    for p in result.get("prefill", []):
        tf = p["TFLOPs"]
        if p["kind"] == "causal_prefill":
            # FlashInfer's fa3 prefill reaches about this share of SDPA-contiguous on Hopper
            row(
                f"causal prefill of {p['new']}: >= 0.86 of SDPA (TFLOP/s)",
                tf["triton_paged"],
                0.86 * tf["sdpa_contiguous"],
            )
        else:
            row(
                "chunked prefill: >= 0.8 of SDPA, bottom-right mask (TFLOP/s)",
                tf["triton_paged"],
                0.8 * tf["sdpa_contiguous"],
            )
    return rows


def print_table(result: dict) -> None:
    print(f"\n{result['machine']}\ncopy bandwidth {result['copy_TBps']:.2f} TB/s")
    print(
        f"{'B':>5}{'L':>7}{'bs':>4}{'D':>5}{'paged TB/s':>12}{'graph':>7}{'sdpa TB/s':>11}{'graph':>7}"
        f"{'gather TB/s':>12}{'vs sdpa':>9}{'graph/sdpa':>11}{'vs gather':>10}{'prepare us':>11}"
    )
    for p in result.get("decode", []) + result.get("decode_variants", []):
        tb = p["TBps"]
        print(
            f"{p['B']:>5}{p['L']:>7}{p['block_size']:>4}{p['head_dim']:>5}{tb['triton_paged']:>12.2f}"
            f"{tb['triton_paged_graph']:>7.2f}{tb['sdpa_contiguous']:>11.2f}{tb['sdpa_contiguous_graph']:>7.2f}"
            f"{tb['gather_then_sdpa']:>12.2f}{tb['triton_paged'] / tb['sdpa_contiguous']:>9.2f}"
            f"{tb['triton_paged_graph'] / tb['sdpa_contiguous']:>11.2f}"
            f"{p['ms']['gather_then_sdpa'] / p['ms']['triton_paged']:>10.2f}"
            f"{p['prepare_host_us']:>11.0f}"
        )
    for p in result.get("prefill", []):
        others = ", ".join(f"{k} {v:.1f}" for k, v in p["TFLOPs"].items() if k != "triton_paged")
        print(
            f"{p['kind']} new={p['new']} cached={p['cached']}: "
            f"paged {p['TFLOPs']['triton_paged']:.1f} TFLOP/s, {others}"
        )
    if "mixed" in result:
        m = result["mixed"]
        print(
            f"mixed {m['decode_seqs']} decode x {m['decode_L']} + prefill {m['prefill']}: "
            f"{m['ms']['triton_paged']:.3f} ms"
        )
    met = sum(r["met"] for r in result["targets"])
    print(f"targets met: {met} of {len(result['targets'])}")
    for r in result["targets"]:
        if not r["met"]:
            print(f"  MISSED {r['target']}: {r['value']:.3g} (floor {r['floor']:.3g})")


def plot(path: str) -> list[str]:
    """PNG plots next to the JSON: time vs history length per implementation, and the
    fraction of copy bandwidth each reaches."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        result = json.load(f)
    base = os.path.splitext(path)[0]
    outs = []
    if result.get("prefill"):
        outs.append(_plot_prefill(result, base + "-prefill.png", plt))
    if not result.get("decode"):
        return outs
    Bs = sorted({p["B"] for p in result["decode"]})
    # the graph replay beside the eager launch: at small B the launch is host-bound, and
    # its time moves with the host between runs; the replay's does not
    impls = ["triton_paged", "triton_paged_graph", "sdpa_contiguous", "gather_then_sdpa"]
    impls = [i for i in impls if all(i in p["ms"] for p in result["decode"])]
    fig, axes = plt.subplots(1, len(Bs), figsize=(4 * len(Bs), 3.6), sharey=False)
    for ax, B in zip(axes, Bs):
        pts = sorted((p for p in result["decode"] if p["B"] == B), key=lambda p: p["L"])
        Ls = [p["L"] for p in pts]
        for impl in impls:
            ax.plot(Ls, [p["ms"][impl] for p in pts], marker="o", label=impl)
        ax.plot(Ls, [p["bytes"] / (result["copy_TBps"] * 1e9) for p in pts], "k--", label="copy-bandwidth line")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"decode, B={B}")
        ax.set_xlabel("history length L")
    axes[0].set_ylabel("ms (median)")
    axes[-1].legend(fontsize=7)
    fig.suptitle(f"{result['machine'].get('gpu', 'cpu')}: paged decode, bf16, Hq=32 Hkv=8 D=128, page 16")
    fig.tight_layout()
    outs.append(base + "-decode-time.png")
    fig.savefig(outs[-1], dpi=110)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    labels = [f"B{p['B']}\nL{p['L'] // 1024}k" for p in result["decode"]]
    x = range(len(labels))
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        ax.bar(
            [xi + (i - (len(impls) - 1) / 2) * width for xi in x],
            [p["TBps"][impl] / result["copy_TBps"] for p in result["decode"]],
            width,
            label=impl,
        )
    ax.set_xticks(list(x), labels, fontsize=6)
    ax.set_ylabel("fraction of copy bandwidth")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    outs.append(base + "-decode-bandwidth.png")
    fig.savefig(outs[-1], dpi=110)
    return outs


def _plot_prefill(result: dict, path: str, plt) -> str:
    """Causal prefill's TFLOP/s per implementation and length (bars), into ``path``."""
    pts = [p for p in result["prefill"] if p["kind"] == "causal_prefill"]
    impls = [i for i in ("triton_paged", "flashinfer_fa3", "sdpa_contiguous") if any(i in p["TFLOPs"] for p in pts)]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        xs = [x + (i - (len(impls) - 1) / 2) * width for x in range(len(pts))]
        ax.bar(xs, [p["TFLOPs"].get(impl, 0.0) for p in pts], width, label=impl)
    ax.set_xticks(range(len(pts)), [f"{p['new'] // 1024}k tokens" for p in pts])
    ax.set_ylabel("TFLOP/s (median)")
    ax.set_title(f"{result['machine'].get('gpu', 'cpu')}: causal prefill, bf16, GQA 32/8, D=128, page 16", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="tiny sizes on the Triton interpreter")
    ap.add_argument("--out", default=None, help="write the JSON here")
    ap.add_argument("--plot", default=None, metavar="JSON", help="only plot an existing JSON")
    ap.add_argument("--parts", default="decode,prefill,mixed", help="comma-separated: decode, prefill, mixed")
    args = ap.parse_args(argv)
    if args.plot:
        print("\n".join(plot(args.plot)))
        return
    device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    parts = tuple(args.parts.split(","))
    if not set(parts) <= {"decode", "prefill", "mixed"}:
        ap.error(f"--parts takes decode, prefill and mixed, got {args.parts}")
    run(device, args.out, parts)


if __name__ == "__main__":
    main()
