"""Sets of integers held in small numpy arrays: the per-frame few hundred tile ids, slots or pool
indices of the render thread's bookkeeping.

numpy 2's ``np.unique`` takes a hash path that costs tens of microseconds even on a few hundred
values, several times a sort's cost; these helpers sort instead, and skip the work when the input
is empty, a single value, or already strictly ascending (the common case for ids produced by the
reductions, which come out sorted).
"""

from __future__ import annotations

import numpy as np

__all__ = ["distinct", "has_duplicates", "sorted_unique"]


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The distinct values of a 1-D integer array, ascending (what ``np.unique`` returns)."""
    v = np.asarray(values).ravel()
    if v.size < 2:
        return v.copy()
    if (v[1:] > v[:-1]).all():
        return v.copy()
    v = np.sort(v)
    keep = np.empty(v.size, bool)
    keep[0] = True
    np.not_equal(v[1:], v[:-1], out=keep[1:])
    return v[keep]


def has_duplicates(values: np.ndarray) -> bool:
    """Whether a value appears twice in a 1-D integer array."""
    v = np.asarray(values).ravel()
    if v.size < 2 or (v[1:] > v[:-1]).all():
        return False
    t = np.sort(v)
    return bool((t[1:] == t[:-1]).any())


def distinct(values: np.ndarray) -> list[int]:
    """The distinct values of a 1-D integer array as Python ints, ascending (a frame's pool indices:
    usually one or two)."""
    v = np.asarray(values).ravel()
    if v.size == 0:
        return []
    lo, hi = int(v.min()), int(v.max())
    if lo == hi:
        return [lo]
    if hi - lo < 1024:  # a narrow range (pool indices): a histogram, no sort
        return (np.flatnonzero(np.bincount(v - lo)) + lo).tolist()
    return sorted_unique(v).tolist()
