"""The staging ring: upload memory that I/O workers fill directly and the GPU reads from.

One GL_PIXEL_UNPACK_BUFFER, persistently and coherently mapped, is split into fixed-size slots.
A slot goes round one cycle, with its state explicit::

    FREE --acquire()--> FILLING --mark_ready()--> READY --submit()--> IN_FLIGHT --reclaim()--> FREE
                  (worker thread)          (worker thread)       (render thread)     (render thread,
                                                                                  once its fence
                                                                                  signalled)

An I/O worker ``acquire()``-s a slot, decompresses a tile straight into ``slot.view`` (a memoryview
of the mapped memory: no extra copy), and ``mark_ready()``-s it. The render thread uploads READY
slots (``GLExt.upload_layers(texture, regions, ring)``) and then ``submit()``-s them as one batch,
which records ONE fence for the batch. ``reclaim()`` polls the fences without blocking and frees
the slots of signalled batches: a slot is never handed out again before the GPU finished reading
it. When no slot is free, ``acquire()`` returns None and counts a stall (the worker retries later).

Without GL_ARB_buffer_storage (or with ``persistent=False``), the ring keeps the same slots in CPU
memory and ``stage()`` copies a batch into an orphaned GL buffer before its uploads (one
glBufferData(NULL) per batch, then glBufferSubData per slot); ``batch()`` does stage + submit.

Threads: ``acquire``, ``slot.view``, ``mark_ready`` and ``abandon`` are safe from any thread;
``stage``, ``submit``, ``batch``, ``reclaim`` and ``release`` call GL and belong to the render
thread. Stop the workers before ``release()``: it invalidates every slot view, and a view that a
worker still holds an export of keeps the mapping alive (logged) instead of being unmapped.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import moderngl
import numpy as np

from ..errors import GLError
from ..gl.gl_ext import FenceLike, GLExt, MappedBuffer

__all__ = ["RingStats", "Slot", "SlotState", "StagingRing"]

log = logging.getLogger(__name__)

SLOT_ALIGNMENT = 256  # slot offsets in the buffer: good for DMA and every GL offset rule


class SlotState(enum.Enum):
    FREE = "free"  # owned by the ring, may be acquired
    FILLING = "filling"  # a worker writes into it
    READY = "ready"  # filled, waiting for the render thread to upload it
    IN_FLIGHT = "in_flight"  # uploads from it were issued; the GPU may still read it


class Slot:
    """One fixed-size region of the ring. Its state changes only through the ring's methods."""

    __slots__ = ("index", "offset", "capacity", "_view", "_state", "nbytes", "tag")

    def __init__(self, index: int, offset: int, capacity: int, view: memoryview) -> None:
        self.index = index
        self.offset = offset  # byte offset in the GL buffer: pass it to upload_layers
        self.capacity = capacity
        self._view = view
        self._state = SlotState.FREE
        self.nbytes = 0  # bytes filled (set by mark_ready)
        self.tag: Any = None  # caller's payload, e.g. the tile key; cleared when the slot is freed

    @property
    def state(self) -> SlotState:
        return self._state

    @property
    def view(self) -> memoryview:
        """Writable bytes of this slot (``capacity`` long). Do not keep it past ``mark_ready``."""
        return self._view

    def __repr__(self) -> str:
        return f"Slot({self.index}, offset={self.offset}, {self._state.value}, nbytes={self.nbytes})"


@dataclass(frozen=True)
class RingStats:
    """A snapshot of the ring; counters are cumulative since creation."""

    slot_count: int
    slot_bytes: int
    persistent: bool  # True: persistent-mapped buffer storage; False: orphaning fallback
    free: int
    filling: int
    ready: int
    in_flight: int
    batches_in_flight: int
    acquires: int
    stalls: int  # acquire() calls that found no free slot
    bytes_filled: int  # sum of mark_ready() sizes
    bytes_submitted: int  # sum of submitted slot sizes
    batches: int  # submit() calls

    @property
    def occupancy(self) -> float:
        """Fraction of slots not free (0..1)."""
        return 1.0 - self.free / self.slot_count if self.slot_count else 0.0


class StagingRing:
    """Fixed slots in one pixel-unpack buffer, reused only after the GPU finished reading them.

    Args:
        ctx: the moderngl context (used for the fallback buffer).
        gl: the context's `GLExt`.
        size_bytes: total ring size; it holds ``size_bytes // stride`` slots (at least one).
        slot_bytes: capacity of a slot (one tile's raw bytes); the stride rounds it up to 256.
        persistent: True forces persistent mapping (GLError without buffer storage), False forces
            the orphaning fallback, None picks persistent when the context has buffer storage.
        fence_factory: makes the fence of a batch; default ``gl.fence`` (tests inject fakes).
    """

    def __init__(
        self,
        ctx: moderngl.Context,
        gl: GLExt,
        size_bytes: int,
        slot_bytes: int,
        *,
        persistent: bool | None = None,
        fence_factory: Callable[[], FenceLike] | None = None,
    ) -> None:
        if slot_bytes < 1:
            raise ValueError(f"slot_bytes must be positive, got {slot_bytes!r}")
        stride = -(-slot_bytes // SLOT_ALIGNMENT) * SLOT_ALIGNMENT
        count = size_bytes // stride if size_bytes > 0 else 0
        if count < 1:
            raise ValueError(f"a {size_bytes!r}-byte ring cannot hold one {slot_bytes}-byte slot")
        if persistent is None:
            persistent = gl.has_buffer_storage
        self._ctx, self._gl = ctx, gl
        self.slot_bytes, self.stride, self.slot_count = slot_bytes, stride, count
        self.persistent = persistent
        self._fence_factory: Callable[[], FenceLike] = fence_factory or gl.fence
        self._lock = threading.Lock()
        self._closed = False
        total = stride * count
        self._mapped: MappedBuffer | None = None
        self._fallback: moderngl.Buffer | None = None
        self._shadow: np.ndarray | None = None
        if persistent:
            self._mapped = gl.create_mapped_buffer(total)
            views = [self._mapped.view(i * stride, slot_bytes) for i in range(count)]
        else:
            self._fallback = ctx.buffer(reserve=total, dynamic=True)
            self._shadow = np.zeros(total, np.uint8)
            shadow_view = memoryview(self._shadow.data)
            views = [shadow_view[i * stride : i * stride + slot_bytes] for i in range(count)]
        self.slots: tuple[Slot, ...] = tuple(Slot(i, i * stride, slot_bytes, v) for i, v in enumerate(views))
        self._free: deque[Slot] = deque(self.slots)
        self._in_flight: deque[tuple[FenceLike, list[Slot]]] = deque()
        self._acquires = self._stalls = self._batches = 0
        self._bytes_filled = self._bytes_submitted = 0
        log.debug(
            "staging ring: %d slots of %d bytes (%s, %d bytes)",
            count,
            slot_bytes,
            "persistent" if persistent else "orphaning",
            total,
        )

    # -- GL-facing properties -------------------------------------------------------------------
    @property
    def glo(self) -> int:
        """The GL buffer name to bind as GL_PIXEL_UNPACK_BUFFER (what ``upload_layers`` takes)."""
        if self._mapped is not None:
            return self._mapped.glo
        return self._fallback.glo if self._fallback is not None else 0

    @property
    def nbytes(self) -> int:
        """GPU bytes the ring occupies (for the budget)."""
        return self.stride * self.slot_count

    @property
    def closed(self) -> bool:
        return self._closed

    # -- any thread -----------------------------------------------------------------------------
    @property
    def free_count(self) -> int:
        """Slots FREE right now (O(1), unlike `stats()` which counts every state)."""
        return len(self._free)

    @property
    def stall_count(self) -> int:
        """Times `acquire` found no free slot."""
        return self._stalls

    def acquire(self, tag: Any = None) -> Slot | None:
        """A FREE slot, now FILLING; None (and a counted stall) when none is free or after release."""
        with self._lock:
            if self._closed:
                return None
            self._acquires += 1
            if not self._free:
                self._stalls += 1
                return None
            slot = self._free.popleft()
            assert slot._state is SlotState.FREE, f"{slot!r} was on the free list"
            slot._state = SlotState.FILLING
            slot.nbytes = 0
            slot.tag = tag
            return slot

    def mark_ready(self, slot: Slot, nbytes: int | None = None) -> None:
        """The worker filled `nbytes` bytes (default: the whole capacity): FILLING -> READY."""
        n = slot.capacity if nbytes is None else nbytes
        if not 0 < n <= slot.capacity:
            raise ValueError(f"nbytes must be in 1..{slot.capacity}, got {nbytes!r}")
        with self._lock:
            if self._closed:
                return  # released under a late worker: its tile is dropped
            self._expect(slot, SlotState.FILLING, "mark_ready")
            slot._state = SlotState.READY
            slot.nbytes = n
            self._bytes_filled += n

    def abandon(self, slot: Slot) -> None:
        """Give back a slot that will not be uploaded (failed read, cancelled tile): FILLING/READY -> FREE."""
        with self._lock:
            if self._closed:
                return
            if slot._state not in (SlotState.FILLING, SlotState.READY):
                raise ValueError(f"only a filling or ready slot can be abandoned, got {slot!r}")
            self._check_owned(slot)
            self._free_slot(slot)

    # -- render thread --------------------------------------------------------------------------
    def stage(self, slots: Sequence[Slot]) -> None:
        """Make READY slots' bytes readable by GL before uploading them (a no-op when persistent).

        The fallback orphans the GL buffer and copies each slot into it, so everything uploaded
        from the buffer afterwards must be in `slots`: stage, upload and submit one batch at a time.
        """
        with self._lock:
            self._check_open()
            for slot in slots:
                self._expect(slot, SlotState.READY, "stage")
        if self.persistent:
            return
        assert self._fallback is not None
        self._fallback.orphan()
        for slot in slots:
            self._fallback.write(slot.view[: slot.nbytes], offset=slot.offset)

    def submit(self, slots: Sequence[Slot]) -> FenceLike | None:
        """Record one fence after the uploads from `slots` were issued: READY -> IN_FLIGHT.

        Returns the batch's fence (None for an empty batch). Call it on the render thread, right
        after the batch's upload calls.
        """
        if not slots:
            return None
        with self._lock:
            self._check_open()
            for slot in slots:
                self._expect(slot, SlotState.READY, "submit")
            if len({s.index for s in slots}) != len(slots):
                raise ValueError("a slot appears twice in one batch")
        fence = self._fence_factory()
        with self._lock:
            for slot in slots:
                slot._state = SlotState.IN_FLIGHT
                self._bytes_submitted += slot.nbytes
            self._in_flight.append((fence, list(slots)))
            self._batches += 1
        return fence

    @contextlib.contextmanager
    def batch(self, slots: Sequence[Slot]) -> Iterator[int]:
        """``with ring.batch(slots) as pbo: gl.upload_layers(texture, regions, pbo)``.

        Stages the slots, yields the buffer name, and submits (fences) the batch on exit, also when
        the body raised, since some uploads may have been issued already.
        """
        self.stage(slots)
        try:
            yield self.glo
        finally:
            self.submit(slots)

    def reclaim(self) -> int:
        """Free the slots of every batch whose fence signalled (polls, never blocks); returns how many."""
        with self._lock:
            batches = list(self._in_flight)
        done: list[tuple[FenceLike, list[Slot]]] = []
        for fence, slots in batches:
            if fence.signalled():
                done.append((fence, slots))
        if not done:
            return 0
        freed = 0
        with self._lock:
            for fence, slots in done:
                self._in_flight.remove((fence, slots))
                for slot in slots:
                    assert slot._state is SlotState.IN_FLIGHT, f"{slot!r} in a fenced batch"
                    self._free_slot(slot)
                    freed += 1
        for fence, _ in done:
            fence.release()
        return freed

    def stats(self) -> RingStats:
        with self._lock:
            counts = dict.fromkeys(SlotState, 0)
            for slot in self.slots:
                counts[slot._state] += 1
            return RingStats(
                slot_count=self.slot_count,
                slot_bytes=self.slot_bytes,
                persistent=self.persistent,
                free=counts[SlotState.FREE],
                filling=counts[SlotState.FILLING],
                ready=counts[SlotState.READY],
                in_flight=counts[SlotState.IN_FLIGHT],
                batches_in_flight=len(self._in_flight),
                acquires=self._acquires,
                stalls=self._stalls,
                bytes_filled=self._bytes_filled,
                bytes_submitted=self._bytes_submitted,
                batches=self._batches,
            )

    def release(self) -> None:
        """Drop fences, invalidate slot views, unmap and delete the buffer. Idempotent.

        Does not wait for the GPU: GL keeps a deleted buffer alive until commands reading it ended.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            batches = list(self._in_flight)
            self._in_flight.clear()
            self._free.clear()
            busy = [s for s in self.slots if s._state is SlotState.FILLING]
        if busy:
            log.warning(
                "staging ring released while %d slots are being filled; stop the workers first", len(busy)
            )
        for fence, _ in batches:
            fence.release()
        for slot in self.slots:
            with contextlib.suppress(BufferError):  # MappedBuffer.release() handles exported views
                slot._view.release()
        if self._mapped is not None:
            self._mapped.release()
            self._mapped = None
        if self._fallback is not None:
            self._fallback.release()
            self._fallback = None
        self._shadow = None

    def __enter__(self) -> StagingRing:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

    # -- internals ------------------------------------------------------------------------------
    def _free_slot(self, slot: Slot) -> None:
        slot._state = SlotState.FREE
        slot.nbytes = 0
        slot.tag = None
        self._free.append(slot)

    def _check_open(self) -> None:
        if self._closed:
            raise GLError("staging ring used after release")

    def _check_owned(self, slot: Slot) -> None:
        if not (0 <= slot.index < self.slot_count and self.slots[slot.index] is slot):
            raise ValueError(f"{slot!r} does not belong to this ring")

    def _expect(self, slot: Slot, state: SlotState, what: str) -> None:
        self._check_owned(slot)
        if slot._state is not state:
            raise ValueError(f"{what} needs a {state.value} slot, got {slot!r}")
