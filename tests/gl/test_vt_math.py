"""vt.glsl's integer helpers against Python: the page grid and page index of every tile size, and the
exact division the slot decode uses (a float reciprocal below 2^20, the integer division above),
and the fragment's feedback cell for any stride (a mask for powers of two, else the remainder).

The helpers run in a fragment shader (vt.glsl reads gl_FragCoord, so not in a compute shader), one
fragment per case, reading the cases from one storage buffer and writing the answers to another.
"""

from __future__ import annotations

from collections.abc import Iterator

import moderngl
import numpy as np
import pytest

from texstream.gl import shaders
from texstream.pack.format import TILE_SIZES, PackHeader, TexelFormat

pytestmark = pytest.mark.gl

VS = """#version 450 core
#include "texstream/common.glsl"
void main() { gl_Position = ts_fullscreen_position(gl_VertexID); }
"""
FS = """#version 450 core
#include "texstream/vt.glsl"
uniform VTInfo u_vt;
uniform int u_what;  // 0: vt_udiv(a, b); 1: vt_pages_in_level(level = a); 2: vt_page_index(t = (a, b) / 16, level);
                     // 3: vt_feedback_cell(stride = u_level) of the fragment
uniform int u_level;
layout(std430, binding = 2) readonly buffer Cases { uvec2 cases[]; };
layout(std430, binding = 3) writeonly buffer Answers { uvec2 answers[]; };
out vec4 f_color;
void main() {
    int i = int(gl_FragCoord.x);
    uvec2 c = cases[i];
    if (u_what == 0) {
        answers[i] = uvec2(vt_udiv(c.x, c.y), 0u);
    } else if (u_what == 1) {
        answers[i] = uvec2(vt_pages_in_level(u_vt, int(c.x)));
    } else if (u_what == 3) {
        answers[i] = uvec2(vt_feedback_cell(u_level));
    } else {
        vec2 t = vec2(ivec2(c)) / 16.0;
        answers[i] = uvec2(vt_page_index(u_vt, t, u_level), 0u);
    }
    f_color = vec4(0.0);
}
"""


class _Runner:
    """Draws one fragment per case; returns the answers (uint32 pairs)."""

    def __init__(self, ctx: moderngl.Context) -> None:
        self.ctx = ctx
        self.prog = shaders.program(ctx, vertex=VS, fragment=FS)
        self.vao = ctx.vertex_array(self.prog, [])
        self.pages = ctx.buffer(np.zeros(64, np.uint32).tobytes())  # level bases all 0: index = y * nx + x
        self.feedback = ctx.buffer(np.zeros(8, np.uint32).tobytes())
        self.fbo = ctx.simple_framebuffer((16384, 1))  # the widest case; each draw covers n fragments

    def run(self, what: int, cases: np.ndarray, header: PackHeader | None = None, level: int = 0) -> np.ndarray:
        cases = np.ascontiguousarray(cases, np.uint32).reshape(-1, 2)
        n = len(cases)
        assert n <= self.fbo.width, "more cases than the framebuffer's width"
        inputs = self.ctx.buffer(cases.tobytes())
        outputs = self.ctx.buffer(reserve=8 * n)
        try:
            if header is not None:
                self.prog["u_vt.size"].value = (header.width, header.height, 1 / header.width, 1 / header.height)
                self.prog["u_vt.tile"].value = (header.tile_size, header.border, header.slot_size, 1 / 4096)
                self.prog["u_vt.meta"].value = (header.level_count, 0, 0, 1)
            self.prog["u_what"].value = what
            self.prog["u_level"].value = level
            inputs.bind_to_storage_buffer(2)
            outputs.bind_to_storage_buffer(3)
            self.pages.bind_to_storage_buffer(6)
            self.feedback.bind_to_storage_buffer(7)
            self.fbo.use()
            self.ctx.viewport = (0, 0, n, 1)
            self.vao.render(moderngl.TRIANGLES, vertices=3)
            self.ctx.memory_barrier()
            return np.frombuffer(outputs.read(), np.uint32).reshape(n, 2).copy()
        finally:
            inputs.release()
            outputs.release()

    def release(self) -> None:
        self.ctx.detect_framebuffer(0).use()
        for obj in (self.vao, self.prog, self.pages, self.feedback, self.fbo):
            obj.release()


@pytest.fixture
def runner(gl_context: moderngl.Context) -> Iterator[_Runner]:
    r = _Runner(gl_context)
    yield r
    r.release()


def test_udiv_is_exact_on_both_paths(runner: _Runner) -> None:
    rng = np.random.default_rng(5)
    b = np.concatenate([np.arange(1, 200), rng.integers(1, 1 << 14, 1800)]).astype(np.int64)
    q = rng.integers(0, (1 << 20) // b + 2)  # quotients up to past 2^20 / b: both sides of the switch
    a = np.concatenate([q * b, q * b - 1, q * b + 1, q * b + b - 1])
    b = np.tile(b, 4)
    big = rng.integers(1 << 20, 1 << 28, 500)
    a = np.concatenate([a, big, np.full(8, (1 << 20) - 1), np.full(8, 1 << 20)])
    b = np.concatenate([b, rng.integers(1, 1 << 12, 500), np.arange(1, 9), np.arange(1, 9)])
    keep = a >= 0
    a, b = a[keep], b[keep]
    got = runner.run(0, np.stack([a, b], axis=1))[:, 0]
    np.testing.assert_array_equal(got, a // b)


@pytest.mark.parametrize("tile", TILE_SIZES)
def test_page_grid_matches_the_pack_layout(runner: _Runner, tile: int) -> None:
    for width, height in ((tile * 5 + 1, tile * 3 - 1), (4096 + 17, 333), (tile, tile), (8191, 12345)):
        header = PackHeader(width=width, height=height, tile_size=tile, texel_format=TexelFormat.BC1)
        levels = header.level_count
        got = runner.run(1, np.stack([np.arange(levels), np.zeros(levels)], axis=1), header)
        table = header.level_table
        want = np.stack([table["tiles_x"][:levels], table["tiles_y"][:levels]], axis=1)
        np.testing.assert_array_equal(got, want, err_msg=f"{width}x{height}, tile {tile}")


@pytest.mark.parametrize("tile", TILE_SIZES)
def test_page_index_clamps_to_the_texture(runner: _Runner, tile: int) -> None:
    header = PackHeader(width=tile * 7 + 5, height=tile * 4 + 9, tile_size=tile, texel_format=TexelFormat.BC1)
    rng = np.random.default_rng(tile)
    # texel coordinates in 1/16 texel: inside, on tile edges, just below them, and past every edge
    span = np.array([header.width, header.height]) * 16
    t = np.concatenate(
        [
            rng.integers(-span // 4, span + span // 4, (400, 2)),
            (np.arange(0, 8)[:, None] * tile * 16 + np.array([[0, -1]])).reshape(-1, 1).repeat(2, axis=1),
            np.array([[-1, -1], [span[0] - 1, span[1] - 1], [span[0], span[1]], [span[0] * 3, -span[1]]]),
        ]
    )
    for level in range(header.level_count):
        got = runner.run(2, t.astype(np.int32).view(np.uint32), header, level)[:, 0]
        n = np.array([header.level_table["tiles_x"][level], header.level_table["tiles_y"][level]], np.int64)
        page = np.clip(np.floor(t / 16 / (tile << level)).astype(np.int64), 0, n - 1)
        np.testing.assert_array_equal(got, page[:, 1] * n[0] + page[:, 0], err_msg=f"level {level}")


@pytest.mark.parametrize("stride", [1, 2, 3, 4, 5, 7, 8, 12, 16])
def test_feedback_cell_is_the_remainder_for_any_stride(runner: _Runner, stride: int) -> None:
    n = 4000  # fragments x = 0 .. n - 1 of the one-row framebuffer (y = 0)
    got = runner.run(3, np.zeros((n, 2)), level=stride)
    np.testing.assert_array_equal(got[:, 0], np.arange(n) % stride)
    np.testing.assert_array_equal(got[:, 1], 0)
