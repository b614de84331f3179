"""A frame's upload calls without GL: runs of consecutive layers at one cell, and the time budget."""

from __future__ import annotations

import numpy as np

from texstream.runtime.upload_budget import UploadCost
from texstream.runtime.upload_plan import PoolUploads, keep_within_budget, upload_runs


def runs_of(cache: list[int], ring: list[int], layers: int, max_run: int = 0) -> list[tuple[int, int]]:
    r = upload_runs(np.array(cache), np.array(ring), layers, max_run)
    return [(int(a), int(b)) for a, b in zip(r["start"], r["count"], strict=True)]


def test_a_run_is_consecutive_in_the_cache_and_in_the_ring() -> None:
    assert runs_of([0, 1, 2, 3], [10, 11, 12, 13], layers=8) == [(0, 4)]
    assert runs_of([0, 1, 3, 4], [10, 11, 12, 13], layers=8) == [(0, 2), (2, 2)]  # a cache gap
    assert runs_of([0, 1, 2, 3], [10, 11, 20, 21], layers=8) == [(0, 2), (2, 2)]  # a ring gap
    assert runs_of([], [], layers=8) == []


def test_a_run_never_crosses_a_cell() -> None:
    # slots 6, 7 are the last layers of cell 0; 8, 9 the first of cell 1 (8 layers a cell)
    assert runs_of([6, 7, 8, 9], [0, 1, 2, 3], layers=8) == [(0, 2), (2, 2)]


def test_max_run_cuts_long_runs_and_one_is_the_per_tile_path() -> None:
    assert runs_of(list(range(7)), list(range(7)), layers=64, max_run=3) == [(0, 3), (3, 3), (6, 1)]
    assert runs_of([0, 1, 2], [5, 6, 7], layers=64, max_run=1) == [(0, 1), (1, 1), (2, 1)]


def test_the_budget_keeps_the_most_urgent_calls_and_at_least_one() -> None:
    ring = np.arange(6)
    plan = [PoolUploads(0, ring, upload_runs(np.arange(6), ring, 2))]  # three calls of two layers
    seq = np.array([5, 6, 0, 1, 9, 9])  # the middle call was submitted first
    nbytes = np.full(6, 10_000)
    cost = UploadCost()
    tiny = keep_within_budget(plan, seq, nbytes, cost, budget_s=1e-9)
    assert len(tiny) == 1 and tiny[0].ring_slots.tolist() == [2, 3]  # at least one: the most urgent
    everything = keep_within_budget(plan, seq, nbytes, cost, budget_s=1.0)
    assert everything[0].ring_slots.tolist() == ring.tolist() and everything[0].runs.size == 3
