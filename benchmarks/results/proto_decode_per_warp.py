# ruff: noqa
"""A prototype, not wired into the kernel (issue 17, fourth round): decode with each 64-key
tile split into W sub-tiles of SUB keys along a batch axis, one per warp (a 3-D ``tl.dot``
puts the batch on the warps: ``warpsPerCTA = [4, 1, 1]``), each with its own running max,
sum and accumulator, combined once at the end. The kernel's decode step crosses the 4 warps
9 times a step (the 16-row tile's row max and sum, and P on its way to the P.V dot); this
form crosses them twice. Compiled for sm_90 on the CPU only (no device time was left):

    PYTHONPATH=<triton 3.6> python benchmarks/results/proto_decode_per_warp.py 4 16

prints the compiled loop's instructions, barriers and registers (``benchmarks/sass_loop_stats.py``'s
readers). Triton 3.6, W=4, SUB=16:
333 instructions and 2 barriers a 64-key step, against 422 and 9 in the kernel's decode
loop; but 218 registers (2 programs an SM instead of 3). Not timed; the single-sequence
form here (one kv head's group, one split, no masks, no variants) is what would be timed
first. The numerics differ from the kernel's (four partial softmax states per split,
merged at its end), still one fixed order: batch invariant. On the interpreter it computes
attention over a 512-key permuted history (fp16, two kv heads) within 1.2e-4 of torch.
"""

import os, re, sys
import torch, triton
import triton.language as tl


@triton.jit
def dec4_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    tab_ptr,
    out_ptr,
    seq_len,
    stride_kb,
    stride_ks,
    stride_kh,
    scale,
    GROUP_PAD: tl.constexpr,
    D: tl.constexpr,
    W: tl.constexpr,
    SUB: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SPLIT: tl.constexpr,
):
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (kv_head * GROUP_PAD + g)[:, None] * D + d[None, :])
    qb = tl.broadcast_to(q[None, :, :], (W, GROUP_PAD, D))
    w = tl.arange(0, W)
    t = tl.arange(0, SUB)
    m = tl.full([W, GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([W, GROUP_PAD], tl.float32)
    acc = tl.zeros([W, GROUP_PAD, D], tl.float32)
    lo = split * SPLIT
    jn = lo + w[:, None] * SUB + t[None, :]
    blk_next = tl.load(tab_ptr + (jn.to(tl.uint32) // BLOCK_SIZE).to(tl.int32))
    for j0 in range(lo, lo + SPLIT, W * SUB):
        j = j0 + w[:, None] * SUB + t[None, :]  # [W, SUB]
        blk = blk_next
        jn = j + W * SUB
        blk_next = tl.load(tab_ptr + (jn.to(tl.uint32) // BLOCK_SIZE).to(tl.int32), mask=jn < seq_len, other=0)
        off = blk * stride_kb + (j.to(tl.uint32) % BLOCK_SIZE).to(tl.int32) * stride_ks + kv_head * stride_kh
        kt = tl.load(k_ptr + off[:, None, :] + d[None, :, None])  # [W, D, SUB]
        v = tl.load(v_ptr + off[:, :, None] + d[None, None, :])  # [W, SUB, D]
        s = tl.dot(qb, kt)  # [W, G, SUB]
        m_new = tl.maximum(m, tl.max(s, 2) * scale)
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s * scale - m_new[:, :, None])
        l = l * alpha + tl.sum(p, 2)
        acc = acc * alpha[:, :, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    m_tot = tl.max(m, 0)
    a = tl.exp2(m - m_tot[None, :])
    l_tot = tl.sum(l * a, 0)
    o = tl.sum(acc * a[:, :, None], 0) / l_tot[:, None]
    tl.store(out_ptr + (kv_head * GROUP_PAD + g)[:, None] * D + d[None, :], o)


if __name__ == "__main__":
    from triton.compiler import ASTSource
    from triton.backends.compiler import GPUTarget

    names = dec4_kernel.arg_names
    consts = dict(GROUP_PAD=16, D=128, W=int(sys.argv[1]), SUB=int(sys.argv[2]), BLOCK_SIZE=16, SPLIT=512)
    types = {
        "q_ptr": "*bf16",
        "k_ptr": "*bf16",
        "v_ptr": "*bf16",
        "tab_ptr": "*i32",
        "out_ptr": "*bf16",
        "scale": "fp32",
    }
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in names}
    aligned = [i for i, n in enumerate(names) if n.endswith("_ptr") or n in ("stride_kb", "stride_ks", "stride_kh")]
    src = ASTSource(
        fn=dec4_kernel,
        signature=sig,
        constexprs={(names.index(c),): v for c, v in consts.items()},
        attrs={(i,): [["tt.divisibility", 16]] for i in aligned},
    )
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
    import tempfile

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from sass_loop_stats import disassemble, loop_stats, registers

    tmp = tempfile.mkdtemp()
    cubin, ptx = os.path.join(tmp, "k.cubin"), os.path.join(tmp, "k.ptx")
    open(cubin, "wb").write(c.asm["cubin"])
    open(ptx, "w").write(c.asm["ptx"])
    print("layout:", [l.strip() for l in c.asm["ttgir"].splitlines() if l.startswith("#mma")][:1])
    waits = re.findall(r"cp\.async\.wait_group\s+(\d+)", c.asm["ptx"])
    print("shared", c.metadata.shared, "cp.async waits", waits, "|", registers(ptx))
    for i, loop in enumerate(loop_stats(disassemble(cubin))):
        print(f"  loop {i}: " + ", ".join(f"{k} {v}" for k, v in loop.items()))
