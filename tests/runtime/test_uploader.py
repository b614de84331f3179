"""The uploader: loads going READING -> READY -> UPLOADING -> FREE, the bytes that land in cache slots,
the per-call caps and the cache slots' overwrite gate, one fence per upload call, failures with
reasons, cancellation (READY and READING, and a tile asked for again), pack descriptors outliving
`remove_source` while batches read them, the blocking `load_now`, and release.

Packs are baked once per module (1024 texels, 64-texel tiles: 341 BC1 tiles of 72x72 texels,
2592 bytes). Pools have one cell per layer, so cache slot s is layer s and `read_layer` returns
exactly the tile uploaded there."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import moderngl
import numpy as np
import pytest

from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig, BudgetConfig, StreamerConfig, UploadPath
from texstream.errors import GLError
from texstream.gl.gl_ext import GLExt
from texstream.gl.loader import Feature
from texstream.gl.objects import DeviceBuffer, FenceLike
from texstream.native import load as load_native
from texstream.pack.format import Supercompression
from texstream.pack.reader import PackReader
from texstream.runtime import staging_share
from texstream.runtime.budget import BudgetManager
from texstream.runtime.pools import CachePool
from texstream.runtime.slots import SlotGeometry
from texstream.runtime.staging import SLOT_ALIGNMENT
from texstream.runtime.tiles import TileSpace
from texstream.runtime.uploader import LoadRecords, LoadState, Uploader

from ..require import skip_unless_native

pytestmark = pytest.mark.gl

RING_SLOTS = 48
BIG = 1 << 30


# ---- packs ----------------------------------------------------------------------------------------
@dataclass
class Packs:
    zstd: Path
    lz4: Path
    none: Path
    zstd_corrupt: Path  # tile (0, 1, 0) lost its zstd magic number: "does not decode"
    none_corrupt: Path  # tile (0, 2, 0) has a flipped byte: "checksum mismatch"


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Packs:
    root = tmp_path_factory.mktemp("uploader-packs")
    paths = {}
    for sc in Supercompression:
        paths[sc] = root / f"{sc.name.lower()}.pack"
        bake_procedural(
            paths[sc], 1024, "terrain", 1, BakeConfig(tile_size=64, jobs=1, progress=False, supercompression=sc)
        )

    def corrupt(
        src: Path, name: str, tile: tuple[int, int, int], change: Callable[[bytearray, int, int], None]
    ) -> Path:
        with PackReader(src) as r:
            e = r.entry(*tile)
        data = bytearray(src.read_bytes())
        change(data, e.offset, e.stored_size)
        out = root / name
        out.write_bytes(bytes(data))
        return out

    def zero_magic(d: bytearray, off: int, _n: int) -> None:
        d[off : off + 4] = bytes(4)

    def flip_middle(d: bytearray, off: int, n: int) -> None:
        d[off + n // 2] ^= 0xFF

    return Packs(
        zstd=paths[Supercompression.ZSTD],
        lz4=paths[Supercompression.LZ4],
        none=paths[Supercompression.NONE],
        zstd_corrupt=corrupt(paths[Supercompression.ZSTD], "zstd-corrupt.pack", (0, 1, 0), zero_magic),
        none_corrupt=corrupt(paths[Supercompression.NONE], "none-corrupt.pack", (0, 2, 0), flip_middle),
    )


@pytest.fixture(scope="module")
def gl(gl_context: moderngl.Context) -> GLExt:
    return GLExt(gl_context)


@pytest.fixture(params=[True, False], ids=["native", "python"])
def native(request: pytest.FixtureRequest) -> bool:
    """StreamerConfig.native: the compiled read and upload loops, or the pure-Python ones."""
    if request.param and load_native() is None:
        skip_unless_native("texstream's compiled helper (texstream.native) is not built: only the Python loops run")
    return request.param


@pytest.fixture(params=[0, 24], ids=["host-ring", "device-buffer"])
def device_slots(request: pytest.FixtureRequest) -> int:
    """The upload path: straight from the host ring, or through a device-local buffer of 24 slots."""
    return request.param


# ---- fences ---------------------------------------------------------------------------------------
class CountingFences:
    """Wraps a fence factory and counts the fences it makes."""

    def __init__(self, inner: Callable[[], FenceLike]) -> None:
        self.inner = inner
        self.count = 0

    def __call__(self) -> FenceLike:
        self.count += 1
        return self.inner()


class FakeFence:
    def __init__(self) -> None:
        self.signal = False
        self.released = 0

    def signalled(self) -> bool:
        return self.signal

    def release(self) -> None:
        self.released += 1


class FakeFences:
    def __init__(self) -> None:
        self.made: list[FakeFence] = []

    def __call__(self) -> FakeFence:
        self.made.append(FakeFence())
        return self.made[-1]


# ---- the rig --------------------------------------------------------------------------------------
@dataclass
class Drain:
    """Everything drain() reported until no batch was left with the I/O threads."""

    failed: list[LoadRecords] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    ready: int = 0

    @property
    def failed_tiles(self) -> list[int]:
        return [int(t) for rec in self.failed for t in rec.tiles]


class Rig:
    """An uploader reading `paths` (texture ids 0, 1, ...) into `pools` one-cell-per-layer pools."""

    def __init__(
        self,
        ctx: moderngl.Context,
        gl: GLExt,
        paths: list[Path],
        *,
        native: bool = True,
        io_threads: int = 2,
        capacity: int = 64,
        pools: int = 1,
        cells_x: int = 1,
        upload_max_run: int = 0,
        ring_slot_bytes: int | None = None,
        fence_factory: Callable[[], FenceLike] | None = None,
        device_slots: int = 0,
        upload_path: UploadPath = UploadPath.DEVICE_BUFFER,
        read_timeout_s: float = 5.0,
    ) -> None:
        self.ctx, self.gl = ctx, gl
        self.space = TileSpace()
        self.readers = [PackReader(p) for p in paths]
        h = self.readers[0].header
        self.raw = h.tile_raw_size
        slot_bytes = ring_slot_bytes or self.raw
        stride = -(-slot_bytes // SLOT_ALIGNMENT) * SLOT_ALIGNMENT
        config = StreamerConfig(
            io_threads=io_threads,
            native=native,
            upload_max_run=upload_max_run,
            upload_staging_min_tiles=1,
            read_timeout_s=read_timeout_s,
        )
        self.up = Uploader(
            ctx,
            gl,
            self.space,
            config,
            RING_SLOTS * stride,
            slot_bytes,
            fence_factory,
            device_bytes=device_slots * stride,
            upload_path=upload_path,
        )
        assert self.up.ring.slot_count == RING_SLOTS
        for tex, r in enumerate(self.readers):
            self.space.register(tex, r.header)
            self.up.add_source(tex, r)
        self.budget = BudgetManager(BudgetConfig(budget_mb=64))
        g = SlotGeometry(h.slot_size, self.raw, cells_x, cells_x)
        self.pools = [
            CachePool(gl, self.budget, (h.texel_format, srgb, h.slot_size), i, g, capacity, 2, 0)
            for i, srgb in enumerate([True, False][:pools])
        ]

    def ids(self, tex: int, *coords: tuple[int, int, int]) -> np.ndarray:
        c = np.array(coords, np.int64).reshape(-1, 3)
        return self.space.ids(tex, c[:, 0], c[:, 1], c[:, 2])

    def allocate(self, frame: int, tiles: np.ndarray, pool: int = 0) -> np.ndarray:
        slots = self.pools[pool].ledger.allocate(frame, tiles, self.space.tex[tiles], self.space.level[tiles]).slots
        assert (slots >= 0).all()
        return slots

    def submit(self, frame: int, tiles: np.ndarray, pool: int = 0) -> np.ndarray:
        """Take cache slots for `tiles` and start their loads; returns the cache slots."""
        cache = self.allocate(frame, tiles, pool)
        assert self.up.submit(frame, tiles, np.full(tiles.size, pool), cache) == tiles.size
        return cache

    def drain_all(self) -> Drain:
        out = Drain()
        deadline = time.monotonic() + 60.0  # a hang guard, not a speed check
        while self.up.io.pending:
            assert time.monotonic() < deadline, f"{self.up.io.pending} read batches never came back"
            d = self.up.drain()
            if len(d.failed):
                out.failed.append(d.failed)
            out.reasons += d.reasons
            out.ready += d.ready
            time.sleep(0.001)
        return out

    def upload(self, frame: int, max_tiles: int = 256, max_bytes: int = BIG):
        return self.up.upload(frame, self.pools, max_tiles, max_bytes)

    def tile_bytes(self, tile: int) -> bytes:
        tex, lv, x, y = (int(v[0]) for v in self.space.coords(np.array([tile])))
        return self.readers[tex].read_tile(lv, x, y)

    def slot_bytes(self, slot: int, pool: int = 0) -> bytes:
        """The bytes of one cache slot (its cell of its layer)."""
        p = self.pools[pool]
        g = p.geometry
        layer, cx, cy = (int(v) for v in g.locate(slot, p.layers))
        per = g.slot_size // 4
        side = g.layer_size[0] // 4
        blocks = np.frombuffer(self.gl.read_layer(p.texture, layer), np.uint8).reshape(side, side, -1)
        return blocks[cy * per : (cy + 1) * per, cx * per : (cx + 1) * per].tobytes()

    def assert_uploaded(self, tiles: np.ndarray, cache: np.ndarray, pool: int = 0) -> None:
        self.ctx.finish()
        for t, s in zip(tiles.tolist(), cache.tolist(), strict=True):
            assert self.slot_bytes(s, pool) == self.tile_bytes(t), f"tile {t} in slot {s}"

    def states(self, **counts: int) -> dict[LoadState, int]:
        """The expected `states()`: the named counts, FREE for the rest of the ring."""
        want = {st: counts.get(st.name.lower(), 0) for st in LoadState}
        want[LoadState.FREE] = RING_SLOTS - sum(want.values())
        return want

    def release(self) -> None:
        self.up.release()
        for p in self.pools:
            p.release()
        for r in self.readers:
            r.close()


@pytest.fixture
def rigs(gl_context: moderngl.Context, gl: GLExt) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(paths: list[Path], **kw: object) -> Rig:
        made.append(Rig(gl_context, gl, paths, **kw))
        return made[-1]

    yield make
    for r in made:
        r.release()


# ---- the cycle ------------------------------------------------------------------------------------
def test_loads_go_reading_ready_uploading_free_and_land_in_their_cache_slots(
    rigs: Callable[..., Rig], packs: Packs, native: bool, device_slots: int
) -> None:
    rig = rigs([packs.zstd], native=native, device_slots=device_slots)
    up = rig.up
    assert (up.native is not None) is native
    assert up.states() == rig.states() and not up.busy
    tiles = rig.space.tile_ids(0)[::23]  # all levels, scattered through the file
    n = tiles.size
    cache = rig.submit(1, tiles)
    assert up.states() == rig.states(reading=n) and up.states(0)[LoadState.READING] == n
    assert up.loading_mask(tiles).all() and up.in_flight == n and up.busy
    assert up.free_slots == RING_SLOTS - n
    drained = rig.drain_all()
    assert drained.ready == n and not drained.failed and not drained.reasons
    assert up.states() == rig.states(ready=n) and up.in_flight == n
    fences = up.ring.fence_factory = CountingFences(up.ring.fence_factory)
    done = rig.upload(3)
    assert done.loads.tiles.tolist() == tiles.tolist()  # submission order
    assert done.loads.cache_slot.tolist() == cache.tolist()
    assert (done.loads.tex == 0).all() and (done.loads.pool == 0).all()
    assert done.latency_frames.tolist() == [2] * n and done.nbytes == n * rig.raw
    assert up.states() == rig.states(uploading=n) and fences.count == 1
    assert not up.loading_mask(tiles).any() and up.in_flight == 0 and not up.busy
    rig.assert_uploaded(tiles, cache)  # (waits for the GPU: the fence has signalled now)
    assert up.reclaim() == n
    assert up.states() == rig.states() and up.free_slots == RING_SLOTS
    assert up.reclaim() == 0


def test_the_reader_may_close_once_its_source_is_added(rigs: Callable[..., Rig], packs: Packs) -> None:
    rig = rigs([packs.lz4])
    rig.readers[0].close()
    tiles = rig.ids(0, (0, 0, 0), (0, 15, 15), (4, 0, 0))
    cache = rig.submit(1, tiles)
    assert rig.drain_all().ready == 3
    rig.upload(2)
    with PackReader(packs.lz4) as again:
        rig.readers[0] = again
        rig.assert_uploaded(tiles, cache)


def test_reclaim_frees_ring_slots_only_after_the_uploads_fence(
    rigs: Callable[..., Rig], packs: Packs, gl_context: moderngl.Context, device_slots: int
) -> None:
    fences = FakeFences()
    rig = rigs([packs.none], fence_factory=fences, device_slots=device_slots)
    up = rig.up
    tiles = rig.ids(0, (0, 0, 0), (0, 1, 0), (1, 0, 0))
    rig.submit(1, tiles)
    rig.drain_all()
    rig.upload(2)
    assert len(fences.made) == 1
    for _ in range(3):
        assert up.reclaim() == 0
    assert up.states() == rig.states(uploading=3) and up.free_slots == RING_SLOTS - 3
    gl_context.finish()
    fences.made[0].signal = True
    assert up.reclaim() == 3 and fences.made[0].released == 1
    assert up.states() == rig.states() and up.free_slots == RING_SLOTS


# ---- caps, gate, fences ---------------------------------------------------------------------------
def test_the_staging_texture_path_caps_a_frame_at_its_arrays_layers_and_lands_every_tile(
    rigs: Callable[..., Rig], packs: Packs
) -> None:
    """A share of 20 ring slots holds a 10-layer array for these tiles (half the share): 16 ready
    loads go up in two frames of 10 and 6, each tile exactly in its cache slot, one fence a frame."""
    rig = rigs([packs.zstd], device_slots=20, upload_path=UploadPath.STAGING_TEXTURE)
    up = rig.up
    assert up.upload_path is UploadPath.STAGING_TEXTURE and up.textures is not None
    tiles = rig.space.tile_ids(0)[:16]
    cache = rig.submit(1, tiles)
    assert rig.drain_all().ready == 16
    first = rig.upload(2)
    assert up.textures.stats().arrays[0][2] == 10
    assert len(first.loads) == 10 and first.loads.tiles.tolist() == tiles[:10].tolist()  # submission order
    second = rig.upload(3)
    assert len(second.loads) == 6 and up.count(LoadState.READY) == 0
    st = up.textures.stats()
    assert st.batches == 2 and st.ring_tiles == 0 and up.ring.stats().batches == 2
    rig.assert_uploaded(tiles, cache)


def test_upload_takes_ready_loads_in_submission_order_under_the_caps(rigs: Callable[..., Rig], packs: Packs) -> None:
    rig = rigs([packs.zstd])
    up = rig.up
    later = rig.ids(0, (0, 9, 9), (0, 10, 9), (0, 11, 9), (0, 12, 9))
    earlier_in_file = rig.ids(0, (0, 0, 0), (0, 1, 0))
    rig.submit(1, later)
    rig.submit(1, earlier_in_file)
    tiles = np.concatenate([later, earlier_in_file])
    assert rig.drain_all().ready == 6
    fences = up.ring.fence_factory = CountingFences(up.ring.fence_factory)
    first = rig.upload(2, max_tiles=2)
    assert first.loads.tiles.tolist() == tiles[:2].tolist() and first.nbytes == 2 * rig.raw
    second = rig.upload(2, max_tiles=10, max_bytes=2 * rig.raw + rig.raw // 2)
    assert second.loads.tiles.tolist() == tiles[2:4].tolist() and second.nbytes == 2 * rig.raw
    # A byte cap below one tile still lets the first ready load go (it could never go otherwise).
    third = rig.upload(2, max_tiles=10, max_bytes=1)
    assert third.loads.tiles.tolist() == tiles[4:5].tolist()
    nothing = rig.upload(2, max_tiles=0)
    assert len(nothing.loads) == 0 and nothing.nbytes == 0
    assert up.states() == rig.states(ready=1, uploading=5)
    assert fences.count == 3  # one per call that uploaded something, none for the empty one
    rest = rig.upload(3)
    assert rest.loads.tiles.tolist() == tiles[5:].tolist() and fences.count == 4


def test_a_cache_slot_is_not_written_before_its_writable_frame(rigs: Callable[..., Rig], packs: Packs) -> None:
    rig = rigs([packs.zstd])
    up = rig.up
    tiles = rig.ids(0, (0, 0, 0), (0, 1, 0), (0, 2, 0))
    cache = rig.submit(1, tiles)
    rig.pools[0].ledger.writable_at[cache[1]] = 5  # a draw in flight until frame 5 may sample it
    rig.drain_all()
    fences = up.ring.fence_factory = CountingFences(up.ring.fence_factory)
    assert rig.upload(3).loads.tiles.tolist() == [tiles[0], tiles[2]]
    assert up.states() == rig.states(ready=1, uploading=2) and up.loading_mask(tiles[1:2]).all()
    assert len(rig.upload(4).loads) == 0 and fences.count == 1  # still gated: no upload, no fence
    late = rig.upload(5)
    assert late.loads.tiles.tolist() == [tiles[1]] and late.loads.cache_slot.tolist() == [cache[1]]
    assert late.latency_frames.tolist() == [4] and fences.count == 2
    rig.assert_uploaded(tiles, cache)


def test_one_fence_per_upload_call_across_pools_and_packs(
    rigs: Callable[..., Rig], packs: Packs, gl_context: moderngl.Context, device_slots: int
) -> None:
    rig = rigs([packs.zstd, packs.lz4], pools=2, device_slots=device_slots)
    up = rig.up
    fences = up.ring.fence_factory = CountingFences(up.ring.fence_factory)
    a = rig.ids(0, (0, 0, 0), (0, 3, 4), (2, 1, 1))
    b = rig.ids(1, (0, 5, 5), (1, 2, 2), (4, 0, 0))
    ca, cb = rig.allocate(1, a, 0), rig.allocate(1, b, 1)
    tiles, cache = np.concatenate([a, b]), np.concatenate([ca, cb])
    assert up.submit(1, tiles, np.repeat([0, 1], 3), cache) == 6
    assert rig.drain_all().ready == 6
    done = rig.upload(2)
    assert len(done.loads) == 6 and sorted(done.loads.pool.tolist()) == [0, 0, 0, 1, 1, 1]
    assert sorted(done.loads.tex.tolist()) == [0, 0, 0, 1, 1, 1]
    assert fences.count == 1 and up.ring.batches_in_flight == 1
    rig.assert_uploaded(a, ca, pool=0)
    rig.assert_uploaded(b, cb, pool=1)
    more = rig.ids(1, (0, 0, 0), (0, 1, 0))
    rig.submit(3, more, pool=1)
    rig.drain_all()
    assert len(rig.upload(4).loads) == 2 and fences.count == 2
    assert len(rig.upload(5).loads) == 0 and fences.count == 2
    gl_context.finish()
    assert up.reclaim() == 8


# ---- failures -------------------------------------------------------------------------------------
def test_failed_loads_come_back_with_a_reason_naming_the_pack_and_the_tile(
    rigs: Callable[..., Rig], packs: Packs, native: bool, tmp_path: Path, device_slots: int
) -> None:
    cut_copy = tmp_path / "cut.pack"
    shutil.copy(packs.lz4, cut_copy)
    rig = rigs([packs.zstd_corrupt, packs.none_corrupt, cut_copy], native=native, device_slots=device_slots)
    up = rig.up
    idx = rig.readers[2].index
    last = rig.readers[2].tile_position(int(np.argmax(idx["offset"])))  # last in the file
    e = rig.readers[2].entry(*last)
    os.truncate(cut_copy, e.offset + e.stored_size // 2)  # the pack ends inside its last tile now
    bad = {
        int(rig.ids(0, (0, 1, 0))[0]): (packs.zstd_corrupt, (0, 1, 0), "does not decode"),
        int(rig.ids(1, (0, 2, 0))[0]): (packs.none_corrupt, (0, 2, 0), "checksum mismatch"),
        int(rig.ids(2, last)[0]): (cut_copy, last, "truncated"),
    }
    good = np.concatenate([rig.ids(t, (0, 0, 0), (1, 1, 1)) for t in range(3)])
    tiles = np.concatenate([np.array(list(bad)), good])
    cache = rig.submit(1, tiles)
    slot_of = dict(zip(tiles.tolist(), cache.tolist(), strict=True))
    drained = rig.drain_all()
    assert drained.ready == good.size
    assert sorted(drained.failed_tiles) == sorted(bad)
    assert len(drained.reasons) == len(bad)
    reasons = iter(drained.reasons)
    for rec in drained.failed:
        for tile, tex, pool, slot in zip(rec.tiles, rec.tex, rec.pool, rec.cache_slot, strict=True):
            path, (lv, x, y), why = bad[int(tile)]
            reason = next(reasons)  # reasons are parallel to the failed records
            assert str(path) in reason and f"tile ({lv}, {x}, {y})" in reason and why in reason, reason
            assert (int(tex), int(pool), int(slot)) == (int(rig.space.tex[tile]), 0, slot_of[int(tile)])
    assert up.states() == rig.states(ready=good.size)
    assert not up.loading_mask(np.array(list(bad))).any() and up.loading_mask(good).all()
    assert up.free_slots == RING_SLOTS - good.size  # failed loads gave their ring slots back
    rig.upload(2)
    rig.assert_uploaded(good, np.array([slot_of[int(t)] for t in good]))


# ---- cancel ---------------------------------------------------------------------------------------
def test_cancelling_a_ready_load_frees_it_at_once(rigs: Callable[..., Rig], packs: Packs) -> None:
    rig = rigs([packs.zstd])
    up = rig.up
    tiles = rig.ids(0, (0, 0, 0), (0, 1, 0), (0, 2, 0), (0, 3, 0))
    cache = rig.submit(1, tiles)
    rig.drain_all()
    cancelled = up.cancel(tiles[1:3])
    assert sorted(cancelled.tiles.tolist()) == sorted(tiles[1:3].tolist())
    assert sorted(cancelled.cache_slot.tolist()) == sorted(cache[1:3].tolist())  # the caller frees them
    assert up.states() == rig.states(ready=2) and up.free_slots == RING_SLOTS - 2
    assert up.loading_mask(tiles).tolist() == [True, False, False, True]
    assert len(up.cancel(rig.ids(0, (0, 9, 9)))) == 0  # no load: nothing to cancel
    done = rig.upload(2)
    assert done.loads.tiles.tolist() == [tiles[0], tiles[3]]
    assert len(up.cancel(tiles)) == 0  # uploading: too late to cancel
    assert up.states() == rig.states(uploading=2)


def test_cancelling_a_reading_load_drops_it_on_drain(rigs: Callable[..., Rig], packs: Packs) -> None:
    rig = rigs([packs.zstd_corrupt])
    up = rig.up
    corrupt = rig.ids(0, (0, 1, 0))
    tiles = np.concatenate([corrupt, rig.ids(0, (0, 0, 0), (0, 2, 0), (0, 3, 0))])
    cache = rig.submit(1, tiles)
    cancelled = up.cancel(tiles[:2])  # the corrupt tile and a good one, still with the I/O threads
    assert sorted(cancelled.cache_slot.tolist()) == sorted(cache[:2].tolist())
    assert up.states() == rig.states(reading=2, cancelled=2)
    assert up.loading_mask(tiles).tolist() == [False, False, True, True]  # they may be asked for again
    assert up.free_slots == RING_SLOTS - 4  # the ring slots stay with the threads until drain
    drained = rig.drain_all()
    assert drained.ready == 2 and not drained.failed and not drained.reasons  # a cancelled failure is no failure
    assert up.states() == rig.states(ready=2) and up.free_slots == RING_SLOTS - 2
    assert rig.upload(2).loads.tiles.tolist() == tiles[2:].tolist()


def test_a_tile_cancelled_and_asked_for_again_gets_a_fresh_load(
    rigs: Callable[..., Rig], packs: Packs, native: bool
) -> None:
    rig = rigs([packs.zstd], native=native, io_threads=1)
    up = rig.up
    tile = rig.ids(0, (1, 3, 2))
    old_cache = rig.submit(1, tile)
    assert up.cancel(tile).cache_slot.tolist() == old_cache.tolist()
    new_cache = rig.allocate(2, tile)  # the old cache slot is not reused here: the bytes must land in the new one
    assert new_cache[0] != old_cache[0]
    assert up.submit(2, tile, np.zeros(1), new_cache) == 1
    assert up.states() == rig.states(reading=1, cancelled=1) and up.loading_mask(tile).all()
    drained = rig.drain_all()  # the old load's result comes back too, after the new load started
    assert drained.ready == 1 and not drained.failed
    assert up.states() == rig.states(ready=1) and up.loading_mask(tile).all()
    with pytest.raises(ValueError, match="already has a load"):
        up.submit(2, tile, np.zeros(1), new_cache)
    done = rig.upload(3)
    assert done.loads.tiles.tolist() == tile.tolist() and done.loads.cache_slot.tolist() == new_cache.tolist()
    assert done.latency_frames.tolist() == [1]
    rig.assert_uploaded(tile, new_cache)


def test_a_hung_compiled_read_fails_its_loads_and_frees_its_ring_slots_when_it_returns(
    rigs: Callable[..., Rig], packs: Packs
) -> None:
    """A read on the compiled threads that hangs past read_timeout_s: its loads fail (one reason each,
    their cache slots back to the caller), their ring slots stay ABANDONED while the stuck thread owns
    them, the other threads keep reading, and the slots are free once the read returns."""
    rig = rigs([packs.zstd], read_timeout_s=0.5)
    up = rig.up
    if up.io.compiled is None:
        skip_unless_native("texstream's compiled helper has no reader pool here")
    hung, other = rig.space.tile_ids(0)[:5], rig.space.tile_ids(0)[40:45]  # one batch each
    up.io.hold_compiled_reads(1)
    cache = rig.submit(1, hung)
    failed: list[LoadRecords] = []
    reasons: list[str] = []
    deadline = time.monotonic() + 60.0
    while not failed:
        assert time.monotonic() < deadline, "the hung read was never given up"
        d = up.drain()
        failed += [d.failed] if len(d.failed) else []
        reasons += d.reasons
        time.sleep(0.005)
    (gave_up,) = failed
    np.testing.assert_array_equal(np.sort(gave_up.tiles), np.sort(hung))
    np.testing.assert_array_equal(np.sort(gave_up.cache_slot), np.sort(cache))
    assert len(reasons) == 5 and all("its read hangs" in r for r in reasons)
    assert up.states() == rig.states(abandoned=5) and up.io.stuck_count == 1
    rig.submit(2, other)  # the replacement thread reads these meanwhile
    deadline = time.monotonic() + 60.0
    while up.states()[LoadState.READY] < 5:
        assert time.monotonic() < deadline, "reads behind the hung one never finished"
        up.drain()
        time.sleep(0.001)
    up.io.hold_compiled_reads(0)  # the hung read returns: its slots are freed, its loads stay failed
    back = rig.drain_all()
    assert back.ready == 0 and not back.failed and not back.reasons
    assert up.states() == rig.states(ready=5) and up.io.stuck_count == 0


def test_reads_kept_by_submit_start_when_started_or_at_the_next_drain(rigs: Callable[..., Rig], packs: Packs) -> None:
    rig = rigs([packs.zstd])
    up = rig.up
    tiles = rig.space.tile_ids(0)[:40]  # two read batches
    cache = rig.allocate(1, tiles)
    assert up.submit(1, tiles, np.zeros(tiles.size, np.int64), cache, start=False) == 40
    assert up.io.pending == 0 and up.states() == rig.states(reading=40)  # no thread has them yet
    assert up.start_reads() == 2 and up.start_reads() == 0 and up.io.pending == 2
    assert rig.drain_all().ready == 40
    more = rig.space.tile_ids(0)[40:45]
    more_cache = rig.allocate(2, more)
    up.submit(2, more, np.zeros(more.size, np.int64), more_cache, start=False)
    first = up.drain()  # a frame that raised before starting its reads: the next drain starts them
    assert up.io.pending + first.ready // 5 == 1  # started (and maybe already read, on a fast thread)
    assert first.ready + rig.drain_all().ready == 5
    rig.upload(3)
    rig.assert_uploaded(np.concatenate([tiles, more]), np.concatenate([cache, more_cache]))


def test_remove_source_starts_the_kept_reads_and_closes_the_descriptor_after_them(
    rigs: Callable[..., Rig], packs: Packs
) -> None:
    rig = rigs([packs.zstd])
    up = rig.up
    fd = up.sources[0].tile.fd
    tiles = rig.space.tile_ids(0)[:40]
    up.submit(1, tiles, np.zeros(tiles.size, np.int64), rig.allocate(1, tiles), start=False)
    assert len(up.remove_source(0)) == 40 and up.io.pending == 2
    os.fstat(fd)  # the started batches may be reading it (they skip every cancelled load)
    drained = rig.drain_all()
    assert drained.ready == 0 and not drained.failed and up.free_slots == RING_SLOTS
    with pytest.raises(OSError):
        os.fstat(fd)


# ---- sources --------------------------------------------------------------------------------------
def test_remove_source_keeps_the_descriptor_for_batches_in_flight_and_closes_it_after(
    rigs: Callable[..., Rig], packs: Packs
) -> None:
    rig = rigs([packs.zstd, packs.zstd])
    up = rig.up
    fd, idle_fd = up.sources[0].tile.fd, up.sources[1].tile.fd
    assert fd != rig.readers[0].fileno()  # the uploader's own descriptor
    rig.readers[0].close()
    tiles = rig.space.tile_ids(0)[:40]  # two read batches
    cache = rig.submit(1, tiles)
    removed = up.remove_source(0)
    assert sorted(removed.cache_slot.tolist()) == sorted(cache.tolist())
    assert 0 not in up.sources and up.states() == rig.states(cancelled=40)
    os.fstat(fd)  # still open: the I/O threads may be reading it
    drained = rig.drain_all()
    assert drained.ready == 0 and not drained.failed
    assert up.states() == rig.states() and up.free_slots == RING_SLOTS
    with pytest.raises(OSError):
        os.fstat(fd)  # closed once the last batch reading it came back
    assert len(up.remove_source(1)) == 0
    with pytest.raises(OSError):
        os.fstat(idle_fd)  # nothing in flight: closed at once
    os.fstat(rig.readers[1].fileno())  # the reader's own descriptor is its owner's


# ---- the blocking path ----------------------------------------------------------------------------
def test_load_now_reads_and_uploads_at_once_and_reports_bad_tiles(
    rigs: Callable[..., Rig], packs: Packs, native: bool
) -> None:
    rig = rigs([packs.zstd_corrupt], native=native, capacity=348)
    up = rig.up
    tiles = rig.space.tile_ids(0)  # 341 tiles: more than one chunk
    pool = rig.pools[0]
    cache = rig.allocate(1, tiles)
    pool.ledger.writable_at[cache[:5]] = 3  # draws in flight may sample these: load_now waits for them
    ok, reasons = up.load_now(1, tiles, pool, cache)
    corrupt = int(rig.ids(0, (0, 1, 0))[0])
    assert ok.tolist() == [t != corrupt for t in tiles.tolist()]
    assert len(reasons) == 1
    assert str(packs.zstd_corrupt) in reasons[0] and "tile (0, 1, 0) does not decode" in reasons[0], reasons[0]
    assert up.ring.stats().acquired == 0 and up.states() == rig.states()  # streaming loads are not disturbed
    rig.assert_uploaded(tiles[ok], cache[ok])
    none_ok, none_reasons = up.load_now(1, np.zeros(0, np.int64), pool, np.zeros(0, np.int64))
    assert none_ok.size == 0 and none_reasons == []
    with pytest.raises(ValueError, match="cache slot"):
        up.load_now(1, tiles[:2], pool, np.array([cache[0], -1]))


# ---- release --------------------------------------------------------------------------------------
def test_release_is_idempotent_and_closes_every_descriptor(rigs: Callable[..., Rig], packs: Packs, gl: GLExt) -> None:
    rig = rigs([packs.zstd, packs.lz4])
    up = rig.up
    fds = [up.sources[0].tile.fd, up.sources[1].tile.fd]
    rig.submit(1, rig.space.tile_ids(0)[:10])
    rig.submit(1, rig.space.tile_ids(1)[:10])
    up.remove_source(1)  # retired: its batches may still be with the threads
    glo = up.ring.glo
    up.release()
    up.release()
    assert up.ring.closed and not gl.is_buffer(glo)  # the threads let go of the ring's memory
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
    assert up.io.shutdown() is True  # the threads are gone
    os.fstat(rig.readers[0].fileno())  # the readers' own descriptors are their owners'


# ---- runs of layers -------------------------------------------------------------------------------
def test_a_frame_of_loads_uploads_one_call_per_run_and_cancelled_loads_split_runs(
    rigs: Callable[..., Rig], packs: Packs, native: bool, device_slots: int
) -> None:
    """Loads into consecutive cache layers get consecutive ring slots (whatever order they come in),
    so they go up with one call per run; cancelled loads cut a run into parts, each still exact. On
    the device path each part is also one buffer copy (the cancelled loads' ring slots are gaps)."""
    rig = rigs([packs.zstd], native=native, cells_x=2, device_slots=device_slots)  # 4 cells x 16 layers
    up = rig.up
    tiles = rig.space.tile_ids(0)[:12]
    cache = rig.allocate(1, tiles)
    np.testing.assert_array_equal(cache, np.arange(12))  # cell 0, layers 0..11
    # priority order is not cache order: the ring slots still follow the cache slots
    order = np.array([5, 0, 11, 3, 8, 1, 10, 2, 9, 4, 7, 6])
    assert up.submit(1, tiles[order], np.zeros(12, np.int64), cache[order]) == 12
    ring = up.load_of[tiles]
    assert np.array_equal(np.diff(ring), np.ones(11)), "ring slots out of cache order"
    rig.drain_all()
    texture = rig.pools[0].texture
    sentinel = bytes([0x5A]) * texture.layer_bytes  # new storage holds whatever the driver left there
    for layer in range(rig.pools[0].layers):
        rig.gl.write_layer(texture, layer, sentinel)
    cancelled = up.cancel(tiles[[3, 7]])
    rig.pools[0].ledger.free(cancelled.cache_slot)
    done = rig.upload(2)
    copies = 3 if device_slots else 0
    assert len(done.loads) == 10 and up.last_calls == 3 + copies  # layers 0-2, 4-6, 8-11
    keep = np.setdiff1d(np.arange(12), [3, 7])
    rig.assert_uploaded(tiles[keep], cache[keep])
    assert rig.slot_bytes(3) == sentinel[: rig.raw] and rig.slot_bytes(7) == sentinel[: rig.raw]


def test_runs_stop_at_cell_boundaries_and_at_the_run_limit(rigs: Callable[..., Rig], packs: Packs) -> None:
    rig = rigs([packs.zstd], cells_x=2, capacity=16, upload_max_run=3)  # 4 cells x 4 layers
    tiles = rig.space.tile_ids(0)[:10]
    cache = rig.submit(1, tiles)  # slots 0..9: cells 0, 1 whole and two layers of cell 2
    rig.drain_all()
    rig.upload(2)
    assert rig.up.last_calls == 5  # 0-2, 3 | 4-6, 7 | 8-9
    rig.assert_uploaded(tiles, cache)


def test_loads_follow_their_cache_slots_across_a_pool_resize(
    rigs: Callable[..., Rig], packs: Packs, native: bool, device_slots: int
) -> None:
    """Growing a pool of several cells renames its slots; loads already read follow the renames
    and upload, in runs, into the same cells and layers of the new array; resident tiles keep their
    bytes through the GPU copy."""
    rig = rigs([packs.zstd], native=native, cells_x=2, capacity=16, device_slots=device_slots)  # 4 cells x 4 layers
    up, pool = rig.up, rig.pools[0]
    first = rig.space.tile_ids(0)[:6]
    c1 = rig.submit(1, first)
    rig.drain_all()
    rig.upload(2)
    pool.ledger.mark_resident(c1, 2)
    rig.ctx.finish()
    later = rig.space.tile_ids(0)[6:14]
    c2 = rig.submit(3, later)  # slots 6..13: cells 1, 2 and 3
    rig.drain_all()
    r = pool.resize(32, frame=4)  # 4 cells x 8 layers
    assert r.moved_from.size and r.evicted_tiles.size == r.cancelled_tiles.size == 0
    up.move_cache_slots(0, r.moved_from, r.moved_to)
    rename = dict(zip(r.moved_from.tolist(), r.moved_to.tolist(), strict=True))
    new1 = np.array([rename.get(s, s) for s in c1.tolist()])
    new2 = np.array([rename.get(s, s) for s in c2.tolist()])
    np.testing.assert_array_equal(pool.ledger.tile[new2], later)
    done = rig.upload(5)
    assert sorted(done.loads.cache_slot.tolist()) == sorted(new2.tolist())
    assert up.last_calls == 3 + (1 if device_slots else 0)  # a run in each of cells 1, 2, 3 (one copy)
    rig.assert_uploaded(first, new1)
    rig.assert_uploaded(later, new2)


class NoCompressedPixelStorage(GLExt):
    """A context without GL_ARB_compressed_texture_pixel_storage (GL 4.1 drivers)."""

    def has(self, feature: Feature) -> bool:
        return feature is not Feature.COMPRESSED_PIXEL_STORAGE and super().has(feature)


@pytest.mark.parametrize(
    ("slack", "pixel_storage", "calls"),
    [(0, True, 1), (1.0, True, 1), (1.0, False, 6), (16, True, 6)],
    ids=["packed", "padded", "padded-without-pixel-storage", "stride-splits-rows"],
)
def test_padded_ring_slots_upload_in_runs_or_fall_back_to_one_call_a_tile(
    gl_context: moderngl.Context, packs: Packs, slack: float, pixel_storage: bool, calls: int
) -> None:
    """Ring slots larger than the tile (a pack of larger tiles shares the ring): runs step over the
    slack with the unpack modes when the driver has them and the slack is whole rows of blocks;
    otherwise one call per tile. Either way the bytes land exactly."""
    gl = GLExt(gl_context) if pixel_storage else NoCompressedPixelStorage(gl_context)
    with PackReader(packs.zstd) as r:
        raw = r.header.tile_raw_size
    extra = int(raw * slack) if isinstance(slack, float) else slack  # a whole tile, or 16 bytes
    rig = Rig(gl_context, gl, [packs.zstd], ring_slot_bytes=raw + extra)
    try:
        assert rig.up.ring.stride == raw + extra
        tiles = rig.space.tile_ids(0)[:6]
        cache = rig.submit(1, tiles)
        rig.drain_all()
        rig.upload(2)
        assert rig.up.last_calls == calls
        rig.assert_uploaded(tiles, cache)
    finally:
        rig.release()


# ---- the upload path ------------------------------------------------------------------------------
class NoBufferStorage(GLExt):
    """A context without GL_ARB_buffer_storage (GL 4.3 drivers): no persistent mapping."""

    def has(self, feature: Feature) -> bool:
        return feature is not Feature.BUFFER_STORAGE and super().has(feature)


class VideoMemory(GLExt):
    """llvmpipe claiming dedicated video memory, as a discrete GPU's driver reports it."""

    @property
    def reports_video_memory(self) -> bool:
        return True


class NoComputeShaders(VideoMemory):
    """A discrete GPU's driver below GL 4.3: no compute shaders for the staging-texture path."""

    @property
    def has_staging_texture(self) -> bool:
        return False


class NoVideoMemoryLeft(VideoMemory):
    """A driver that refuses the device-local buffer (GL_OUT_OF_MEMORY)."""

    def create_device_buffer(self, size: int) -> DeviceBuffer:
        raise GLError(f"creating a {size}-byte device-local buffer failed: GL_OUT_OF_MEMORY")


@pytest.mark.parametrize(
    ("layer", "asked", "runs"),
    [
        (GLExt, UploadPath.AUTO, UploadPath.HOST_RING),
        (GLExt, UploadPath.DEVICE_BUFFER, UploadPath.DEVICE_BUFFER),
        (VideoMemory, UploadPath.AUTO, UploadPath.DEVICE_BUFFER),
        (NoComputeShaders, UploadPath.AUTO, UploadPath.DEVICE_BUFFER),
        (GLExt, UploadPath.STAGING_TEXTURE, UploadPath.STAGING_TEXTURE),
        (NoComputeShaders, UploadPath.STAGING_TEXTURE, UploadPath.DEVICE_BUFFER),
        (VideoMemory, UploadPath.HOST_RING, UploadPath.HOST_RING),
        (NoBufferStorage, UploadPath.DEVICE_BUFFER, UploadPath.HOST_RING),
        (NoBufferStorage, UploadPath.AUTO, UploadPath.HOST_RING),
        (NoBufferStorage, UploadPath.STAGING_TEXTURE, UploadPath.HOST_RING),
        (NoVideoMemoryLeft, UploadPath.DEVICE_BUFFER, UploadPath.HOST_RING),
    ],
    ids=[
        "auto-shared-memory",
        "device",
        "auto-video-memory",
        "auto-video-memory-without-compute",
        "staging-texture",
        "staging-texture-without-compute",
        "host",
        "device-without-storage",
        "auto-without-storage",
        "staging-texture-without-storage",
        "device-buffer-refused",
    ],
)
def test_the_upload_path_follows_the_config_and_the_context_and_the_budget_counts_its_buffers(
    gl_context: moderngl.Context, packs: Packs, layer: type[GLExt], asked: UploadPath, runs: UploadPath
) -> None:
    """The staging share (ring_mb, at most a quarter of the budget) is split between the host ring
    and the device buffer, both reserved in the budget; without buffer storage the device path falls
    back to the host ring (an orphaned buffer then); and tiles land exactly either way."""
    gl = layer(gl_context)
    space = TileSpace()
    budget = BudgetManager(BudgetConfig(budget_mb=64))
    config = StreamerConfig(upload_path=asked, ring_mb=16, io_threads=2, upload_staging_min_tiles=1)
    with PackReader(packs.zstd) as reader:
        space.register(0, reader.header)
        raw = reader.header.tile_raw_size
        up = Uploader.fitting(
            None, raw, [(0, reader)], ctx=gl_context, gl=gl, space=space, config=config, budget=budget, read_hook=None
        )
    g = SlotGeometry(reader.header.slot_size, raw, 1, 1)
    pool = CachePool(gl, budget, (reader.header.texel_format, True, reader.header.slot_size), 0, g, 16, 2, 0)
    try:
        assert up.upload_path is runs and up.ring.persistent is gl.has_buffer_storage
        assert staging_share.staging_reserved(budget) == staging_share.staging_bytes(config, budget, raw) == 16 << 20
        if runs is UploadPath.DEVICE_BUFFER:
            assert up.device is not None and budget.reserved("staging-device") == up.device.nbytes
            assert up.device.slot_count == 1024  # two frames of 512 tiles
        elif runs is UploadPath.STAGING_TEXTURE:  # the same share, for the arrays
            assert up.device is None and up.textures is not None
            assert budget.reserved("staging-device") == up.textures.share_bytes == 1024 * up.ring.stride
            assert up.textures.nbytes == 0  # made at first use
        else:
            assert up.device is None and up.textures is None and budget.reserved("staging-device") == 0
        assert budget.reserved("staging-ring") >= up.ring.nbytes
        tiles = space.tile_ids(0)[:6]
        cache = pool.ledger.allocate(1, tiles, space.tex[tiles], space.level[tiles]).slots
        assert up.submit(1, tiles, np.zeros(6, np.int64), cache) == 6
        deadline = time.monotonic() + 60.0  # a hang guard, not a speed check
        while up.io.pending:
            assert time.monotonic() < deadline
            up.drain()
            time.sleep(0.001)
        assert len(up.upload(2, [pool]).loads) == 6
        gl_context.finish()
        if up.textures is not None:  # the tiles went through an array, within the share
            assert up.textures.stats().copies >= 1 and up.textures.stats().ring_tiles == 0
            assert 0 < up.textures.nbytes <= budget.reserved("staging-device")
        with PackReader(packs.zstd) as reader:
            for t, s in zip(tiles.tolist(), cache.tolist(), strict=True):
                tex, lv, x, y = (int(v[0]) for v in space.coords(np.array([t])))
                assert gl.read_layer(pool.texture, s) == reader.read_tile(lv, x, y)
        names = [up.ring.glo] + ([up.device.glo] if up.device is not None else [])
        arrays = up.textures.glos if up.textures is not None else ()
    finally:
        up.release()
        staging_share.release_staging(budget)
        pool.release()
    assert staging_share.staging_reserved(budget) == 0
    assert not any(gl.is_buffer(n) for n in names)  # the ring and the device buffer are deleted
    assert not any(gl.is_texture(n) for n in arrays)  # and the staging arrays
