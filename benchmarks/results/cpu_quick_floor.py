"""How low the CPU's check of the quick window case could go with the torch path's formulas
(issue 16, eighteenth stop): a lean prototype of the check of decodes only, against the oracle and
the check, in one process, one torch thread, best of ``ROUNDS``, called in turn.

The prototype keeps what a decode's bound must read (each decode's largest key norm, ``|v|`` and
``(v - c)^2`` over its keys and their float32 product with its weights) and cuts the rest to a
minimum: the rows' arithmetic once for all decodes (not per block), the group's first head's
output as the centre (no mean), no subnormal guard beyond one read, a verdict of a few operations.
It handles this case's variants only (a window; no sink, ALiBi or soft-cap; decodes only) and is
not the policy: it measures the floor the torch operations leave. Its worst ratio is printed beside
the check's (they agree to the product's rounding).

    MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456 \\
        python benchmarks/results/cpu_quick_floor.py
"""

import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_suite import _case  # noqa: E402

from pagedattn.oracle import check_attention, paged_attention_reference_lse, policy  # noqa: E402
from pagedattn.oracle.reference import iter_chunks  # noqa: E402

ROUNDS = 40
U = policy.U_FP32

torch.set_num_threads(1)
case = _case("quick", "sliding_window-gqa4-bs16-d64-fp32-L1100-B2-win700", "cpu")
assert case.sinks is None and case.alibi_slopes is None and case.logits_soft_cap is None and max(case.query_lens) == 1
ref, bound = policy.attention_error_bound(case)
g = torch.Generator().manual_seed(0)
out = (ref + bound * 0.5 * torch.randn(ref.shape, generator=g, dtype=torch.float64)).to(case.dtype)


def lean() -> tuple[float, int]:
    terms = policy._terms(case, "ieee", "fp32", "ieee")
    outs, kmax, row_max, floor, sums, grows, accs = [], [], [], [], [], [], []
    for c in iter_chunks(case, live=4, score_floor=True):
        Hkv, G, _, Lc = c.probs.shape
        D = c.v.shape[2]
        o = c.output()  # [1, Hq, D]
        kmax.append(c.k.norm(dim=-1).amax(dim=-1))  # [Hkv]
        centre = o.view(Hkv, G, D)[:, :1]  # [Hkv, 1, D]: the group's first head's output
        vv = torch.empty(Hkv, Lc, 2 * D, dtype=torch.float32)
        vv[..., :D].copy_(c.v).abs_()
        vv[..., D:] = torch.sub(c.v, centre).square_()
        sums.append(torch.bmm(c.probs.view(Hkv, G, Lc).float(), vv))  # [Hkv, G, 2D]
        outs.append(o)
        row_max.append(c.row_max)
        floor.append(c.score_floor)
        grows.append(1.0 / (1.0 - (Lc + 3) * U))
        accs.append(policy.C_ACC * U * math.sqrt(case.seq_lens_list[c.seq]))
    o = torch.cat(outs)  # [B, Hq, D]
    B, Hq, D = o.shape
    G = Hq // kmax[0].shape[0]
    s = torch.stack(sums).view(B, Hq, 2 * D)
    grow = torch.tensor(grows, dtype=torch.float64).view(B, 1, 1)
    acc = torch.tensor(accs, dtype=torch.float64).view(B, 1, 1)
    q_norm = case.query.to(torch.float64).norm(dim=-1)  # [B, Hq]
    k_max = torch.stack(kmax).repeat_interleave(G, dim=1)  # [B, Hq]
    m, f = torch.stack(row_max).view(B, Hq), torch.stack(floor).view(B, Hq)
    ds = (q_norm * k_max).mul_(terms.a).add_(f.clamp(max=0.0).mul_(-2.0).add_(m).mul_(U)).add_(terms.row_const)
    d = o.view(B, -1, G, D)[:, :, :1].expand(-1, -1, G, -1).reshape(B, Hq, D) - o
    e = torch.sub(s[..., D:], d.square_().div_(grow)).clamp_min_(0.0).sqrt_().mul_(ds[..., None] * grow.sqrt())
    o_abs = o.abs()
    e.addcmul_(s[..., :D], (terms.pv + acc) * grow).addcmul_(o_abs, acc)
    e.add_(policy._half_ulp(o_abs.add_(e), case.dtype))
    assert not bool((f - m < math.log(terms.model.weights_min_normal)).any())
    ratio = torch.sub(out.to(torch.float64), o).abs_().div_(e)
    flat = int(torch.argmax(ratio))
    return float(ratio.view(-1)[flat]), int((ratio > 1.0).sum())


calls = {
    "oracle": lambda: paged_attention_reference_lse(case),
    "check": lambda: check_attention(out, case),
    "lean": lean,
}
chk = check_attention(out, case)
print("worst ratio and elements over: lean", lean(), "check", (chk.budget_used, chk.num_over))
for f in calls.values():
    f()
times: dict[str, list[float]] = {k: [] for k in calls}
for _ in range(ROUNDS):
    for k, f in calls.items():
        t0 = time.perf_counter()
        f()
        times[k].append(time.perf_counter() - t0)
best = {k: min(v) * 1e3 for k, v in times.items()}
print(
    {k: round(v, 3) for k, v in best.items()},
    "check/oracle",
    round(best["check"] / best["oracle"], 2),
    "lean/oracle",
    round(best["lean"] / best["oracle"], 2),
)
