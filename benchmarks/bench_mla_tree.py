"""MLA decode against FlashInfer's BatchMLAPagedAttentionWrapper, and tree-masked prefill
against causal prefill of the same shapes, for the Triton kernel; medians of
triton.testing.do_bench over ``run`` (the launches; ``prepare`` happens once per batch).

    python benchmarks/bench_mla_tree.py --out benchmarks/results/h100-mla-tree.json
    python benchmarks/bench_mla_tree.py --plot benchmarks/results/h100-mla-tree.json  # its two plots
    python benchmarks/bench_mla_tree.py --cpu --out /tmp/cpu.json   # the harness, on the interpreter

MLA decode: DeepSeek's absorbed form (one latent kv head of 576 columns, the value its first
512, scale 0.1352), bf16, pages of 64, randomly permuted; 16 and 128 query heads (V2-Lite and
V3 per tensor-parallel rank) over batches and histories: ``triton_ms`` is the kernel as it
ships; ``tunings_ms`` times the other launch shapes of ``MLA_TUNINGS`` beside it. Bandwidth
counts the latent rows read once (576 columns a key) plus Q and O. FlashInfer reads the same
bytes: its ``ckv_cache`` and ``kpe_cache`` are views of the one latent cache (``key_cache[:, :, 0, :512]`` and
``[..., 512:]``); where FlashInfer is absent its columns are ``null``.

Tree-masked prefill: branching draft trees (``random_tree_mask``) of ``q`` tokens over a
history of ``context`` keys a sequence, GQA 32/8, head dim 128; the causal run takes the same
shapes without a mask. ``tree_over_causal`` is causal's time over the tree's (1.0: free);
FlashInfer's prefill wrapper runs the same batch with the tree as ``custom_mask`` and causal
(``tree_over_flashinfer_tree``: its tree time over ours).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

if "--cpu" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_paged_attention import bench, machine  # noqa: E402

#: the other MLA launch shapes each point is timed at (``TUNING`` fields over the default): 64
#: heads a program on eight warps (the warp-group MMA's 64 rows), with 16 keys a step or one
#: stage, and splits of half and a quarter of the decode kernel's (one latent kv head gives a
#: history a program a split and head block: few programs where the batch is small)
MLA_TUNINGS = {
    "heads64": {"mla_block_h": 64, "mla_warps": 8},
    "heads64-16keys": {"mla_block_h": 64, "mla_warps": 8, "mla_block_n": 16},
    "heads64-1stage": {"mla_block_h": 64, "mla_warps": 8, "mla_stages": 1},
    "half-splits": {"split_short": 128, "split_size": 256, "split_long": 1024},
    "quarter-splits": {"split_short": 64, "split_size": 128, "split_long": 512},
}
GPU = {
    "mla": [(B, L, H) for H in (16, 128) for B in (1, 8, 32, 128) for L in (2048, 8192, 32768)],
    "mla_page": 64,
    "tree": [(32, 4096, 16), (32, 4096, 64), (8, 8192, 128), (4, 2048, 256), (4, 8192, 256)],  # (B, context, q)
    "tree_heads": (32, 8, 128),
    "tree_page": 16,
}
CPU = {
    "mla": [(2, 70, 16), (1, 300, 16)],
    "mla_page": 16,
    "tree": [(2, 40, 9)],
    "tree_heads": (4, 2, 32),
    "tree_page": 8,
}
#: DeepSeek V2/V3: the latent and rotary widths, the softmax scale with YaRN's mscale
D_LATENT, D_ROPE, MLA_SCALE = 512, 64, 0.1352


def _tables(B: int, L: int, page: int, device: str, seed: int = 0) -> tuple[torch.Tensor, int]:
    """``[B, ceil(L / page)]`` int32 block tables over a randomly permuted pool, and its pages."""
    g = torch.Generator().manual_seed(seed)
    per = -(-L // page)
    perm = torch.randperm(B * per, generator=g)
    return perm.view(B, per).to(torch.int32).to(device), B * per


def mla_batch(B: int, L: int, H: int, page: int, dtype: torch.dtype, device: str) -> dict:
    """One MLA decode batch: ``query`` [B, H, 576], ``key_cache`` [N, page, 1, 576], ``value_cache``
    its first 512 columns (a view), tables, lengths, offsets."""
    tables, N = _tables(B, L, page, device)
    key_cache = torch.randn(N, page, 1, D_LATENT + D_ROPE, dtype=dtype, device=device)
    return dict(
        query=torch.randn(B, H, D_LATENT + D_ROPE, dtype=dtype, device=device),
        key_cache=key_cache,
        value_cache=key_cache[..., :D_LATENT],
        block_tables=tables,
        seq_lens=torch.full((B,), L, dtype=torch.int32, device=device),
        query_start_loc=torch.arange(B + 1, dtype=torch.int32, device=device),
    )


def flashinfer_mla(batch: dict, device: str):
    """FlashInfer's MLA wrapper planned for ``batch`` (its run as a function of no arguments),
    or ``None`` without FlashInfer or a GPU."""
    if device != "cuda":
        return None
    try:
        import flashinfer
    except ImportError:
        return None
    q, kc, tables, lens = batch["query"], batch["key_cache"], batch["block_tables"], batch["seq_lens"]
    B, H, _ = q.shape
    page = kc.shape[1]
    per = tables.shape[1]
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device=device)
    wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend="auto")
    wrapper.plan(
        batch["query_start_loc"],
        torch.arange(0, (B + 1) * per, per, dtype=torch.int32, device=device),  # pages a request
        tables.reshape(-1),
        lens,
        H,
        D_LATENT,
        D_ROPE,
        page,
        False,  # one new token: nothing to mask
        MLA_SCALE,
        q.dtype,
        kc.dtype,
    )
    # the latent cache's two parts and the query's, as views (no copy)
    ckv, kpe = kc[:, :, 0, :D_LATENT], kc[:, :, 0, D_LATENT:]
    q_nope, q_pe = q[..., :D_LATENT], q[..., D_LATENT:]
    return lambda: wrapper.run(q_nope, q_pe, ckv, kpe)


def mla_point(B: int, L: int, H: int, page: int, dtype: torch.dtype, device: str) -> dict:
    """One MLA decode point: the kernel as it ships (``triton_ms``), at each of ``MLA_TUNINGS``
    (``tunings_ms``), and FlashInfer."""
    from pagedattn.kernels.triton_paged_attention import prepare, run
    from pagedattn.kernels.tuning import TUNING

    batch = mla_batch(B, L, H, page, dtype, device)
    q, kc, vc = batch["query"], batch["key_cache"], batch["value_cache"]
    times = {}
    for name, fields in {"shipped": {}, **MLA_TUNINGS}.items():
        prep = prepare(*batch.values(), scale=MLA_SCALE, tuning=dataclasses.replace(TUNING, **fields))
        times[name] = bench(lambda: run(prep, q, kc, vc), device)  # noqa: B023
    best = min(times, key=times.__getitem__)
    t_triton = times["shipped"]
    elt = kc.element_size()
    nbytes = B * L * (D_LATENT + D_ROPE) * elt + B * H * (2 * D_LATENT + D_ROPE) * elt
    row: dict = {"B": B, "L": L, "heads": H, "bytes": nbytes, "triton_ms": t_triton, "best_tuning": best}
    row["tunings_ms"] = times
    row["triton_TBps"] = nbytes / t_triton / 1e9
    fi = flashinfer_mla(batch, device)
    row["flashinfer_ms"] = row["flashinfer_TBps"] = row["triton_over_flashinfer"] = row["max_abs_diff"] = None
    if fi is not None:
        t_fi = bench(fi, device)
        row.update(flashinfer_ms=t_fi, flashinfer_TBps=nbytes / t_fi / 1e9, triton_over_flashinfer=t_fi / t_triton)
        prep = prepare(*batch.values(), scale=MLA_SCALE)
        row["max_abs_diff"] = float((run(prep, q, kc, vc).float() - fi().float()).abs().max())
    return row


def flashinfer_tree(case, device: str) -> dict | None:
    """FlashInfer's prefill wrapper planned for ``case`` (a ``PagedCase``) twice, with its tree as
    ``custom_mask`` and causal: ``{"tree": run, "causal": run}`` (functions of no arguments), or
    ``None`` without FlashInfer or a GPU. The paged cache is FlashInfer's ``[N, 2, page, Hkv, D]``
    (one copy, made here); the mask goes as bools, which ``plan`` packs."""
    if device != "cuda":
        return None
    try:
        import flashinfer
    except ImportError:
        return None
    from pagedattn.adapters.layouts import to_flashinfer, tree_mask_to_flashinfer

    a = to_flashinfer(case)
    custom = tree_mask_to_flashinfer(case.tree_mask, case.query_lens, case.seq_lens_list)
    runs = {}
    for name, mask in (("tree", custom), ("causal", None)):
        workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device=device)
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(
            a["qo_indptr"],
            a["kv_indptr"],
            a["kv_indices"],
            a["kv_last_page_len"],
            case.num_heads,
            case.num_kv_heads,
            case.head_dim,
            case.block_size,
            custom_mask=mask,
            causal=mask is None,
            sm_scale=case.scale,
            q_data_type=case.dtype,
        )
        runs[name] = lambda w=wrapper: w.run(a["q"], a["kv_cache"])
    return runs


def tree_point(B: int, context: int, n: int, heads: tuple[int, int, int], page: int, dtype, device: str) -> dict:
    from pagedattn.cases.spec import random_tree_mask
    from pagedattn.kernels.triton_paged_attention import prepare, run

    Hq, Hkv, D = heads
    L = context + n
    tables, N = _tables(B, L, page, device, seed=1)
    k = torch.randn(N, page, Hkv, D, dtype=dtype, device=device)
    v = torch.randn(N, page, Hkv, D, dtype=dtype, device=device)
    q = torch.randn(B * n, Hq, D, dtype=dtype, device=device)
    lens = torch.full((B,), L, dtype=torch.int32, device=device)
    loc = torch.arange(0, (B + 1) * n, n, dtype=torch.int32, device=device)
    g = torch.Generator().manual_seed(2)
    mask = torch.cat([random_tree_mask(n, g).reshape(-1) for _ in range(B)]).to(device)
    prep_tree = prepare(q, k, v, tables, lens, loc, tree_mask=mask)
    prep_causal = prepare(q, k, v, tables, lens, loc)
    t_tree = bench(lambda: run(prep_tree, q, k, v), device)
    t_causal = bench(lambda: run(prep_causal, q, k, v), device)
    seen = mask.view(B, n, n).sum().item() / B  # new-token pairs a sequence's tree lets through
    flops = 4 * B * (n * context + seen) * Hq * D
    from pagedattn.oracle.case import PagedCase

    case = PagedCase(q, k, v, tables, lens, loc, tree_mask=mask)
    fi = flashinfer_tree(case, device)
    fi_times = {name: bench(f, device) for name, f in fi.items()} if fi is not None else {}
    return {
        "B": B,
        "context": context,
        "q": n,
        "tree_ms": t_tree,
        "causal_ms": t_causal,
        "tree_over_causal": t_causal / t_tree,
        "tree_words": prep_tree.tree_words.shape[1],  # 64-bit words a token's row
        "tree_TFLOPs": flops / t_tree / 1e9,
        # FlashInfer's prefill with the tree as custom_mask, and causal, on the same batch
        "flashinfer_tree_ms": fi_times.get("tree"),
        "flashinfer_causal_ms": fi_times.get("causal"),
        "tree_over_flashinfer_tree": fi_times["tree"] / t_tree if fi_times else None,
    }


def plot(path: str) -> list[str]:
    """PNG plots next to the JSON: MLA decode's speed over FlashInfer's per batch and history (one
    panel a head count), and tree-masked prefill's over causal prefill's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        result = json.load(f)
    base, outs = os.path.splitext(path)[0], []
    gpu = result["machine"].get("gpu", "cpu")
    rows = [r for r in result["mla"] if r.get("triton_over_flashinfer")]
    if rows:
        heads = sorted({r["heads"] for r in rows})
        fig, axes = plt.subplots(1, len(heads), figsize=(5 * len(heads), 3.4), squeeze=False)
        for ax, H in zip(axes[0], heads):
            for B in sorted({r["B"] for r in rows if r["heads"] == H}):
                pts = sorted((r for r in rows if r["heads"] == H and r["B"] == B), key=lambda r: r["L"])
                ax.plot([r["L"] for r in pts], [r["triton_over_flashinfer"] for r in pts], marker="o", label=f"B={B}")
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("history length")
            ax.set_title(f"MLA decode, {H} query heads", fontsize=9)
        axes[0][0].set_ylabel("FlashInfer's time / ours")
        axes[0][-1].legend(fontsize=7)
        fig.suptitle(f"{gpu}: this kernel against FlashInfer's MLA wrapper (above 1: faster)", fontsize=9)
        fig.tight_layout()
        outs.append(base + "-mla.png")
        fig.savefig(outs[-1], dpi=110)
    if result["tree"]:
        fig, ax = plt.subplots(figsize=(5.5, 3.2))
        labels = [f"B{r['B']} q{r['q']}\nover {r['context'] // 1024}k" for r in result["tree"]]
        ax.bar(range(len(labels)), [r["tree_over_causal"] for r in result["tree"]])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylabel("causal's time / the tree's")
        ax.set_title(f"{gpu}: tree-masked prefill against causal prefill", fontsize=9)
        fig.tight_layout()
        outs.append(base + "-tree.png")
        fig.savefig(outs[-1], dpi=110)
    return outs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="tiny sizes on the Triton interpreter")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None, metavar="JSON", help="only plot an existing JSON")
    ap.add_argument("--parts", default="mla,tree", help="comma-separated: mla, tree")
    args = ap.parse_args(argv)
    parts = args.parts.split(",")
    if not set(parts) <= {"mla", "tree"}:
        ap.error(f"--parts takes mla and tree, got {args.parts}")
    if args.plot:
        print("\n".join(plot(args.plot)))
        return
    device = "cpu" if args.cpu else "cuda"
    cfg = CPU if args.cpu else GPU
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    result: dict = {"machine": machine(device), "config": {"dtype": str(dtype)}, "mla": [], "tree": []}
    for B, L, H in cfg["mla"] if "mla" in parts else []:
        row = mla_point(B, L, H, cfg["mla_page"], dtype, device)
        result["mla"].append(row)
        fi = "n/a" if row["flashinfer_ms"] is None else f"{row['flashinfer_ms'] * 1e3:8.1f} us"
        print(
            f"mla B={B:4d} L={L:6d} H={H:4d}  triton {row['triton_ms'] * 1e3:8.1f} us "
            f"{row['triton_TBps']:5.2f} TB/s (fastest: {row['best_tuning']})  flashinfer {fi}",
            flush=True,
        )
    for B, context, n in cfg["tree"] if "tree" in parts else []:
        row = tree_point(B, context, n, cfg["tree_heads"], cfg["tree_page"], dtype, device)
        result["tree"].append(row)
        print(
            f"tree B={B:3d} context={context:6d} q={n:4d}  tree {row['tree_ms']:8.3f} ms  "
            f"causal {row['causal_ms']:8.3f} ms  causal/tree {row['tree_over_causal']:5.2f}  "
            f"flashinfer tree/ours {row['tree_over_flashinfer_tree'] or float('nan'):5.2f}",
            flush=True,
        )
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
