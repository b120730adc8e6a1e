"""The convention converters: each agrees with the definition it converts, checked on
the oracle (a window converted there and back selects the same keys)."""

import math

import pytest
import torch

from pagedattn.adapters import conventions as cv
from pagedattn.oracle import paged_attention_reference_lse
from pagedattn.oracle.reference import causal_mask
from tests.asserts import F64_ROUND_TRIP, assert_close, assert_equal
from tests.helpers import make_case


@pytest.mark.parametrize("w", [1, 2, 7, 4096])
def test_windows_round_trip(w):
    assert cv.window_to_flash_attn(w) == (w - 1, 0)
    assert cv.window_from_flash_attn(cv.window_to_flash_attn(w)) == w
    assert cv.window_to_flashinfer(w) == w - 1
    assert cv.window_from_flashinfer(cv.window_to_flashinfer(w)) == w


def test_no_window():
    assert cv.window_to_flash_attn(None) == (-1, -1) and cv.window_from_flash_attn((-1, -1)) is None
    assert cv.window_from_flash_attn((-1, 0)) is None
    assert cv.window_to_flashinfer(None) == -1 and cv.window_from_flashinfer(-1) is None


def test_flash_attn_window_selects_the_same_keys():
    # FlashAttention's definition, written out: key j is seen by the query at p when
    # p - left <= j <= p + right (and j <= p, causal)
    left, right = cv.window_to_flash_attn(5)
    q_len, L = 6, 20
    p = torch.arange(L - q_len, L)[:, None]
    j = torch.arange(L)[None, :]
    theirs = (j >= p - left) & (j <= p + right) & (j <= p)
    assert_equal(theirs, causal_mask(q_len, L, torch.device("cpu"), 5), f"the causal mask, q_len={q_len} L={L}")


def test_bad_conventions_are_refused_with_the_field():
    with pytest.raises(ValueError, match="right=3"):
        cv.window_from_flash_attn((4, 3))
    with pytest.raises(ValueError, match="left=-2"):
        cv.window_from_flash_attn((-2, 0))
    with pytest.raises(ValueError, match="window_left=-5"):
        cv.window_from_flashinfer(-5)
    with pytest.raises(ValueError, match="sliding_window"):
        cv.window_to_flashinfer(0)


def test_lse_conversions():
    case = make_case([(9, 3), (5, 1)], num_heads=2, num_kv_heads=1)
    _, lse = paged_attention_reference_lse(case)
    assert_close(cv.lse_from_log2(cv.lse_to_log2(lse)), lse, F64_ROUND_TRIP, "lse through base 2 and back")
    assert_close(cv.lse_to_log2(lse), lse / math.log(2), F64_ROUND_TRIP, "lse in base 2")
    heads_first = lse.transpose(0, 1).contiguous()
    assert_equal(cv.lse_from_heads_first(heads_first), lse, "lse from heads first")
    assert cv.lse_from_log2(torch.tensor([float("-inf")])).item() == float("-inf")


def test_descale_tensors_become_scales():
    assert cv.scales_from_descale(torch.full((2, 4), 0.5), torch.full((2, 4), 2.0)) == (0.5, 2.0)
    assert cv.scales_from_descale(0.25, 3.0) == (0.25, 3.0)
    with pytest.raises(ValueError, match="k_descale"):
        cv.scales_from_descale(torch.tensor([[0.5, 0.6]]), 1.0)
