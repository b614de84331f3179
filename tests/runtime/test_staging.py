"""The staging ring: integer slots going FREE -> HELD -> IN_FLIGHT -> FREE, stalls, ONE fence per batch,
reuse only after that fence (fake fences: llvmpipe signals at once), state checks, the orphaning
fallback's `stage`, uploads from the slots into a texture array, threads filling slots, and release.
Every behaviour runs in both modes (persistent mapping and orphaning)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import moderngl
import numpy as np
import pytest

from texstream.errors import GLError
from texstream.gl.enums import gl_format
from texstream.gl.gl_ext import GLExt
from texstream.gl.objects import TextureArray
from texstream.pack.format import TexelFormat
from texstream.runtime.staging import SLOT_ALIGNMENT, RingSlotState, StagingRing

pytestmark = pytest.mark.gl

CELL = 136  # a production slot: 128 content texels and a 4-texel border on each side
BC1 = gl_format(TexelFormat.BC1, False)
CELL_BYTES = BC1.layer_bytes(CELL)  # 9248: one BC1 cell, any bytes are valid BC1 blocks
STRIDE = -(-CELL_BYTES // SLOT_ALIGNMENT) * SLOT_ALIGNMENT


class FakeFence:
    """Signals only when the test says so."""

    def __init__(self) -> None:
        self.signal = False
        self.released = 0
        self.polls = 0

    def signalled(self) -> bool:
        self.polls += 1
        return self.signal

    def release(self) -> None:
        self.released += 1


class FenceFactory:
    def __init__(self) -> None:
        self.made: list[FakeFence] = []

    def __call__(self) -> FakeFence:
        self.made.append(FakeFence())
        return self.made[-1]


@pytest.fixture(scope="module")
def gl(gl_context: moderngl.Context) -> GLExt:
    return GLExt(gl_context)


@pytest.fixture(params=[True, False], ids=["persistent", "orphaning"])
def persistent(request: pytest.FixtureRequest) -> bool:
    return request.param


@pytest.fixture
def fences() -> FenceFactory:
    return FenceFactory()


@pytest.fixture
def ring(gl_context: moderngl.Context, gl: GLExt, persistent: bool, fences: FenceFactory) -> Iterator[StagingRing]:
    r = StagingRing(gl_context, gl, size_bytes=3 * 1024, slot_bytes=1000, persistent=persistent, fence_factory=fences)
    yield r
    r.release()


@pytest.fixture
def cells(gl: GLExt) -> Iterator[TextureArray]:
    tex = gl.create_texture_array(BC1, CELL, 8)
    yield tex
    tex.release()


def as_set(slots: np.ndarray) -> set[int]:
    return {int(s) for s in slots}


def tile_bytes(seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, CELL_BYTES, dtype=np.uint8).tobytes()


def write(ring: StagingRing, slot: int, data: bytes) -> None:
    """What an I/O thread does: write a tile into the memory of a slot handed to it."""
    o = int(ring.offsets(np.array([slot]))[0])
    ring.memory[o : o + len(data)] = np.frombuffer(data, np.uint8)


def upload(gl: GLExt, ring: StagingRing, tex: TextureArray, slots: np.ndarray, layers: list[int]) -> int:
    n = len(layers)
    zeros = np.zeros(n, np.int64)
    return gl.upload_cell_batch(tex, np.array(layers, np.int64), zeros, zeros, ring.offsets(slots), CELL, ring.glo)


# ---- geometry and arguments ------------------------------------------------------------------------
def test_geometry(ring: StagingRing, persistent: bool) -> None:
    assert ring.slot_count == 3 and ring.stride == 1008 and ring.stride % SLOT_ALIGNMENT == 0
    assert ring.offsets(np.array([0, 1, 2])).tolist() == [0, 1008, 2016]
    assert all(len(ring.view(s)) == 1000 for s in range(3))
    assert ring.nbytes == 3 * 1008 and ring.glo != 0 and ring.persistent is persistent
    assert ring.memory.dtype == np.uint8 and ring.memory.size == 3 * 1008
    assert ring.address == ring.memory.ctypes.data
    assert ring.state.tolist() == [RingSlotState.FREE] * 3 and ring.free_count == 3 and not ring.closed
    st = ring.stats()
    assert (st.slot_count, st.slot_bytes, st.persistent) == (3, 1000, persistent)
    assert (st.free, st.held, st.in_flight, st.batches_in_flight) == (3, 0, 0, 0)
    assert (st.acquired, st.stalls, st.bytes_submitted, st.batches, st.occupancy) == (0, 0, 0, 0, 0.0)


def test_view_is_the_slots_memory(ring: StagingRing) -> None:
    before = ring.memory.copy()
    ring.view(1)[:4] = b"\x01\x02\x03\x04"
    assert ring.memory[1008:1012].tolist() == [1, 2, 3, 4]
    changed = np.flatnonzero(ring.memory != before)
    assert set(changed.tolist()) <= {1008, 1009, 1010, 1011}


def test_argument_checks(gl_context: moderngl.Context, gl: GLExt) -> None:
    with pytest.raises(ValueError, match="slot_bytes"):
        StagingRing(gl_context, gl, 4096, 0)
    with pytest.raises(ValueError, match="cannot hold one"):
        StagingRing(gl_context, gl, 100, 1000)
    with pytest.raises(ValueError, match="cannot hold one"):
        StagingRing(gl_context, gl, 0, 256)
    with StagingRing(gl_context, gl, 4096, 257) as r:  # the stride rounds up to the slot alignment
        assert (r.stride, r.slot_count, r.nbytes) == (272, 15, 4080)
    with StagingRing(gl_context, gl, 4 * 9248, 9248) as r:  # a 136-texel BC1 tile: packed, no slack
        assert r.stride == 9248 and r.slot_count == 4


def test_auto_mode_follows_buffer_storage(gl_context: moderngl.Context, gl: GLExt) -> None:
    with StagingRing(gl_context, gl, 4096, 256) as r:
        assert r.persistent is gl.has_buffer_storage


# ---- the cycle ---------------------------------------------------------------------------------
def test_acquire_hands_out_distinct_free_slots_and_counts_stalls(ring: StagingRing) -> None:
    a = ring.acquire(2)
    assert a.size == 2 and len(as_set(a)) == 2 and (ring.state[a] == RingSlotState.HELD).all()
    assert ring.acquire(0).size == 0 and ring.stall_count == 0  # asking for nothing is no stall
    b = ring.acquire(5)  # fewer than asked: the last slot, and a stall
    assert b.size == 1 and as_set(a) | as_set(b) == {0, 1, 2}
    assert ring.acquire(1).size == 0  # dry
    st = ring.stats()
    assert (st.acquired, st.stalls, st.held, st.free, st.occupancy) == (3, 2, 3, 0, 1.0)
    assert ring.stall_count == 2 and ring.free_count == 0


def test_slots_come_in_ring_order_from_the_cursor(gl_context: moderngl.Context, gl: GLExt) -> None:
    """acquire hands out consecutive slots from where the last one ended, wrapping once, skipping
    slots still held or in flight: a frame's loads get one contiguous span wherever the ring allows."""
    fences = FenceFactory()
    with StagingRing(gl_context, gl, 10 * 1008, 1000, fence_factory=fences) as r:
        a = r.acquire(4)
        np.testing.assert_array_equal(a, [0, 1, 2, 3])
        r.submit(a)
        b = r.acquire(3)
        np.testing.assert_array_equal(b, [4, 5, 6])
        r.abandon(b[1:2])  # slot 5 back early: the cursor moves on regardless
        np.testing.assert_array_equal(r.acquire(2), [7, 8])
        fences.made[0].signal = True
        assert r.reclaim().size == 4
        # from slot 9, wrapping past the held 4 and 6: 9, then 0..3, then 5
        got = r.acquire(6)
        np.testing.assert_array_equal(got, [9, 0, 1, 2, 3, 5])
        assert r.free_count == 0 and (r.state == RingSlotState.HELD).all()


def test_slot_is_not_reused_before_its_fence_signals(ring: StagingRing, fences: FenceFactory) -> None:
    a, b = ring.acquire(2), ring.acquire(1)
    assert ring.acquire(1).size == 0 and ring.stats().stalls == 1  # full: a stall, no slot
    ring.stage(a, 1000)
    fence_a = ring.submit(a, 2000)
    ring.stage(b, 1000)
    fence_b = ring.submit(b, 1000)
    assert len(fences.made) == 2 and fence_a is fences.made[0] and fence_b is fences.made[1]  # ONE fence per batch
    assert (ring.state == RingSlotState.IN_FLIGHT).all() and ring.batches_in_flight == 2
    for _ in range(3):  # unsignalled fences: nothing comes back, however often we poll
        assert ring.reclaim().size == 0
        assert ring.acquire(1).size == 0
    assert ring.stats().stalls == 4 and fences.made[0].polls >= 3
    assert fences.made[1].polls == 0  # polling stops at the oldest pending fence
    # The later batch signals first: it still waits behind the older one.
    fences.made[1].signal = True
    assert ring.reclaim().size == 0 and fences.made[1].polls == 0 and fences.made[1].released == 0
    assert (ring.state == RingSlotState.IN_FLIGHT).all() and ring.acquire(1).size == 0
    # The first batch signals: both batches come back, each fence released once.
    fences.made[0].signal = True
    freed = ring.reclaim()
    assert freed.size == 3 and as_set(freed) == {0, 1, 2}
    assert fences.made[0].released == 1 and fences.made[1].released == 1
    assert ring.reclaim().size == 0 and fences.made[0].released == 1  # nothing left, nothing released twice
    assert (ring.state == RingSlotState.FREE).all() and ring.batches_in_flight == 0
    again = ring.acquire(3)
    assert as_set(again) == {0, 1, 2}
    st = ring.stats()
    assert (st.held, st.occupancy, st.batches, st.batches_in_flight) == (3, 1.0, 2, 0)
    assert st.bytes_submitted == 3000 and st.acquired == 6 and st.stalls == 5


def test_reclaim_frees_each_batch_once_its_fence_signals_in_order(ring: StagingRing, fences: FenceFactory) -> None:
    batches = [ring.acquire(1) for _ in range(3)]
    for s in batches:
        ring.submit(s)
    fences.made[0].signal = True
    assert ring.reclaim().tolist() == batches[0].tolist()
    assert ring.state[batches[0]][0] == RingSlotState.FREE and ring.batches_in_flight == 2
    fences.made[2].signal = True  # out of order: blocked behind batch 1
    assert ring.reclaim().size == 0 and ring.state[batches[2]][0] == RingSlotState.IN_FLIGHT
    fences.made[1].signal = True
    assert as_set(ring.reclaim()) == as_set(batches[1]) | as_set(batches[2])
    assert [f.released for f in fences.made] == [1, 1, 1] and ring.free_count == 3


def test_abandon_returns_held_slots(ring: StagingRing, fences: FenceFactory) -> None:
    held = ring.acquire(3)
    ring.abandon(held[:2])
    st = ring.stats()
    assert (st.free, st.held) == (2, 1) and ring.free_count == 2 and not fences.made
    assert (ring.state[held[:2]] == RingSlotState.FREE).all()
    assert as_set(ring.acquire(3)) == as_set(held[:2])  # they are handed out again (and nothing else is free)
    ring.abandon(np.zeros(0, np.int64))  # nothing: fine


def test_state_checks_raise_value_error(ring: StagingRing, fences: FenceFactory) -> None:
    with pytest.raises(ValueError, match="needs HELD"):
        ring.submit(np.array([0]))  # never acquired
    with pytest.raises(ValueError, match="needs HELD"):
        ring.stage(np.array([0]), 1000)
    with pytest.raises(ValueError, match="needs HELD"):
        ring.abandon(np.array([0]))
    s = ring.acquire(1)
    with pytest.raises(ValueError, match="twice"):
        ring.submit(np.concatenate([s, s]))
    assert ring.state[s[0]] == RingSlotState.HELD and not fences.made  # a refused batch changes nothing
    ring.submit(s)
    for call in (ring.abandon, ring.submit, lambda x: ring.stage(x, 1000)):  # in flight: only its fence frees it
        with pytest.raises(ValueError, match="IN_FLIGHT"):
            call(s)
    other = ring.acquire(1)
    with pytest.raises(ValueError, match="IN_FLIGHT"):
        ring.submit(np.concatenate([other, s]))  # one bad slot refuses the whole batch
    with pytest.raises(ValueError, match="IN_FLIGHT"):
        ring.abandon(np.concatenate([other, s]))
    assert ring.state[other[0]] == RingSlotState.HELD and ring.free_count == 1 and len(fences.made) == 1
    for bad in (np.array([3]), np.array([-1])):
        for call in (ring.abandon, ring.submit, lambda x: ring.stage(x, 1000)):
            with pytest.raises(ValueError, match="out of range"):
                call(bad)
    assert ring.submit(np.zeros(0, np.int64)) is None and len(fences.made) == 1  # an empty batch: no fence
    assert ring.stats().batches == 1


def test_abandoning_a_slot_twice_in_one_call_does_not_free_it_twice(ring: StagingRing) -> None:
    """`submit` refuses a slot listed twice; `abandon` must not push it on the free list twice
    (or later `acquire`s hand the same slot to two loads)."""
    s = ring.acquire(1)
    try:
        ring.abandon(np.concatenate([s, s]))
    except ValueError:
        pass  # refusing is as good as freeing it once
    assert ring.free_count == ring.stats().free, "the free list disagrees with the slot states"
    got = ring.acquire(ring.slot_count + 1)
    assert np.unique(got).size == got.size, f"one slot handed out twice: {got.tolist()}"


# ---- uploads through the buffer ---------------------------------------------------------------------
def test_batches_land_in_their_layers_and_reuse_after_the_fence_keeps_them(
    gl_context: moderngl.Context, gl: GLExt, persistent: bool, cells: TextureArray
) -> None:
    """Each batch is staged, uploaded and fenced on its own; a later batch (which orphans the whole
    buffer in the fallback) and reusing the first batch's slots after its fence leave the layers
    uploaded before exactly as they were."""
    fences = FenceFactory()
    with StagingRing(gl_context, gl, 4 * STRIDE, CELL_BYTES, persistent=persistent, fence_factory=fences) as ring:
        data = {layer: tile_bytes(layer) for layer in range(6)}

        def batch(layers: list[int]) -> np.ndarray:
            slots = ring.acquire(len(layers))
            assert slots.size == len(layers)
            for s, layer in zip(slots.tolist(), layers, strict=True):
                write(ring, s, data[layer])
            ring.stage(slots, CELL_BYTES)
            assert (ring.state[slots] == RingSlotState.HELD).all()  # staging changes no state
            assert upload(gl, ring, cells, slots, layers) == len(layers) * CELL_BYTES
            ring.submit(slots, len(layers) * CELL_BYTES)
            return slots

        first = batch([0, 1])
        batch([2, 3])
        assert ring.free_count == 0 and len(fences.made) == 2
        gl_context.finish()  # the GPU really is done: now the fake fence may say so
        fences.made[0].signal = True
        assert as_set(ring.reclaim()) == as_set(first)
        assert as_set(batch([4, 5])) == as_set(first)  # the same slots, new bytes
        for layer, want in data.items():
            assert gl.read_layer(cells, layer) == want, f"layer {layer}"
        assert ring.stats().bytes_submitted == 6 * CELL_BYTES


def test_stage_copies_the_bytes_of_that_moment_in_the_fallback(
    gl_context: moderngl.Context, gl: GLExt, persistent: bool, cells: TextureArray
) -> None:
    """Orphaning: `stage` copies the slot into GL, so later writes miss the upload. Persistent: the
    coherent mapping is the buffer, so the upload reads what the slot holds when it is issued."""
    staged, later = tile_bytes(10), tile_bytes(11)
    with StagingRing(gl_context, gl, 2 * STRIDE, CELL_BYTES, persistent=persistent, fence_factory=FenceFactory()) as r:
        s = r.acquire(1)
        write(r, int(s[0]), staged)
        r.stage(s, CELL_BYTES)
        write(r, int(s[0]), later)
        upload(gl, r, cells, s, [0])
        r.submit(s, CELL_BYTES)
        assert gl.read_layer(cells, 0) == (later if persistent else staged)


def test_threads_fill_slots_while_the_render_thread_uploads(
    gl_context: moderngl.Context, gl: GLExt, persistent: bool
) -> None:
    """The render thread hands slots to four threads that write tiles into them, then stages,
    uploads and fences what they filled; real fences gate reuse. Every tile lands intact."""
    count, workers = 48, 4
    tiles = {k: tile_bytes(100 + k) for k in range(count)}
    ring = StagingRing(gl_context, gl, 5 * STRIDE, CELL_BYTES, persistent=persistent)
    tex = gl.create_texture_array(BC1, CELL, count)
    jobs: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
    done: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            while (job := jobs.get()) is not None:
                slot, key = job
                write(ring, slot, tiles[key])
                done.put(job)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    try:
        next_key = uploaded = 0
        deadline = time.monotonic() + 60.0  # a hang guard, not a speed check
        while uploaded < count and not errors and time.monotonic() < deadline:
            ring.reclaim()
            slots = ring.acquire(min(ring.free_count, count - next_key))
            for s in slots.tolist():
                jobs.put((s, next_key))
                next_key += 1
            filled = []
            try:
                filled.append(done.get(timeout=0.001))  # a frame's worth of other work
                while True:
                    filled.append(done.get_nowait())
            except queue.Empty:
                pass
            if not filled:
                continue
            s = np.array([f[0] for f in filled], np.int64)
            ring.stage(s, CELL_BYTES)
            upload(gl, ring, tex, s, [f[1] for f in filled])
            ring.submit(s, s.size * CELL_BYTES)
            uploaded += len(filled)
        assert not errors, errors
        assert uploaded == count
        for key, want in tiles.items():
            assert gl.read_layer(tex, key) == want, key
        gl_context.finish()
        ring.reclaim()
        st = ring.stats()
        assert st.free == ring.slot_count and st.bytes_submitted == count * CELL_BYTES and st.acquired == count
    finally:
        for _ in threads:
            jobs.put(None)
        for t in threads:
            t.join(10)
        tex.release()
        ring.release()


# ---- release ------------------------------------------------------------------------------------
def test_release_is_idempotent_and_later_use_raises(gl_context: moderngl.Context, gl: GLExt, persistent: bool) -> None:
    fences = FenceFactory()
    r = StagingRing(gl_context, gl, 4096, 1024, persistent=persistent, fence_factory=fences)
    name = r.glo
    a = r.acquire(1)
    r.submit(a, 1024)
    held = r.acquire(1)
    r.release()
    r.release()
    assert r.closed and r.glo == 0 and not gl.is_buffer(name)
    assert fences.made[0].released == 1 and fences.made[0].polls == 0  # in-flight fences dropped, not waited for
    assert r.free_count == 0 and r.memory.size == 0  # never a write into unmapped memory
    r.abandon(held)  # a late reader's slot is dropped quietly
    assert r.reclaim().size == 0
    with pytest.raises(GLError, match="after release"):
        r.acquire(1)
    with pytest.raises(GLError, match="after release"):
        r.submit(held)
    with pytest.raises(GLError, match="after release"):
        r.stage(held, 1024)
    assert fences.made[0].released == 1 and len(fences.made) == 1
