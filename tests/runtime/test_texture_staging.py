"""The staging-texture upload path (`texture_staging.TextureStaging`): tiles land exactly, through the
compute fill and the block-compatible copies, whatever the ring's stride; pools it cannot serve
upload from the ring; a frame's share of an array is capped at its layers; the arrays stay within
their share of the budget. GL (llvmpipe); random bytes stand in for tiles (the copies are bitwise)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import moderngl
import numpy as np
import pytest

from texstream.config import BudgetConfig
from texstream.gl.gl_ext import GLExt
from texstream.pack.format import TexelFormat
from texstream.runtime.budget import BudgetManager
from texstream.runtime.pools import CachePool
from texstream.runtime.slots import SlotGeometry
from texstream.runtime.staging import SLOT_ALIGNMENT, StagingRing
from texstream.runtime.texture_staging import MIN_LAYERS, TextureStaging
from texstream.runtime.upload_plan import PoolUploads, upload_runs

pytestmark = pytest.mark.gl

SLOT = 136
RING_SLOTS = 32


@pytest.fixture(scope="module")
def gl(gl_context: moderngl.Context) -> GLExt:
    gl = GLExt(gl_context)
    if not gl.has_staging_texture:
        pytest.skip("this context cannot run the staging-texture path")
    return gl


def tile_bytes(fmt: TexelFormat, slot: int = SLOT) -> int:
    return (slot // 4) ** 2 * fmt.block_bytes


@dataclass
class Frame:
    """One frame's uploads through `TextureStaging.issue`, checked against the bytes written."""

    gl: GLExt
    ring: StagingRing
    pools: list[CachePool]

    def __post_init__(self) -> None:
        n = self.ring.slot_count
        self.cache_slot = np.full(n, -1, np.int64)
        self.nbytes = np.zeros(n, np.int64)
        self.pool_of = np.full(n, -1, np.int64)
        self.expected: list[tuple[int, int, bytes]] = []  # (pool, cache slot, bytes)
        self.rng = np.random.default_rng(7)

    def load(self, pool: int, cache_slots: list[int]) -> np.ndarray:
        """Write random tiles for `cache_slots` of `pool` into fresh ring slots (in cache-slot order)."""
        p = self.pools[pool]
        size = p.geometry.slot_bytes
        got = self.ring.acquire(len(cache_slots))
        assert got.size == len(cache_slots)
        for r, c in zip(got.tolist(), cache_slots, strict=True):
            data = self.rng.integers(0, 256, size, np.uint8).tobytes()
            view = np.frombuffer(self.ring.view(r), np.uint8)
            view[:size] = np.frombuffer(data, np.uint8)
            view[size:] = 0xEE  # the slack past the tile: never copied
            self.cache_slot[r], self.nbytes[r], self.pool_of[r] = c, size, pool
            self.expected.append((pool, c, data))
        return got

    def plan(self, slots: np.ndarray) -> list[PoolUploads]:
        out = []
        for p in sorted(set(self.pool_of[slots].tolist())):
            s = slots[self.pool_of[slots] == p]
            s = s[np.argsort(self.cache_slot[s], kind="stable")]
            pool = self.pools[p]  # runs from the ring where the unpack modes step over the slack (as the uploader)
            ok = self.gl.run_image_stride_ok(pool.texture, pool.geometry.slot_size, self.ring.stride)
            out.append(PoolUploads(p, s, upload_runs(self.cache_slot[s], s, pool.layers, 0 if ok else 1)))
        return out

    def issue(self, staging: TextureStaging, slots: np.ndarray) -> tuple[int, int]:
        self.ring.stage(slots, self.nbytes[slots])
        return staging.issue(slots, self.nbytes, self.cache_slot, self.plan(slots), self.pools)

    def cell(self, pool: int, slot: int) -> bytes:
        p = self.pools[pool]
        g = p.geometry
        layer, cx, cy = (int(v) for v in g.locate(slot, p.layers))
        per, side = g.slot_size // 4, g.layer_size[0] // 4
        blocks = np.frombuffer(self.gl.read_layer(p.texture, layer), np.uint8).reshape(side, side, -1)
        return blocks[cy * per : (cy + 1) * per, cx * per : (cx + 1) * per].tobytes()

    def check(self) -> None:
        self.gl.ctx.finish()
        for pool, slot, data in self.expected:
            assert self.cell(pool, slot) == data, f"pool {pool} slot {slot}"


@pytest.fixture
def budget() -> BudgetManager:
    return BudgetManager(BudgetConfig(budget_mb=64))


def make_pools(
    gl: GLExt, budget: BudgetManager, formats: list[tuple[TexelFormat, int]], capacity: int = 16, cells: int = 2
) -> list[CachePool]:
    return [
        CachePool(
            gl, budget, (fmt, False, slot), i, SlotGeometry(slot, tile_bytes(fmt, slot), cells, cells), capacity, 2, 0
        )
        for i, (fmt, slot) in enumerate(formats)
    ]


@pytest.fixture
def rig(gl: GLExt, budget: BudgetManager) -> Iterator[tuple[list[CachePool], StagingRing]]:
    """A BC1, a BC5 and a BC7 pool (2 x 2 cells a layer, 4 layers) and a ring whose stride is the BC7
    tile's: BC1 tiles then sit in slots twice their size (mixed formats share one ring)."""
    pools = make_pools(gl, budget, [(TexelFormat.BC1, SLOT), (TexelFormat.BC5, SLOT), (TexelFormat.BC7, SLOT)])
    big = tile_bytes(TexelFormat.BC7)
    ring = StagingRing(gl.ctx, gl, RING_SLOTS * -(-big // SLOT_ALIGNMENT) * SLOT_ALIGNMENT, big)
    yield pools, ring
    ring.release()
    for p in pools:
        p.release()


def test_bc1_bc5_and_bc7_tiles_land_exactly_in_runs_across_cells_from_a_wider_ring_stride(
    gl: GLExt, rig: tuple[list[CachePool], StagingRing]
) -> None:
    pools, ring = rig
    assert ring.stride > tile_bytes(TexelFormat.BC1)  # BC1 tiles leave slack in their ring slots
    staging = TextureStaging(gl, 4 << 20, ring)
    frame = Frame(gl, ring, pools)
    try:
        # BC1: layers 1..3 of cell 0 then layers 0..1 of cell 1 (slots are cell-major: 4 layers a cell)
        a = frame.load(0, [1, 2, 3, 4, 5])
        b = frame.load(1, [6, 7, 12])  # BC5: cells 1 and 3
        c = frame.load(2, [0, 9, 10, 11])  # BC7
        slots = np.concatenate([a, b, c])
        nbytes, calls = frame.issue(staging, slots)
        assert nbytes == int(frame.nbytes[slots].sum())
        st = staging.stats()
        # one dispatch per array (each array's ring slots are consecutive) and one copy per run:
        # BC1 runs [1..3], [4, 5]; BC5 [6, 7], [12]; BC7 [0], [9..11]
        assert (st.dispatches, st.copies, st.ring_tiles) == (2, 6, 0)
        assert calls == 8
        assert {(block, slot) for block, slot, _ in st.arrays} == {(8, SLOT), (16, SLOT)}
        assert st.nbytes <= st.share_bytes
        frame.check()
        # the ring's fence went out with the dispatches: the slots come back once the GPU is done
        gl.ctx.finish()
        assert ring.reclaim().size == slots.size
        # a second frame takes the layers after the first one's (the cursor), and lands exactly too;
        # a ring slot left out between its loads (a cancelled load) splits the fill into two spans
        frame.expected.clear()
        head = frame.load(0, [8, 9])
        gap = ring.acquire(1)
        tail = frame.load(0, [10, 11])
        again = np.concatenate([head, tail])
        _, calls = frame.issue(staging, again)
        ring.abandon(gap)
        st = staging.stats()
        assert (st.dispatches, st.copies, st.batches) == (2 + 2, 6 + 2, 2)  # two spans, two runs (the gap)
        assert calls == 4
        frame.check()
    finally:
        staging.release()


def test_pools_it_cannot_serve_upload_from_the_ring(
    gl: GLExt, budget: BudgetManager, rig: tuple[list[CachePool], StagingRing]
) -> None:
    """Another slot size than the first seen for its block size, an uncompressed format, or a
    share too small for `MIN_LAYERS`: those pools' tiles upload straight from the ring, exactly."""
    pools, ring = rig
    extra = make_pools(gl, budget, [(TexelFormat.BC1, 72), (TexelFormat.RGBA8, 64)], cells=1)
    pools = pools + extra  # 3: BC1 of 72-texel slots, 4: RGBA8
    staging = TextureStaging(gl, 4 << 20, ring)
    tiny = TextureStaging(gl, 2 * (MIN_LAYERS - 1) * tile_bytes(TexelFormat.BC7), ring)
    frame = Frame(gl, ring, pools)
    try:
        slots = np.concatenate([frame.load(0, [0, 1]), frame.load(3, [2]), frame.load(4, [5])])
        _, calls = frame.issue(staging, slots)
        st = staging.stats()
        assert st.ring_tiles == 2 and st.copies == 1 and st.dispatches == 1  # only pool 0 was staged
        assert calls == 4  # a dispatch and a copy for pool 0, one ring upload each for pools 3 and 4
        assert [a[:2] for a in st.arrays] == [(8, SLOT)]
        frame.check()
        gl.ctx.finish()
        ring.reclaim()
        frame.expected.clear()
        slots = frame.load(2, [4, 5])  # BC7: its array would have MIN_LAYERS - 1 layers
        frame.issue(tiny, slots)
        assert tiny.stats().ring_tiles == 2 and tiny.stats().arrays == () and tiny.nbytes == 0
        frame.check()
    finally:
        staging.release()
        tiny.release()
        for p in extra:
            p.release()


def test_a_frame_is_capped_at_each_arrays_layers(gl: GLExt, rig: tuple[list[CachePool], StagingRing]) -> None:
    """`within_layers` keeps each array's first `layers` loads in upload order; loads the ring
    serves are never capped; the arrays' bytes stay within the share."""
    pools, ring = rig
    share = 2 * MIN_LAYERS * tile_bytes(TexelFormat.BC7)  # MIN_LAYERS BC7 layers, 2 x as many BC1
    staging = TextureStaging(gl, share, ring)
    try:
        assert staging.layers_for(16, SLOT) == MIN_LAYERS and staging.layers_for(8, SLOT) == 2 * MIN_LAYERS
        pool_of = np.array([2] * 10 + [0] * 3 + [1] * 2, np.int64)  # BC7 then BC1 then BC5 (16-byte, like BC7)
        keep = staging.within_layers(pool_of, pools)
        # the BC7 and BC5 pools share the 16-byte array: its first MIN_LAYERS loads; BC1 has room
        assert keep.tolist() == [True] * 8 + [False] * 2 + [True] * 3 + [False] * 2
        assert staging.nbytes <= share and staging.nbytes == share  # both arrays made, filling it
    finally:
        staging.release()


def test_a_pools_batch_below_min_tiles_uploads_from_the_ring(
    gl: GLExt, rig: tuple[list[CachePool], StagingRing]
) -> None:
    """With `min_tiles` (StreamerConfig.upload_staging_min_tiles), a pool's frame batch of fewer
    tiles goes up straight from the ring and a larger one is staged, both exactly, in one frame."""
    pools, ring = rig
    staging = TextureStaging(gl, 4 << 20, ring, min_tiles=3)
    frame = Frame(gl, ring, pools)
    try:
        slots = np.concatenate([frame.load(0, [0, 1]), frame.load(1, [4, 5, 6])])  # 2 BC1 tiles, 3 BC5
        frame.issue(staging, slots)
        st = staging.stats()
        assert st.ring_tiles == 2 and st.dispatches == 1 and st.copies == 1
        assert [a[0] for a in st.arrays] == [16]  # only the BC5 batch was staged
        frame.check()
    finally:
        staging.release()
