"""Isolates the fp8 prefill bug found on the H200 (issue 17, ``FP8_SMALL_TILE_BUG`` in
``tests/test_triton.py``): bf16 queries over an fp8 e4m3 cache, head_dim 32, 16-key prefill
tiles; the output is ~509x its bound while the lse is right.

Each variant runs in its own process (a replaced ``@triton.jit`` helper must be seen by a
fresh compile) and prints, per sequence, the worst |error| / bound of the output and of the
lse. Run on a GPU: ``python benchmarks/results/diag_fp8_small_tile.py [out.json]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

VARIANTS = {
    "as-tested": {},
    "block_n-32": {"host.PREFILL_BLOCK_N": 32},
    "block_n-64": {"host.PREFILL_BLOCK_N": 64},
    "stages-2": {"host.PREFILL_STAGES": 2},
    "stages-1": {"host.PREFILL_STAGES": 1},
    "plain-widen": {"widen": "plain"},
    "no-f16-dots": {"tpa.F16_DOTS_FOR_FP8": False},
    "no-table-ahead": {"tpa.TABLE_AHEAD": False},
    "no-mask-split": {"host.PREFILL_MASK_SPLIT": False},
    "no-cap-alibi": {"spec": "plain"},
    "e5m2": {"spec": "e5m2"},
    "fp16-query": {"spec": "fp16"},
    "d64": {"spec": "d64"},
}


def child(name: str) -> dict:
    import torch
    import triton
    import triton.language as tl

    from pagedattn.cases.spec import CaseSpec
    from pagedattn.kernels import host
    from pagedattn.kernels import triton_paged_attention as tpa
    from pagedattn.oracle.policy import attention_lse_error_bounds

    cfg = VARIANTS[name]
    for key, value in cfg.items():
        if "." in key:
            mod, attr = key.split(".")
            setattr({"host": host, "tpa": tpa}[mod], attr, value)
    if cfg.get("widen") == "plain":
        globals().update(tl=tl)  # a jit function resolves names through its module's globals

        @triton.jit
        def _plain(x, dtype: tl.constexpr):
            return x.to(dtype)

        tpa._widen_rows = _plain
    host.PREFILL_BLOCK_N = cfg.get("host.PREFILL_BLOCK_N", 16)
    host.PREFILL_ROWS = 32
    spec_kind = cfg.get("spec", "as-tested")
    kw = dict(
        num_heads=4,
        num_kv_heads=2,
        head_dim=64 if spec_kind == "d64" else 32,
        dtype=torch.float16 if spec_kind == "fp16" else torch.bfloat16,
        kv_dtype=torch.float8_e5m2 if spec_kind == "e5m2" else torch.float8_e4m3fn,
        k_scale=0.5,
        v_scale=2.0,
    )
    if spec_kind != "plain":
        kw.update(logits_soft_cap=20.0, alibi_slopes=True)
    case = CaseSpec("t", ((140, 35), (70, 1)), **kw).build().to(os.environ.get("DIAG_DEVICE", "cuda"))
    out, lse = tpa.paged_attention(
        case.query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.seq_lens,
        case.query_start_loc,
        scale=case.scale,
        logits_soft_cap=case.logits_soft_cap,
        alibi_slopes=case.alibi_slopes,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
        return_lse=True,
    )
    ref, bound, ref_lse, bound_lse = attention_lse_error_bounds(case)
    err = (out.double() - ref).abs() / bound
    err_lse = (lse.double() - ref_lse).abs() / bound_lse
    rows = {}
    loc = case.query_start_loc.tolist()
    for s in range(len(loc) - 1):
        a, b = loc[s], loc[s + 1]
        e = err[a:b]
        worst = int(e.amax(dim=(1, 2)).argmax())
        rows[f"seq{s}"] = {
            "out": round(float(e.max()), 3),
            "lse": round(float(err_lse[a:b].max()), 3),
            "rows_over": int((e.amax(dim=(1, 2)) > 1).sum()),
            "rows": b - a,
            "worst_row": worst,
            "worst_head": int(e[worst].amax(dim=1).argmax()),
            "dims_over_in_worst_row": int((e[worst] > 1).sum()),
        }
    return rows


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
        return
    results = {}
    for name in VARIANTS:
        p = subprocess.run(
            [sys.executable, __file__, "--child", name], capture_output=True, text=True, env=os.environ, timeout=300
        )
        if p.returncode == 0:
            results[name] = json.loads(p.stdout.strip().splitlines()[-1])
        else:
            results[name] = {"error": p.stderr.strip().splitlines()[-3:]}
        print(name, json.dumps(results[name]), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
