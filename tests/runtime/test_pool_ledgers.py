"""A frame's passes over every pool's ledger at once (`PoolLedgers`): the compiled calls against the
ledgers' own numpy methods, pool by pool."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.runtime.compiled_loops import decider_loops
from texstream.runtime.pool_ledgers import PoolLedgers
from texstream.runtime.slots import CacheSlotState, SlotLedger

LOADING = CacheSlotState.LOADING


def ledgers(capacities: dict[int, int]) -> list[SlotLedger | None]:
    out: list[SlotLedger | None] = [None] * 4
    for p, capacity in capacities.items():
        out[p] = SlotLedger(f"pool/{p}", capacity, 2, 16)
    return out


@pytest.mark.skipif(decider_loops() is None, reason="the compiled helper is not built")
@pytest.mark.parametrize("seed", range(5))
def test_the_compiled_passes_over_every_pool_equal_numpy_pool_by_pool(seed: int) -> None:
    """Twin sets of ledgers (pools 0, 1 and 3; 2 has none) through random allocations, arrivals of
    every pool in one call, uses of every pool in one call (slots past a pool and -1 among them) and
    a grow of one pool between frames (its arrays replaced): the same state every frame."""
    loops = decider_loops()
    assert loops is not None
    rng = np.random.default_rng(seed)
    twins = [ledgers({0: 64, 1: 32, 3: 48}) for _ in range(2)]
    passes = [PoolLedgers(twins[0]), PoolLedgers(twins[1], loops.ledger)]
    for frame in range(1, 40):
        if frame == 20:
            for t in twins:
                t[1].grow(64)  # type: ignore[union-attr]
        slots, pools = [], []
        for p in (0, 1, 3):
            k = int(rng.integers(0, 6))
            for t in twins:
                a = t[p].allocate(frame, np.arange(k) + 1000 * p + 10 * frame, np.full(k, p), np.zeros(k, np.int64))  # type: ignore[union-attr]
            slots.append(a.slots[a.slots >= 0])
            pools.append(np.full(int((a.slots >= 0).sum()), p))
        s, q = np.concatenate(slots), np.concatenate(pools)
        order = rng.permutation(s.size)  # arrivals in any pool order
        width = 12
        sampled = rng.integers(-1, 70, (4, width)).astype(np.int64)
        counts = rng.integers(0, width + 1, 4).astype(np.int64)
        for ps in passes:
            ps.mark_resident(s[order], q[order], frame)
            ps.touch(sampled, counts, frame)
        for name in ("state", "last_used"):
            for p in (0, 1, 3):
                np.testing.assert_array_equal(
                    getattr(twins[0][p], name), getattr(twins[1][p], name), err_msg=f"{name} of pool {p}"
                )


@pytest.mark.skipif(decider_loops() is None, reason="the compiled helper is not built")
def test_an_arrival_into_a_slot_not_loading_or_of_no_pool_is_refused_naming_it() -> None:
    loops = decider_loops()
    assert loops is not None
    for loops_or_none in (None, loops.ledger):
        t = ledgers({0: 16, 1: 16})
        passes = PoolLedgers(t, loops_or_none)
        a = t[1].allocate(1, np.arange(3), np.ones(3, np.int64), np.zeros(3, np.int64))  # type: ignore[union-attr]
        free = int(np.flatnonzero(t[1].state != LOADING)[0])  # type: ignore[union-attr]
        before = t[1].state.copy()  # type: ignore[union-attr]
        with pytest.raises(ValueError, match=f"cannot mark resident slot {free} in state"):
            passes.mark_resident(np.append(a.slots, free), np.ones(4, np.int64), 2)
        if loops_or_none is not None:  # the compiled pass wrote nothing before numpy named the slot
            np.testing.assert_array_equal(t[1].state, before)  # type: ignore[union-attr]
        with pytest.raises(ValueError, match="pool 2, which has no ledger"):
            passes.mark_resident(a.slots, np.full(3, 2), 2)
