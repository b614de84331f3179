"""The shortest complete texstream program: a pack streamed onto a spinning quad with your own shader.

python demos/embed_minimal.py PACK.tpk            # a window when a display exists, else headless
"""

import os
import sys

import glfw
import moderngl
import numpy as np

from texstream import BudgetConfig, Overlay, Streamer, StreamerConfig, Telemetry, program

VS = """#version 450 core
uniform float u_angle;
in vec2 in_pos;
out vec2 v_uv;
void main() {
    v_uv = in_pos * 0.5 + 0.5;
    mat2 r = mat2(cos(u_angle), sin(u_angle), -sin(u_angle), cos(u_angle));
    gl_Position = vec4(r * in_pos * 0.9, 0.0, 1.0);
}
"""
FS = """#version 450 core
#include "texstream/common.glsl"
#include "texstream/vt.glsl"
VT_DECLARE(albedo)
in vec2 v_uv;
out vec4 f_color;
void main() {
    vec4 c = VT_SAMPLE(albedo, v_uv);                       // page lookup, trilinear, feedback
    f_color = vec4(ts_linear_to_srgb(c.rgb), 1.0);          // the cache decodes sRGB to linear
}
"""

windowed = bool(os.environ.get("DISPLAY")) and glfw.init()
if windowed:
    glfw.window_hint(glfw.CONTEXT_VERSION_MAJOR, 4)
    glfw.window_hint(glfw.CONTEXT_VERSION_MINOR, 5)
    glfw.window_hint(glfw.OPENGL_PROFILE, glfw.OPENGL_CORE_PROFILE)
    window = glfw.create_window(800, 800, "texstream: embed_minimal", None, None)
    glfw.make_context_current(window)
    ctx = moderngl.create_context()
else:
    ctx = moderngl.create_context(standalone=True, backend="egl")
fbo = ctx.screen if windowed else ctx.simple_framebuffer((800, 800))

streamer = Streamer(ctx, StreamerConfig(budget=BudgetConfig(budget_mb=128)))
texture = streamer.open(sys.argv[1])
telemetry, overlay = Telemetry(streamer), Overlay(ctx)
prog = program(ctx, vertex_shader=VS, fragment_shader=FS)
quad = ctx.buffer(np.array([-1, -1, 1, -1, -1, 1, 1, 1], "f4").tobytes())
vao = ctx.vertex_array(prog, [(quad, "2f", "in_pos")])

for frame in range(10**9 if windowed else 120):
    if windowed and (glfw.window_should_close(window) or glfw.poll_events()):
        break
    telemetry.update()  # streamer.update() + per-frame records
    fbo.use()
    fbo.clear(0.1, 0.1, 0.12)
    prog["u_angle"].value = frame * 0.005
    texture.bind(prog, "albedo")
    vao.render(moderngl.TRIANGLE_STRIP)
    overlay.draw(telemetry, fbo.size)
    if windowed:
        glfw.swap_buffers(window)

if not windowed:
    from PIL import Image

    Image.frombytes("RGB", fbo.size, fbo.read()).transpose(Image.FLIP_TOP_BOTTOM).save("embed_minimal.png")
print(streamer.memory_summary())
streamer.release()
