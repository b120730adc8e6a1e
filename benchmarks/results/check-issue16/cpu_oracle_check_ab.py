"""The lse case's oracle and check on the CPU, best of 7 in a fresh process, for the checkout given
as ``argv[1]`` (run alternately for the sixth stop's tree and this one: the oracle's own time
moves between processes). Output of this stop's run: ``cpu-oracle-check-ab.txt`` beside it.

    python cpu_oracle_check_ab.py /path/to/checkout
"""

import sys
import time


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    import torch

    import pagedattn
    from pagedattn.cases import grid
    from pagedattn.oracle import check_attention, paged_attention_reference_lse

    assert pagedattn.__file__.startswith(sys.argv[1]), pagedattn.__file__
    torch.set_num_threads(1)
    case = next(s for s in grid("standard") if s.id == "lse-gqa4-bs16-d128-fp32-L4000-B2").build()
    out = torch.randn(case.num_tokens, case.num_heads, case.head_dim)

    def best(fn, n: int = 7) -> float:
        fn()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    oracle = best(lambda: paged_attention_reference_lse(case))
    check = best(lambda: check_attention(out, case))
    print(sys.argv[1], f"oracle {oracle * 1e3:.1f} ms check {check * 1e3:.1f} ms x{check / oracle:.2f}")


if __name__ == "__main__":
    main()
