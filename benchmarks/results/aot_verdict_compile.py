"""The fused check's verdict kernel compiled for sm_90 on the CPU: its compile time and machine code
size, for a tree given on the command line (issue 16, fifteenth stop: the reduction folded into the
kernel's last program grew it). A fresh Triton cache each run (``TRITON_CACHE_DIR``); the first
configuration's time includes Triton's own warm-up.

    TRITON_CACHE_DIR=$(mktemp -d) python benchmarks/results/aot_verdict_compile.py TREE
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, sys.argv[1])
os.environ.pop("TRITON_INTERPRET", None)
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from pagedattn.oracle import fused, policy  # noqa: E402

F64 = {"o_ptr", "ex_ptr", "c_ptr", "q_ptr", "rm_ptr", "fl_ptr", "lse_ptr", "kn_ptr", "kr_ptr", "ps_ptr", "sh_ptr"}
F64 |= {"sk_ptr", "sl_ptr", "st_ptr", "ls_ptr", "rd_ptr"}


def main() -> None:
    kernel = fused._compiled().verdict
    ns = getattr(fused, "ROW_STATS", fused.STATS)
    for out_type, block_d in (("fp32", 64), ("bf16", 128), ("fp16", 64)):
        consts = {"BLOCK_D": block_d, "BLOCK_K": fused.KEY_BLOCK, "U": policy.U_FP32, "C_EXP": policy.C_EXP}
        consts |= {"CW": policy.C_W, "NS": ns}
        sig = {}
        for p in kernel.params:
            if p.name in consts:
                sig[p.name] = "constexpr"
            elif p.annotation:
                sig[p.name] = p.annotation
            elif p.name.endswith("_ptr"):
                sig[p.name] = "*" + (out_type if p.name == "out_ptr" else "fp64" if p.name in F64 else "fp32")
            else:
                sig[p.name] = "i32"
        names = kernel.arg_names
        src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(c),): v for c, v in consts.items()})
        t0 = time.perf_counter()
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        seconds = time.perf_counter() - t0
        size = len(compiled.asm["cubin"])
        print(f"{sys.argv[1]}: verdict {out_type} BLOCK_D {block_d}: {seconds:.2f} s, cubin {size} B")


if __name__ == "__main__":
    main()
