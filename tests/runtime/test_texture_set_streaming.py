"""Texture sets and priorities through the public API, headless: a set of three members of different
sizes and formats streamed from its lead's feedback alone equals the all-resident frame of every
member; a set's draw writes one texture's feedback; a member whose pack is damaged keeps its
fallback while the others stream; a member that cannot be opened leaves nothing open; and at 2x
oversubscription a high-priority texture ends at finer levels than an equal low-priority one."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import moderngl
import numpy as np
import pytest

import texstream as ts
from texstream.bake.pipeline import bake, bake_procedural
from texstream.bake.source import ArraySource
from texstream.pack.reader import PackReader
from texstream.testing import psnr

from .test_streamer import colour_image

pytestmark = pytest.mark.gl

SIZE = 128  # framebuffer side
CONVERGED_DB = 45.0
WINDOW = (0.3, 0.3, 0.25, 0.25)  # uv: 256 texels of the 1024² lead on 128 px (its level 1), 1:1 on the normals

VS = """#version 450 core
#include "texstream/common.glsl"
out vec2 v_uv;
void main() {
    v_uv = ts_fullscreen_uv(gl_VertexID);
    gl_Position = ts_fullscreen_position(gl_VertexID);
}
"""
# A material: every member sampled by every fragment; u_show picks the one written out.
SET_FS = """#version 450 core
#include "texstream/vt.glsl"
VT_DECLARE(albedo)
VT_DECLARE(normal)
VT_DECLARE(mask)
uniform vec4 u_window;
uniform int u_show;
in vec2 v_uv;
out vec4 f_color;
void main() {
    vec2 uv = u_window.xy + v_uv * u_window.zw;
    vec4 a = VT_SAMPLE(albedo, uv), n = VT_SAMPLE(normal, uv), m = VT_SAMPLE(mask, uv);
    f_color = vec4((u_show == 0 ? a : u_show == 1 ? n : m).rgb, 1.0);
}
"""
ONE_FS = """#version 450 core
#include "texstream/vt.glsl"
VT_DECLARE(albedo)
uniform vec4 u_window;
in vec2 v_uv;
out vec4 f_color;
void main() { f_color = vec4(VT_SAMPLE(albedo, u_window.xy + v_uv * u_window.zw).rgb, 1.0); }
"""
MEMBERS = ("albedo", "normal", "mask")


@dataclass
class Packs:
    albedo: Path  # 1024² BC1 (the lead: finest texels)
    normal: Path  # 512² BC5: wants one level finer of its own than the albedo
    mask: Path  # 512² RGBA8, 128-texel tiles
    root: Path

    def sources(self, **override: Path) -> dict[str, Path]:
        return {name: override.get(name, getattr(self, name)) for name in MEMBERS}


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Packs:
    root = tmp_path_factory.mktemp("sets")
    bake(ArraySource(colour_image(1024), "waves"), root / "albedo.tpk", ts.BakeConfig(tile_size=64, progress=False))
    bc5 = ts.BakeConfig(texel_format=ts.TexelFormat.BC5, tile_size=64, progress=False)
    bake_procedural(root / "normal.tpk", 512, "normals", 1, bc5)
    rgba = ts.BakeConfig(texel_format=ts.TexelFormat.RGBA8, srgb=False, tile_size=128, progress=False)
    bake(ArraySource(colour_image(512, seed=9), "mask"), root / "mask.tpk", rgba)
    return Packs(root / "albedo.tpk", root / "normal.tpk", root / "mask.tpk", root)


class Screen:
    def __init__(self, ctx: moderngl.Context) -> None:
        self.ctx = ctx
        self.set_prog = ts.program(ctx, vertex=VS, fragment=SET_FS)
        self.one_prog = ts.program(ctx, vertex=VS, fragment=ONE_FS)
        self.vaos = [ctx.vertex_array(p, []) for p in (self.set_prog, self.one_prog)]
        self.fbo = ctx.simple_framebuffer((SIZE, SIZE))

    def draw(self, members: ts.TextureSet | dict[str, ts.VirtualTexture], show: int = 0) -> np.ndarray:
        """The material drawn once, member `show` written out: (SIZE, SIZE, 3) uint8."""
        self.fbo.use()
        self.fbo.clear(0.0, 0.0, 0.0, 1.0)
        self.set_prog["u_window"].value = WINDOW
        self.set_prog["u_show"].value = show
        if isinstance(members, ts.TextureSet):
            members.bind(self.set_prog)
        else:
            for name, vt in members.items():
                vt.bind(self.set_prog, name)
        self.vaos[0].render(moderngl.TRIANGLES, vertices=3)
        return np.frombuffer(self.fbo.read(components=3), np.uint8).reshape(SIZE, SIZE, 3)[::-1].copy()

    def draw_one(self, vt: ts.VirtualTexture) -> None:
        self.fbo.use()
        self.one_prog["u_window"].value = WINDOW
        vt.bind(self.one_prog, "albedo")
        self.vaos[1].render(moderngl.TRIANGLES, vertices=3)
        self.ctx.memory_barrier()  # the feedback's atomics visible to the readback (draw() reads pixels)
        self.ctx.finish()

    def release(self) -> None:
        if self.ctx.fbo is self.fbo:
            self.ctx.detect_framebuffer(0).use()
        for obj in (*self.vaos, self.fbo, self.set_prog, self.one_prog):
            obj.release()


@pytest.fixture
def screen(gl_context: moderngl.Context) -> Iterator[Screen]:
    s = Screen(gl_context)
    s.fbo.use()  # the viewport the streamer sizes its feedback from
    yield s
    s.release()


def converge(streamer: ts.Streamer, screen: Screen, tset: ts.TextureSet, frames: int = 200) -> list[np.ndarray]:
    """Frames until nothing the feedback wants is missing and no load is in flight; each member's
    last image. A frame counts only once its feedback has been read (it wants pages): before that, or
    while a refitted feedback buffer has nothing yet, nothing is missing because nothing is known."""
    settled = 0
    for _ in range(frames):
        stats = streamer.update()
        images = [screen.draw(tset, k) for k in range(len(MEMBERS))]
        known = stats.wanted_pages > 0
        settled = settled + 1 if known and stats.missing_pages == 0 and not streamer.busy else 0
        if settled == 3:
            break
    return images


def all_resident(screen: Screen, sources: dict[str, Path]) -> list[np.ndarray]:
    with ts.Streamer(screen.ctx) as reference:
        tset = reference.open_set(sources)
        for vt in tset.members.values():
            reference.make_all_resident(vt)
        reference.update()
        return [screen.draw(tset, k) for k in range(len(MEMBERS))]


def test_a_streamed_set_equals_the_all_resident_frame_for_every_member(screen: Screen, packs: Packs) -> None:
    with ts.Streamer(screen.ctx) as streamer:
        tset = streamer.open_set(packs.sources())
        assert tset.lead == "albedo" and set(tset) == set(MEMBERS) and tset["normal"].header.width == 512
        assert [tset[n].writes_feedback for n in MEMBERS] == [True, False, False]
        pinned = {n: tset[n].table.resident_count for n in MEMBERS}
        first = [screen.draw(tset, k) for k in range(len(MEMBERS))]
        images = converge(streamer, screen, tset)
        streamed = {n: tset[n].table.resident_count - pinned[n] for n in MEMBERS}
    expected = all_resident(screen, packs.sources())
    for k, name in enumerate(MEMBERS):
        assert psnr(images[k], expected[k]) >= CONVERGED_DB, name
    # the followers streamed from the lead's feedback: their pinned levels alone did not show this
    assert streamed["normal"] > 0 and streamed["mask"] > 0, streamed
    assert psnr(first[1], expected[1]) < CONVERGED_DB


def test_a_sets_draw_writes_the_feedback_of_one_texture(screen: Screen, packs: Packs) -> None:
    with ts.Streamer(screen.ctx) as streamer:
        tset = streamer.open_set(packs.sources())
        streamer.update()
        screen.draw(tset)
        set_entries = streamer.current_feedback().size
        screen.draw_one(tset["albedo"])  # the lead alone, same frame (same feedback phase)
        one_entries = streamer.current_feedback().size - set_entries
    with ts.Streamer(screen.ctx) as streamer:
        independent = {n: streamer.open(p) for n, p in packs.sources().items()}
        streamer.update()
        screen.draw(independent)
        independent_entries = streamer.current_feedback().size
    assert one_entries > 0 and set_entries == one_entries
    assert independent_entries == len(MEMBERS) * one_entries


def damaged_copy(src: Path, dst: Path, levels: tuple[int, ...]) -> Path:
    """`src` copied with every tile of `levels` corrupted (its checksum no longer matches)."""
    shutil.copyfile(src, dst)
    with PackReader(dst) as r:
        grid = r.header.level_table
        entries = [
            r.entry(lv, x, y) for lv in levels for x in range(grid[lv]["tiles_x"]) for y in range(grid[lv]["tiles_y"])
        ]
    with dst.open("r+b") as f:
        for e in entries:
            f.seek(e.offset + e.stored_size // 2)
            chunk = bytearray(f.read(8))
            f.seek(e.offset + e.stored_size // 2)
            f.write(bytes(v ^ 0x5A for v in chunk))
    return dst


def test_a_damaged_lead_keeps_its_fallback_and_the_other_members_stream(screen: Screen, packs: Packs) -> None:
    bad = damaged_copy(packs.albedo, packs.root / "albedo-damaged.tpk", (0, 1, 2))
    with ts.Streamer(screen.ctx, ts.StreamerConfig(retry_frames=4)) as streamer:
        tset = streamer.open_set(packs.sources(albedo=bad))
        images = converge(streamer, screen, tset, frames=40)
        assert tset["albedo"].corrupt_tiles > 0 and tset["normal"].corrupt_tiles == 0
        assert not (images[0] == 0).all(axis=-1).any()  # the damaged member is never black
    expected = all_resident(screen, packs.sources())
    assert psnr(images[1], expected[1]) >= CONVERGED_DB and psnr(images[2], expected[2]) >= CONVERGED_DB
    assert psnr(images[0], expected[0]) < CONVERGED_DB  # its coarser fallback stands in


def test_a_member_that_cannot_be_opened_leaves_nothing_open(screen: Screen, packs: Packs) -> None:
    with ts.Streamer(screen.ctx) as streamer:
        with pytest.raises(ts.PackNotFoundError):
            streamer.open_set(packs.sources(mask=packs.root / "missing.tpk"))
        assert streamer.textures == []
        with pytest.raises(ValueError, match="at least one member"):
            streamer.open_set({})
        with pytest.raises(ValueError, match="priority"):
            streamer.open_set(packs.sources(), priority=-1.0)


def test_closing_the_lead_hands_the_feedback_to_the_next_finest_member(screen: Screen, packs: Packs) -> None:
    with ts.Streamer(screen.ctx) as streamer:
        tset = streamer.open_set(packs.sources(), priority=2.0)
        assert [tset[n].priority for n in MEMBERS] == [2.0] * 3
        tset["albedo"].close()
        assert tset.lead == "normal" and set(tset) == {"normal", "mask"} and tset["normal"].writes_feedback
        tset.priority = 0.5
        assert tset["mask"].priority == 0.5
        streamer.close(tset)
        assert tset.closed and streamer.textures == []


# ---- priority under pressure -----------------------------------------------------------------------
PAN_PX = 384  # screen side
PAN = (0.25, 0.25, 0.375, 0.375)  # 384 texels of a 1024² texture at 1:1: level-0 tiles 4..9 a side


def mean_level(vt: ts.VirtualTexture) -> float:
    """Mean level the view's level-0 pages are drawn from (0: all at full resolution)."""
    y, x = np.mgrid[4:10, 4:10]
    return float(vt.table.resident_levels(np.zeros(x.size, np.int64), x.ravel(), y.ravel()).mean())


@pytest.mark.parametrize("high", [1.0, 4.0])
def test_at_2x_oversubscription_the_high_priority_texture_ends_at_finer_levels(
    gl_context: moderngl.Context, packs: Packs, high: float
) -> None:
    """Two equal textures (two copies of one pack), seen the same way, in a cache holding half of what
    the two views want. The high-priority one is opened second, so ties broken by id cannot favour it."""
    other = packs.root / "albedo-copy.tpk"
    shutil.copyfile(packs.albedo, other)
    prog = ts.program(gl_context, vertex=VS, fragment=ONE_FS)
    vao = gl_context.vertex_array(prog, [])
    fbo = gl_context.simple_framebuffer((PAN_PX, PAN_PX))
    fbo.use()
    try:
        # (no feedback compaction: its buffer would be dropped at the small budget and its bytes go to the cache)
        with ts.Streamer(gl_context, ts.StreamerConfig(ring_mb=1, feedback_compaction=False)) as streamer:
            low, hi = streamer.open(packs.albedo), streamer.open(other, priority=high)
            assert (low.priority, hi.priority) == (1.0, high)
            # One layer of cache slots (64; 10 of them pinned) for 2 x 49 wanted tiles (6x6 level-0
            # pages, 3x3 parents, 2x2 grandparents): ~1.8x oversubscribed.
            fixed = sum(v for k, v in streamer.budget.breakdown().items() if not k.startswith("pool/"))
            streamer.set_budget((fixed + 64 * low.header.tile_raw_size + 4096) / 2**20)
            assert [p.ledger.capacity for p in streamer.pools.values()] == [64]
            for _ in range(60):
                streamer.update()
                for vt in (low, hi):
                    prog["u_window"].value = PAN
                    vt.bind(prog, "albedo")
                    vao.render(moderngl.TRIANGLES, vertices=3)
                fbo.read(components=3)  # a frame's end (the GPU catches up, as a swap would make it)
            assert streamer.budget.bias > 0  # it was under pressure
            got_low, got_hi = mean_level(low), mean_level(hi)
    finally:
        for obj in (vao, fbo, prog):
            obj.release()
        gl_context.detect_framebuffer(0).use()
    if high == 1.0:
        assert got_hi >= got_low  # equal priorities: the second texture is no sharper
    else:
        assert got_hi < got_low, (got_hi, got_low)
