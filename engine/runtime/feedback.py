"""GPU feedback: the SSBO that `vt_sample` appends wanted pages to, read back without stalling.

A small ring of shader storage buffers: frame N's draw appends into buffer N % depth; at the next
`update()` a fence is placed behind that frame, and the buffer is read (glGetBufferSubData) only
once its fence has signalled, so the CPU never waits for the GPU. The age of the newest feedback
read (in frames) is reported.

Buffer layout (shaders/vt.glsl, `VTFeedback`): four uints (count, capacity, stride, phase) then
`capacity` packed entries (engine/runtime/feedback_reduce.py holds the packing contract).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import moderngl
import numpy as np

from ..gl.gl_ext import FenceLike, GLExt

log = logging.getLogger(__name__)

FEEDBACK_BINDING = 7  # VT_FEEDBACK_BINDING in shaders/vt.glsl
HEADER_UINTS = 4
GL_BUFFER_UPDATE_BARRIER_BIT = 0x00000200


@dataclass
class _Entry:
    buffer: moderngl.Buffer
    frame: int = -1  # frame whose draw wrote it; -1: free
    fence: FenceLike | None = None


class FeedbackRing:
    """`depth` feedback SSBOs of `capacity` entries; one is bound for drawing at a time."""

    def __init__(self, ctx: moderngl.Context, gl: GLExt, capacity: int, stride: int, depth: int = 4) -> None:
        if capacity < 1 or stride < 1 or depth < 2:
            raise ValueError(f"bad feedback ring: capacity {capacity!r}, stride {stride!r}, depth {depth!r}")
        self.ctx, self.gl = ctx, gl
        self.capacity, self.stride, self.depth = capacity, stride, depth
        self._entries = [_Entry(ctx.buffer(reserve=self.nbytes_each)) for _ in range(depth)]
        self._current: _Entry | None = None
        self._spare_entry: _Entry | None = None
        self.age = -1  # frames between the newest feedback read and the frame it was read in
        self.dropped = 0  # entries lost because the buffer was full
        self.skipped_frames = 0  # frames without a free buffer (GPU far behind): no feedback recorded

    @property
    def nbytes_each(self) -> int:
        return (HEADER_UINTS + self.capacity) * 4

    @property
    def nbytes(self) -> int:
        return self.nbytes_each * self.depth

    def begin_frame(self, frame: int) -> None:
        """Close the previous frame's buffer (fence it) and bind a fresh one for this frame's draw."""
        if self._current is not None:
            # Shader writes reach glGetBufferSubData / glMapBuffer only through this barrier; the
            # fence behind it tells when both the draw and the barrier are done.
            self.ctx.memory_barrier(GL_BUFFER_UPDATE_BARRIER_BIT)
            self._current.fence = self.gl.fence()
            self._current = None
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

    def bind(self) -> None:
        """Bind this frame's buffer again (after user code rebound the binding point)."""
        if self._current is not None:
            self._current.buffer.bind_to_storage_buffer(FEEDBACK_BINDING)

    def collect(self, frame: int) -> list[np.ndarray]:
        """Entries of every closed buffer whose fence signalled, oldest first (never blocks)."""
        ready = [e for e in self._entries if e.fence is not None and e.fence.signalled()]
        out = []
        for e in sorted(ready, key=lambda e: e.frame):
            head = np.frombuffer(e.buffer.read(size=HEADER_UINTS * 4), np.uint32)
            count = int(head[0])
            n = min(count, self.capacity)
            self.dropped += count - n
            data = np.frombuffer(e.buffer.read(size=n * 4, offset=HEADER_UINTS * 4), np.uint32) if n else (
                np.zeros(0, np.uint32))  # fmt: skip
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
        self._entries = []
        if self._spare_entry is not None:
            self._spare_entry.buffer.release()
            self._spare_entry = None
        self._current = None
