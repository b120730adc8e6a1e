"""Runs the FlashInfer adapter on one quick-profile lse case and saves its output and lse
(``torch.save``), so that the verdict can be re-judged off the device under another policy
(the soft-cap lse case that warned under the IEEE tanh model; issue 15).

    python benchmarks/results/fi_dump_lse.py lse-gqa2-bs16-d64-bf16-L1100-B2-win20-cap5 out.pt
"""

from __future__ import annotations

import sys

import torch

from pagedattn.adapters.contrib.flashinfer import FlashInferBackend
from pagedattn.cases.grid import grid


def main() -> None:
    case_id, path = sys.argv[1], sys.argv[2]
    (spec,) = [s for s in grid("quick") if s.id == case_id]
    case = spec.build().to("cuda")
    backend = FlashInferBackend()
    backend.warmup(case)
    out, lse = backend.paged_attention_lse(case)
    torch.cuda.synchronize()
    torch.save({"case": case_id, "out": out.cpu(), "lse": lse.cpu(), "route": backend.route(case)}, path)
    print("saved", case_id, tuple(out.shape), tuple(lse.shape), backend.route(case))


if __name__ == "__main__":
    main()
