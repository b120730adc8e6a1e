"""The tensor assertions fail with a message that names what differs, and pass otherwise."""

import pytest
import torch

from tests.asserts import assert_close, assert_differs, assert_equal


def test_assert_equal_names_the_first_differing_element():
    a = torch.zeros(2, 3)
    b = a.clone()
    b[1, 2] = 5.0
    assert_equal(a, a.clone(), "same")
    with pytest.raises(AssertionError, match=r"the output: 1 of 6 elements differ; the first at \(1, 2\): got 0.0"):
        assert_equal(a, b, "the output")
    with pytest.raises(AssertionError, match=r"got \(2, 3\) torch.float32, expected \(3, 2\)"):
        assert_equal(a, a.reshape(3, 2), "shape")


def test_nan_is_equal_only_when_asked():
    a = torch.tensor([1.0, float("nan")])
    with pytest.raises(AssertionError, match="1 of 2 elements differ"):
        assert_equal(a, a.clone(), "nan")
    assert_equal(a, a.clone(), "nan", nan_equal=True)


def test_assert_close_reports_the_worst_element_and_rejects_nan():
    want = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    assert_close(want * (1 + 1e-15), want, 1e-14, "close")
    got = want.clone()
    got[1] = 2.1
    got[2] = 4.0001
    with pytest.raises(AssertionError, match=r"2 of 3 elements outside rtol=1e-06 atol=0; the worst at \(1,\)"):
        assert_close(got, want, 1e-6, "far")
    with pytest.raises(AssertionError, match=r"the worst at \(0,\): got nan"):
        assert_close(torch.tensor([float("nan"), 2.0, 4.0], dtype=torch.float64), want, 1e-6, "nan")


def test_assert_differs():
    a = torch.arange(4)
    assert_differs(a, a + 1, "differs")
    with pytest.raises(AssertionError, match="all 4 elements are equal"):
        assert_differs(a, a.clone(), "same")
