"""The staging ring: upload memory that I/O threads fill directly and the GPU reads from.

One GL_PIXEL_UNPACK_BUFFER, persistently and coherently mapped, split into fixed-size slots named by
integers. A slot goes round one cycle, its state explicit (`RingSlotState`, one uint8 per slot)::

    FREE --acquire()--> HELD --submit()--> IN_FLIGHT --reclaim(), once its batch's fence signalled--> FREE
                          |
                          +--abandon()--> FREE          (a read failed or its tile was cancelled)

While a slot is HELD its bytes belong to whoever the uploader handed it to (an I/O thread writes a
tile into it, or the render thread reads it for an upload). Slots are handed out in ring order from
a cursor (the free slots after the last one handed out, wrapping once), so one `acquire` gets
consecutive slots wherever the ring is free there: a run of them is one contiguous span of buffer
memory, which one upload call can read. ``submit`` fences a whole upload batch
with ONE fence; ``reclaim`` polls only the oldest fences (they signal in submission order) and never
blocks, so a slot is never handed out again before the GPU finished reading it.

Without GL_ARB_buffer_storage (or with ``persistent=False``) the slots live in CPU memory and
``stage`` copies a batch into an orphaned GL buffer before its uploads.

Threads: the ring's methods belong to the render thread (they change slot states and call GL); I/O
threads only write into the memory of slots handed to them (`memory`, `address`).
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import moderngl
import numpy as np

from ..errors import GLError
from ..gl.gl_ext import GLExt
from ..gl.objects import FenceLike, MappedBuffer

__all__ = ["RingStats", "SLOT_ALIGNMENT", "RingSlotState", "StagingRing"]

log = logging.getLogger(__name__)

#: Slot offsets in the buffer are multiples of this. 16 keeps every GL offset rule and SIMD copies
#: happy while letting the stride equal a tile's bytes (BC rows are multiples of 16 bytes for
#: slots of a multiple of 8 texels), so a run of slots is a run of tightly packed layers.
SLOT_ALIGNMENT = 16


def _has_duplicates(slots: np.ndarray) -> bool:
    """Whether a slot appears twice (by sorting: numpy 2's ``np.unique`` takes a hash path that costs
    tens of microseconds on a frame's few hundred slots)."""
    if slots.size < 2:
        return False
    t = np.sort(slots)
    return bool((t[1:] == t[:-1]).any())


class RingSlotState(enum.IntEnum):
    FREE = 0  # the ring's; may be acquired
    HELD = 1  # handed out: being filled by an I/O thread or waiting for its upload
    IN_FLIGHT = 2  # uploads from it were issued; the GPU may still read it until its fence signals


# plain ints of the states for per-frame array code (enum attribute lookups are slow)
_FREE = int(RingSlotState.FREE)
_HELD = int(RingSlotState.HELD)
_IN_FLIGHT = int(RingSlotState.IN_FLIGHT)


@dataclass(frozen=True)
class RingStats:
    """A snapshot of the ring; counters are cumulative since creation."""

    slot_count: int
    slot_bytes: int
    persistent: bool  # True: persistent-mapped buffer storage; False: orphaning fallback
    free: int
    held: int
    in_flight: int
    batches_in_flight: int
    acquired: int
    stalls: int  # acquire() calls that got fewer slots than asked
    bytes_submitted: int
    batches: int

    @property
    def occupancy(self) -> float:
        """Fraction of slots not free (0..1)."""
        return 1.0 - self.free / self.slot_count if self.slot_count else 0.0


class StagingRing:
    """Fixed slots in one pixel-unpack buffer, reused only after the GPU finished reading them.

    Parameters
    ----------
    ctx
        The moderngl context (used for the fallback buffer).
    gl
        The context's `GLExt`.
    size_bytes
        Total ring size; it holds ``size_bytes // stride`` slots (at least one).
    slot_bytes
        Capacity of a slot (one tile's raw bytes); the stride rounds it up to 256.
    persistent
        True forces persistent mapping (GLError without buffer storage), False forces
        the orphaning fallback, None picks persistent when the context has buffer storage.
    fence_factory
        Makes the fence of a batch; default ``gl.fence`` (tests inject fakes).
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
        self.fence_factory: Callable[[], FenceLike] = fence_factory or gl.fence
        total = stride * count
        self._mapped: MappedBuffer | None = None
        self._fallback: moderngl.Buffer | None = None
        if persistent:
            self._mapped = gl.create_mapped_buffer(total)
            self.memory = self._mapped.array()
        else:
            self._fallback = ctx.buffer(reserve=total, dynamic=True)
            self.memory = np.zeros(total, np.uint8)
        self.state = np.zeros(count, np.uint8)
        self._cursor = 0  # the next slot to hand out when free (ring order)
        self._free_count = count
        self._batches: deque[tuple[FenceLike, np.ndarray]] = deque()
        self._acquired = self._stalls = self._batch_count = self._bytes_submitted = 0
        self._closed = False
        log.debug(
            "staging ring: %d slots of %d bytes (%s)", count, slot_bytes, "persistent" if persistent else "orphaning"
        )

    # ---- properties -----------------------------------------------------------------------------
    @property
    def glo(self) -> int:
        """The GL buffer name to bind as GL_PIXEL_UNPACK_BUFFER."""
        if self._mapped is not None:
            return self._mapped.glo
        return self._fallback.glo if self._fallback is not None else 0

    @property
    def address(self) -> int:
        """Address of slot 0's first byte in this process (for compiled readers)."""
        return int(self.memory.ctypes.data)

    @property
    def nbytes(self) -> int:
        """GPU bytes the ring occupies (for the budget)."""
        return self.stride * self.slot_count

    @property
    def free_count(self) -> int:
        return self._free_count

    @property
    def stall_count(self) -> int:
        return self._stalls

    @property
    def closed(self) -> bool:
        return self._closed

    def offsets(self, slots: np.ndarray) -> np.ndarray:
        """Byte offset of each slot in the buffer (the upload's PBO offset)."""
        return np.asarray(slots, np.int64) * self.stride

    def view(self, slot: int) -> memoryview:
        """Writable bytes of one slot (tests and the blocking path)."""
        o = int(slot) * self.stride
        return memoryview(self.memory[o : o + self.slot_bytes])

    # ---- the cycle ------------------------------------------------------------------------------
    def acquire(self, count: int) -> np.ndarray:
        """Up to `count` FREE slots, now HELD (fewer, and a counted stall, when the ring runs dry), in
        ring order from the cursor: consecutive wherever the ring is free there."""
        self._check_open()
        take = min(int(count), self._free_count)
        if take < count:
            self._stalls += 1
        if take <= 0:
            return np.zeros(0, np.int64)
        free = (self.state == _FREE).nonzero()[0]
        at = int(np.searchsorted(free, self._cursor))
        out = np.concatenate([free[at : at + take], free[: max(0, take - (free.size - at))]])
        self._cursor = (int(out[-1]) + 1) % self.slot_count
        self._free_count -= take
        self.state[out] = _HELD
        self._acquired += take
        return out

    def abandon(self, slots: np.ndarray) -> None:
        """HELD -> FREE for slots that will not be uploaded (failed read, cancelled tile)."""
        s = self._expect(slots, _HELD, "abandon")
        if _has_duplicates(s):
            raise ValueError("a slot appears twice in one abandon call")
        if s.size and not self._closed:
            self.state[s] = _FREE
            self._free_count += int(s.size)

    def stage(self, slots: np.ndarray, nbytes: np.ndarray | int) -> None:
        """Make HELD slots readable by GL before uploading them (a no-op when persistent).

        The fallback orphans the GL buffer and copies each slot into it, so everything uploaded from
        the buffer afterwards must be in `slots`: stage, upload and submit one batch at a time.
        """
        s = self._expect(slots, _HELD, "stage")
        if self.persistent:
            return
        assert self._fallback is not None
        self._fallback.orphan()
        sizes = np.broadcast_to(np.asarray(nbytes, np.int64), s.shape)
        for slot, n in zip(s.tolist(), sizes.tolist(), strict=True):
            o = slot * self.stride
            self._fallback.write(self.memory[o : o + n], offset=o)

    def submit(self, slots: np.ndarray, nbytes: int = 0) -> FenceLike | None:
        """Fence the uploads just issued from `slots`: HELD -> IN_FLIGHT under ONE fence."""
        s = self._expect(slots, _HELD, "submit")
        if s.size == 0:
            return None
        if _has_duplicates(s):
            raise ValueError("a slot appears twice in one batch")
        fence = self.fence_factory()
        self.state[s] = _IN_FLIGHT
        self._batches.append((fence, s.copy()))
        self._batch_count += 1
        self._bytes_submitted += int(nbytes)
        return fence

    def reclaim(self) -> np.ndarray:
        """Free the slots of every batch whose fence signalled (polls, never blocks); returns them.

        Fences signal in submission order, so polling stops at the first one still pending."""
        freed = []
        while self._batches:
            fence, s = self._batches[0]
            if not fence.signalled():
                break
            self._batches.popleft()
            fence.release()
            assert (self.state[s] == _IN_FLIGHT).all(), "a fenced slot was not in flight"
            self.state[s] = _FREE
            self._free_count += int(s.size)
            freed.append(s)
        return np.concatenate(freed) if freed else np.zeros(0, np.int64)

    @property
    def batches_in_flight(self) -> int:
        return len(self._batches)

    def stats(self) -> RingStats:
        counts = np.bincount(self.state, minlength=3)
        return RingStats(
            slot_count=self.slot_count,
            slot_bytes=self.slot_bytes,
            persistent=self.persistent,
            free=int(counts[_FREE]),
            held=int(counts[_HELD]),
            in_flight=int(counts[_IN_FLIGHT]),
            batches_in_flight=len(self._batches),
            acquired=self._acquired,
            stalls=self._stalls,
            bytes_submitted=self._bytes_submitted,
            batches=self._batch_count,
        )

    def release(self) -> None:
        """Drop fences, unmap and delete the buffer. Idempotent. Stop the I/O threads first: their
        writes go into this memory. Does not wait for the GPU: GL keeps a deleted buffer alive until
        the commands reading it ended."""
        if self._closed:
            return
        self._closed = True
        for fence, _ in self._batches:
            fence.release()
        self._batches.clear()
        self._free_count = 0
        self.memory = np.zeros(0, np.uint8)
        if self._mapped is not None:
            self._mapped.release()
            self._mapped = None
        if self._fallback is not None:
            self._fallback.release()
            self._fallback = None

    def __enter__(self) -> StagingRing:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

    # ---- internals ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise GLError("staging ring used after release")

    def _expect(self, slots: np.ndarray, state: RingSlotState, what: str) -> np.ndarray:
        s = np.asarray(slots, np.int64).ravel()
        if self._closed:
            if what == "abandon":
                return s
            self._check_open()
        if s.size and (s.min() < 0 or s.max() >= self.slot_count):
            raise ValueError(f"{what}: slot out of range 0..{self.slot_count - 1}")
        bad = s[self.state[s] != state]
        if bad.size:
            now = RingSlotState(int(self.state[bad[0]])).name
            raise ValueError(f"{what} needs {RingSlotState(state).name} slots; slot {int(bad[0])} is {now}")
        return s
