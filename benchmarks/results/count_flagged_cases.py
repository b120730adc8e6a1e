"""How many of a profile's cases the fused check judges twice (issue 16, fifteenth stop).

For an output whose weights keep float32's range (float32, bfloat16) the fused check forms no
correction of subnormal weights at first and judges a case again, with it, where a row's logits
span past ``log(2**-126)`` (``fused.verdict_rows``). fp16 (``2**-14``) keeps the guard. Here, on the
CPU, over the attention cases of a profile (not gather or cache write, which no check judges):
per output dtype, how many cases the guard (``policy._weights_stay_normal``) would clear, and of
the others how many have a row past the edge (the torch path's own test, from the oracle's pass).

    python benchmarks/results/count_flagged_cases.py [quick|standard]
"""

from __future__ import annotations

import collections
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402

from pagedattn.cases import grid  # noqa: E402
from pagedattn.oracle import policy, reference  # noqa: E402


def main(profile: str) -> None:
    counts: collections.Counter = collections.Counter()
    for spec in grid(profile):
        if spec.family in ("gather", "cache_write"):
            continue
        case = spec.build()
        if case.dtype == torch.float64:
            continue
        name = str(case.dtype).split(".")[-1]
        counts[(name, "cases")] += 1
        min_normal = policy.DTYPE_TABLE[case.dtype].weights_min_normal
        if policy._weights_stay_normal(case, min_normal):
            counts[(name, "guard clears")] += 1
            continue
        edge = math.log(min_normal)
        past = any(
            bool((c.score_floor - c.row_max < edge).any())
            for c in reference.iter_chunks(case, live=policy._live(case), score_floor=True)
        )
        counts[(name, "a row past the edge" if past else "no row past the edge")] += 1
    for (name, what), n in sorted(counts.items()):
        print(f"{profile} {name}: {what} {n}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "quick")
