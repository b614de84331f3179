"""The naive baseline of `texstream bench scene`: Pillow loads a PNG, one mipmapped RGBA8 texture is
uploaded and drawn with a plain sampler2D over the same terrain path, side by side with texstream
on the same image (time to first frame, VRAM, frame time)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import moderngl
import numpy as np

from ..errors import EngineError
from ..pack.format import TexelFormat
from ..pack.reader import PackReader
from ..scene.paths import Pose, flythrough
from ..scene.terrain import set_view_uniforms, sky_clear_colour
from .scene_rig import DT, GL_SRGB8_ALPHA8, Mode, Packs, SceneRig, release_fbo

log = logging.getLogger(__name__)


# ---- the naive approach side by side ------------------------------------------------------------------


class _NaiveScene:
    """TerrainScene's geometry and shading over one plain texture."""

    def __init__(self, ctx: moderngl.Context, size: tuple[int, int]) -> None:
        from ..gl.shaders import program as load_program
        from ..gl.shaders import shader_file

        self.ctx, self.size = ctx, size
        self.program = load_program(
            ctx,
            vertex=shader_file("texstream/terrain_vs.glsl"),
            fragment=shader_file("texstream/naive_terrain_fs.glsl"),
        )
        self.vbo = ctx.buffer(np.array([0, 0, 1, 0, 0, 1, 1, 1], np.float32).tobytes())
        self.vao = ctx.vertex_array(self.program, [(self.vbo, "2f", "in_pos")])
        self.sun = np.array([0.4, -0.3, -0.85])

    def draw(self, tex: moderngl.Texture, pose: Pose, fb_size: tuple[int, int]) -> None:
        p = self.program
        set_view_uniforms(p, pose, self.size, fb_size, self.sun)
        tex.use(0)
        p["u_tex"].value = 0
        self.vao.render(moderngl.TRIANGLE_STRIP)

    def release(self) -> None:
        for obj in (self.vao, self.vbo, self.program):
            obj.release()


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _naive_pack(mode: Mode, size: int, packs: Packs, folder: Path) -> Path:
    """A terrain pack of `size`^2 texels: the albedo pack when it has that size, else one baked."""
    with PackReader(packs.albedo) as r:
        if (r.header.width, r.header.height) == (size, size):
            return packs.albedo
    from .assets import AssetRecipe, ensure_asset

    recipe = AssetRecipe(name="bench-naive", pattern="terrain", size=size, seed=1, texel_format=TexelFormat.BC1)
    return ensure_asset(recipe, progress=False, folder=folder if mode.quick else None)


def _naive_png(pack: Path, folder: Path) -> Path:
    """Level 0 of `pack` as an RGB PNG (Pillow's default compression), written once."""
    from PIL import Image

    from ..pack.extract import extract_level

    png = folder / f"{pack.stem}-level0.png"
    if not png.exists():
        rgba = extract_level(pack, 0)
        tmp = png.with_name(png.name + ".tmp")
        Image.fromarray(np.ascontiguousarray(rgba[..., :3]), "RGB").save(tmp, format="PNG")
        del rgba
        os.replace(tmp, png)
    return png


def naive_run(ctx: moderngl.Context, png: Path, fb_size: tuple[int, int], frames: int) -> dict:
    """Pillow load + one mipmapped texture; time to first frame, then mean frame time on the flythrough."""
    from PIL import Image

    color = ctx.renderbuffer(fb_size, 4)
    fbo = ctx.framebuffer(color_attachments=[color])
    tex = scene = None
    limit = Image.MAX_IMAGE_PIXELS
    try:
        ctx.finish()
        t0 = time.perf_counter()
        Image.MAX_IMAGE_PIXELS = None  # a huge texture is the point: no decompression-bomb guard
        with Image.open(png) as img:
            img.load()
            w, h = img.size
            data = (img if img.mode == "RGBA" else img.convert("RGBA")).tobytes()
        t1 = time.perf_counter()
        scene = _NaiveScene(ctx, (w, h))
        t2 = time.perf_counter()
        tex = ctx.texture((w, h), 4, data, internal_format=GL_SRGB8_ALPHA8)
        del data
        ctx.finish()
        t3 = time.perf_counter()
        tex.build_mipmaps()
        tex.repeat_x = tex.repeat_y = False
        tex.anisotropy = 4.0  # vt_sample's anisotropic taps: up to 4 with 4-texel borders
        ctx.finish()
        t4 = time.perf_counter()
        err = ctx.error
        if err != "GL_NO_ERROR":
            raise EngineError(f"naive texture of {w}x{h}: {err}")
        path = flythrough(w, h)
        fbo.use()
        fbo.clear(*sky_clear_colour(), 1.0)
        scene.draw(tex, path.pose(0.0), fb_size)
        ctx.finish()
        t5 = time.perf_counter()
        frame_ms = {}
        for aniso in (4.0, 1.0):  # 4: what vt_sample's taps do; 1: plain trilinear (llvmpipe's aniso is slow)
            tex.anisotropy = aniso
            ctx.finish()
            t = time.perf_counter()
            for i in range(frames):
                fbo.use()
                fbo.clear(*sky_clear_colour(), 1.0)
                scene.draw(tex, path.pose(i * DT), fb_size)
            ctx.finish()
            frame_ms[aniso] = (time.perf_counter() - t) / frames * 1e3
        return {
            "size": [w, h],
            "png_bytes": png.stat().st_size,
            "texture_format": "SRGB8_ALPHA8, mipmapped, LINEAR_MIPMAP_LINEAR",
            "anisotropy": 4.0,
            "load_s": t1 - t0,
            "program_s": t2 - t1,
            "upload_s": t3 - t2,
            "mipmaps_s": t4 - t3,
            "first_draw_s": t5 - t4,
            "first_frame_s": t5 - t0,
            "vram_bytes": w * h * 4 * 4 // 3,
            "frames": frames,
            "frame_ms_mean": frame_ms[4.0],
            "frame_ms_mean_trilinear": frame_ms[1.0],
        }
    finally:
        Image.MAX_IMAGE_PIXELS = limit
        if tex is not None:
            tex.release()
        if scene is not None:
            scene.release()
        release_fbo(ctx, fbo)
        color.release()


def texstream_run(
    ctx: moderngl.Context,
    pack: Path,
    packs: Packs,
    fb_size: tuple[int, int],
    budget_mb: float,
    frames: int,
    settle_max: int = 600,
) -> dict:
    """The same image through the streamer: time to first frame, frames until fully resident at the first
    pose, then the mean frame time (update + draw) on the flythrough."""
    ctx.finish()
    t0 = time.perf_counter()
    rig = SceneRig(ctx, packs, fb_size, budget_mb, normals=False, albedo=pack)
    try:
        t1 = time.perf_counter()
        s = rig.streamer
        h = rig.albedo.header
        path = flythrough(h.width, h.height)
        s.update()
        rig.draw(path.pose(0.0))
        ctx.finish()
        t2 = time.perf_counter()
        settle = None
        for k in range(1, settle_max + 1):
            st = s.update()
            rig.draw(path.pose(0.0))
            if st.feedback_age >= 0 and st.wanted_pages and not st.missing_pages and not s.busy:
                settle = k
                break
        ctx.finish()
        t3 = time.perf_counter()
        for i in range(frames):
            s.update()
            rig.draw(path.pose(i * DT))
        ctx.finish()
        t4 = time.perf_counter()
        return {
            "pack": pack.name,
            "size": [h.width, h.height],
            "open_s": t1 - t0,
            "first_frame_s": t2 - t0,
            "settle_frames": settle,
            "settle_s": t3 - t0 if settle is not None else None,
            "budget_bytes": s.budget.budget,
            "vram_peak_bytes": s.budget.peak,
            "frames": frames,
            "frame_ms_mean": (t4 - t3) / frames * 1e3,
        }
    finally:
        rig.release()


def naive_comparison(ctx: moderngl.Context, mode: Mode, packs: Packs, folder: Path) -> dict:
    """The naive approach at the largest size that fits here, and texstream on the same image."""
    with PackReader(packs.albedo) as r:
        top = min(r.header.width, mode.naive_max, ctx.info["GL_MAX_TEXTURE_SIZE"])
    sizes = [top >> k for k in range(4) if top >> k >= 1024]
    attempts = []
    for size in sizes:
        need = size * size * 4 * (0.75 + 1 + 1 + 4 / 3)  # PIL RGB + RGBA + bytes + the texture (llvmpipe: RAM)
        avail = _mem_available()
        if avail is not None and need > 0.8 * avail:
            attempts.append({"size": size, "error": f"needs ~{need / 2**30:.1f} GiB, {avail / 2**30:.1f} available"})
            continue
        try:
            pack = _naive_pack(mode, size, packs, folder)
            png = _naive_png(pack, folder if mode.quick else pack.parent)
            naive = naive_run(ctx, png, mode.frame_size, mode.compare_frames)
        except (MemoryError, moderngl.Error, EngineError) as exc:
            attempts.append({"size": size, "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__})
            while ctx.error != "GL_NO_ERROR":
                pass
            continue
        attempts.append({"size": size, "error": None})
        ts = texstream_run(ctx, pack, packs, mode.frame_size, mode.budget_mb, mode.compare_frames)
        return {
            "size": size,
            "attempts": attempts,
            "naive": naive,
            "texstream": ts,
            "first_frame_speedup": naive["first_frame_s"] / ts["first_frame_s"],
            "vram_ratio": naive["vram_bytes"] / ts["vram_peak_bytes"],
            "frame_time_ratio": ts["frame_ms_mean"] / naive["frame_ms_mean"],
        }
    raise EngineError(f"the naive approach fits none of {sizes} here: {attempts}")
