"""The HUD: it changes only its own rectangle, its text is the font's Pillow rendering, GL state it
touches is restored, and release is idempotent."""

from __future__ import annotations

from collections.abc import Iterator

import moderngl
import numpy as np
import pytest
from PIL import Image, ImageDraw

from texstream.apps.render import PlaneRenderer
from texstream.errors import GLError
from texstream.gl.gl_ext import GLExt
from texstream.runtime.streamer import Streamer
from texstream.scene.camera import View
from texstream.telemetry import Overlay, Telemetry
from texstream.telemetry.overlay import LEVEL_COLOURS, NO_LEVEL_COLOUR
from texstream.testing import psnr

from .conftest import Packs, streamer_config

pytestmark = pytest.mark.gl

SIZE = (640, 600)
TEXT = "texstream 0123456789 MiB/s p95 latency"


@pytest.fixture(scope="module")
def overlay(gl_context: moderngl.Context) -> Iterator[Overlay]:
    ov = Overlay(gl_context)
    yield ov
    ov.release()


@pytest.fixture
def canvas(gl_context: moderngl.Context) -> Iterator[moderngl.Framebuffer]:
    colour = gl_context.renderbuffer((400, 48), 4)
    fbo = gl_context.framebuffer(color_attachments=[colour])
    yield fbo
    if gl_context.fbo is fbo:
        gl_context.detect_framebuffer(0).use()
    fbo.release()
    colour.release()


def read(fbo: moderngl.Framebuffer) -> np.ndarray:
    w, h = fbo.size
    return np.frombuffer(fbo.read(components=4, alignment=1), np.uint8).reshape(h, w, 4)[::-1].copy()


def test_hud_changes_only_its_rectangle(gl_context: moderngl.Context, packs: Packs, overlay: Overlay) -> None:
    renderer = PlaneRenderer(gl_context, SIZE)
    try:
        with Streamer(gl_context, streamer_config()) as streamer, Telemetry(streamer, dt=1 / 60) as tel:
            vt = streamer.open(packs.small)
            streamer.open(packs.normals)
            for i in range(8):
                tel.update()
                tel.gpu_begin()
                renderer.draw(vt, View(0.5, 0.5, 1.5 if i < 4 else 0.6))
                tel.gpu_end()
            plain = renderer.read()
            rect = overlay.draw(tel, SIZE)  # into the renderer's framebuffer, still bound
            hud = renderer.read()
    finally:
        renderer.release()
    x, y, w, h = rect
    assert rect == overlay.last_rect and (x, y) == (overlay.margin, overlay.margin)
    assert 0 < w < SIZE[0] and 0 < h <= SIZE[1] - y
    inside = np.zeros(hud.shape[:2], bool)
    inside[y : y + h, x : x + w] = True
    np.testing.assert_array_equal(hud[~inside], plain[~inside], "pixels outside the HUD changed")
    changed = np.any(hud[inside] != plain[inside], axis=-1)
    assert changed.mean() > 0.9, "the translucent panel covers its whole rectangle"
    assert psnr(hud[inside], plain[inside]) < 20
    # the panel darkens what is bright behind it; text and graphs add bright pixels
    bright = inside & (plain[..., :3].min(-1) > 100)
    if np.count_nonzero(bright) > 1000:
        assert hud[bright][..., :3].mean() < plain[bright][..., :3].mean()
    assert np.count_nonzero(hud[inside][..., :3].min(-1) > 200) > 200


def test_text_is_the_fonts_pillow_rendering(
    gl_context: moderngl.Context, overlay: Overlay, canvas: moderngl.Framebuffer
) -> None:
    canvas.use()
    canvas.clear(0, 0, 0, 1)
    box = overlay.draw_text(TEXT, canvas.size, pos=(6, 5), colour=(255, 255, 255, 255))
    got = read(canvas)[..., 0].astype(np.float64)
    ref_img = Image.new("L", canvas.size, 0)
    ImageDraw.Draw(ref_img).text((6, 5), TEXT, font=overlay.font.font, fill=255)
    ref = np.asarray(ref_img, np.float64)
    x, y, w, h = box
    assert w > 200 and h >= overlay.font.line_height
    region = (slice(y, y + h), slice(x, x + w))
    corr = np.corrcoef(got[region].ravel(), ref[region].ravel())[0, 1]
    assert corr > 0.98, f"GPU text differs from Pillow's rendering (correlation {corr:.3f})"
    assert psnr(got[region], ref[region]) > 30
    outside = np.ones(got.shape, bool)
    outside[region] = False
    assert not got[outside].any(), "no pixel outside the text box is touched"
    assert np.count_nonzero(got[region] > 128) > 100, "the glyphs have solid strokes"


def test_text_background_and_colour(
    gl_context: moderngl.Context, overlay: Overlay, canvas: moderngl.Framebuffer
) -> None:
    canvas.use()
    canvas.clear(1, 1, 1, 1)
    x, y, w, h = overlay.draw_text("A\nB", canvas.size, pos=(2, 2), colour=(255, 0, 0, 255), background=(0, 0, 0, 255))
    img = read(canvas)
    assert h == 2 * overlay.font.line_height
    assert (img[y : y + h, x : x + w, 1] < 255).all(), "opaque black background under red text"
    assert img[y : y + h, x : x + w, 0].max() == 255 and img[y : y + h, x : x + w, 2].max() == 0
    assert (img[y + h :, :, :3] == 255).all()


def test_gl_state_is_restored(gl_context: moderngl.Context, overlay: Overlay, canvas: moderngl.Framebuffer) -> None:
    gl = GLExt(gl_context)
    canvas.use()
    gl_context.viewport = (3, 4, 100, 20)
    gl_context.enable(moderngl.DEPTH_TEST | moderngl.CULL_FACE)
    gl_context.disable(moderngl.BLEND)
    gl_context.blend_func = (moderngl.ONE, moderngl.ONE, moderngl.DST_ALPHA, moderngl.ZERO)
    gl_context.blend_equation = (moderngl.FUNC_SUBTRACT, moderngl.MAX)
    try:
        overlay.draw_text("state", canvas.size, pos=(1, 1), background=(0, 0, 0, 128))
        assert gl_context.viewport == (3, 4, 100, 20)
        assert gl.get_integer(0x0B71) == 1 and gl.get_integer(0x0B44) == 1 and gl.get_integer(0x0BE2) == 0
        assert [gl.get_integer(p) for p in (0x80C9, 0x80C8, 0x80CB, 0x80CA)] == [
            moderngl.ONE,
            moderngl.ONE,
            moderngl.DST_ALPHA,
            moderngl.ZERO,
        ]
        assert (gl.get_integer(0x8009), gl.get_integer(0x883D)) == (moderngl.FUNC_SUBTRACT, moderngl.MAX)
        gl_context.enable(moderngl.BLEND)
        overlay.draw_text("state", canvas.size)
        assert gl.get_integer(0x0BE2) == 1, "blending left on when it was on"
    finally:
        gl_context.disable(moderngl.DEPTH_TEST | moderngl.CULL_FACE | moderngl.BLEND)
        gl_context.blend_func = moderngl.DEFAULT_BLENDING
        gl_context.blend_equation = moderngl.FUNC_ADD
        gl_context.viewport = (0, 0, *canvas.size)


def test_corners_and_no_frame_yet(gl_context: moderngl.Context, canvas: moderngl.Framebuffer) -> None:
    with (
        Streamer(gl_context, streamer_config()) as streamer,
        Telemetry(streamer) as tel,
        Overlay(gl_context, corner="bottom-right", margin=0, font_size=10) as ov,
    ):
        canvas.use()
        x, y, w, h = ov.draw(tel, canvas.size)  # nothing recorded yet: a one-line panel
        assert (x + w, y + h) == canvas.size or x == 0
        assert h < 40
    with pytest.raises(ValueError, match="corner"):
        Overlay(gl_context, corner="middle")


def test_residency_minimap_colours(gl_context: moderngl.Context, packs: Packs, overlay: Overlay) -> None:
    with Streamer(gl_context, streamer_config()) as streamer:
        vt = streamer.open(packs.small)
        top = vt.table.level_count - 1
        pinned = overlay.residency_image(vt)  # noqa: SLF001
        streamer.make_all_resident(vt)
        full = overlay.residency_image(vt)  # noqa: SLF001
    tx, ty = int(vt.table.tiles_x[0]), int(vt.table.tiles_y[0])
    assert pinned.shape == full.shape == (ty, tx, 4)
    first_pinned = vt.table.first_pinned_level  # pages sample the finest pinned level
    assert (pinned[..., :3] == LEVEL_COLOURS[min(first_pinned, len(LEVEL_COLOURS) - 1)]).all()
    assert (full[..., :3] == LEVEL_COLOURS[0]).all()
    assert not (full[..., :3] == NO_LEVEL_COLOUR).all(-1).any() and top >= 1


def test_release_is_idempotent(gl_context: moderngl.Context, canvas: moderngl.Framebuffer) -> None:
    ov = Overlay(gl_context)
    ov.release()
    ov.release()
    with pytest.raises(GLError, match="after release"):
        ov.draw_text("x", canvas.size)
    with pytest.raises(ValueError, match="fb_size"):
        Overlay.draw_text(ov, "x", (0, 10))
