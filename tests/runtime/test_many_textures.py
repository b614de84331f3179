"""256 virtual textures drawn in one frame, one draw call each, by one shader.

Every texture samples through the same fixed bindings (the shared page-table buffer, the feedback
buffer, one texture unit per cache pool), so the texture count is limited by the id space, not by
texture units. The packs mix formats and tile sizes (several pools); each has its own content, so a
texture drawn with another's pages or cache would show the wrong image. Each cell of the streamed
frame is compared with the same cell drawn from a streamer where every tile was made resident.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import moderngl
import numpy as np
import pytest

from texstream.bake.pipeline import bake
from texstream.bake.source import ArraySource
from texstream.config import BakeConfig, BudgetConfig, StreamerConfig
from texstream.gl.shaders import program
from texstream.pack.format import TexelFormat
from texstream.runtime.streamer import Streamer, VirtualTexture
from texstream.runtime.texture import FIRST_UNIT, MAX_POOLS
from texstream.testing import psnr

pytestmark = pytest.mark.gl

COUNT = 256
GRID = 16  # cells a side
CELL = 24  # pixels a side: each 192-texel texture is seen minified, several levels at once
SIZE = GRID * CELL
CONVERGED_DB = 45.0
MEAN_TOLERANCE = 6.0  # a cell's mean colour against its source's, in 8-bit levels
# (format, tile size): 7 pools besides the sRGB split of the colour formats
KINDS = [
    (TexelFormat.BC1, 64),
    (TexelFormat.BC3, 64),
    (TexelFormat.BC4, 64),
    (TexelFormat.BC5, 64),
    (TexelFormat.RGBA8, 64),
    (TexelFormat.BC1, 128),
    (TexelFormat.BC7, 64),
]

VS = """#version 450 core
uniform ivec2 u_cell;
uniform float u_cells;
out vec2 v_uv;
void main() {
    vec2 corner = vec2(gl_VertexID & 1, gl_VertexID >> 1);
    v_uv = corner;
    gl_Position = vec4((vec2(u_cell) + corner) / u_cells * 2.0 - 1.0, 0.0, 1.0);
}
"""
FS = """#version 450 core
#include "texstream/common.glsl"
#include "texstream/vt.glsl"
VT_DECLARE(u_vt)
uniform bool u_srgb;
in vec2 v_uv;
out vec4 f_color;
void main() {
    vec4 c = VT_SAMPLE(u_vt, v_uv);
    f_color = vec4(u_srgb ? ts_linear_to_srgb(c.rgb) : c.rgb, 1.0);
}
"""


def kind(i: int) -> tuple[TexelFormat, int, bool]:
    """Format, tile size and sRGB flag of texture i."""
    fmt, tile = KINDS[i % len(KINDS)]
    return fmt, tile, fmt.colour and (i // len(KINDS)) % 2 == 0  # colour formats alternate sRGB / linear


def level3(i: int) -> np.ndarray:
    """What cell i must show, from the source alone: its 24 x 24 level (box filter, linear light for sRGB),
    the channels its format keeps, encoded for display as the shader does."""
    fmt, _, srgb = kind(i)
    c = image(i)[..., :3].astype(np.float64) / 255.0
    if srgb:
        c = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    c = c.reshape(CELL, 8, CELL, 8, 3).mean(axis=(1, 3))
    if fmt is TexelFormat.BC4:
        c[..., 1:] = 0.0
    elif fmt is TexelFormat.BC5:
        c[..., 2] = 0.0
    if srgb:
        c = np.where(c <= 0.0031308, c * 12.92, 1.055 * c ** (1 / 2.4) - 0.055)
    return np.clip(np.round(c * 255.0), 0, 255)  # top row first, like the image and the grid read back


def image(i: int, size: int = 192) -> np.ndarray:
    """Distinct content per texture: its own colours, stripe direction and frequency; never black."""
    rng = np.random.default_rng(i)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    angle = rng.uniform(0, np.pi)
    f = rng.uniform(2.0, 9.0)
    wave = 0.5 + 0.5 * np.sin(2 * np.pi * f * (x * np.cos(angle) + y * np.sin(angle)))
    a, b = rng.uniform(50, 230, 3), rng.uniform(50, 230, 3)
    rgb = a * wave[..., None] + b * (1 - wave[..., None])
    out = np.full((size, size, 4), 255, np.uint8)
    out[..., :3] = np.clip(rgb, 40, 235).astype(np.uint8)
    return out


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("many")
    out = []
    for i in range(COUNT):
        fmt, tile, srgb = kind(i)
        cfg = BakeConfig(texel_format=fmt, tile_size=tile, srgb=srgb, jobs=1, progress=False, bc7_quality="fast")
        path = root / f"t{i:03d}.tpk"
        bake(ArraySource(image(i), f"t{i}"), path, cfg)
        out.append(path)
    return out


class Grid:
    """Draws texture i into cell i of a 16 x 16 grid, one draw call each."""

    def __init__(self, ctx: moderngl.Context) -> None:
        self.ctx = ctx
        self.prog = program(ctx, vertex=VS, fragment=FS)
        self.vao = ctx.vertex_array(self.prog, [])
        self.fbo = ctx.simple_framebuffer((SIZE, SIZE))

    def draw(self, textures: list[VirtualTexture]) -> np.ndarray:
        self.fbo.use()
        self.fbo.clear(0.0, 0.0, 0.0, 1.0)
        self.prog["u_cells"].value = float(GRID)
        for i, vt in enumerate(textures):
            self.prog["u_cell"].value = (i % GRID, i // GRID)
            self.prog["u_srgb"].value = bool(vt.header.srgb)
            vt.bind(self.prog, "u_vt")
            self.vao.render(moderngl.TRIANGLE_STRIP, vertices=4)
        img = np.frombuffer(self.fbo.read(components=3), np.uint8).reshape(SIZE, SIZE, 3)
        return img[::-1].copy()

    def release(self) -> None:
        if self.ctx.fbo is self.fbo:
            self.ctx.detect_framebuffer(0).use()
        for obj in (self.vao, self.fbo, self.prog):
            obj.release()


@pytest.fixture
def grid(gl_context: moderngl.Context) -> Iterator[Grid]:
    g = Grid(gl_context)
    yield g
    g.release()


def config() -> StreamerConfig:
    return StreamerConfig(budget=BudgetConfig(budget_mb=96), ring_mb=8, io_threads=2, feedback_divisor=4)


def test_256_textures_draw_in_one_frame_like_their_all_resident_references(
    gl_context: moderngl.Context, packs: list[Path], grid: Grid
) -> None:
    with Streamer(gl_context, config()) as ref:
        textures = [ref.open(p) for p in packs]
        pools = {vt.pool.name for vt in textures}
        assert len(pools) >= 8, pools  # several texture units in play
        assert {vt.pool.unit for vt in textures} <= set(range(FIRST_UNIT, FIRST_UNIT + MAX_POOLS))
        for vt in textures:
            ref.make_all_resident(vt)
        ref.update()
        expected = grid.draw(textures)
        # the GPU's page tables hold every texture's entries (the reference samples through them too)
        ref.validate()
    assert not (expected == 0).all(axis=-1).any(), "the reference has black pixels: a cell did not draw"
    # independent of the engine: each cell's mean colour is its own texture's, computed by numpy from the
    # source (the mean survives filtering; aliasing and BC error move it by < 6 levels here, while a
    # texture drawn from another's pages or cache is off by more for most pairs)
    for i in range(COUNT):
        y, x = GRID - 1 - i // GRID, i % GRID
        got = expected[y * CELL : (y + 1) * CELL, x * CELL : (x + 1) * CELL].reshape(-1, 3).mean(axis=0)
        off = float(np.abs(got - level3(i).reshape(-1, 3).mean(axis=0)).max())
        assert off <= MEAN_TOLERANCE, f"texture {i} ({packs[i].name}) is {off:.1f} levels off its source's mean"

    with Streamer(gl_context, config()) as s:
        textures = [s.open(p) for p in packs]
        for _ in range(12):
            s.update()
            frame = grid.draw(textures)
            assert not (frame == 0).all(axis=-1).any(), "a texture drew black"
        assert s.stats().missing_pages == 0 and not s.busy
    scores = [
        psnr(
            frame[y * CELL : (y + 1) * CELL, x * CELL : (x + 1) * CELL],
            expected[y * CELL : (y + 1) * CELL, x * CELL : (x + 1) * CELL],
        )
        for y in range(GRID)
        for x in range(GRID)
    ]
    worst = int(np.argmin(scores))
    assert min(scores) >= CONVERGED_DB, f"texture {worst} ({packs[worst].name}) is {scores[worst]:.1f} dB off"


def test_the_257th_texture_is_refused_with_one_clear_error(gl_context: moderngl.Context, packs: list[Path]) -> None:
    from texstream.errors import EngineError

    extra = packs[0].with_name("t256-copy.tpk")  # another file: opening packs[0] again would share it
    shutil.copyfile(packs[0], extra)
    with Streamer(gl_context, config()) as s:
        for p in packs:
            s.open(p)
        assert s.open(packs[0]).id == 0  # the same pack again shares its residency: no new texture
        with pytest.raises(EngineError, match="at most 256 virtual textures"):
            s.open(extra)
