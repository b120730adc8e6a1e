# ruff: noqa
"""A prototype, not wired into the kernel (issue 17, nineteenth stop): the decode's two dots
with their operands swapped, keys as the dots' M dimension.

The kernel's decode step forms ``s = q . k^T`` [GROUP_PAD=16, BLOCK_N] and ``p . v``
[16, D]: 16 rows, below the 64 that Hopper's warp-group MMA (wgmma) needs, so triton runs
them on ``mma.sync`` with both operands through ``ldmatrix``. For an fp8 cache that puts each
tile through a shared-memory round trip after its widening (copy, load, convert, store,
``ldmatrix``), the chain the sixth stop found the fp8 loop bound by. Swapped, ``s^T = k . q^T``
[BLOCK_N, 16] and ``acc^T = v^T . p^T`` [D, 16] have M = 64 and 128: wgmma, whose A operand
may come from registers (the widened tile) and whose B operand (the query, loaded once; the
weights, 16 columns) is small.

Both forms here are the same minimal decode: one program per (sequence, kv head, 512-key
split), page 16, one tile of BLOCK_N keys a step, base-2 softmax with the scale folded into
the exponent, the split's state normalised and stored (no merge, no masks, no variants), fp8
tiles widened by the kernel's own ``_widen_pairs``. Both are judged against torch first.

    python benchmarks/results/proto_decode_swapped.py compile      # sm_90 machine code, on the CPU
    python benchmarks/results/proto_decode_swapped.py time OUT.json  # on a GPU
"""

import json
import os
import re
import sys
import tempfile

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from pagedattn.kernels.triton_paged_attention import _query_rows, _widen_pairs  # noqa: E402


@triton.jit
def _tile(cache_ptr, off, d, dp, FP8: tl.constexpr, E5M2: tl.constexpr):
    """The tile [BLOCK_N, D] at row offsets ``off`` [BLOCK_N], fp16 (widened) for fp8."""
    if FP8:
        pairs = cache_ptr.to(tl.pointer_type(tl.uint16), bitcast=True) + (off >> 1)[:, None] + dp[None, :]
        x = _widen_pairs(tl.load(pairs), E5M2)
    else:
        x = tl.load(cache_ptr + off[:, None] + d[None, :])
    return x


@triton.jit
def dec_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    tab_ptr,
    out_ptr,
    n_kv_heads,
    stride_bt,
    stride_kb,
    stride_ks,
    stride_kh,
    n_splits,
    scale,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SPLIT: tl.constexpr,
    FP8: tl.constexpr,
    SWAP: tl.constexpr,
    LOAD_ONLY: tl.constexpr = False,
    SUM_DOT: tl.constexpr = False,
):
    pid = tl.program_id(0)
    kv_head = pid % n_kv_heads
    seq = pid // n_kv_heads
    split = tl.program_id(1)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D)
    dp = tl.arange(0, D // 2)
    head = kv_head * GROUP + g
    q = tl.load(
        q_ptr + (seq * n_kv_heads * GROUP + head)[:, None] * D + d[None, :], mask=(g < GROUP)[:, None], other=0.0
    )
    q, qk_scale = _query_rows(q, scale, FP8)
    s_scale = qk_scale * 1.4426950408889634
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_sum = tl.zeros([GROUP_PAD], tl.float32)
    if SWAP:
        acc = tl.zeros([D, GROUP_PAD], tl.float32)
        qt = tl.trans(q)
    else:
        acc = tl.zeros([GROUP_PAD, D], tl.float32)
    t = tl.arange(0, BLOCK_N)
    lo = split * SPLIT
    if LOAD_ONLY:  # the same pages read as 16-bit words and folded by xor: the loads alone
        W: tl.constexpr = D // 2 if FP8 else D
        w = tl.arange(0, W)
        bits = tl.zeros([W], tl.int32)
        for j0 in range(lo, lo + SPLIT, BLOCK_N):
            j = j0 + t
            blk = tl.load(tab_ptr + seq * stride_bt + (j.to(tl.uint32) // BLOCK_SIZE).to(tl.int32))
            off = blk * stride_kb + (j.to(tl.uint32) % BLOCK_SIZE).to(tl.int32) * stride_ks + kv_head * stride_kh
            if FP8:
                off = off >> 1
            off = tl.multiple_of(off, 8)  # rows of whole 16-byte words: vector loads
            kw = tl.load(k_ptr.to(tl.pointer_type(tl.uint16), bitcast=True) + off[:, None] + w[None, :])
            vw = tl.load(v_ptr.to(tl.pointer_type(tl.uint16), bitcast=True) + off[:, None] + w[None, :])
            bits ^= tl.xor_sum((kw ^ vw).to(tl.int32), 0)
        base = out_ptr + ((seq * n_kv_heads + kv_head) * n_splits + split) * GROUP_PAD * D
        tl.store(base + w, bits.to(tl.float32))
        return
    for j0 in range(lo, lo + SPLIT, BLOCK_N):
        j = j0 + t
        blk = tl.load(tab_ptr + seq * stride_bt + (j.to(tl.uint32) // BLOCK_SIZE).to(tl.int32))
        off = blk * stride_kb + (j.to(tl.uint32) % BLOCK_SIZE).to(tl.int32) * stride_ks + kv_head * stride_kh
        k = _tile(k_ptr, off, d, dp, FP8, False)  # [BLOCK_N, D]
        v = _tile(v_ptr, off, d, dp, FP8, False)
        if SWAP:
            st = tl.dot(k, qt)  # [BLOCK_N, GROUP_PAD]
            m_new = tl.maximum(m, tl.max(st, 0) * s_scale)
            alpha = tl.exp2(m - m_new)
            pt = tl.exp2(st * s_scale[None, :] - m_new[None, :])
            l_sum = l_sum * alpha + tl.sum(pt, 0)
            acc = acc * alpha[None, :] + tl.dot(tl.trans(v), pt.to(v.dtype))  # [D, GROUP_PAD]
        else:
            s = tl.dot(q, tl.trans(k))  # [GROUP_PAD, BLOCK_N]
            m_new = tl.maximum(m, tl.max(s, 1) * s_scale)
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(s * s_scale[:, None] - m_new[:, None])
            if SUM_DOT:  # the row sums by the tensor cores (the weights as the P.V dot takes them)
                ones = tl.full([BLOCK_N, 16], 1.0, v.dtype)
                l_sum = l_sum * alpha + tl.max(tl.dot(p.to(v.dtype), ones), 1)
            else:
                l_sum = l_sum * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    base = out_ptr + ((seq * n_kv_heads + kv_head) * n_splits + split) * GROUP_PAD * D
    if SWAP:
        o = acc / l_sum[None, :]
        tl.store(base + g[None, :] * D + d[:, None], o)
    else:
        o = acc / l_sum[:, None]
        tl.store(base + g[:, None] * D + d[None, :], o)


CONSTS = dict(GROUP=4, GROUP_PAD=16, D=128, BLOCK_N=64, BLOCK_SIZE=16, SPLIT=512)


def compile_stats() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from sass_loop_stats import disassemble, loop_stats, registers

    names = dec_kernel.arg_names
    for fp8 in (False, True):
        for swap in (False, True):
            consts = dict(CONSTS, FP8=fp8, SWAP=swap)
            types = {
                "q_ptr": "*bf16",
                "k_ptr": "*fp8e4nv" if fp8 else "*bf16",
                "v_ptr": "*fp8e4nv" if fp8 else "*bf16",
                "tab_ptr": "*i32",
                "out_ptr": "*fp32",
                "scale": "fp32",
            }
            sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in names}
            aligned = [
                i
                for i, n in enumerate(names)
                if n.endswith("_ptr") or n in ("stride_bt", "stride_kb", "stride_ks", "stride_kh")
            ]
            src = ASTSource(
                fn=dec_kernel,
                signature=sig,
                constexprs={(names.index(c),): v for c, v in consts.items()},
                attrs={(i,): [["tt.divisibility", 16]] for i in aligned},
            )
            c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
            tmp = tempfile.mkdtemp()
            cubin, ptx = os.path.join(tmp, "k.cubin"), os.path.join(tmp, "k.ptx")
            open(cubin, "wb").write(c.asm["cubin"])
            open(ptx, "w").write(c.asm["ptx"])
            mma = sorted(set(re.findall(r"#mma\d* = #ttg\.nvidia_mma<\{versionMajor = (\d)", c.asm["ttgir"])))
            print(f"fp8={fp8} swap={swap}: mma versions {mma}, shared {c.metadata.shared}, {registers(ptx)}")
            print(
                "   wgmma in ptx:",
                len(re.findall(r"wgmma\.mma_async", c.asm["ptx"])),
                " mma.sync:",
                len(re.findall(r"mma\.sync", c.asm["ptx"])),
            )
            for i, loop in enumerate(loop_stats(disassemble(cubin))):
                print(f"   loop {i}: " + ", ".join(f"{k} {v}" for k, v in loop.items()))


def make(B, L, fp8, device, Hkv=8, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    bs, D, G = CONSTS["BLOCK_SIZE"], CONSTS["D"], CONSTS["GROUP"]
    nb = B * L // bs
    k = torch.randn(nb, bs, Hkv, D, generator=g).to(device)
    v = torch.randn(nb, bs, Hkv, D, generator=g).to(device)
    if fp8:
        k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    else:
        k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
    tab = torch.randperm(nb, generator=g).view(B, L // bs).to(torch.int32).to(device)
    q = torch.randn(B, Hkv * G, D, generator=g).to(torch.bfloat16).to(device)
    return q, k, v, tab


def launch(q, k, v, tab, out, swap, L, block_n=64, warps=4, stages=3, load_only=False, maxnreg=None, sum_dot=False):
    B, Hq, D = q.shape
    Hkv = k.shape[2]
    n_splits = L // CONSTS["SPLIT"]
    fp8 = k.dtype != torch.bfloat16
    return dec_kernel[(B * Hkv, n_splits)](
        q,
        k,
        v,
        tab,
        out,
        Hkv,
        tab.stride(0),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        n_splits,
        D**-0.5,
        FP8=fp8,
        SWAP=swap,
        LOAD_ONLY=load_only,
        SUM_DOT=sum_dot,
        **({} if maxnreg is None else {"maxnreg": maxnreg}),
        num_warps=warps,
        num_stages=stages,
        **dict(CONSTS, BLOCK_N=block_n),
    )


def reference(q, k, v, tab, L):
    """Each split's normalised output [B, Hkv, n_splits, GROUP, D] in float64."""
    B, Hq, D = q.shape
    Hkv, G, S = k.shape[2], CONSTS["GROUP"], CONSTS["SPLIT"]
    kk = k.double()[tab.long()].reshape(B, L, Hkv, D)
    vv = v.double()[tab.long()].reshape(B, L, Hkv, D)
    qq = q.double().view(B, Hkv, G, D)
    s = torch.einsum("bhgd,blhd->bhgl", qq, kk) * D**-0.5
    s = s.view(B, Hkv, G, L // S, S)
    p = torch.softmax(s, -1)
    return torch.einsum("bhgns,bnshd->bhngd", p, vv.view(B, L // S, S, Hkv, D))


def timing(path):
    sys.path.insert(0, "benchmarks")
    from bench_paged_attention import bench, graph_replay

    dev = "cuda"
    rows = []
    # correctness first
    for fp8 in (False, True):
        q, k, v, tab = make(2, 1024, fp8, dev)
        ref = reference(q, k, v, tab, 1024)
        for swap in (False, True):
            out = torch.zeros(2, 8, 2, CONSTS["GROUP_PAD"], CONSTS["D"], device=dev)
            launch(q, k, v, tab, out, swap, 1024)
            err = (out[:, :, :, : CONSTS["GROUP"]].double() - ref).abs().max().item()
            print(f"check fp8={fp8} swap={swap}: max abs err {err:.3e}", flush=True)
            rows.append({"check": True, "fp8": fp8, "swap": swap, "max_abs_err": err})
            assert err < 2e-2, err
    for B, L in ((32, 4096), (8, 8192), (128, 2048), (64, 4096)):
        graphs = {}
        keep = []
        for fp8 in (False, True):
            q, k, v, tab = make(B, L, fp8, dev)
            for swap in (False, True):
                out = torch.empty(B, 8, L // CONSTS["SPLIT"], CONSTS["GROUP_PAD"], CONSTS["D"], device=dev)
                keep.append((q, k, v, tab, out))
                fn = lambda q=q, k=k, v=v, tab=tab, out=out, swap=swap: launch(q, k, v, tab, out, swap, L)
                graphs[(fp8, swap)] = graph_replay(fn, dev)
        times = {key: [] for key in graphs}
        for _ in range(3):
            for key, gr in graphs.items():
                times[key].append(bench(gr, dev) * 1e3)  # us
        best = {key: min(v) for key, v in times.items()}
        base = best[(False, False)]
        for (fp8, swap), t in best.items():
            row = {"B": B, "L": L, "fp8": fp8, "swap": swap, "us": round(t, 2), "speed_vs_bf16_normal": base / t}
            rows.append(row)
            print(row, flush=True)
        del graphs, keep
    json.dump(
        {
            "rows": rows,
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
        },
        open(path, "w"),
        indent=1,
    )


def sweep(path, configs=None):
    """fp8 and bf16 at B=32 L=4k over tiles, warps and stages, both forms; each judged first."""
    sys.path.insert(0, "benchmarks")
    from bench_paged_attention import bench, graph_replay

    dev, B, L = "cuda", 32, 4096
    rows = []
    data = {fp8: make(B, L, fp8, dev) for fp8 in (False, True)}
    lc = 2 * CONSTS["SPLIT"]  # the check's history: two splits
    small = {fp8: make(2, lc, fp8, dev) for fp8 in (False, True)}
    graphs, regs = {}, {}
    every = [
        (f, s, b, w, st)
        for f in (False, True)
        for s in (False, True)
        for b in (32, 64, 128)
        for w in (4, 8)
        for st in (2, 3, 4)
    ]
    for cfg in configs or every:
        fp8 = cfg[0]
        try:
            q, k, v, tab = small[fp8]
            out = torch.zeros(2, 8, 2, CONSTS["GROUP_PAD"], CONSTS["D"], device=dev)
            ck = launch(q, k, v, tab, out, cfg[1], lc, *cfg[2:])
            regs[cfg] = (getattr(ck, "n_regs", None), getattr(ck, "n_spills", None))
            err = (out[:, :, :, : CONSTS["GROUP"]].double() - reference(q, k, v, tab, lc)).abs().max().item()
            if not err < 2e-2:
                print(cfg, "wrong", err, flush=True)
                continue
            q, k, v, tab = data[fp8]
            out = torch.empty(B, 8, L // CONSTS["SPLIT"], CONSTS["GROUP_PAD"], CONSTS["D"], device=dev)
            fn = lambda q=q, k=k, v=v, tab=tab, out=out, c=cfg: launch(q, k, v, tab, out, c[1], L, *c[2:])
            graphs[cfg] = (graph_replay(fn, dev), out)
        except Exception as e:  # a configuration that does not compile (shared memory)
            print(cfg, "failed:", type(e).__name__, str(e)[:100], flush=True)
    times = {c: [] for c in graphs}
    for _ in range(2):
        for c, (g, _) in graphs.items():
            times[c].append(bench(g, dev) * 1e3)
    base = min(min(t) for c, t in times.items() if not c[0] and not c[1])
    for c, t in sorted(times.items(), key=lambda kv: min(kv[1])):
        row = dict(
            zip(("fp8", "swap", "block_n", "warps", "stages", "load_only", "maxnreg"), c),
            us=round(min(t), 2),
            speed_vs_best_bf16_normal=round(base / min(t), 3),
            regs_spills=regs.get(c),
        )
        rows.append(row)
        print(row, flush=True)
    json.dump(
        {
            "rows": rows,
            "B": B,
            "L": L,
            "split": CONSTS["SPLIT"],
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
        },
        open(path, "w"),
        indent=1,
    )


def ceiling(path):
    """What the loads alone reach (B=32 L=4k, 64-key tiles, 4 warps, 2 stages): the decode's
    pages read and folded by xor, in the benchmark's layout ``[N, page, Hkv, D]`` (a kv head's
    row 128 B apart of 1 KB for fp8 at D=128) and head-major ``[N, Hkv, page, D]`` (a page of a
    head contiguous), beside the full decode in both layouts and torch's copy of the cache."""
    sys.path.insert(0, "benchmarks")
    from bench_paged_attention import bench, graph_replay

    dev, B, L = "cuda", 32, 4096
    rows, graphs, keep = [], {}, []
    for fp8 in (False, True):
        q, k, v, tab = make(B, L, fp8, dev)
        nbytes = 2 * k.numel() * k.element_size()
        hk = k.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)  # head-major storage, same view
        hv = v.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
        for layout, (kk, vv) in (("token-major", (k, v)), ("head-major", (hk, hv))):
            for load_only in (False, True):
                out = torch.zeros(B, 8, L // CONSTS["SPLIT"], CONSTS["GROUP_PAD"], CONSTS["D"], device=dev)
                keep.append((kk, vv, out))
                fn = lambda q=q, kk=kk, vv=vv, tab=tab, out=out, lo=load_only: launch(
                    q, kk, vv, tab, out, fp8, L, 64, 4, 2, lo
                )
                graphs[(fp8, layout, "loads" if load_only else "decode")] = (graph_replay(fn, dev), nbytes)
        kc = k.clone()
        graphs[(fp8, "torch copy (read + write)", "copy")] = (
            graph_replay(lambda kc=kc, k=k: kc.copy_(k), dev),
            2 * k.numel() * k.element_size(),
        )
        keep.append(kc)
    times = {c: [] for c in graphs}
    for _ in range(3):
        for c, (g, _) in graphs.items():
            times[c].append(bench(g, dev) * 1e3)
    for c, t in times.items():
        us = min(t)
        row = dict(zip(("fp8", "layout", "what"), c), us=round(us, 2), tb_s=round(graphs[c][1] / us / 1e6, 3))
        rows.append(row)
        print(row, flush=True)
    json.dump(
        {
            "rows": rows,
            "B": B,
            "L": L,
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
        },
        open(path, "w"),
        indent=1,
    )


def warps_bits(path):
    """Whether one-warp and four-warp programs of 16-key tiles compute the same bits (fp8, the
    normal form), with the row sums by ``tl.sum`` and by a dot with ones (``SUM_DOT``); and the
    four-warp 16-key form's speed at small batches beside the one-warp form and the 64-key one."""
    sys.path.insert(0, "benchmarks")
    from bench_paged_attention import bench, graph_replay

    dev = "cuda"
    res = {
        "bits": [],
        "rows": [],
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    q, k, v, tab = make(4, 2048, True, dev, seed=3)
    ref = reference(q, k, v, tab, 2048)
    for sum_dot in (False, True):
        outs = {}
        for warps in (1, 2, 4):
            out = torch.zeros(4, 8, 4, CONSTS["GROUP_PAD"], CONSTS["D"], device=dev)
            launch(q, k, v, tab, out, False, 2048, 16, warps, 2, False, 128 if warps == 1 else None, sum_dot)
            outs[warps] = out
        err = (outs[1][:, :, :, : CONSTS["GROUP"]].double() - ref).abs().max().item()
        row = {
            "sum_dot": sum_dot,
            "max_abs_err_1warp": err,
            "same_1_4": bool(torch.equal(outs[1], outs[4])),
            "same_1_2": bool(torch.equal(outs[1], outs[2])),
        }
        row["differ_1_4"] = int((outs[1] != outs[4]).sum())
        res["bits"].append(row)
        print(row, flush=True)
    configs = {
        "bf16 4w 64": (False, 64, 4, 3, None, False),
        "fp8 4w 64": (True, 64, 4, 3, None, False),
        "fp8 4w 16 sumdot": (True, 16, 4, 2, None, True),
        "fp8 4w 16": (True, 16, 4, 2, None, False),
        "fp8 1w 16 sumdot": (True, 16, 1, 2, 128, True),
        "fp8 1w 16": (True, 16, 1, 2, 128, False),
    }
    for B, L in ((1, 4096), (8, 2048), (8, 8192), (32, 4096), (128, 4096)):
        data = {fp8: make(B, L, fp8, dev) for fp8 in (False, True)}
        graphs = {}
        for name, (fp8, bn, w, st, reg, sd) in configs.items():
            qq, kk, vv, tt = data[fp8]
            out = torch.empty(B, 8, L // CONSTS["SPLIT"], CONSTS["GROUP_PAD"], CONSTS["D"], device=dev)
            fn = lambda qq=qq, kk=kk, vv=vv, tt=tt, out=out, bn=bn, w=w, st=st, reg=reg, sd=sd: launch(
                qq, kk, vv, tt, out, False, L, bn, w, st, False, reg, sd
            )
            graphs[name] = (graph_replay(fn, dev), out)
        times = {n: [] for n in graphs}
        for _ in range(3):
            for n, (g, _) in graphs.items():
                times[n].append(bench(g, dev) * 1e3)
        best = {n: min(t) for n, t in times.items()}
        row = {
            "B": B,
            "L": L,
            "us": {n: round(t, 2) for n, t in best.items()},
            "x_bf16": {n: round(best["bf16 4w 64"] / t, 3) for n, t in best.items()},
        }
        res["rows"].append(row)
        print(row, flush=True)
        del graphs, data
    json.dump(res, open(path, "w"), indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "compile":
        compile_stats()
    elif sys.argv[1] == "regs":
        # the fp8 forms under register caps (more programs an SM), with fewer warps for the normal form
        configs = [(False, False, 32, 4, 2), (False, False, 64, 4, 2)]
        for reg in (None, 128, 96, 80, 72, 64):
            configs += [(True, True, 64, 4, st, False, reg) for st in (2, 3)]
            configs += [(True, False, bn, 4, 2, False, reg) for bn in (64, 128)]
            configs += [(True, False, bn, 2, 2, False, reg) for bn in (32, 64)]
        sweep(sys.argv[2], configs=configs)
    elif sys.argv[1] == "small":
        # small programs (one or two warps, 16- or 32-key tiles) under register caps, both caches
        configs = [(False, False, 32, 4, 2), (False, False, 64, 4, 2)]
        for fp8 in (False, True):
            for warps, bn in ((1, 16), (1, 32), (2, 16), (2, 32)):
                for st in (2, 3, 4):
                    for reg in (None, 128, 112):
                        configs.append((fp8, False, bn, warps, st, False, reg))
        sweep(sys.argv[2], configs=configs)
    elif sys.argv[1] == "warps":
        warps_bits(sys.argv[2])
    elif sys.argv[1] == "ceiling":
        ceiling(sys.argv[2])
    elif sys.argv[1] == "sweep":
        sweep(sys.argv[2])
    elif sys.argv[1] == "splits":
        # the sweep's best forms at longer splits (fewer, longer programs; fewer partial states)
        CONSTS["SPLIT"] = int(sys.argv[3])
        sweep(
            sys.argv[2],
            configs=(
                (False, False, 32, 4, 2),
                (False, False, 128, 4, 3),
                (False, False, 64, 4, 2),
                (True, True, 64, 4, 2),
                (True, False, 128, 4, 2),
                (True, False, 64, 4, 2),
            ),
        )
    else:
        timing(sys.argv[2])
