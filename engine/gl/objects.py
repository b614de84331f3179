"""The GL objects `GLExt` hands out: fences, frame throttles, texture arrays, mapped buffers, timers.

Each object has one owner and an idempotent ``release()``; like `GLExt`, they are used on the render
thread only, except the byte views a `MappedBuffer` hands out, which any thread may write.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import GLError
from .enums import (
    GL_ALREADY_SIGNALED,
    GL_CONDITION_SATISFIED,
    GL_QUERY_RESULT,
    GL_QUERY_RESULT_AVAILABLE,
    GL_SYNC_FLUSH_COMMANDS_BIT,
    GL_TIME_ELAPSED,
    GL_WAIT_FAILED,
    GLFormat,
)
from .loader import GLFunctions

__all__ = [
    "Fence",
    "FenceLike",
    "FrameThrottle",
    "GpuMemoryInfo",
    "GpuTimer",
    "DeviceBuffer",
    "LiveObjects",
    "MappedBuffer",
    "ObjectOwner",
    "TextureArray",
]

log = logging.getLogger(__name__)


class ObjectOwner(Protocol):
    """What the GL objects need of the layer that made them (`GLExt` is the one implementation).

    A narrow interface instead of the facade itself: the objects call GL through the shared function
    table and hand deletions back to their owner, which keeps the live-object counts.
    """

    functions: GLFunctions

    def fence(self) -> Fence: ...

    def bind_texture_array(self, texture: TextureArray, unit: int) -> None: ...

    def delete_textures(self, *names: int) -> None: ...

    def delete_buffers(self, *names: int) -> None: ...

    def unmap_and_delete_buffer(self, name: int) -> None: ...

    def sync_released(self) -> None: ...


class FenceLike(Protocol):
    """What the staging ring needs of a fence (a GL `Fence`, or a fake one in tests)."""

    def signalled(self) -> bool: ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class LiveObjects:
    """Live GL objects of a context by kind (`GLExt.live_objects`)."""

    buffers: int
    textures: int
    queries: int
    framebuffers: int
    renderbuffers: int
    vertex_arrays: int
    programs: int
    shaders: int
    syncs: int

    @property
    def total(self) -> int:
        return sum(getattr(self, f) for f in self.__dataclass_fields__)

    def minus(self, other: LiveObjects) -> dict[str, int]:
        """Kinds whose count differs from `other`'s, with the difference."""
        diff = {f: getattr(self, f) - getattr(other, f) for f in self.__dataclass_fields__}
        return {k: v for k, v in diff.items() if v}


@dataclass(frozen=True)
class GpuMemoryInfo:
    """GPU memory as the driver reports it, in KiB (GL's unit). Fields the source lacks are None."""

    source: str  # "GL_NVX_gpu_memory_info" or "GL_ATI_meminfo"
    available_kib: int  # free video memory now (NVX current available; ATI texture pool free)
    total_kib: int | None = None  # dedicated video memory (NVX only)
    total_available_kib: int | None = None  # NVX: dedicated plus what the driver may spill to
    evicted_kib: int | None = None  # NVX: memory evicted since start
    eviction_count: int | None = None  # NVX: evictions since start

    @property
    def available_bytes(self) -> int:
        return self.available_kib * 1024

    @property
    def total_bytes(self) -> int | None:
        return None if self.total_kib is None else self.total_kib * 1024


class Fence:
    """A GL sync object: ``signalled()`` polls it (never blocks); ``release()`` deletes it.

    The first poll flushes the command stream (GL_SYNC_FLUSH_COMMANDS_BIT), so a fence that is only
    ever polled still signals. Once signalled, the sync object is deleted at once and the answer
    cached; ``release()`` is idempotent.
    """

    __slots__ = ("_gl", "_sync", "_done", "_flushed")

    def __init__(self, gl: ObjectOwner, sync: int) -> None:
        self._gl = gl
        self._sync: int | None = sync
        self._done = False
        self._flushed = False

    def signalled(self) -> bool:
        if self._done:
            return True
        if self._sync is None:
            raise GLError("fence polled after release (it never signalled)")
        flags = 0 if self._flushed else GL_SYNC_FLUSH_COMMANDS_BIT
        self._flushed = True
        status = self._gl.functions.glClientWaitSync(self._sync, flags, 0)
        if status == GL_WAIT_FAILED:
            raise GLError("glClientWaitSync failed (GL_WAIT_FAILED): invalid sync object or context lost")
        if status in (GL_ALREADY_SIGNALED, GL_CONDITION_SATISFIED):
            self._done = True
            self.release()
            return True
        return False

    def wait(self, timeout_s: float) -> bool:
        """Block up to `timeout_s` (releasing the interpreter lock) until the fence signals; True once
        it has. For frame throttling; the streamer itself never waits."""
        if self._done:
            return True
        if self._sync is None:
            raise GLError("fence waited on after release (it never signalled)")
        self._flushed = True
        status = self._gl.functions.wait_sync(self._sync, GL_SYNC_FLUSH_COMMANDS_BIT, int(timeout_s * 1e9))
        if status == GL_WAIT_FAILED:
            raise GLError("glClientWaitSync failed (GL_WAIT_FAILED): invalid sync object or context lost")
        if status in (GL_ALREADY_SIGNALED, GL_CONDITION_SATISFIED):
            self._done = True
            self.release()
            return True
        return False

    def release(self) -> None:
        if self._sync is not None:
            sync, self._sync = self._sync, None
            self._gl.functions.glDeleteSync(sync)
            self._gl.sync_released()

    @property
    def released(self) -> bool:
        return self._sync is None


class FrameThrottle:
    """Keeps at most `depth` frames queued on the GPU, as a window's swap chain does.

    A headless loop (EGL, offscreen framebuffers, no swap) has nothing else that stops the CPU from
    queueing hundreds of frames ahead of the GPU; every fenced readback (the streamer's feedback, its
    upload fences) then lags by as many frames. Call `frame_done()` once per frame, after its draws:
    it fences the frame and waits for the frame `depth` frames older.
    """

    def __init__(self, gl: ObjectOwner, depth: int = 2, timeout_s: float = 5.0) -> None:
        if depth < 1:
            raise ValueError(f"throttle depth must be >= 1, got {depth!r}")
        self._gl, self.depth, self.timeout_s = gl, depth, timeout_s
        self._fences: list[Fence] = []
        self.wait_ms = 0.0  # time the latest frame_done() waited

    def frame_done(self) -> None:
        self._fences.append(self._gl.fence())
        t0 = time.perf_counter()
        while len(self._fences) > self.depth:
            oldest = self._fences.pop(0)
            if not oldest.wait(self.timeout_s):
                oldest.release()
                raise GLError(f"the GPU did not finish a frame within {self.timeout_s:.0f} s")
        self.wait_ms = (time.perf_counter() - t0) * 1e3

    def release(self) -> None:
        for f in self._fences:
            f.release()
        self._fences.clear()


class TextureArray:
    """An immutable 2D texture array: `layers` layers of `size` x `size` texels, one mip level.

    Filtering is linear (or nearest) without mips, addressing clamp-to-edge: tiles carry their own
    border, and the virtual-texture shader picks levels itself. Not a moderngl object: bind it with
    ``bind(unit)`` and point a ``sampler2DArray`` uniform at that unit.
    """

    def __init__(self, gl: ObjectOwner, glo: int, fmt: GLFormat, size: int, layers: int) -> None:
        self._gl = gl
        self._glo = glo
        self.format = fmt
        self.size = size
        self.layers = layers
        self.layer_bytes = fmt.layer_bytes(size)

    @property
    def glo(self) -> int:
        """The GL texture name (0 after release)."""
        return self._glo

    @property
    def nbytes(self) -> int:
        """GPU bytes this texture occupies (for the budget)."""
        return self.layer_bytes * self.layers

    @property
    def released(self) -> bool:
        return self._glo == 0

    def bind(self, unit: int) -> None:
        """Bind to texture unit `unit` (``GL_TEXTURE0 + unit``) as ``GL_TEXTURE_2D_ARRAY``."""
        self._gl.bind_texture_array(self, unit)

    def release(self) -> None:
        if self._glo:
            name, self._glo = self._glo, 0
            self._gl.delete_textures(name)

    def __enter__(self) -> TextureArray:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"TextureArray(glo={self._glo}, {self.format.name}, {self.size}x{self.size}x{self.layers})"


class DeviceBuffer:
    """An immutable GL buffer (glBufferStorage) with no mapping flags: GPU-only memory, which drivers
    of discrete GPUs place in video memory. Filled and read by GL commands only (buffer copies,
    uploads with it bound as the pixel-unpack buffer)."""

    def __init__(self, gl: ObjectOwner, glo: int, size: int) -> None:
        self._gl = gl
        self._glo = glo
        self.size = size

    @property
    def glo(self) -> int:
        """The GL buffer name (0 after release)."""
        return self._glo

    @property
    def released(self) -> bool:
        return self._glo == 0

    def release(self) -> None:
        """Delete the buffer (idempotent). GL keeps it alive until the commands using it ended."""
        if self._glo:
            self._gl.delete_buffers(self._glo)
            self._glo = 0

    def __repr__(self) -> str:
        return f"DeviceBuffer(glo={self._glo}, size={self.size})"


class MappedBuffer:
    """An immutable GL buffer (glBufferStorage) mapped once, persistently and coherently, for writing.

    ``view(offset, nbytes)`` hands out writable byte memoryviews into the mapping, usable from any
    thread; CPU writes are visible to GL commands issued after them (coherent mapping, no flush).
    ``release()`` invalidates the views it handed out, then unmaps and deletes the buffer. If any
    memory derived from a view is still alive (a slice, ``numpy.frombuffer(view)``, an export), the
    mapping is left in place and the GL buffer leaks, with an error logged, rather than unmapping
    memory under a writer's feet.
    """

    def __init__(self, gl: ObjectOwner, glo: int, size: int, address: int) -> None:
        self._gl = gl
        self._glo = glo
        self.size = size
        self.address = address
        self._array = (ctypes.c_ubyte * size).from_address(address)
        self._chunks: list[tuple[ctypes.Array[ctypes.c_ubyte], memoryview]] = []
        self._prune_at = 64  # list length that triggers forgetting views nobody holds
        self._numpy: np.ndarray | None = None

    @property
    def glo(self) -> int:
        """The GL buffer name (0 after release)."""
        return self._glo

    @property
    def released(self) -> bool:
        return self._glo == 0

    def view(self, offset: int, nbytes: int) -> memoryview:
        """A writable memoryview of `nbytes` bytes at `offset` in the mapping."""
        if self.released:
            raise GLError(f"{self!r} used after release")
        if offset < 0 or nbytes < 1 or offset + nbytes > self.size:
            raise ValueError(f"range {offset}+{nbytes} is outside the {self.size}-byte buffer")
        if len(self._chunks) >= self._prune_at:
            self._prune()
        chunk = (ctypes.c_ubyte * nbytes).from_buffer(self._array, offset)
        mv = memoryview(chunk).cast("B")
        self._chunks.append((chunk, mv))
        return mv

    def _prune(self) -> None:
        """Forget views nobody holds any more, so a view taken every frame costs no memory for good."""
        view_baseline, chunk_baseline = _view_refcount_baseline(), _refcount_baseline()
        kept = []
        for pair in self._chunks:
            if _refs(pair[1]) <= view_baseline:  # only this list holds the view
                try:
                    pair[1].release()
                except BufferError:  # something made from it (numpy.frombuffer) is alive
                    kept.append(pair)
                    continue
                if _refs(pair[0]) <= chunk_baseline:
                    continue
            kept.append(pair)
        self._chunks = kept
        self._prune_at = max(64, 2 * len(kept))

    def array(self) -> np.ndarray:
        """The whole mapping as one uint8 numpy array (made once; slices of it share the memory)."""
        if self.released:
            raise GLError(f"{self!r} used after release")
        if self._numpy is None:
            self._numpy = np.frombuffer(self._array, np.uint8)
        return self._numpy

    def release(self) -> None:
        if not self._glo:
            return
        busy = 0
        if self._numpy is not None:
            # our reference, getrefcount's argument: anything more is a live slice or a caller's copy
            if sys.getrefcount(self._numpy) > 2:
                busy += 1
            else:
                self._numpy = None
        for pair in self._chunks:
            try:
                pair[1].release()
            except BufferError:  # exported (e.g. numpy.frombuffer(view) is alive)
                busy += 1
        # Views sharing a chunk's buffer (slices, memoryview(view)) keep the chunk referenced. Both
        # counts go through the same expression, so interpreter-specific temporaries cancel out.
        baseline = _refcount_baseline()
        busy += sum(1 for pair in self._chunks if _refs(pair[0]) > baseline)
        name, self._glo = self._glo, 0
        if busy:
            log.error("%s: %d views are still in use; leaving it mapped (GL buffer %d leaked)", self, busy, name)
            return
        self._chunks.clear()
        self._gl.unmap_and_delete_buffer(name)

    def __repr__(self) -> str:
        return f"MappedBuffer(glo={self._glo}, size={self.size})"


def _refs(obj: object) -> int:
    return sys.getrefcount(obj)


def _refcount_baseline() -> int:
    """What `_refs` reports for a chunk referenced only from a MappedBuffer's chunk list."""
    probe = [((ctypes.c_ubyte * 1)(), None)]
    return max(_refs(pair[0]) for pair in probe)


def _view_refcount_baseline() -> int:
    """What `_refs` reports for a view referenced only from a MappedBuffer's chunk list."""
    probe = [(None, memoryview(bytearray(1)))]
    return max(_refs(pair[1]) for pair in probe)


class GpuTimer:
    """GPU time per frame from GL_TIME_ELAPSED queries, read back without ever waiting.

    ``begin()`` / ``end()`` bracket the GPU work of a frame; ``poll()`` returns the newest finished
    measurement in milliseconds (None when none finished yet). `depth` queries rotate, so results are
    read `depth - 1` frames late at most; when the GPU falls further behind, frames go unmeasured
    (counted in ``skipped``) rather than stalling. TIME_ELAPSED queries cannot nest: do not bracket
    the same work with a moderngl ``Query(time=True)``.
    """

    def __init__(self, gl: ObjectOwner, depth: int = 4) -> None:
        if depth < 2:
            raise ValueError(f"timer depth must be >= 2, got {depth!r}")
        self._gl = gl
        self._ids = gl.functions.gen_names(gl.functions.glGenQueries, depth)
        self._pending: list[int] = []  # query ids begun and ended, oldest first
        self._active: int | None = None
        self._next = 0
        self.last_ms: float | None = None
        self.skipped = 0

    def begin(self) -> bool:
        """Start timing; returns False (frame unmeasured) when every query is still in flight."""
        if self._active is not None:
            raise GLError("GpuTimer.begin() called twice without end()")
        if not self._ids:
            raise GLError("GpuTimer used after release")
        self.poll()
        qid = self._ids[self._next]
        if qid in self._pending:
            self.skipped += 1
            return False
        self._next = (self._next + 1) % len(self._ids)
        self._gl.functions.glBeginQuery(GL_TIME_ELAPSED, qid)
        self._active = qid
        return True

    def end(self) -> None:
        if self._active is None:
            return  # begin() declined this frame
        self._gl.functions.glEndQuery(GL_TIME_ELAPSED)
        self._pending.append(self._active)
        self._active = None

    def poll(self) -> float | None:
        """Collect finished queries (oldest first); returns the newest GPU time in ms, or None."""
        f = self._gl.functions
        avail = ctypes.c_int(0)
        result = ctypes.c_uint64(0)
        while self._pending:
            qid = self._pending[0]
            f.glGetQueryObjectiv(qid, GL_QUERY_RESULT_AVAILABLE, ctypes.byref(avail))
            if not avail.value:
                break
            f.glGetQueryObjectui64v(qid, GL_QUERY_RESULT, ctypes.byref(result))
            self._pending.pop(0)
            self.last_ms = result.value / 1e6
        return self.last_ms

    def release(self) -> None:
        if self._ids:
            if self._active is not None:
                self._gl.functions.glEndQuery(GL_TIME_ELAPSED)
                self._active = None
            ids, self._ids = self._ids, []
            self._pending.clear()
            self._gl.functions.delete_names(self._gl.functions.glDeleteQueries, *ids)
