"""How far a decode's direct sums (``policy.direct_decode``, the device path) move its bound from the
one formed with the float32 product about the values' mean (``DIRECT_DECODES`` off), over every
attention case of a profile with a decode: per case, the extreme ratios direct / product over the
decodes' elements, and that every other row is unchanged (issue 16, sixteenth stop; its records
were taken with the direct sums up to 2^19 keys times D, ``DIRECT_DECODE_ELEMS`` then, which
``DIRECT_DECODES`` has replaced: every decode on the device path since the seventeenth).

    python benchmarks/results/direct_decode_bounds.py --profile quick [--device cuda]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402

from pagedattn.cases import grid  # noqa: E402
from pagedattn.oracle import policy  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="quick")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    policy.DEVICE_PATH_ON_CPU = True  # the device path on the CPU too
    lo, hi, cases, other_moved = float("inf"), 0.0, 0, 0
    worst = ("", 1.0, 1.0)
    for spec in grid(args.profile):
        if spec.family in ("gather", "cache_write"):
            continue
        case = spec.build().to(args.device)
        loc = case.query_start_loc_list
        decode = torch.zeros(case.num_tokens, dtype=torch.bool, device=case.device)
        decode[[loc[b] for b in range(case.num_seqs) if loc[b + 1] - loc[b] == 1]] = True
        if not decode.any():
            continue
        _, direct = policy.attention_error_bound(case)
        policy.DIRECT_DECODES = False
        _, product = policy.attention_error_bound(case)
        policy.DIRECT_DECODES = True
        cases += 1
        other_moved += int(not torch.equal(direct[~decode], product[~decode]))
        r = (direct[decode] / product[decode]).flatten()
        r = r[torch.isfinite(r)]
        c_lo, c_hi = float(r.min()), float(r.max())
        lo, hi = min(lo, c_lo), max(hi, c_hi)
        if max(c_hi - 1.0, 1.0 - c_lo) > max(worst[2] - 1.0, 1.0 - worst[1]):
            worst = (spec.id, c_lo, c_hi)
        print(f"{spec.id:70s} direct/product {c_lo:.6f} .. {c_hi:.6f}", flush=True)
    print(
        f"{args.profile} on {args.device}: {cases} cases with decodes; a decode's bound direct / product "
        f"{lo:.6f} .. {hi:.6f} (widest: {worst[0]}); other rows moved in {other_moved} cases"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
