"""The slots a frame's pages sample, which the residency core marks as used every frame: the compiled
walk of the page tables against numpy's, over a partly resident cache."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.runtime.compiled_loops import decider_loops
from texstream.runtime.tiles import MAX_TEXTURES
from texstream.runtime.touch import SampledSlots

from .test_residency import Sim


@pytest.mark.skipif(decider_loops() is None, reason="the compiled helper is not built")
@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_walk_finds_the_same_slots_as_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sim = Sim(capacity=40, textures=3)  # too small for everything: some pages sample an ancestor
    space, tables = sim.core.space, sim.core.tables
    for _ in range(6):
        sim.frame(rng.choice(space.used, size=30).astype(np.uint32))
    assert 0 < int((tables.own[: space.used] >= 0).sum()) < space.used
    pool_of = np.full(MAX_TEXTURES, -1, np.int64)
    pool_of[:3] = [0, 2, -1]  # texture 2 has no pool: its pages are left out by both
    ids = np.unique(rng.choice(space.used, size=60)).astype(np.int64)
    loops = decider_loops()
    assert loops is not None
    walk = SampledSlots(space, tables, walk_loop=loops.sample_slots)
    compiled = walk.by_pool(ids, pool_of, [0, 2])
    plain = SampledSlots(space, tables).by_pool(ids, pool_of, [0, 2])
    assert [p for p, _ in compiled] == [p for p, _ in plain] == [0, 2]
    for (_, a), (_, b) in zip(compiled, plain, strict=True):
        np.testing.assert_array_equal(np.sort(a), np.sort(b))
    assert compiled[0][1].size and compiled[1][1].size
    with pytest.raises(ValueError, match="outside"):
        walk.by_pool(np.array([space.capacity + 1]), pool_of, [0])
