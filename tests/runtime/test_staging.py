"""The staging ring: slot states, fence-gated reuse (with fake fences: llvmpipe signals at once),
stalls, the orphaning fallback, worker threads, and release."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import moderngl
import pytest

from tests.gl.helpers import encode, make_image
from texstream.errors import GLError
from texstream.gl.gl_ext import GLExt, gl_format
from texstream.pack.format import TexelFormat
from texstream.runtime.staging import SLOT_ALIGNMENT, SlotState, StagingRing

pytestmark = pytest.mark.gl


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
def gl(gl_ctx: moderngl.Context) -> GLExt:
    return GLExt(gl_ctx)


@pytest.fixture(params=[True, False], ids=["persistent", "orphaning"])
def persistent(request: pytest.FixtureRequest) -> bool:
    return request.param


@pytest.fixture
def fences() -> FenceFactory:
    return FenceFactory()


@pytest.fixture
def ring(
    gl_ctx: moderngl.Context, gl: GLExt, persistent: bool, fences: FenceFactory
) -> Iterator[StagingRing]:
    r = StagingRing(
        gl_ctx, gl, size_bytes=3 * 1024, slot_bytes=1000, persistent=persistent, fence_factory=fences
    )
    yield r
    r.release()


def fill(ring: StagingRing, value: int, nbytes: int = 1000):
    slot = ring.acquire(tag=("tile", value))
    assert slot is not None
    slot.view[:nbytes] = bytes([value]) * nbytes
    ring.mark_ready(slot, nbytes)
    return slot


def test_geometry(ring: StagingRing, persistent: bool) -> None:
    assert ring.slot_count == 3 and ring.stride == 1024 and ring.stride % SLOT_ALIGNMENT == 0
    assert [s.offset for s in ring.slots] == [0, 1024, 2048]
    assert all(len(s.view) == 1000 and s.capacity == 1000 for s in ring.slots)
    assert ring.nbytes == 3 * 1024 and ring.glo != 0 and ring.persistent is persistent
    st = ring.stats()
    assert (st.free, st.occupancy, st.stalls, st.slot_count) == (3, 0.0, 0, 3)


def test_slot_is_not_reused_before_its_fence_signals(ring: StagingRing, fences: FenceFactory) -> None:
    a, b, c = (fill(ring, v) for v in (1, 2, 3))
    assert ring.acquire() is None and ring.stats().stalls == 1  # full: a stall, no slot
    ring.stage([a, b])
    fence_ab = ring.submit([a, b])
    ring.stage([c])
    fence_c = ring.submit([c])
    assert len(fences.made) == 2 and fence_ab is fences.made[0]  # ONE fence per batch
    assert {s.state for s in (a, b, c)} == {SlotState.IN_FLIGHT}
    # unsignalled fences: nothing comes back, however often we poll
    for _ in range(3):
        assert ring.reclaim() == 0
        assert ring.acquire() is None
    assert ring.stats().stalls == 4 and fence_ab.polls >= 3
    # the later batch signals first: only its slot returns
    fences.made[1].signal = True
    assert ring.reclaim() == 1 and c.state is SlotState.FREE and c.tag is None
    assert fence_c is not None and fences.made[1].released == 1
    again = ring.acquire()
    assert again is c and ring.acquire() is None
    assert a.state is SlotState.IN_FLIGHT and b.state is SlotState.IN_FLIGHT
    # the first batch signals: both of its slots return, its fence is released once
    fences.made[0].signal = True
    assert ring.reclaim() == 2 and fences.made[0].released == 1
    assert ring.reclaim() == 0
    got = {ring.acquire(), ring.acquire()}
    assert got == {a, b} and ring.acquire() is None
    st = ring.stats()
    assert st.filling == 3 and st.occupancy == 1.0 and st.batches == 2 and st.batches_in_flight == 0
    assert st.bytes_filled == 3000 and st.bytes_submitted == 3000 and st.stalls == 6


def test_state_machine_rejects_out_of_order_calls(ring: StagingRing) -> None:
    slot = ring.acquire()
    assert slot is not None and slot.state is SlotState.FILLING
    with pytest.raises(ValueError, match="ready slot"):
        ring.submit([slot])  # not filled yet
    with pytest.raises(ValueError, match="nbytes"):
        ring.mark_ready(slot, 1001)
    with pytest.raises(ValueError, match="nbytes"):
        ring.mark_ready(slot, 0)
    ring.mark_ready(slot)  # whole capacity
    assert slot.nbytes == 1000 and slot.state is SlotState.READY
    with pytest.raises(ValueError, match="filling slot"):
        ring.mark_ready(slot)
    with pytest.raises(ValueError, match="twice"):
        ring.submit([slot, slot])
    ring.submit([slot])
    with pytest.raises(ValueError, match="abandon"):
        ring.abandon(slot)  # in flight: only its fence frees it
    with pytest.raises(ValueError, match="ready slot"):
        ring.submit([slot])
    assert ring.submit([]) is None


def test_slots_of_another_ring_are_refused(gl_ctx: moderngl.Context, gl: GLExt, ring: StagingRing) -> None:
    with StagingRing(gl_ctx, gl, 4096, 1000, fence_factory=FakeFence) as other:
        foreign = other.acquire()
        assert foreign is not None
        with pytest.raises(ValueError, match="does not belong"):
            ring.mark_ready(foreign)


def test_abandon_returns_filling_and_ready_slots(ring: StagingRing) -> None:
    a = ring.acquire()
    b = fill(ring, 9)
    assert a is not None
    ring.abandon(a)
    ring.abandon(b)
    st = ring.stats()
    assert st.free == 3 and st.filling == 0 and st.ready == 0


def test_batch_context_fences_even_when_the_upload_raises(ring: StagingRing, fences: FenceFactory) -> None:
    slot = fill(ring, 5)
    with pytest.raises(RuntimeError, match="boom"):
        with ring.batch([slot]) as pbo:
            assert pbo == ring.glo
            raise RuntimeError("boom")
    assert slot.state is SlotState.IN_FLIGHT and len(fences.made) == 1


def test_argument_checks(gl_ctx: moderngl.Context, gl: GLExt) -> None:
    with pytest.raises(ValueError, match="slot_bytes"):
        StagingRing(gl_ctx, gl, 4096, 0)
    with pytest.raises(ValueError, match="cannot hold one"):
        StagingRing(gl_ctx, gl, 100, 1000)


def test_auto_mode_follows_buffer_storage(gl_ctx: moderngl.Context, gl: GLExt) -> None:
    with StagingRing(gl_ctx, gl, 4096, 256) as r:
        assert r.persistent is gl.has_buffer_storage


def test_release_is_idempotent_and_final(gl_ctx: moderngl.Context, gl: GLExt, persistent: bool) -> None:
    fences = FenceFactory()
    r = StagingRing(gl_ctx, gl, 4096, 1024, persistent=persistent, fence_factory=fences)
    name = r.glo
    a = fill(r, 1, 1024)
    r.submit([a])
    held = r.acquire()
    assert held is not None
    r.release()
    r.release()
    assert r.closed and not gl.is_buffer(name)
    assert fences.made[0].released == 1  # in-flight fences are dropped, not waited for
    assert r.acquire() is None  # workers asking after shutdown get nothing (and no stall)
    r.mark_ready(held)  # a late worker's tile is dropped quietly
    if persistent:
        with pytest.raises(ValueError):
            held.view[0] = 1  # never a write into unmapped memory
    with pytest.raises(GLError, match="after release"):
        r.submit([a])


def test_workers_fill_while_the_render_thread_uploads(
    gl_ctx: moderngl.Context, gl: GLExt, persistent: bool
) -> None:
    """Four workers fill slots concurrently; every tile lands intact in its layer (real GL fences)."""
    f = gl_format(TexelFormat.BC1)
    size, per_worker, workers = 16, 12, 4
    n = f.layer_bytes(size)
    tiles = {k: encode(TexelFormat.BC1, make_image(size, k)) for k in range(per_worker * workers)}
    ring = StagingRing(gl_ctx, gl, 5 * n, n, persistent=persistent)
    tex = gl.create_texture_array(f, size, len(tiles))
    done = threading.Event()
    errors: list[BaseException] = []

    def worker(first: int) -> None:
        try:
            for key in range(first, first + per_worker):
                while (slot := ring.acquire(tag=key)) is None:
                    if done.wait(0.0005):
                        return
                slot.view[:n] = tiles[key]
                ring.mark_ready(slot, n)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w * per_worker,)) for w in range(workers)]
    for t in threads:
        t.start()
    uploaded = 0
    try:
        deadline = time.monotonic() + 60.0  # a hang guard, not a speed check
        while uploaded < len(tiles) and not errors and time.monotonic() < deadline:
            ring.reclaim()
            ready = [s for s in ring.slots if s.state is SlotState.READY]
            if not ready:
                time.sleep(0.0005)  # a frame's worth of other work
                continue
            with ring.batch(ready) as pbo:
                gl.upload_layers(tex, [(s.tag, s.offset, s.nbytes) for s in ready], pbo)
            uploaded += len(ready)
        done.set()
        for t in threads:
            t.join(10)
        assert not errors, errors
        assert uploaded == len(tiles)
        for key, data in tiles.items():
            assert gl.read_layer(tex, key) == data, key
        gl_ctx.finish()
        ring.reclaim()
        st = ring.stats()
        assert st.free == ring.slot_count and st.bytes_submitted == len(tiles) * n
    finally:
        done.set()
        tex.release()
        ring.release()
