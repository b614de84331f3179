"""Texture-coordinate origin: which image row v = 0 samples, per texture, through the public API.

The image is asymmetric (a different colour in each quadrant, as the image reads: red top-left,
green top-right, blue bottom-left, white bottom-right) and drawn on a full-screen triangle whose
v = 0 lies at the bottom of the screen, the moderngl habit. With the default origin (bottom-left)
the picture reads right side up; with `Origin.TOP_LEFT` it is mirrored top to bottom. Streaming
from the pinned levels checks that the feedback names the pages sampling reads: a streamed frame
converges to the all-resident frame in both origins.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import moderngl
import numpy as np
import pytest
from PIL import Image

import texstream as ts
from texstream.bake import bake_file
from texstream.testing import psnr

pytestmark = pytest.mark.gl

SIZE = 128  # framebuffer side
RED, GREEN, BLUE, WHITE = (230, 30, 30), (30, 200, 40), (40, 50, 220), (240, 240, 240)

VS = """#version 450 core
#include "texstream/common.glsl"
out vec2 v_uv;
void main() {
    v_uv = ts_fullscreen_uv(gl_VertexID);
    gl_Position = ts_fullscreen_position(gl_VertexID);
}
"""
FS = """#version 450 core
#include "texstream/vt.glsl"
VT_DECLARE(u_vt)
uniform vec4 u_window;  // uv of the screen's bottom-left corner, uv span across the screen
in vec2 v_uv;
out vec4 f_color;
void main() { f_color = vec4(VT_SAMPLE(u_vt, u_window.xy + v_uv * u_window.zw).rgb, 1.0); }
"""


def quadrants(side: int) -> np.ndarray:
    """RGB, top row first; fine stripes inside each quadrant so a coarse level reads differently."""
    half = side // 2
    img = np.zeros((side, side, 3), np.uint8)
    img[:half, :half], img[:half, half:], img[half:, :half], img[half:, half:] = RED, GREEN, BLUE, WHITE
    stripes = (np.arange(side) // 2) % 2 == 0
    img[:, stripes] = (img[:, stripes] * 0.7).astype(np.uint8)
    return img


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("origin")
    Image.fromarray(quadrants(512)).save(root / "quadrants.png")
    out = root / "quadrants.tpk"
    config = ts.BakeConfig(texel_format="rgba8", srgb=False, tile_size=64, jobs=1, progress=False)
    bake_file(root / "quadrants.png", out, config)
    return out


class Screen:
    def __init__(self, ctx: moderngl.Context) -> None:
        self.ctx = ctx
        self.prog = ts.program(ctx, vertex=VS, fragment=FS)
        self.vao = ctx.vertex_array(self.prog, [])
        self.fbo = ctx.simple_framebuffer((SIZE, SIZE))

    def draw(self, vt: ts.VirtualTexture, window: tuple[float, float, float, float]) -> np.ndarray:
        """(SIZE, SIZE, 3) uint8, top row of the screen first."""
        self.fbo.use()
        self.fbo.clear(0.0, 0.0, 0.0, 1.0)
        self.prog["u_window"].value = window
        vt.bind(self.prog, "u_vt")
        self.vao.render(moderngl.TRIANGLES, vertices=3)
        img = np.frombuffer(self.fbo.read(components=3), np.uint8).reshape(SIZE, SIZE, 3)
        return img[::-1].copy()

    def release(self) -> None:
        if self.ctx.fbo is self.fbo:
            self.ctx.detect_framebuffer(0).use()
        for obj in (self.vao, self.fbo, self.prog):
            obj.release()


@pytest.fixture
def screen(gl_context: moderngl.Context) -> Iterator[Screen]:
    s = Screen(gl_context)
    s.fbo.use()  # the viewport the streamer sizes its feedback from
    yield s
    s.release()


def corner_colours(img: np.ndarray) -> dict[str, tuple[int, ...]]:
    """Mean colour (rounded) of a patch in each quadrant of the screen, by screen corner."""
    q = SIZE // 4
    patch = {"top-left": img[q - 8 : q + 8, q - 8 : q + 8], "top-right": img[q - 8 : q + 8, 3 * q - 8 : 3 * q + 8]}
    patch |= {"bottom-left": img[3 * q - 8 : 3 * q + 8, q - 8 : q + 8]}
    patch |= {"bottom-right": img[3 * q - 8 : 3 * q + 8, 3 * q - 8 : 3 * q + 8]}
    return {k: tuple(int(c) for c in v.reshape(-1, 3).mean(0).round()) for k, v in patch.items()}


def dominant(colour: tuple[int, ...]) -> str:
    """Which of the four quadrant colours `colour` is closest to."""
    names = {"red": RED, "green": GREEN, "blue": BLUE, "white": WHITE}
    return min(names, key=lambda n: sum((a - b) ** 2 for a, b in zip(colour, names[n], strict=True)))


@pytest.mark.parametrize(
    ("origin", "expected"),
    [
        (None, {"top-left": "red", "top-right": "green", "bottom-left": "blue", "bottom-right": "white"}),
        (
            ts.Origin.BOTTOM_LEFT,
            {"top-left": "red", "top-right": "green", "bottom-left": "blue", "bottom-right": "white"},
        ),
        (ts.Origin.TOP_LEFT, {"top-left": "blue", "top-right": "white", "bottom-left": "red", "bottom-right": "green"}),
    ],
    ids=["default", "bottom-left", "top-left"],
)
def test_corners_land_where_the_origin_says(
    screen: Screen, pack: Path, origin: ts.Origin | None, expected: dict
) -> None:
    with ts.Streamer(screen.ctx) as streamer:
        vt = streamer.open(pack) if origin is None else streamer.open(pack, origin=origin)
        assert vt.origin is (origin or ts.Origin.BOTTOM_LEFT)
        streamer.make_all_resident(vt)
        streamer.update()
        seen = {corner: dominant(c) for corner, c in corner_colours(screen.draw(vt, (0.0, 0.0, 1.0, 1.0))).items()}
    assert seen == expected


def test_origin_can_change_after_open(screen: Screen, pack: Path) -> None:
    with ts.Streamer(screen.ctx) as streamer:
        vt = streamer.open(pack, origin="top-left")
        streamer.make_all_resident(vt)
        streamer.update()
        flipped = screen.draw(vt, (0.0, 0.0, 1.0, 1.0))
        vt.origin = ts.Origin.BOTTOM_LEFT
        upright = screen.draw(vt, (0.0, 0.0, 1.0, 1.0))
    np.testing.assert_array_equal(flipped, upright[::-1])


@pytest.mark.parametrize("origin", list(ts.Origin), ids=[o.value for o in ts.Origin])
def test_feedback_streams_the_pages_sampling_reads(screen: Screen, pack: Path, origin: ts.Origin) -> None:
    """One corner of the image at 1:1 needs level-0 pages only the feedback can ask for: if feedback
    named the pages mirrored, the frame would stay at the pinned levels' blur."""
    window = (0.0, 0.0, SIZE / 512, SIZE / 512)  # the bottom-left 128² texels of uv space, 1:1
    with ts.Streamer(screen.ctx, ts.StreamerConfig(pinned_levels=2)) as streamer:
        vt = streamer.open(pack, origin=origin)
        first = screen.draw(vt, window)
        settled = 0
        for i in range(300):  # feedback comes back a frame or two after the draw that wrote it
            stats = streamer.update()
            frame = screen.draw(vt, window)
            known = i >= 3 and stats.wanted_pages > 0  # its feedback read: nothing is missing before that
            settled = settled + 1 if known and stats.missing_pages == 0 and not streamer.busy else 0
            if settled == 3:
                break
        reference = ts.Streamer(screen.ctx)
        with reference:
            ref_vt = reference.open(pack, origin=origin)
            reference.make_all_resident(ref_vt)
            reference.update()
            expected = screen.draw(ref_vt, window)
    assert psnr(first, expected) < 30.0  # the pinned levels alone cannot show the stripes
    assert psnr(frame, expected) >= 45.0


def test_bad_origin_names_the_choices(screen: Screen, pack: Path) -> None:
    with ts.Streamer(screen.ctx) as streamer, pytest.raises(ValueError, match="'bottom-left', 'top-left'"):
        streamer.open(pack, origin="upside-down")


def test_handles_of_one_pack_each_keep_their_own_origin(screen: Screen, pack: Path) -> None:
    """A pack opened twice shares its residency, not its origin: each handle draws its own way."""
    with ts.Streamer(screen.ctx) as streamer:
        upright = streamer.open(pack)
        flipped = streamer.open(pack, origin=ts.Origin.TOP_LEFT)
        assert (upright.origin, flipped.origin) == (ts.Origin.BOTTOM_LEFT, ts.Origin.TOP_LEFT)
        assert upright.shader_meta[1] == flipped.shader_meta[1]  # one page table
        streamer.make_all_resident(upright)
        streamer.update()
        a = screen.draw(upright, (0.0, 0.0, 1.0, 1.0))
        b = screen.draw(flipped, (0.0, 0.0, 1.0, 1.0))
    np.testing.assert_array_equal(a, b[::-1])
