"""How a decode history is split, and how the decode launch's programs take the splits:
the split sizes and the merge's parts (rules of a history's own length, so a sequence
computes the same bits in any batch), and the launch shape (the split loop, splits a
program, whole sequences a program, register caps), which changes no bit. Plain Python,
tested on any machine; nothing here imports triton."""

from __future__ import annotations

import collections

from pagedattn.kernels.tuning import TUNING, KernelTuning


def decode_work(seq_len: int, sliding_window: int | None = None, tuning: KernelTuning = TUNING) -> tuple[int, int, int]:
    """A decode history's splits (``decode_split``), the first of them with keys the new token
    sees (under ``sliding_window``: the kernel's programs skip the splits before it), and the
    keys a split."""
    size = decode_split(seq_len, tuning)
    first = max(0, seq_len - sliding_window) // size if sliding_window else 0
    return -(-seq_len // size), first, size


def decode_fold(n_splits: int, tuning: KernelTuning = TUNING) -> int:
    """Splits a part of the decode merge, for a history of ``n_splits`` splits (the kernel's
    rule): ``max(1, n_splits // decode_fold_parts)``, 1 with ``decode_fold_parts`` 0."""
    parts = tuning.decode_fold_parts
    return max(1, n_splits // parts) if parts > 0 else 1


def decode_split(seq_len: int, tuning: KernelTuning = TUNING) -> int:
    """Keys per split of a decode history of ``seq_len`` keys (the kernel's rule, in the
    decode kernel: ``split_short`` below ``short_under`` keys, ``split_long`` from
    ``long_from`` keys on, else ``split_size``). It reads that history's length only, so a
    sequence splits alike in any batch."""
    if seq_len < tuning.short_under:
        return tuning.split_short
    if seq_len >= tuning.long_from:
        return tuning.split_long
    return tuning.split_size


def decode_launch_shape(
    work: list[tuple[int, int, int]],
    num_kv_heads: int,
    kv_fp8: bool = False,
    cap_ok: bool = False,
    tuning: KernelTuning = TUNING,
) -> tuple[bool, int, bool]:
    """The decode launch's shape: whether its programs walk their splits in one loop
    (``SPLIT_LOOP``), how many consecutive splits each takes, and whether the launch runs at
    ``decode_whole_maxnreg`` registers. A launch shape only: each split computes the same bits
    whoever runs it and however (the decode kernel).

    ``work``: for each decode sequence, ``decode_work``'s (splits, first split with visible
    keys, keys a split). ``cap_ok``: the tiles are narrow enough for the register cap (over an
    fp8 cache, ``fp8_decode_maxnreg``'s, which its rule needs).

    The split loop may hold more registers than a program of one split, and storing splits in
    it more shared memory: two programs an SM where one split a program runs three. But it
    keeps its K/V pipeline running across a split's end. So, in order:

    1. the fewest splits a program (up to ``decode_spp_max``) that fit the launch in
       ``decode_wave`` programs, one wave of the split loop, where more than one split a
       program leaves the programs balanced (``_balanced``: a long history beside short ones
       would be walked by few programs while the rest of the GPU idles);
    2. else a whole sequence a program, merged in its loop, where its programs fill at least
       ``decode_whole_fill`` of the waves' slots (programs over whole waves' slots) at two
       programs an SM (``decode_wave``) or, with ``cap_ok``, at three (``decode_wave_capped``
       at ``decode_whole_maxnreg`` registers; the fuller, two on a tie), and the programs are
       balanced: launches past one wave, and launches one wave holds only at more than
       ``decode_spp_max`` splits a program;
    3. else one split a program without the loop.

    An fp8 cache (``kv_fp8``) has its own rule, with ``cap_ok`` only: the loop at the most
    splits a program, from ``fp8_decode_spp`` halving (integer division) down to 2, at which the
    programs with keys to read are still at least ``fp8_loop_min_programs``, fill at least
    ``fp8_loop_fill`` of their waves' slots (``fp8_decode_wave`` a wave) and are balanced, and
    fewer than the longest history's splits (the launch never takes a program a sequence; under
    a window one program may still walk all of a history's visible splits); else one split a
    program without it (the loop fitted in one wave, or over whole sequences, is slower there:
    its programs hold more registers, and an fp8 program's speed is its occupancy)."""
    max_splits = max((n for n, _, _ in work), default=1)
    heads = len(work) * num_kv_heads
    kinds = collections.Counter(work)  # the balance is counted over distinct works
    if kv_fp8:
        # the waves are four programs an SM at fp8_decode_maxnreg registers: uncapped (fp32
        # queries, head_dim > 128), or without a wave, one split a program
        spp = tuning.fp8_decode_spp if cap_ok and tuning.fp8_decode_wave > 0 else 1
        while spp > 1:  # the most splits a program, halving, that leave enough programs
            programs = _programs(kinds, spp) * num_kv_heads
            # never a launch of one program a sequence (slower over an fp8 cache)
            if spp < max_splits and programs >= max(1, tuning.fp8_loop_min_programs):
                if _fill(programs, tuning.fp8_decode_wave) >= tuning.fp8_loop_fill and _balanced(kinds, spp, tuning):
                    return True, spp, False
            spp //= 2
        return False, 1, False
    for spp in range(1, max(1, min(tuning.decode_spp_max, max_splits)) + 1):
        if heads * -(-max_splits // spp) <= tuning.decode_wave and (spp == 1 or _balanced(kinds, spp, tuning)):
            return True, spp, False
    if _balanced(kinds, max_splits, tuning):
        candidates = ((tuning.decode_wave, False), (tuning.decode_wave_capped, True))
        waves = [(w, c) for w, c in candidates if w > 0 and (cap_ok or not c)]
        if waves:
            fill, _, capped = max((_fill(heads, w), not c, c) for w, c in waves)
            if fill >= tuning.decode_whole_fill:
                return True, max_splits, capped
    return False, 1, False


def _fill(programs: int, wave: int) -> float:
    """The share of the slots of whole waves of ``wave`` programs (> 0) that ``programs``
    (> 0) fill."""
    return programs / (-(-programs // wave) * wave)


def _programs(kinds: collections.Counter[tuple[int, int, int]], spp: int) -> int:
    """Decode programs of ``spp`` consecutive splits each with keys to read, a kv head
    (``kinds``: ``decode_launch_shape``'s works, counted): those wholly before a window have
    none and end at once."""
    return sum(c * (-(-n // spp) - first // spp) for (n, first, _), c in kinds.items())


def _balanced(
    work: collections.Counter[tuple[int, int, int]] | list[tuple[int, int, int]],
    spp: int,
    tuning: KernelTuning = TUNING,
) -> bool:
    """Whether the decode programs of ``spp`` consecutive splits each (``work`` as in
    ``decode_launch_shape``, or counted: a batch holds few distinct works) are of about one
    length: their mean work, in keys, at least ``decode_balance`` of the longest's. A program's
    work is counted in whole splits of its history's split size, visible keys or not: under a
    window narrower than a split, histories of different split tiers read as unbalanced."""
    kinds = work if isinstance(work, collections.Counter) else collections.Counter(work)
    total = sum(c * (n - first) * keys for (n, first, keys), c in kinds.items())
    longest = max((min(spp, n - first) * keys for n, first, keys in kinds), default=0)
    programs = _programs(kinds, spp)
    return programs > 0 and total >= tuning.decode_balance * longest * programs
