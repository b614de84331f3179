"""A moderngl-window app that streams a pack: the streamer lives in a `WindowConfig`.

    python demos/embed_moderngl_window.py [PACK.tpk]                 # a window (pyglet by default)
    python demos/embed_moderngl_window.py --window headless --backend egl --frames 60 --out frame.png

Drag with the left mouse button to pan, scroll to zoom, Esc quits. `--frames N` closes after N frames
and `--out` saves the last one (with moderngl-window's headless window this runs without a display).
Without a pack it bakes a 1024² procedural terrain into texstream's cache folder first.
"""

from __future__ import annotations

import gc
from argparse import ArgumentParser
from pathlib import Path

import moderngl
import moderngl_window as mglw
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


class StreamingApp(mglw.WindowConfig):
    gl_version = (4, 5)  # texstream needs OpenGL 4.5 core
    title = "texstream in moderngl-window"
    window_size = (960, 540)
    aspect_ratio = None  # any window shape: the view keeps texels square itself

    @classmethod
    def add_arguments(cls, parser: ArgumentParser) -> None:
        parser.add_argument("pack", nargs="?", help="a .tpk path or URL (default: a procedural terrain)")
        parser.add_argument("--frames", type=int, default=0, help="close after this many frames (0: never)")
        parser.add_argument("--out", help="save the last frame to this PNG")

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.streamer = Streamer(self.ctx, StreamerConfig(budget=BudgetConfig(budget_mb=128)))
        self.texture = self.streamer.open(self.argv.pack or default_pack())
        self.prog = program(
            self.ctx, vertex_shader=VERTEX, fragment_shader=FRAGMENT
        )  # resolves the texstream/ includes
        self.vao = self.ctx.vertex_array(self.prog, [])
        self.center, self.zoom, self.frame = [0.5, 0.5], 1.0, 0
        self.wnd.exit_key = None  # Esc is handled below: the streamer must go before the GL context
        gc.freeze()  # loading is done: keep the collector's full passes out of the frame loop

    def span(self) -> tuple[float, float]:
        """Texture coordinates across the window: the whole texture's height at zoom 1."""
        width, height = self.wnd.buffer_size
        return width / height / self.zoom, 1.0 / self.zoom

    def on_render(self, time: float, frame_time: float) -> None:
        # Once per frame, on this (the GL) thread, before the draws that sample the textures. The
        # window's buffer swap keeps the CPU at most a frame or two ahead of the GPU.
        self.streamer.update()
        if self.argv.frames:  # a scripted zoom by frame number, so a headless run is repeatable
            self.zoom = 4.0 ** min(self.frame / max(self.argv.frames - 1, 1), 1.0)
        self.ctx.clear(0.1, 0.1, 0.12)  # the window's framebuffer, bound by moderngl-window
        self.prog["u_center"].value = tuple(self.center)
        self.prog["u_span"].value = self.span()
        self.texture.bind(self.prog, "albedo")
        self.vao.render(moderngl.TRIANGLES, vertices=3)
        self.frame += 1
        if self.frame == self.argv.frames:
            if self.argv.out:
                self.save(self.argv.out)
            self.quit()

    def on_key_event(self, key, action, modifiers) -> None:
        if key == self.wnd.keys.ESCAPE and action == self.wnd.keys.ACTION_PRESS:
            self.quit()

    def quit(self) -> None:
        self.streamer.release()  # frees GL objects: before the window takes its context down
        self.wnd.close()

    def save(self, path: str) -> None:
        fbo = self.wnd.fbo
        image = Image.frombytes("RGB", fbo.size, fbo.read(components=3))
        image.transpose(Image.Transpose.FLIP_TOP_BOTTOM).save(path)  # GL rows run bottom-up

    def on_mouse_drag_event(self, x: int, y: int, dx: int, dy: int) -> None:
        span_x, span_y = self.span()
        width, height = self.wnd.size
        self.center[0] -= dx / width * span_x
        self.center[1] += dy / height * span_y  # window y runs down, texture v runs up

    def on_mouse_scroll_event(self, x_offset: float, y_offset: float) -> None:
        self.zoom = min(max(self.zoom * 1.25**y_offset, 0.5), 64.0)

    def on_close(self) -> None:
        # The window's close button: the GL context is destroyed after this returns. release() is
        # idempotent, so the quit() path calling it again is harmless.
        self.streamer.release()


if __name__ == "__main__":
    mglw.run_window_config(StreamingApp)
