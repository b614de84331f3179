"""The sort-based integer sets agree with numpy's set routines on every shape of input."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.runtime.int_sets import distinct, has_duplicates, sorted_unique

CASES = [
    np.zeros(0, np.int64),
    np.array([7]),
    np.array([3, 3]),
    np.array([0, 1, 2, 5, 9]),  # strictly ascending: the shortcut
    np.array([0, 1, 1, 2]),  # ascending with a repeat: not strictly ascending
    np.array([9, 2, 2, -1, 5, -1]),
    np.array([2, 1]),
    np.array([5000, -3, 5000, 12]),  # a range too wide for the histogram path of `distinct`
]


@pytest.mark.parametrize("values", CASES, ids=lambda v: repr(v.tolist()))
def test_small_cases_match_numpy(values: np.ndarray) -> None:
    expected = np.unique(values)
    got = sorted_unique(values)
    assert got.dtype == values.dtype
    np.testing.assert_array_equal(got, expected)
    assert has_duplicates(values) == (expected.size != values.size)
    assert distinct(values) == expected.tolist()


def test_random_arrays_match_numpy() -> None:
    rng = np.random.default_rng(19)
    for _ in range(200):
        n = int(rng.integers(0, 300))
        v = rng.integers(-5, int(rng.integers(1, 400)), n)
        if rng.random() < 0.3:
            v = np.sort(v)
        np.testing.assert_array_equal(sorted_unique(v), np.unique(v))
        assert has_duplicates(v) == (np.unique(v).size != v.size)
        assert distinct(v) == np.unique(v).tolist()


def test_the_result_never_aliases_the_input() -> None:
    v = np.array([1, 2, 3])
    out = sorted_unique(v)
    out[0] = 99
    assert v[0] == 1
