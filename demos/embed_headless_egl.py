"""Headless streaming through EGL: no display, no window. Renders until the view is fully streamed,
then writes a PNG. The pattern for CI and for offline renders.

    python demos/embed_headless_egl.py [PACK.tpk] [--out frame.png] [--size 512] [--frames 60]
    python demos/embed_headless_egl.py PACK.tpk --all-resident      # the reference: every tile loaded

Without a pack it bakes a 1024² procedural terrain into texstream's cache folder first.
"""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

import moderngl
from PIL import Image

from texstream import BakeConfig, BudgetConfig, Streamer, StreamerConfig, program
from texstream.bake import bake_procedural
from texstream.config import cache_dir

# A triangle that covers the screen; `texstream/common.glsl` makes it from gl_VertexID alone.
VERTEX = """#version 450 core
#include "texstream/common.glsl"
out vec2 v_uv;
void main() {
    v_uv = ts_fullscreen_uv(gl_VertexID);
    gl_Position = ts_fullscreen_position(gl_VertexID);
}
"""
# VT_DECLARE(albedo) declares the uniforms `texture.bind(prog, "albedo")` sets; VT_SAMPLE does the
# page lookup, trilinear filtering, and records which tiles this pixel wanted (the feedback).
FRAGMENT = """#version 450 core
#include "texstream/common.glsl"
#include "texstream/vt.glsl"
VT_DECLARE(albedo)
uniform float u_span;  // texture coordinates across the screen: 1 shows the whole texture
in vec2 v_uv;
out vec4 f_color;
void main() {
    vec4 c = VT_SAMPLE(albedo, 0.5 + (v_uv - 0.5) * u_span);
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


def span_at(frame: int, frames: int) -> float:
    """A zoom from the whole texture (span 1) to a quarter of its width over `frames` frames. By frame
    number, not by clock, so a run always ends on the same picture."""
    return 0.25 ** min(frame / max(frames - 1, 1), 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pack", nargs="?", help="a .tpk path or URL (default: a procedural terrain)")
    parser.add_argument("--out", default="embed_headless_egl.png", help="the PNG to write")
    parser.add_argument("--size", type=int, default=512, help="framebuffer width and height in pixels")
    parser.add_argument("--frames", type=int, default=60, help="frames of the zoom before settling")
    parser.add_argument("--all-resident", action="store_true", help="load every tile first: the reference")
    args = parser.parse_args()

    ctx = moderngl.create_context(standalone=True, backend="egl", require=450)
    fbo = ctx.simple_framebuffer((args.size, args.size))
    fbo.use()  # the viewport the streamer sizes its feedback buffers from

    streamer = Streamer(ctx, StreamerConfig(budget=BudgetConfig(budget_mb=64)))
    try:
        texture = streamer.open(args.pack or default_pack())
        if args.all_resident:
            streamer.make_all_resident(texture)
        prog = program(ctx, vertex_shader=VERTEX, fragment_shader=FRAGMENT)  # resolves the texstream/ includes
        vao = ctx.vertex_array(prog, [])
        # No swap chain here: without a throttle the CPU would queue frames far ahead of the GPU and
        # every feedback readback would arrive that many frames late.
        throttle = streamer.gl.throttle(2)
        gc.freeze()  # loading is done: keep the collector's full passes out of the frame loop

        frame = settled = 0
        while settled < 3 and frame < args.frames + 600:
            stats = streamer.update()  # once per frame, before the draws that sample the textures
            fbo.use()
            fbo.clear(0.1, 0.1, 0.12)
            prog["u_span"].value = span_at(frame, args.frames)
            texture.bind(prog, "albedo")
            vao.render(moderngl.TRIANGLES, vertices=3)
            throttle.frame_done()
            frame += 1
            # After the zoom, hold the last view until nothing it wants is missing or loading, a few
            # frames running (feedback comes back a frame or two after the draw that wrote it).
            done = frame >= args.frames and stats.missing_pages == 0 and not streamer.busy
            settled = settled + 1 if done else 0

        image = Image.frombytes("RGB", fbo.size, fbo.read(components=3))
        image.transpose(Image.Transpose.FLIP_TOP_BOTTOM).save(args.out)  # GL rows run bottom-up
        print(f"{args.out}: {frame} frames")
        throttle.release()
    finally:
        streamer.release()  # before the context: the streamer frees GL objects
        ctx.release()


if __name__ == "__main__":
    main()
