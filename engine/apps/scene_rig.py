"""What the scene benchmarks share: the run modes, the terrain's packs, and a streamer drawing the
terrain into an offscreen framebuffer (`SceneRig`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import moderngl
import numpy as np

from ..config import BudgetConfig, StreamerConfig
from ..runtime.streamer import Streamer, VirtualTexture
from ..scene.paths import Pose
from ..scene.terrain import TerrainScene, sky_clear_colour

__all__ = ["DT", "FPS", "FULL", "GL_SRGB8_ALPHA8", "QUICK", "Mode", "Packs", "SceneRig", "release_fbo"]

FPS = 60.0
DT = 1.0 / FPS
GL_SRGB8_ALPHA8 = 0x8C43


@dataclass(frozen=True)
class Mode:
    quick: bool
    frame_size: tuple[int, int]
    budget_mb: float  # the regular paths' VRAM budget
    ceiling_tiles: int  # tiles uploaded to measure the ceiling
    naive_max: int  # largest naive texture side tried
    compare_frames: int  # flythrough frames each side of the naive comparison draws
    ws_stride: int  # oversubscribed path: working set sampled every this many frames


QUICK = Mode(True, (480, 270), 8.0, 16384, 4096, 240, 10)
FULL = Mode(False, (1920, 1080), 192.0, 32768, 16384, 600, 10)


@dataclass(frozen=True)
class Packs:
    albedo: Path
    normals: Path


# ---- a streamer drawing the terrain into an offscreen framebuffer ---------------------------------
class SceneRig:
    """A Streamer with the terrain's packs open, its TerrainScene and an RGBA8 framebuffer."""

    def __init__(
        self,
        ctx: moderngl.Context,
        packs: Packs,
        size: tuple[int, int],
        budget_mb: float,
        normals: bool = True,
        albedo: Path | None = None,
    ) -> None:
        self.ctx, self.size = ctx, size
        self.streamer = Streamer(ctx, StreamerConfig(budget=BudgetConfig(budget_mb=budget_mb)))
        self.scene: TerrainScene | None = None
        self.fbo: moderngl.Framebuffer | None = None
        try:
            self.albedo: VirtualTexture = self.streamer.open(albedo or packs.albedo)
            self.normals = self.streamer.open(packs.normals) if normals else None
            self.scene = TerrainScene(ctx, self.albedo, self.normals)
            self.color = ctx.renderbuffer(size, 4)
            self.fbo = ctx.framebuffer(color_attachments=[self.color])
        except BaseException:
            self.release()
            raise

    def draw(self, pose: Pose) -> None:
        assert self.fbo is not None and self.scene is not None
        self.fbo.use()
        self.fbo.clear(*sky_clear_colour(), 1.0)
        self.scene.draw(pose, self.size)

    def read(self) -> np.ndarray:
        assert self.fbo is not None
        data = self.fbo.read(components=4, alignment=1)
        return np.frombuffer(data, np.uint8).reshape(self.size[1], self.size[0], 4)

    def release(self) -> None:
        if self.fbo is not None:
            release_fbo(self.ctx, self.fbo)
            self.color.release()
            self.fbo = None
        if self.scene is not None:
            self.scene.release()
            self.scene = None
        self.streamer.release()


def release_fbo(ctx: moderngl.Context, fbo: moderngl.Framebuffer) -> None:
    if ctx.fbo is fbo:  # moderngl keeps the current framebuffer; a released one breaks the next one
        ctx.detect_framebuffer(0).use()
    fbo.release()
