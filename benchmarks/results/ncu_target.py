# ruff: noqa
"""One kernel launch for Nsight Compute to read (issue 17, fourth round): the inputs are
built and the kernel compiled and run outside the profiled range; the profiled range
(``torch.cuda.profiler.start/stop``, for ``ncu --profile-from-start off``) holds one launch.

    ncu --clock-control none --profile-from-start off --section ... \
        python benchmarks/results/ncu_target.py MODE B L [SWITCH=VALUE ...]

MODE: ``decode`` | ``decode-e4m3`` | ``sdpa-decode`` | ``prefill`` | ``sdpa-prefill``
(bf16, Hq=32, Hkv=8, D=128, page 16, permuted tables, as in bench_paged_attention.py;
prefill: one causal sequence of L tokens, B ignored). SWITCH=VALUE sets a constant of
``pagedattn.kernels.host`` or of the kernel module (Python literal) before the launch is planned.
"""

import ast
import sys

import torch

sys.path.insert(0, "benchmarks")
from bench_paged_attention import contiguous_history, paged_batch, sdpa  # noqa: E402

from pagedattn.kernels import host  # noqa: E402
from pagedattn.kernels import triton_paged_attention as tpa  # noqa: E402

mode, B, L = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for kv in sys.argv[4:]:
    k, v = kv.split("=", 1)
    owner = host if hasattr(host, k) else tpa
    if not hasattr(owner, k):  # e.g. UNSIGNED_INDICES, a switch when h200_call_17d.sh ran
        print(f"{k}: not a switch of this tree, ignored", flush=True)
        continue
    setattr(owner, k, ast.literal_eval(v))
Hq, Hkv, D = 32, 8, 128
q_len = L if mode.endswith("prefill") else 1
B = 1 if mode.endswith("prefill") else B
q, k, v, tables, seq_lens, loc = paged_batch(B, L, q_len, Hq, Hkv, D, 16, torch.bfloat16, "cuda")
if mode.startswith("sdpa"):
    kc, vc = contiguous_history(k, v, tables, L)
    qd = q.view(B, Hq, 1, D) if q_len == 1 else q.view(1, L, Hq, D).transpose(1, 2)
    causal = q_len > 1
    fn = lambda: sdpa(qd, kc, vc, is_causal=causal)
else:
    scales = {}
    if mode == "decode-e4m3":
        k, v, scales = (
            (k.float() / 0.37).to(torch.float8_e4m3fn),
            (v.float() / 1.9).to(torch.float8_e4m3fn),
            dict(k_scale=0.37, v_scale=1.9),
        )
    prep = tpa.prepare(q, k, v, tables, seq_lens, loc, **scales)
    out = torch.empty_like(q)
    fn = lambda: tpa.run(prep, q, k, v, out=out)
    print("plan:", prep.plan.decode if q_len == 1 else prep.plan.other, flush=True)
for _ in range(3):
    fn()
torch.cuda.synchronize()
torch.cuda.profiler.start()
fn()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
print("done", mode, B, L, sys.argv[4:], flush=True)
