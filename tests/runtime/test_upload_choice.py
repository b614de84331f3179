"""Which READY loads a frame uploads and in which calls (`upload_choice`): the rules, and the compiled
calls against their numpy twins on random ring states."""

from __future__ import annotations

import numpy as np
import pytest

from texstream import native
from texstream.runtime.upload_choice import RingLoads, UploadChoice, choose_numpy, plan_numpy

READY, OTHER = 3, 1

compiled = pytest.mark.skipif(
    native.choose_uploads() is None or native.plan_uploads() is None, reason="the compiled helper is not built"
)


def ring(n: int) -> dict[str, np.ndarray]:
    return {
        "state": np.full(n, OTHER, np.uint8),
        "seq": np.arange(n, dtype=np.int64),
        "pool": np.zeros(n, np.int64),
        "cache_slot": np.arange(n, dtype=np.int64),
        "nbytes": np.full(n, 100, np.int64),
    }


def choose(r: dict[str, np.ndarray], writable, frame=10, max_tiles=1 << 20, max_bytes=1 << 40, *, chooser=None):  # noqa: ANN001, ANN202
    loads = RingLoads(r["state"], r["seq"], r["pool"], r["cache_slot"], r["nbytes"])
    args = (loads, READY, writable, frame, max_tiles, max_bytes)
    return (chooser.choose(*args) if chooser else choose_numpy(*args)).tolist()


@pytest.mark.parametrize("kind", ["numpy", pytest.param("compiled", marks=compiled)])
def test_ready_loads_go_in_submission_order_under_the_caps_and_gates(kind: str) -> None:
    chooser = UploadChoice(8, kind == "compiled")
    assert chooser.compiled == (kind == "compiled")
    r = ring(8)
    r["state"][[1, 2, 4, 5, 7]] = READY
    r["seq"][:] = [0, 9, 3, 0, 1, 7, 0, 2]  # submission order: 4, 7, 2, 5, 1
    gates = np.zeros(8, np.int64)
    assert choose(r, [gates], chooser=chooser) == [4, 7, 2, 5, 1]
    gates[7] = 11  # slot 7's cache slot waits for a frame in flight: skipped, not a stop
    assert choose(r, [gates], chooser=chooser) == [4, 2, 5, 1]
    assert choose(r, [None], chooser=chooser) == [4, 7, 2, 5, 1]  # no table: every slot writable
    assert choose(r, [gates], max_tiles=2, chooser=chooser) == [4, 2]
    assert choose(r, [gates], max_bytes=250, chooser=chooser) == [4, 2]
    assert choose(r, [gates], max_bytes=1, chooser=chooser) == [4]  # the first always goes
    assert choose(r, [gates], max_tiles=0, chooser=chooser) == []
    r["state"][:] = OTHER
    assert choose(r, [gates], chooser=chooser) == []


@pytest.mark.parametrize("kind", ["numpy", pytest.param("compiled", marks=compiled)])
def test_loads_outside_the_pools_are_refused(kind: str) -> None:
    chooser = UploadChoice(4, kind == "compiled")
    r = ring(4)
    r["state"][2] = READY
    r["pool"][2] = 1
    with pytest.raises(ValueError, match="pool"):
        choose(r, [np.zeros(4, np.int64)], chooser=chooser)
    r["pool"][2], r["cache_slot"][2] = 0, 9
    with pytest.raises(ValueError, match="cache slot"):
        choose(r, [np.zeros(4, np.int64)], chooser=chooser)
    with pytest.raises(ValueError, match="pool"):
        chooser.plan(np.array([2]), r["pool"], r["cache_slot"], np.zeros(1, np.int64), np.zeros(1, np.int64))


def flat(plan) -> list[tuple[int, list[int], list[tuple[int, int]]]]:  # noqa: ANN001
    return [(u.pool, u.ring_slots.tolist(), [(int(a), int(b)) for a, b in u.runs.tolist()]) for u in plan]


@pytest.mark.parametrize("kind", ["numpy", pytest.param("compiled", marks=compiled)])
def test_the_plan_sorts_by_pool_and_slot_and_splits_runs(kind: str) -> None:
    chooser = UploadChoice(16, kind == "compiled")
    pool = np.array([1, 0, 0, 1, 0, 0, 1, 1], np.int64)
    cache = np.array([5, 3, 2, 4, 7, 4, 9, 8], np.int64)
    layers, max_run = np.array([8, 4], np.int64), np.array([0, 0], np.int64)
    chosen = np.array([0, 1, 2, 3, 4, 5, 6, 7], np.int64)
    # by cache slot, pool 0 takes ring slots 2, 1, 5, 4 (cache 2, 3, 4, 7) and pool 1 ring slots
    # 3, 0, 7, 6 (cache 4, 5, 8, 9): no two neighbours consecutive in the ring, so a call each
    got = flat(chooser.plan(chosen, pool, cache, layers, max_run))
    assert got == [
        (0, [2, 1, 5, 4], [(0, 1), (1, 1), (2, 1), (3, 1)]),
        (1, [3, 0, 7, 6], [(0, 1), (1, 1), (2, 1), (3, 1)]),
    ]
    pool = np.zeros(8, np.int64)
    cache = np.array([0, 1, 2, 3, 4, 5, 6, 7], np.int64)
    got = flat(chooser.plan(chosen, pool, cache, np.array([4], np.int64), np.array([3], np.int64)))
    assert got == [(0, list(range(8)), [(0, 3), (3, 1), (4, 3), (7, 1)])]  # cut at a cell and at 3


@compiled
@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_choice_and_plan_equal_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, n_pools = int(rng.integers(1, 300)), int(rng.integers(1, 4))
    chooser = UploadChoice(n, True)
    for _ in range(20):
        r = ring(n)
        r["state"] = rng.choice(np.array([READY, OTHER, 0], np.uint8), n, p=[0.4, 0.4, 0.2])
        r["seq"] = rng.integers(0, n // 2 + 1, n)  # ties: ordered by slot
        r["pool"] = rng.integers(0, n_pools, n)
        for p in range(n_pools):  # distinct slots a pool, mostly ascending with the ring: runs form
            mine = r["pool"] == p
            slots = np.cumsum(rng.integers(1, 3, int(mine.sum())))
            r["cache_slot"][mine] = slots if rng.random() < 0.7 else slots[::-1]
        capacity = int(r["cache_slot"].max()) + 1
        r["nbytes"] = rng.integers(1, 200, n)
        writable = [None if rng.random() < 0.2 else rng.integers(0, 14, capacity) for _ in range(n_pools)]
        frame, tiles, nbytes = 10, int(rng.integers(0, 80)), int(rng.integers(0, 20_000))
        want = choose(r, writable, frame, tiles, nbytes)
        assert choose(r, writable, frame, tiles, nbytes, chooser=chooser) == want
        chosen = np.array(want, np.int64)
        layers = rng.integers(1, 20, n_pools)
        max_run = rng.integers(0, 4, n_pools)
        assert flat(chooser.plan(chosen, r["pool"], r["cache_slot"], layers, max_run)) == flat(
            plan_numpy(chosen, r["pool"], r["cache_slot"], layers, max_run)
        )
