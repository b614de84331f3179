"""A GLFW window that streams a pack, with the loop written out: events, update(), draw, swap.

    python demos/embed_glfw.py [PACK.tpk]                          # scroll to zoom, drag to pan, Esc quits
    python demos/embed_glfw.py PACK.tpk --frames 60 --out frame.png  # close after 60 frames, save the last

It needs a display (under CI: Xvfb). Without a pack it bakes a 1024² procedural terrain into
texstream's cache folder first.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import glfw
import moderngl
from PIL import Image

from texstream import BakeConfig, BudgetConfig, Streamer, StreamerConfig, program
from texstream.bake import bake_procedural
from texstream.config import cache_dir

VERTEX = """#version 450 core
#include "texstream/common.glsl"
out vec2 v_uv;
void main() {
    v_uv = ts_fullscreen_uv(gl_VertexID);
    gl_Position = ts_fullscreen_position(gl_VertexID);
}
"""
FRAGMENT = """#version 450 core
#include "texstream/common.glsl"
#include "texstream/vt.glsl"
VT_DECLARE(albedo)
uniform vec2 u_center;  // texture coordinate at the middle of the screen
uniform vec2 u_span;    // texture coordinates across the screen, per axis (keeps texels square)
in vec2 v_uv;
out vec4 f_color;
void main() {
    vec4 c = VT_SAMPLE(albedo, u_center + (v_uv - 0.5) * u_span);
    f_color = vec4(ts_linear_to_srgb(c.rgb), 1.0);  // the cache decodes sRGB to linear
}
"""


def default_pack() -> Path:
    """A 1024² procedural terrain, baked once (well under a second) into texstream's cache folder."""
    path = cache_dir() / "examples" / "terrain-1024.tpk"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        bake_procedural(path, 1024, "terrain", seed=1, config=BakeConfig(tile_size=64, progress=False))
    return path


class View:
    """Pan and zoom from the mouse: the texture's height fills the window at zoom 1."""

    def __init__(self) -> None:
        self.center, self.zoom = [0.5, 0.5], 1.0
        self.last_cursor: tuple[float, float] | None = None

    def span(self, size: tuple[int, int]) -> tuple[float, float]:
        return size[0] / max(size[1], 1) / self.zoom, 1.0 / self.zoom

    def on_scroll(self, window, x_offset: float, y_offset: float) -> None:
        self.zoom = min(max(self.zoom * 1.25**y_offset, 0.5), 64.0)

    def on_cursor(self, window, x: float, y: float) -> None:
        if glfw.get_mouse_button(window, glfw.MOUSE_BUTTON_LEFT) == glfw.PRESS and self.last_cursor:
            size = glfw.get_window_size(window)
            span_x, span_y = self.span(size)
            self.center[0] -= (x - self.last_cursor[0]) / size[0] * span_x
            self.center[1] += (y - self.last_cursor[1]) / size[1] * span_y  # window y runs down
        self.last_cursor = (x, y)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pack", nargs="?", help="a .tpk path or URL (default: a procedural terrain)")
    parser.add_argument("--frames", type=int, default=0, help="close after this many frames (0: never)")
    parser.add_argument("--out", help="save the last frame to this PNG")
    parser.add_argument("--size", default="960x540", help="window size, WIDTHxHEIGHT")
    args = parser.parse_args()
    width, height = map(int, args.size.split("x"))

    if not glfw.init():
        print("embed_glfw: GLFW could not start (no display?); see embed_headless_egl.py", file=sys.stderr)
        return 1
    glfw.window_hint(glfw.CONTEXT_VERSION_MAJOR, 4)  # texstream needs OpenGL 4.5 core
    glfw.window_hint(glfw.CONTEXT_VERSION_MINOR, 5)
    glfw.window_hint(glfw.OPENGL_PROFILE, glfw.OPENGL_CORE_PROFILE)
    glfw.window_hint(glfw.OPENGL_FORWARD_COMPAT, True)
    window = glfw.create_window(width, height, "texstream in GLFW", None, None)
    if not window:
        glfw.terminate()
        print("embed_glfw: no OpenGL 4.5 window", file=sys.stderr)
        return 1
    glfw.make_context_current(window)
    glfw.swap_interval(1)  # vsync: the swap keeps the CPU at most a frame or two ahead of the GPU
    ctx = moderngl.create_context()  # wraps the window's context, current on this thread

    view = View()
    glfw.set_scroll_callback(window, view.on_scroll)
    glfw.set_cursor_pos_callback(window, view.on_cursor)

    streamer = Streamer(ctx, StreamerConfig(budget=BudgetConfig(budget_mb=128)))
    try:
        texture = streamer.open(args.pack or default_pack())
        prog = program(ctx, vertex_shader=VERTEX, fragment_shader=FRAGMENT)  # resolves the texstream/ includes
        vao = ctx.vertex_array(prog, [])
        gc.freeze()  # loading is done: keep the collector's full passes out of the frame loop

        frame = 0
        while not glfw.window_should_close(window):
            glfw.poll_events()
            if glfw.get_key(window, glfw.KEY_ESCAPE) == glfw.PRESS:
                break
            if args.frames:  # a scripted zoom by frame number, so a run of N frames is repeatable
                view.zoom = 4.0 ** min(frame / max(args.frames - 1, 1), 1.0)
            size = glfw.get_framebuffer_size(window)  # pixels; differs from the window size on HiDPI
            ctx.screen.use()
            ctx.viewport = (0, 0, *size)  # the streamer grows its feedback buffers to the viewport

            streamer.update()  # once per frame, on this (the GL) thread, before the draws
            ctx.clear(0.1, 0.1, 0.12)
            prog["u_center"].value = tuple(view.center)
            prog["u_span"].value = view.span(size)
            texture.bind(prog, "albedo")
            vao.render(moderngl.TRIANGLES, vertices=3)

            frame += 1
            if frame == args.frames:
                if args.out:  # read before the swap: the back buffer holds this frame
                    image = Image.frombytes("RGB", size, ctx.screen.read(components=3))
                    image.transpose(Image.Transpose.FLIP_TOP_BOTTOM).save(args.out)  # GL rows run bottom-up
                break
            glfw.swap_buffers(window)
    finally:
        streamer.release()  # frees GL objects: before the context goes
        ctx.release()
        glfw.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
