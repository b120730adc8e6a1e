"""tlsim: the programming model and the kernels written in it."""

import pytest
import torch

from pagedattn.cases import CaseSpec
from pagedattn.kernels import tlsim as tl
from pagedattn.kernels import tlsim_programs as kernels
from pagedattn.oracle import check_attention, check_bitexact, paged_gather


@pytest.mark.parametrize("grid", [5, (3,), (2, 3), (4, 1, 2), (1, 1, 1), (2, 2, 3)])
def test_every_program_runs_exactly_once(grid):
    seen = []

    def kernel(prog, log):
        log.append(tuple(prog.program_id(a) for a in range(3)))
        assert tuple(prog.num_programs(a) for a in range(3)) == prog.grid

    tl.launch(grid, kernel, seen)
    dims = (grid,) if isinstance(grid, int) else grid
    dims = tuple(dims) + (1,) * (3 - len(dims))
    expected = {(x, y, z) for x in range(dims[0]) for y in range(dims[1]) for z in range(dims[2])}
    assert len(seen) == len(expected) and set(seen) == expected


def test_empty_grid_runs_nothing_and_bad_grids_fail():
    tl.launch((0, 3), lambda prog: pytest.fail("ran"))
    with pytest.raises(ValueError, match="grid"):
        tl.launch((1, 2, 3, 4), lambda prog: None)


def test_helpers():
    assert [tl.cdiv(a, 4) for a in (0, 1, 4, 5)] == [0, 1, 1, 2]
    assert [tl.next_power_of_2(n) for n in (0, 1, 2, 3, 80, 128, 129)] == [1, 1, 2, 4, 128, 128, 256]
    assert tl.arange(2, 5).tolist() == [2, 3, 4] and tl.arange(0, 3).dtype == torch.int64


def test_masked_load_never_faults_and_fills_other():
    buf = torch.arange(10, dtype=torch.float32)
    offs = torch.tensor([1, 10**9, -(10**9), 3])
    mask = torch.tensor([True, False, False, True])
    assert tl.load(buf, offs, mask, other=-7.0).tolist() == [1.0, -7.0, -7.0, 3.0]
    nan_other = tl.load(buf, offs, mask, other=float("nan"))
    assert torch.isnan(nan_other[1:3]).all()
    with pytest.raises(IndexError):
        tl.load(buf, offs)  # unmasked out-of-bounds does fault


def test_masked_store_writes_nothing_masked():
    buf = torch.zeros(6)
    offs = torch.tensor([0, 10**9, 2, -(10**9)])
    tl.store(buf, offs, torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([True, False, True, False]))
    assert buf.tolist() == [1.0, 0.0, 3.0, 0.0, 0.0, 0.0]
    tile = torch.arange(2)[:, None] * 3 + torch.arange(3)[None, :]  # 2-D tile by broadcasting
    tl.store(buf, tile, 5.0, tile < 4)
    assert buf.tolist() == [5.0, 5.0, 5.0, 5.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="must be flat 1-D memory"):
        tl.load(torch.zeros(2, 2), torch.tensor([0]))


SCATTERED = CaseSpec("t", ((45, 1), (29, 29), (33, 7)), head_dim=24, block_size=4, layout="permuted")


@pytest.mark.parametrize("tile", [1, 2, 3, 4, 8, 13, 20])
def test_gather_sequence_is_byte_equal_to_pool_indexing(tile):
    case = SCATTERED.build()
    for b in range(case.num_seqs):
        for pool in (case.key_cache, case.value_cache):
            got = kernels.gather_sequence(pool, case.block_tables[b], case.seq_lens_list[b], tile=tile)
            check = check_bitexact(got, paged_gather(pool, case.slot_mapping(b)), f"tile {tile} seq {b}")
            assert check.passed, str(check)


@pytest.mark.parametrize("tile", [1, 3, 16])
def test_slot_gather_and_write(tile):
    case = SCATTERED.build()
    slots = torch.tensor([5, 0, 17, 17, 3, 40])
    assert check_bitexact(kernels.gather_slots(case.key_cache, slots, tile), paged_gather(case.key_cache, slots)).passed
    pool = case.value_cache.clone()
    new = torch.randn(4, *pool.shape[2:])
    w = torch.tensor([7, -1, 2, 30])
    kernels.write_slots(pool, w, new, tile)
    want = case.value_cache.clone()
    flat = want.view(-1, *want.shape[2:])
    flat[7], flat[2], flat[30] = new[0], new[2], new[3]
    assert check_bitexact(pool, want, "write").passed


ATTENTION = [
    CaseSpec("decode", ((70, 1), (1, 1), (17, 1)), dtype=torch.float32),
    CaseSpec("prefill", ((33, 33), (5, 5)), head_dim=48, block_size=3, dtype=torch.float32),
    CaseSpec("continuation", ((40, 7), (50, 25)), scale=0.3, dtype=torch.float32),
    CaseSpec("gqa", ((23, 1), (30, 5)), num_heads=8, num_kv_heads=1, dtype=torch.bfloat16),
    CaseSpec("layout", ((40, 1), (35, 9), (20, 20)), block_size=4, layout="interleaved", dtype=torch.float16),
    SCATTERED,
]


@pytest.mark.parametrize("spec", ATTENTION, ids=lambda s: s.id)
@pytest.mark.parametrize("tile", [1, 2, 3, 4, 8, 13, 32])
def test_fused_kernel_within_policy_at_every_tile(spec, tile):
    case = spec.build()
    check = check_attention(kernels.paged_attention(case, tile=tile), case)
    assert check.passed and not check.warning, f"{spec.id} tile {tile}:\n{check}"


def test_fused_kernel_does_not_touch_inputs():
    case = SCATTERED.build()
    before = case.clone()
    kernels.paged_attention(case)
    for f in ("query", "key_cache", "value_cache", "block_tables"):
        assert check_bitexact(getattr(case, f), getattr(before, f), f).passed
