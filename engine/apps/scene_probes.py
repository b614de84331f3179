"""What `bench scene` measures while a camera path plays: re-fetches within a window of frames,
frames grabbed for the convergence check, and frames to converge after each cut (PSNR against an
all-resident reference)."""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Protocol

import moderngl
import numpy as np

from ..runtime.streamer import Streamer
from ..scene.paths import CameraPath, Pose
from ..testing.images import psnr
from .scene_rig import DT, FPS

__all__ = ["CONVERGED_DB", "Convergence", "FrameGrabber", "ReferenceImages", "RefetchWindow"]

CONVERGED_DB = 45.0  # a frame this close to the all-resident reference has converged


class ReferenceImages(Protocol):
    """All-resident frames of a scene, by camera pose (`bench_scene`'s reference renderer)."""

    def image(self, pose: Pose) -> np.ndarray: ...


class RefetchWindow:
    """Counts uploads of tiles evicted at most `window` frames earlier, from each frame's upload and
    eviction records (tile ids: one vectorized pass per frame with uploads or evictions)."""

    def __init__(self, streamer: Streamer, window: int) -> None:
        self.streamer, self.window = streamer, window
        self.evicted_at = np.full(streamer.tile_capacity, -(1 << 40), np.int64)
        self.count = 0
        self.evictions = 0

    def check(self, frame: int) -> None:
        st = self.streamer.last
        cap = self.streamer.tile_capacity
        if self.evicted_at.size < cap:
            self.evicted_at = np.concatenate([self.evicted_at, np.full(cap - self.evicted_at.size, -(1 << 40))])
        if st.evicted_tiles.size:
            self.evicted_at[st.evicted_tiles] = frame
            self.evictions += int(st.evicted_tiles.size)
        if st.uploaded is not None and len(st.uploaded.loads):
            new = st.uploaded.loads.tiles
            self.count += int(np.count_nonzero(frame - self.evicted_at[new] <= self.window))


class FrameGrabber:
    """Reads frames back through a ring of pixel-pack buffers; each is read two frames later."""

    def __init__(self, ctx: moderngl.Context, size: tuple[int, int], depth: int = 3) -> None:
        self.size, self.depth = size, depth
        self.buffers = [ctx.buffer(reserve=size[0] * size[1] * 4) for _ in range(depth)]
        self.pending: deque[tuple[moderngl.Buffer, int, Any]] = deque()
        self.next = 0

    def grab(self, fbo: moderngl.Framebuffer, frame: int, tag: Any) -> list[tuple[Any, np.ndarray]]:
        out = self.take(frame) if len(self.pending) < self.depth else [self._pop()]
        buf = self.buffers[self.next]
        self.next = (self.next + 1) % self.depth
        fbo.read_into(buf, components=4, alignment=1)
        self.pending.append((buf, frame, tag))
        return out

    def take(self, frame: int | None = None) -> list[tuple[Any, np.ndarray]]:
        """Frames grabbed at least depth - 1 frames before `frame` (None: all of them)."""
        out = []
        while self.pending and (frame is None or frame - self.pending[0][1] >= self.depth - 1):
            out.append(self._pop())
        return out

    def _pop(self) -> tuple[Any, np.ndarray]:
        buf, _, tag = self.pending.popleft()
        return tag, np.frombuffer(buf.read(), np.uint8).reshape(self.size[1], self.size[0], 4)

    def release(self) -> None:
        self.pending.clear()
        for b in self.buffers:
            b.release()
        self.buffers = []


class Convergence:
    """Frames from each cut of a path to the first frame matching the all-resident reference."""

    def __init__(
        self, ctx: moderngl.Context, path: CameraPath, reference: ReferenceImages, size: tuple[int, int]
    ) -> None:
        self.path, self.reference = path, reference
        n = path.frames(FPS)
        starts = [math.ceil(t * FPS - 1e-9) for t in path.cut_times()]
        ends = starts[1:] + [n]
        self.cuts = [
            {
                "cut_time_s": t,
                "frame": a,
                "hold_frames": b - a,
                "frames_to_converge": None,
                "psnr_first_db": None,
                "psnr_converged_db": None,
            }
            for t, a, b in zip(path.cut_times(), starts, ends, strict=True)
        ]
        self._window = {f: k for k, (a, b) in enumerate(zip(starts, ends, strict=True)) for f in range(a, b)}
        for a, b in zip(starts, ends, strict=True):  # the references, rendered before the run
            for f in range(a, b):
                reference.image(path.pose(f * DT))
        self.grabber = FrameGrabber(ctx, size)

    def after_draw(self, frame: int, pose: Pose, fbo: moderngl.Framebuffer) -> None:
        k = self._window.get(frame)
        if k is not None and self.cuts[k]["frames_to_converge"] is None:
            done = self.grabber.grab(fbo, frame, (k, frame, pose))
        else:
            done = self.grabber.take(frame)
        for tag, img in done:
            self._score(*tag, img)

    def finish(self) -> None:
        for tag, img in self.grabber.take():
            self._score(*tag, img)
        self.grabber.release()

    def _score(self, k: int, frame: int, pose: Pose, img: np.ndarray) -> None:
        cut = self.cuts[k]
        if cut["frames_to_converge"] is not None:
            return
        db = psnr(img, self.reference.image(pose))
        if frame == cut["frame"]:
            cut["psnr_first_db"] = round(db, 2)
        if db >= CONVERGED_DB:
            cut["frames_to_converge"] = frame - cut["frame"]
            cut["psnr_converged_db"] = round(db, 2)
