"""How many Triton kernels the thorough profile's grid needs, and which warm-up classes
(``pagedattn.ahead.kernel_classes``) share one (issue 16, thirteenth stop). On the CPU, no
launch: the kernel module's launcher is replaced by one that records each launch's compile key
(the kernel, its constexprs and launch options, and what Triton's JIT specializes its other
arguments on).

    python benchmarks/results/count_compile_keys.py [thorough]
"""

from __future__ import annotations

import collections
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
import torch  # noqa: E402

from pagedattn import ahead  # noqa: E402
from pagedattn.adapters.triton import TritonBackend  # noqa: E402
from pagedattn.cases import grid  # noqa: E402
from pagedattn.kernels import triton_paged_attention as m  # noqa: E402

KEYS: collections.Counter = collections.Counter()
BY_CASE: dict = collections.defaultdict(set)
CURRENT: list = [None]


def _spec(a, plain: bool):
    if isinstance(a, torch.Tensor):
        return a.dtype
    if isinstance(a, bool):
        return ("b", a)
    if isinstance(a, int):
        return "i" if plain else ("i", a == 1, a % 16 == 0)
    return None if a is None else type(a).__name__


def _launcher(kernel, grid_, compile_only):
    def record(*args, **kwargs):
        plain = set(m._PLAIN_INTS if kernel is m._decode_kernel else m._PLAIN_INTS_PREFILL)
        spec = tuple(_spec(a, n in plain) for a, n in zip(args, kernel.arg_names))
        key = (kernel.fn.__name__, tuple(sorted(kwargs.items())), spec)
        KEYS[key] += 1
        BY_CASE[CURRENT[0]].add(key)

    return record


def main(profile: str) -> None:
    m._launcher = _launcher
    backend = TritonBackend()
    specs = list(grid(profile))
    runs = [(s, op) for s in specs for op in ("attention",) + (("lse",) if s.family == "lse" else ())]
    for s, op in runs:
        CURRENT[0] = (s.id, op)
        backend._call(s.build(), return_lse=op == "lse", compile_only=False)
    print(
        f"{len(runs)} runs of {len(specs)} cases: {len(KEYS)} compile keys",
        dict(collections.Counter(k[0] for k in KEYS)),
    )

    # were HEAD_DIM a run-time argument (HEAD_DIM_PAD kept): head dims padded alike would share
    merged = {(k[0], tuple(x for x in k[1] if x[0] != "HEAD_DIM"), k[2]) for k in KEYS}
    print(f"without HEAD_DIM among the constexprs: {len(merged)} compile keys")

    def by_heads(s, op):  # the classes before the thirteenth stop: head counts, not the GQA group
        return [(c[0], s.num_heads, s.num_kv_heads, c[-1]) for c in ahead.kernel_classes(s, op)]

    for name, classes in (("by head counts (before)", by_heads), ("by GQA group (now)", ahead.kernel_classes)):
        by_key = collections.defaultdict(set)
        for s, op in runs:
            for cls in classes(s, op):
                for key in BY_CASE[(s.id, op)]:
                    if cls[-1] == ("decode" if key[0] == "_decode_kernel" else "prefill"):
                        by_key[key].add(cls)
        shared = {k: v for k, v in by_key.items() if len(v) > 1}
        n_classes = sum(map(len, shared.values()))
        print(f"warm-up classes {name}: {len(shared)} compile keys shared by several ({n_classes} classes)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "thorough")
