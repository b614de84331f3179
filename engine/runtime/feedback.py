"""GPU feedback: the SSBO that `vt_sample` appends wanted pages to, read back without stalling.

A small ring of shader storage buffers: frame N's draw appends into buffer N % depth; at the next
`update()` the buffer is copied on the GPU into a persistent, coherent, read-mapped buffer and a
fence is placed behind the copy; once the fence has signalled the CPU reads the mapped memory
directly. No driver call reads GPU memory (glGetBufferSubData waits for the GPU on some drivers:
~20 ms a frame on NVIDIA), so the CPU never waits for the GPU. Without ARB_buffer_storage the
buffer is read with glGetBufferSubData after its fence. The age of the newest feedback read (in
frames) is reported.

Buffer layout (shaders/vt.glsl, `VTFeedback`): four uints (count, capacity, stride, phase) then
`capacity` entries, each the tile id of a page a fragment wanted (engine/runtime/feedback_reduce.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import moderngl
import numpy as np

from ..config import StreamerConfig
from ..errors import BudgetError
from ..gl.gl_ext import GLExt
from ..gl.objects import FenceLike, MappedBuffer
from .budget import BudgetManager

log = logging.getLogger(__name__)

FEEDBACK_BINDING = 7  # VT_FEEDBACK_BINDING in shaders/vt.glsl
HEADER_UINTS = 4
GL_BUFFER_UPDATE_BARRIER_BIT = 0x00000200


@dataclass
class _Entry:
    buffer: moderngl.Buffer
    readback: MappedBuffer | None = None  # persistent read mapping the buffer is copied into
    frame: int = -1  # frame whose draw wrote it; -1: free
    fence: FenceLike | None = None

    def read(self, nbytes: int) -> np.ndarray:
        """The first `nbytes` (after the fence signalled) as uint32 (a copy)."""
        if self.readback is not None:
            return self.readback.array()[:nbytes].view(np.uint32).copy()
        return np.frombuffer(self.buffer.read(size=nbytes), np.uint32)


class FeedbackRing:
    """`depth` feedback SSBOs of `capacity` entries; one is bound for drawing at a time."""

    def __init__(self, ctx: moderngl.Context, gl: GLExt, capacity: int, stride: int, depth: int = 4) -> None:
        if capacity < 1 or stride < 1 or depth < 2:
            raise ValueError(f"bad feedback ring: capacity {capacity!r}, stride {stride!r}, depth {depth!r}")
        self.ctx, self.gl = ctx, gl
        self.capacity, self.stride, self.depth = capacity, stride, depth
        mapped = gl.has_buffer_storage
        self._entries = [
            _Entry(
                ctx.buffer(reserve=self.nbytes_each),
                gl.create_mapped_buffer(self.nbytes_each, read=True) if mapped else None,
            )
            for _ in range(depth)
        ]
        self._current: _Entry | None = None
        self._spare_entry: _Entry | None = None
        self.age = -1  # frames between the newest feedback read and the frame it was read in
        self.dropped = 0  # entries lost because the buffer was full
        self.skipped_frames = 0  # frames without a free buffer (GPU far behind): no feedback recorded

    @classmethod
    def reserved(
        cls, ctx: moderngl.Context, gl: GLExt, budget: BudgetManager, size: tuple[int, int], config: StreamerConfig
    ) -> FeedbackRing:
        """A ring for draws of `size` pixels, its bytes reserved in `budget` as "feedback" (BudgetError:
        nothing made)."""
        divisor = config.feedback_divisor
        ring = cls(ctx, gl, cls.capacity_for(size, divisor), divisor)
        try:
            budget.reserve("feedback", ring.nbytes)
        except BaseException:
            ring.release()
            raise
        return ring

    def resized(self, size: tuple[int, int], budget: BudgetManager, config: StreamerConfig) -> FeedbackRing:
        """A ring for draws of `size` pixels in place of this one (released); BudgetError keeps this one."""
        budget.release("feedback")
        try:
            new = FeedbackRing.reserved(self.ctx, self.gl, budget, size, config)
        except BudgetError:
            budget.reserve("feedback", self.nbytes)
            raise
        self.release()
        return new

    def fitted(
        self, viewport: tuple[int, int, int, int] | None, budget: BudgetManager, config: StreamerConfig
    ) -> FeedbackRing:
        """This ring, or a bigger one when draws of `viewport` would overflow it (kept if the budget
        cannot hold a bigger one: the entries that do not fit are counted as dropped)."""
        if not viewport or FeedbackRing.capacity_for(viewport[2:], config.feedback_divisor) <= self.capacity:
            return self
        try:
            return self.resized((viewport[2], viewport[3]), budget, config)
        except BudgetError:
            return self

    @staticmethod
    def capacity_for(size: tuple[int, int], stride: int) -> int:
        """Entries for draws of `size` pixels: up to 4 samples (textures) per stride x stride cell."""
        return 4 * (-(-size[0] // stride)) * (-(-size[1] // stride))

    @property
    def nbytes_each(self) -> int:
        return (HEADER_UINTS + self.capacity) * 4

    @property
    def nbytes(self) -> int:
        """GPU bytes: the SSBOs (the read mappings live in client memory)."""
        return self.nbytes_each * self.depth

    def end_frame(self) -> None:
        """Close the buffer the latest draws appended to: copy it for reading and fence the copy.
        Called as early as possible (the start of the next update), so the copy is queued right
        behind those draws and a GPU that keeps up answers within the same update."""
        if self._current is not None:
            # Shader writes reach glGetBufferSubData / glMapBuffer only through this barrier; the
            # fence behind it tells when both the draw and the barrier are done.
            self.ctx.memory_barrier(GL_BUFFER_UPDATE_BARRIER_BIT)
            cur = self._current
            if cur.readback is not None:
                self.gl.copy_buffer(cur.buffer.glo, cur.readback.glo, self.nbytes_each)
            cur.fence = self.gl.fence()
            self._current = None

    def begin_frame(self, frame: int) -> None:
        """Bind a fresh buffer for this frame's draws (closing the previous one if still open)."""
        self.end_frame()
        free = next((e for e in self._entries if e.frame < 0), None)
        capacity = self.capacity
        if free is None:
            self.skipped_frames += 1
            free, capacity = self._spare(), 0
        phase = (frame * 7) % (self.stride * self.stride)  # visits every fragment of a cell
        free.buffer.write(np.array([0, capacity, self.stride, phase], np.uint32))
        if capacity:
            free.frame = frame
            self._current = free
        free.buffer.bind_to_storage_buffer(FEEDBACK_BINDING)

    def _spare(self) -> _Entry:
        # Every buffer still waits on the GPU: this frame records nothing (capacity 0) into a tiny
        # dedicated buffer rather than overwrite one the GPU may still be writing.
        if self._spare_entry is None:
            self._spare_entry = _Entry(self.ctx.buffer(reserve=HEADER_UINTS * 4 + 4))
        return self._spare_entry

    def inject(self, ids: np.ndarray) -> bool:
        """Append entries to this frame's buffer as if the coming draw had written them (benchmarks and
        tests that drive the streamer without drawing). False when this frame records nothing."""
        if self._current is None:
            return False
        ids = np.asarray(ids, np.uint32)[: self.capacity]
        head = np.array([ids.size, self.capacity, self.stride, 0], np.uint32)
        self._current.buffer.write(head.tobytes() + ids.tobytes())
        return True

    def read_current(self) -> np.ndarray:
        """This frame's entries so far, read back at once (waits for the GPU: tests only)."""
        if self._current is None:
            return np.zeros(0, np.uint32)
        n = int(np.frombuffer(self._current.buffer.read(size=4), np.uint32)[0])
        n = min(n, self.capacity)
        if n == 0:
            return np.zeros(0, np.uint32)
        return np.frombuffer(self._current.buffer.read(size=4 * n, offset=HEADER_UINTS * 4), np.uint32).copy()

    def bind(self) -> None:
        """Bind this frame's buffer again (after user code rebound the binding point)."""
        if self._current is not None:
            self._current.buffer.bind_to_storage_buffer(FEEDBACK_BINDING)

    def collect(self, frame: int) -> list[np.ndarray]:
        """Entries of every closed buffer whose fence signalled, oldest first (never blocks)."""
        ready = [e for e in self._entries if e.fence is not None and e.fence.signalled()]
        out = []
        for e in sorted(ready, key=lambda e: e.frame):
            count = int(e.read(4)[0])
            n = min(count, self.capacity)
            self.dropped += count - n
            data = e.read((HEADER_UINTS + n) * 4)[HEADER_UINTS:]
            out.append(data)
            self.age = frame - e.frame
            e.fence.release()
            e.fence, e.frame = None, -1
        return out

    def release(self) -> None:
        for e in self._entries:
            if e.fence is not None:
                e.fence.release()
            e.buffer.release()
            if e.readback is not None:
                e.readback.release()
        self._entries = []
        if self._spare_entry is not None:
            self._spare_entry.buffer.release()
            self._spare_entry = None
        self._current = None
