# ruff: noqa
"""A prototype, not wired into the kernel (issue 17, twentieth stop): a split run as quarters
folded in order, by one warp in turn or by four warps side by side, with the same bits.

The nineteenth stop found (``proto_decode_swapped.py``; ``benchmarks/NOTES.md``) that one-warp
programs of 16-key tiles read an fp8 cache at about 1.5x the bf16 decode's speed where a launch
holds many programs, but cost small batches 0.48-0.63, on any number of warps: a four-warp
program of 16-key tiles splits each tile across its warps. The tile size fixes the order in
which a split's keys join the softmax, so the kernel cannot take one form for large launches and
another for small ones without a sequence's bits following its batch (``host.LaunchPlan``).

Here a split of ``SPLIT`` keys is four quarters of ``SPLIT / 4``. Each quarter is an online
softmax over 16-key tiles from the identity; the four quarters' states are then folded in order,
``((q0 . q1) . q2) . q3``. ``PAR=False``: one program walks the quarters in turn (one warp, for
large launches); ``PAR=True``: the quarters are a leading dimension of every tensor, so that four
warps each take a quarter side by side (3-D dots), and the fold reads each quarter's state out of
it exactly (a maximum or a sum with zeros). If a 3-D dot's products equal the 2-D dot's, the two
forms give the same bits and a launch may choose either.

Each configuration is judged against a float64 torch reference first; the bits of the two forms
are compared on the GPU (``bits``), and both are timed beside the minimal decode of
``proto_decode_swapped.py`` (``time``).

    TRITON_INTERPRET=1 python benchmarks/results/proto_decode_quarters.py check   # bf16, the interpreter
    python benchmarks/results/proto_decode_quarters.py compile                  # sm_90 code, on the CPU
    python benchmarks/results/proto_decode_quarters.py time OUT.json            # on a GPU
"""

import json
import os
import re
import sys
import tempfile

import torch
import triton
import triton.language as tl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from pagedattn.kernels.triton_paged_attention import _E4M3_PAIRS, _query_rows  # noqa: E402
from proto_decode_swapped import CONSTS, dec_kernel, launch, make, reference  # noqa: E402

NQ = 4


@triton.jit
def _tile3(cache_ptr, off, d, dp, FP8: tl.constexpr):
    """The tile [NQ, TN, D] at row offsets ``off`` [NQ, TN]: fp16 (widened) for fp8."""
    if FP8:
        pairs = cache_ptr.to(tl.pointer_type(tl.uint16), bitcast=True) + (off >> 1)[:, :, None] + dp[None, None, :]
        x = tl.load(pairs)
        lo, hi = tl.inline_asm_elementwise(
            _E4M3_PAIRS, "=h,=h,h", [x], dtype=(tl.float16, tl.float16), is_pure=True, pack=1
        )
        return tl.join(lo, hi).reshape(x.shape[0], x.shape[1], 2 * x.shape[2])
    else:
        return tl.load(cache_ptr + off[:, :, None] + d[None, None, :])


@triton.jit
def _tile2(cache_ptr, off, d, dp, FP8: tl.constexpr):
    """The tile [TN, D] at row offsets ``off`` [TN]: fp16 (widened) for fp8."""
    if FP8:
        pairs = cache_ptr.to(tl.pointer_type(tl.uint16), bitcast=True) + (off >> 1)[:, None] + dp[None, :]
        x = tl.load(pairs)
        lo, hi = tl.inline_asm_elementwise(
            _E4M3_PAIRS, "=h,=h,h", [x], dtype=(tl.float16, tl.float16), is_pure=True, pack=1
        )
        return tl.join(lo, hi).reshape(x.shape[0], 2 * x.shape[1])
    else:
        return tl.load(cache_ptr + off[:, None] + d[None, :])


@triton.jit
def _fold(M, L, A, m, l, a):
    """State ``(M, L, A)`` then state ``(m, l, a)``: ``[ROWS]``, ``[ROWS]``, ``[ROWS, D]`` fp32."""
    mn = tl.maximum(M, m)
    ca = tl.exp2(M - mn)
    cb = tl.exp2(m - mn)
    return mn, L * ca + l * cb, A * ca[:, None] + a * cb[:, None]


@triton.jit
def _real(x, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, MAX: tl.constexpr):
    """Rows ``0 .. GROUP - 1`` of ``x`` [GROUP_PAD], exactly: [GROUP]."""
    x2 = x.reshape(GROUP_PAD // GROUP, GROUP)
    first = (tl.arange(0, GROUP_PAD // GROUP) == 0)[:, None]
    if MAX:
        return tl.max(tl.where(first, x2, float("-inf")), 0)
    return tl.sum(tl.where(first, x2, 0.0), 0)


@triton.jit
def _real_rows(x, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr):
    """Rows ``0 .. GROUP - 1`` of ``x`` [GROUP_PAD, D], exactly (a sum with zeros): [GROUP, D]."""
    x3 = x.reshape(GROUP_PAD // GROUP, GROUP, x.shape[1])
    first = (tl.arange(0, GROUP_PAD // GROUP) == 0)[:, None, None]
    return tl.sum(tl.where(first, x3, 0.0), 0)


@triton.jit
def q_kernel(
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
    BLOCK_SIZE: tl.constexpr,
    SPLIT: tl.constexpr,
    FP8: tl.constexpr,
    PAR: tl.constexpr,
    SUM_DOT: tl.constexpr,
    TN: tl.constexpr = 16,
    NQ: tl.constexpr = 4,
):
    pid = tl.program_id(0)
    kv_head = pid % n_kv_heads
    seq = pid // n_kv_heads
    split = tl.program_id(1)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D)
    dp = tl.arange(0, D // 2)
    t = tl.arange(0, TN)
    head = kv_head * GROUP + g
    q = tl.load(
        q_ptr + (seq * n_kv_heads * GROUP + head)[:, None] * D + d[None, :], mask=(g < GROUP)[:, None], other=0.0
    )
    q, qk_scale = _query_rows(q, scale, FP8)
    s_scale = qk_scale * 1.4426950408889634
    QL: tl.constexpr = SPLIT // NQ
    lo = split * SPLIT
    # the folded state of the GROUP real rows only: one warp's [16, D] accumulator is 64 registers,
    # and the fold would hold two
    M = tl.full([GROUP], float("-inf"), tl.float32)
    L = tl.zeros([GROUP], tl.float32)
    A = tl.zeros([GROUP, D], tl.float32)
    if PAR:
        qi = tl.arange(0, NQ)
        q3 = tl.broadcast_to(q[None, :, :], (NQ, GROUP_PAD, D))
        s3 = tl.broadcast_to(s_scale[None, :], (NQ, GROUP_PAD))
        m = tl.full([NQ, GROUP_PAD], float("-inf"), tl.float32)
        l = tl.zeros([NQ, GROUP_PAD], tl.float32)
        acc = tl.zeros([NQ, GROUP_PAD, D], tl.float32)
        for j0 in range(0, QL, TN):
            j = lo + qi[:, None] * QL + j0 + t[None, :]  # [NQ, TN]
            blk = tl.load(tab_ptr + seq * stride_bt + (j.to(tl.uint32) // BLOCK_SIZE).to(tl.int32))
            off = blk * stride_kb + (j.to(tl.uint32) % BLOCK_SIZE).to(tl.int32) * stride_ks + kv_head * stride_kh
            k = _tile3(k_ptr, off, d, dp, FP8)  # [NQ, TN, D]
            v = _tile3(v_ptr, off, d, dp, FP8)
            s = tl.dot(q3, tl.permute(k, (0, 2, 1)))  # [NQ, GROUP_PAD, TN]
            m_new = tl.maximum(m, tl.max(s, 2) * s3)
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(s * s3[:, :, None] - m_new[:, :, None])
            if SUM_DOT:
                ones = tl.full([NQ, TN, 16], 1.0, v.dtype)
                l = l * alpha + tl.max(tl.dot(p.to(v.dtype), ones), 2)
            else:
                l = l * alpha + tl.sum(p, 2)
            acc = acc * alpha[:, :, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        # each quarter's state read out exactly (a maximum with -inf, sums with zeros), its real
        # rows only, and folded in order; the quarters to the last axis, so that one thread
        # holds an element's four quarters
        acc_t = tl.permute(acc, (1, 2, 0))  # [GROUP_PAD, D, NQ]
        for i in tl.static_range(NQ):
            sel = qi == i
            mi = _real(tl.max(tl.where(sel[:, None], m, float("-inf")), 0), GROUP, GROUP_PAD, True)
            li = _real(tl.sum(tl.where(sel[:, None], l, 0.0), 0), GROUP, GROUP_PAD, False)
            ai = _real_rows(tl.sum(tl.where(sel[None, None, :], acc_t, 0.0), 2), GROUP, GROUP_PAD)
            M, L, A = _fold(M, L, A, mi, li, ai)
    else:
        for i in range(NQ):
            m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
            l = tl.zeros([GROUP_PAD], tl.float32)
            acc = tl.zeros([GROUP_PAD, D], tl.float32)
            for j0 in range(0, QL, TN):
                j = lo + i * QL + j0 + t
                blk = tl.load(tab_ptr + seq * stride_bt + (j.to(tl.uint32) // BLOCK_SIZE).to(tl.int32))
                off = blk * stride_kb + (j.to(tl.uint32) % BLOCK_SIZE).to(tl.int32) * stride_ks + kv_head * stride_kh
                k = _tile2(k_ptr, off, d, dp, FP8)  # [TN, D]
                v = _tile2(v_ptr, off, d, dp, FP8)
                s = tl.dot(q, tl.trans(k))  # [GROUP_PAD, TN]
                m_new = tl.maximum(m, tl.max(s, 1) * s_scale)
                alpha = tl.exp2(m - m_new)
                p = tl.exp2(s * s_scale[:, None] - m_new[:, None])
                if SUM_DOT:
                    ones = tl.full([TN, 16], 1.0, v.dtype)
                    l = l * alpha + tl.max(tl.dot(p.to(v.dtype), ones), 1)
                else:
                    l = l * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m = m_new
            M, L, A = _fold(
                M,
                L,
                A,
                _real(m, GROUP, GROUP_PAD, True),
                _real(l, GROUP, GROUP_PAD, False),
                _real_rows(acc, GROUP, GROUP_PAD),
            )
    base = out_ptr + ((seq * n_kv_heads + kv_head) * n_splits + split) * GROUP_PAD * D
    r = tl.arange(0, GROUP)
    tl.store(base + r[:, None] * D + d[None, :], A / L[:, None])


def qlaunch(q, k, v, tab, out, L, par, warps, stages=2, maxnreg=None, sum_dot=True):
    B, Hq, D = q.shape
    Hkv = k.shape[2]
    n_splits = L // CONSTS["SPLIT"]
    fp8 = k.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    c = {n: CONSTS[n] for n in ("GROUP", "GROUP_PAD", "D", "BLOCK_SIZE", "SPLIT")}
    return q_kernel[(B * Hkv, n_splits)](
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
        PAR=par,
        SUM_DOT=sum_dot,
        **({} if maxnreg is None else {"maxnreg": maxnreg}),
        num_warps=warps,
        num_stages=stages,
        **c,
    )


def check() -> None:
    """Both forms against the float64 reference, fp16 (the interpreter has no inline assembly,
    and its bf16 runs of both prototypes gave wrong numbers here, cause not looked at)."""
    for par in (False, True):
        for sum_dot in (False, True):
            q, k, v, tab = make(2, 1024, False, "cpu", Hkv=2)
            q, k, v = q.half(), k.half(), v.half()
            out = torch.zeros(2, 2, 2, CONSTS["GROUP_PAD"], CONSTS["D"])
            qlaunch(q, k, v, tab, out, 1024, par, 4 if par else 1, sum_dot=sum_dot)
            err = (out[:, :, :, : CONSTS["GROUP"]].double() - reference(q, k, v, tab, 1024)).abs().max().item()
            print(f"par={par} sum_dot={sum_dot}: max abs err {err:.3e}", flush=True)
            assert err < 2e-2, err


def compile_stats() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sys.path.insert(0, os.path.join(HERE, ".."))
    from sass_loop_stats import disassemble, loop_stats, registers

    forms = [
        ("plain 1w 16 sumdot, cap 128", dec_kernel, 1, 128, dict(SWAP=False, SUM_DOT=True, BLOCK_N=16)),
        ("quarters in turn 1w, cap 128", q_kernel, 1, 128, dict(PAR=False, SUM_DOT=True, TN=16, NQ=NQ)),
        ("quarters in turn 1w, uncapped", q_kernel, 1, None, dict(PAR=False, SUM_DOT=True, TN=16, NQ=NQ)),
        ("quarters side by side 4w", q_kernel, 4, None, dict(PAR=True, SUM_DOT=True, TN=16, NQ=NQ)),
    ]
    for label, kernel, warps, cap, extra in forms:
        names = kernel.arg_names
        consts = dict({n: CONSTS[n] for n in ("GROUP", "GROUP_PAD", "D", "BLOCK_SIZE", "SPLIT")}, FP8=True, **extra)
        types = {
            "q_ptr": "*bf16",
            "k_ptr": "*fp8e4nv",
            "v_ptr": "*fp8e4nv",
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
            fn=kernel,
            signature=sig,
            constexprs={(names.index(c),): v for c, v in consts.items()},
            attrs={(i,): [["tt.divisibility", 16]] for i in aligned},
        )
        opts = {"num_warps": warps, "num_stages": 2}
        if cap is not None:
            opts["maxnreg"] = cap
        c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
        tmp = tempfile.mkdtemp()
        cubin, ptx = os.path.join(tmp, "k.cubin"), os.path.join(tmp, "k.ptx")
        open(cubin, "wb").write(c.asm["cubin"])
        open(ptx, "w").write(c.asm["ptx"])
        layouts = sorted(set(re.findall(r"warpsPerCTA = \[([0-9, ]+)\]", c.asm["ttgir"])))
        print(f"{label}: shared {c.metadata.shared}, {registers(ptx)}, warpsPerCTA {layouts}")
        print("   mma.sync:", len(re.findall(r"mma\.sync", c.asm["ptx"])))
        for i, loop in enumerate(loop_stats(disassemble(cubin))):
            print(f"   loop {i}: " + ", ".join(f"{k} {v}" for k, v in loop.items()))


def timing(path):
    sys.path.insert(0, os.path.join(HERE, ".."))
    from bench_paged_attention import bench, graph_replay

    dev = "cuda"
    res = {
        "bits": [],
        "rows": [],
        "split": CONSTS["SPLIT"],
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    # judged, and the forms' bits compared: quarters in turn (1, 4 warps) and side by side (4, 2 warps)
    for fp8 in (True, False):
        q, k, v, tab = make(4, 2048, fp8, dev, seed=3)
        ref = reference(q, k, v, tab, 2048)
        for sum_dot in (True, False):
            outs = {}
            for name, (par, warps, reg) in {
                "turn 1w": (False, 1, 128),
                "turn 4w": (False, 4, None),
                "par 4w": (True, 4, None),
                "par 2w": (True, 2, None),
                "par 8w": (True, 8, None),
            }.items():
                out = torch.zeros(4, 8, 4, CONSTS["GROUP_PAD"], CONSTS["D"], device=dev)
                qlaunch(q, k, v, tab, out, 2048, par, warps, 2, reg, sum_dot)
                outs[name] = out
            errs = {n: (o[:, :, :, : CONSTS["GROUP"]].double() - ref).abs().max().item() for n, o in outs.items()}
            row = {
                "fp8": fp8,
                "sum_dot": sum_dot,
                "max_abs_err": errs,
                "differ_from_turn_1w": {n: int((o != outs["turn 1w"]).sum()) for n, o in outs.items()},
                "elements": outs["turn 1w"].numel(),
            }
            res["bits"].append(row)
            print(row, flush=True)
            assert max(errs.values()) < 2e-2, errs
    configs = {
        "bf16 4w 64": ("dec", False, (64, 4, 3, None, False)),
        "fp8 4w 64": ("dec", True, (64, 4, 3, None, False)),
        "fp8 1w 16 sumdot": ("dec", True, (16, 1, 2, 128, True)),
        "fp8 Q turn 1w": ("q", True, (False, 1, 2, 128, True)),
        "fp8 Q turn 1w s3": ("q", True, (False, 1, 3, 128, True)),
        "fp8 Q turn 1w c168": ("q", True, (False, 1, 2, 168, True)),
        "fp8 Q turn 1w sum": ("q", True, (False, 1, 2, 128, False)),
        "fp8 Q par 4w": ("q", True, (True, 4, 2, None, True)),
        "fp8 Q par 4w c128": ("q", True, (True, 4, 2, 128, True)),
        "fp8 Q par 4w c168": ("q", True, (True, 4, 2, 168, True)),
        "fp8 Q par 4w s3": ("q", True, (True, 4, 3, None, True)),
        "fp8 Q par 4w sum": ("q", True, (True, 4, 2, None, False)),
    }
    for B, L in ((1, 4096), (1, 16384), (8, 2048), (8, 8192), (32, 4096), (128, 4096)):
        data = {fp8: make(B, L, fp8, dev) for fp8 in (False, True)}
        graphs = {}
        for name, (kind, fp8, a) in configs.items():
            qq, kk, vv, tt = data[fp8]
            out = torch.empty(B, 8, L // CONSTS["SPLIT"], CONSTS["GROUP_PAD"], CONSTS["D"], device=dev)
            if kind == "dec":
                bn, w, st, reg, sd = a
                fn = lambda qq=qq, kk=kk, vv=vv, tt=tt, out=out, bn=bn, w=w, st=st, reg=reg, sd=sd: launch(
                    qq, kk, vv, tt, out, False, L, bn, w, st, False, reg, sd
                )
            else:
                par, w, st, reg, sd = a
                fn = lambda qq=qq, kk=kk, vv=vv, tt=tt, out=out, par=par, w=w, st=st, reg=reg, sd=sd: qlaunch(
                    qq, kk, vv, tt, out, L, par, w, st, reg, sd
                )
            try:
                graphs[name] = (graph_replay(fn, dev), out)
            except Exception as e:  # a configuration that does not compile
                print(B, L, name, "failed:", type(e).__name__, str(e)[:200], flush=True)
        times = {n: [] for n in graphs}
        for _ in range(3):
            for n, (gr, _) in graphs.items():
                times[n].append(bench(gr, dev) * 1e3)
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
    if sys.argv[1] == "check":
        check()
    elif sys.argv[1] == "compile":
        compile_stats()
    else:
        timing(sys.argv[2])
