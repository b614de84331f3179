"""The device-local staging buffer of the device upload path (`UploadPath.DEVICE_BUFFER`).

I/O threads still write tiles into the host staging ring (`staging.StagingRing`). At upload time the
frame's runs are copied GPU-side, one glCopyBufferSubData per span of ring memory that is contiguous
in both buffers (`upload_plan.copy_spans`), into this buffer (glBufferStorage with no mapping flags:
video memory on a discrete GPU), and the runs are uploaded with it bound as the pixel-unpack buffer,
so each upload call reads video memory instead of host memory across the bus.

Ordering, without a fence of its own: GL executes a context's commands in order, so a copy into a
region is never overtaken by the uploads issued after it, and a later copy into the same region waits
for the uploads issued before it. The host ring's slots are fenced right behind the copies, so they
go back to the I/O threads as soon as the copy ran, before the uploads finished.

A frame's batch takes consecutive slots from a cursor (wrapping to slot 0 when the batch does not fit
before the end), so consecutive frames copy into different regions; the uploader caps a frame's
uploads at the buffer's slot count. Render thread only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import GLError
from ..gl.gl_ext import GLExt
from ..gl.objects import DeviceBuffer
from .upload_plan import copy_spans

__all__ = ["DeviceStaging", "DeviceStagingStats"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceStagingStats:
    """A snapshot of the device buffer; counters are cumulative since creation."""

    slot_count: int
    nbytes: int
    batches: int  # frames whose uploads went through it
    copies: int  # glCopyBufferSubData calls
    bytes_copied: int


class DeviceStaging:
    """`slot_count` slots of `stride` bytes in one device-local buffer (see the module docstring).

    Parameters
    ----------
    gl
        The context's `GLExt` (needs buffer storage).
    slot_count, stride
        Slots and their size: the staging ring's stride, so a run keeps the ring's layer spacing.
    """

    def __init__(self, gl: GLExt, slot_count: int, stride: int) -> None:
        if slot_count < 1 or stride < 1:
            raise ValueError(f"a device staging buffer needs slots, got {slot_count!r} of {stride!r} bytes")
        self._gl = gl
        self.slot_count, self.stride = int(slot_count), int(stride)
        self._buffer: DeviceBuffer | None = gl.create_device_buffer(self.slot_count * self.stride)
        self._cursor = 0
        self._batches = self._copies = self._bytes = 0
        log.debug("device staging buffer: %d slots of %d bytes", self.slot_count, self.stride)

    @property
    def glo(self) -> int:
        """The GL buffer name to bind as GL_PIXEL_UNPACK_BUFFER."""
        if self._buffer is None:
            raise GLError("device staging buffer used after release")
        return self._buffer.glo

    @property
    def nbytes(self) -> int:
        """GPU bytes the buffer occupies (for the budget)."""
        return self.slot_count * self.stride

    def copy_in(
        self, ring_glo: int, ring_first: np.ndarray, counts: np.ndarray, native: Any = None
    ) -> tuple[np.ndarray, int]:
        """Copy runs from the host ring into consecutive device slots of one batch: run i is
        `counts[i]` ring slots from `ring_first[i]`. Returns each run's first device slot and the
        copy calls issued. The whole batch (``counts.sum()``) must fit the buffer."""
        c = np.asarray(counts, np.int64)
        total = int(c.sum())
        if total > self.slot_count:
            raise ValueError(f"a batch of {total} slots does not fit the {self.slot_count}-slot device buffer")
        if total == 0:
            return np.zeros(0, np.int64), 0
        if self._cursor + total > self.slot_count:
            self._cursor = 0
        device_first = self._cursor + np.cumsum(c) - c
        self._cursor = (self._cursor + total) % self.slot_count
        spans = copy_spans(ring_first, device_first, c)
        st = self.stride
        self._bytes += self._gl.copy_buffer_spans(
            ring_glo, self.glo, spans["ring"] * st, spans["device"] * st, spans["count"] * st, native
        )
        self._batches += 1
        self._copies += int(spans.size)
        return device_first, int(spans.size)

    def stats(self) -> DeviceStagingStats:
        return DeviceStagingStats(self.slot_count, self.nbytes, self._batches, self._copies, self._bytes)

    def release(self) -> None:
        """Delete the buffer (idempotent; GL keeps it until the uploads reading it ended)."""
        if self._buffer is not None:
            self._buffer.release()
            self._buffer = None
