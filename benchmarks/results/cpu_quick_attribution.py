# ruff: noqa
"""Where the CPU check of the quick window case spends its time beyond the oracle (issue 16,
nineteenth stop): each of the policy's pieces timed by a wrapper over 300 checks, one torch thread.

    MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456 \\
        python benchmarks/results/cpu_quick_attribution.py
"""

import collections
import functools
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_suite import _case
from pagedattn.oracle import check_attention, paged_attention_reference_lse, policy, verdict, reference

torch.set_num_threads(1)
case = _case("quick", "sliding_window-gqa4-bs16-d64-fp32-L1100-B2-win700", "cpu")
ref, bound = policy.attention_error_bound(case)
out = ref.to(case.dtype)
acc = collections.Counter()


def wrap(mod, name):
    f = getattr(mod, name)

    @functools.wraps(f)
    def g(*a, **k):
        t0 = time.perf_counter()
        r = f(*a, **k)
        acc[name] += time.perf_counter() - t0
        return r

    setattr(mod, name, g)


for n in ("_value_moments", "_subnormal_weights", "_merged", "_visible_keys_grow", "_terms", "_live"):
    wrap(policy, n)
KM = policy._KeyMax.__call__


def km(self, c):
    t0 = time.perf_counter()
    r = KM(self, c)
    acc["key_max"] += time.perf_counter() - t0
    return r


policy._KeyMax.__call__ = km
OUT = reference.Chunk.output


def co(self, *a, **k):
    t0 = time.perf_counter()
    r = OUT(self, *a, **k)
    acc["Chunk.output" + ("(s12)" if a or k else "")] += time.perf_counter() - t0
    return r


reference.Chunk.output = co
IT = reference.iter_chunks


def it(*a, **k):
    g = IT(*a, **k)
    while True:
        t0 = time.perf_counter()
        try:
            c = next(g)
        except StopIteration:
            break
        acc["iter_chunks"] += time.perf_counter() - t0
        yield c


policy.iter_chunks = it
N = 300
for _ in range(10):
    check_attention(out, case)
acc.clear()
t0 = time.perf_counter()
for _ in range(N):
    check_attention(out, case)
tot = (time.perf_counter() - t0) / N
print("check per call", round(tot * 1e6, 1), "us")
for k, v in acc.most_common():
    print(f"  {k:22s} {v / N * 1e6:8.1f} us")
print("  rest (chunk_bounds' own lines + verdict)", round((tot - sum(acc.values()) / N) * 1e6, 1))
