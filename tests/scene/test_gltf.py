"""glTF scenes drawn with streamed textures (headless EGL): files written by trimesh and by
pygltflib converge to the all-resident render of the same view, glTF's top-left uv origin and its
sampler wrap modes are honoured, a material's textures open as one texture set, and bad files
fail in one line with nothing left open."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import moderngl
import numpy as np
import pytest
from PIL import Image

from texstream import BudgetConfig, Origin, Streamer, StreamerConfig, TextureSet
from texstream.errors import GltfError, SourceError
from texstream.pack.format import AddressMode, TexelFormat
from texstream.scene.camera import look_at, orthographic, perspective
from texstream.scene.gltf import load_gltf
from texstream.scene.gltf_file import Wrap
from texstream.testing.frames import all_resident, converge
from texstream.testing.images import psnr

from .files import pygltflib_quad, trimesh_scene

pytestmark = pytest.mark.gl

SIZE = (256, 192)
UP = np.array([0.0, 1.0, 0.0])


@pytest.fixture
def fbo(gl_context: moderngl.Context) -> Iterator[moderngl.Framebuffer]:
    color = gl_context.renderbuffer(SIZE, 4)
    depth = gl_context.depth_renderbuffer(SIZE)
    fb = gl_context.framebuffer(color_attachments=[color], depth_attachment=depth)
    yield fb
    gl_context.detect_framebuffer(0).use()  # never leave a released framebuffer bound
    for obj in (fb, color, depth):
        obj.release()


def render(ctx: moderngl.Context, fbo: moderngl.Framebuffer, path: Path, view, proj, *, resident: bool, budget=32):
    """The converged streamed frame, or (resident) the all-resident reference, of `path`'s scene."""
    streamer = Streamer(ctx, StreamerConfig(budget=BudgetConfig(budget_mb=budget)))
    scene = None
    try:
        scene = load_gltf(path, streamer)

        def draw() -> None:
            fbo.use()
            fbo.clear(0.05, 0.05, 0.05, 1.0, depth=1.0)
            scene.draw(view, proj)

        return (all_resident if resident else converge)(streamer, draw)
    finally:
        if scene is not None:
            scene.release()
        streamer.release()


def perspective_view(eye: tuple[float, float, float]) -> tuple[np.ndarray, np.ndarray]:
    return look_at(np.array(eye, float), np.zeros(3), UP), perspective(50.0, SIZE[0] / SIZE[1], 0.05, 50.0)


FRONT = (look_at(np.array([0.0, 0.0, 3.0]), np.zeros(3), UP), orthographic(-1, 1, -1, 1, 0.1, 10))  # the quad fills it


@pytest.mark.parametrize("writer", ["trimesh", "pygltflib"])
def test_streamed_scene_equals_the_all_resident_render(
    writer: str, gl_context: moderngl.Context, fbo: moderngl.Framebuffer, tmp_path: Path
) -> None:
    if writer == "trimesh":
        path = trimesh_scene(tmp_path / "scene.glb", size=256)
        view, proj = perspective_view((2.2, 1.6, 2.6))
    else:
        path = pygltflib_quad(tmp_path / "quad", size=256)
        view, proj = perspective_view((0.6, -0.4, 1.6))  # at an angle: anisotropy and several levels
    streamed = render(gl_context, fbo, path, view, proj, resident=False)
    reference = render(gl_context, fbo, path, view, proj, resident=True)
    assert reference[..., :3].std() > 20, "the reference frame shows no texture"
    background = np.all(np.abs(reference[..., :3].astype(int) - 13) <= 2, axis=2)
    assert background.mean() < 0.7, "the scene covers little of the frame"
    assert psnr(streamed, reference) >= 45.0


def test_materials_open_with_role_settings_and_top_left_origin(gl_context: moderngl.Context, tmp_path: Path) -> None:
    path = pygltflib_quad(tmp_path / "quad", size=128, wrap=int(Wrap.CLAMP))
    with Streamer(gl_context, StreamerConfig(budget=BudgetConfig(budget_mb=32))) as streamer:
        scene = load_gltf(path, streamer)
        try:
            (material, default) = scene.materials
            formats = {role: vt.header.texel_format for role, vt in material.textures.items()}
            assert formats == {
                "base_color": TexelFormat.BC1,
                "normal": TexelFormat.BC5,
                "metallic_roughness": TexelFormat.BC1,
            }
            assert material.textures["base_color"].header.srgb and not material.textures["normal"].header.srgb
            assert not material.textures["metallic_roughness"].header.srgb
            for vt in material.textures.values():
                assert vt.origin is Origin.TOP_LEFT and vt.header.address_mode is AddressMode.CLAMP
            assert not default.textures  # primitives without a material: factors only
            assert len(streamer.textures) == 3
        finally:
            scene.release()
        assert not streamer.textures  # release closed them


def test_uv_origin_is_the_images_top_left(
    gl_context: moderngl.Context, fbo: moderngl.Framebuffer, tmp_path: Path
) -> None:
    img = np.zeros((128, 128, 3), np.uint8)
    img[:64] = (230, 20, 20)  # top half red
    img[64:] = (20, 20, 230)  # bottom half blue
    path = pygltflib_quad(tmp_path / "quad", albedo=Image.fromarray(img))
    frame = render(gl_context, fbo, path, *FRONT, resident=True).astype(int)
    h = frame.shape[0]
    top, bottom = frame[: h // 3, :, :3].mean(axis=(0, 1)), frame[-h // 3 :, :, :3].mean(axis=(0, 1))
    assert top[0] > top[2] + 40 and bottom[2] > bottom[0] + 40, (top, bottom)


def _columns(frame: np.ndarray) -> np.ndarray:
    """Mean colour of each column of the middle rows (the quad spans the whole frame)."""
    h = frame.shape[0]
    return frame[h // 3 : 2 * h // 3, :, :3].astype(float).mean(axis=0)


@pytest.mark.parametrize("wrap", [Wrap.REPEAT, Wrap.CLAMP, Wrap.MIRROR])
def test_sampler_wrap_modes_are_honoured(
    wrap: Wrap, gl_context: moderngl.Context, fbo: moderngl.Framebuffer, tmp_path: Path
) -> None:
    # u runs 0..2 across the quad: the left half shows the image, the right half what the wrap says
    x = np.linspace(0, 255, 128).astype(np.uint8)
    img = np.stack([np.tile(x, (128, 1)), np.tile(255 - x, (128, 1)), np.full((128, 128), 60, np.uint8)], axis=2)
    path = pygltflib_quad(tmp_path / "quad", wrap=int(wrap), uv_max=2.0, albedo=Image.fromarray(img))
    cols = _columns(render(gl_context, fbo, path, *FRONT, resident=True))
    w = cols.shape[0]
    left, right = cols[: w // 2, 0], cols[w // 2 :, 0]  # red: the gradient along u
    assert left[-4] > left[4] + 100  # the image itself: dark to bright
    if wrap is Wrap.REPEAT:
        assert np.abs(right - left).mean() < 6
    elif wrap is Wrap.MIRROR:
        assert np.abs(right - left[::-1]).mean() < 6
    else:  # the last column stretched
        assert right.std() < 4 and abs(right.mean() - left[-1]) < 8


def test_a_material_opens_as_one_texture_set(gl_context: moderngl.Context, tmp_path: Path) -> None:
    path = pygltflib_quad(tmp_path / "quad", size=64)
    with Streamer(gl_context, StreamerConfig(budget=BudgetConfig(budget_mb=32))) as streamer:
        scene = load_gltf(path, streamer, priority=2.5)
        material, default = scene.materials
        tset = material.texture_set
        assert isinstance(tset, TextureSet) and sorted(tset.members) == ["base_color", "metallic_roughness", "normal"]
        assert tset.priority == 2.5 and all(vt.origin is Origin.TOP_LEFT for vt in tset.members.values())
        assert default.texture_set is None and len(scene.textures) == 3
        scene.release()
        assert not streamer.textures  # the set closed its members
        scene = load_gltf(path, streamer, priority={"material0": 3.0, "other": 0.5})
        assert scene.materials[0].texture_set.priority == 3.0  # by material name
        scene.release()
        with pytest.raises(ValueError, match="positive"):
            load_gltf(path, streamer, priority=0.0)


def test_bad_files_fail_in_one_line_and_leave_nothing_open(gl_context: moderngl.Context, tmp_path: Path) -> None:
    path = pygltflib_quad(tmp_path / "quad", size=64)
    (tmp_path / "quad" / "quad.bin").write_bytes(b"short")
    with Streamer(gl_context, StreamerConfig(budget=BudgetConfig(budget_mb=32))) as streamer:
        with pytest.raises(GltfError, match=r"buffers\[0\]: holds 5 bytes"):
            load_gltf(path, streamer)
        good = pygltflib_quad(tmp_path / "quad2", size=64)
        (tmp_path / "quad2" / "albedo.png").write_bytes(b"not a png at all")  # the first texture fails to bake
        with pytest.raises(SourceError) as err:
            load_gltf(good, streamer)
        assert "\n" not in str(err.value) and "albedo.png" in str(err.value)
        assert not streamer.textures


def test_a_released_scene_gives_its_packs_back_and_keeps_no_image_copies(
    gl_context: moderngl.Context, tmp_path: Path
) -> None:
    """Embedded images are baked from temporary files removed at once; the scene leases its packs
    until released, after which the cache may evict them."""
    from texstream.assets.pack_cache import PackCache, PackCacheConfig

    path = pygltflib_quad(tmp_path / "quad", size=128)  # a data-URI and a buffer-view image among its three
    cache = PackCache(PackCacheConfig(folder=tmp_path / "packs"))
    images = tmp_path / "cache" / "gltf-images"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TEXSTREAM_CACHE", str(tmp_path / "cache"))
        with Streamer(gl_context, StreamerConfig(budget=BudgetConfig(budget_mb=32))) as streamer:
            scene = load_gltf(path, streamer, cache=cache)
            try:
                assert len(cache.leased()) == 3
                assert not images.exists() or not any(images.iterdir())
            finally:
                scene.release()
            assert cache.leased() == set()
            again = load_gltf(path, streamer, cache=cache)  # the packs are found again by their bytes
            again.release()
    assert not images.exists() or not any(images.iterdir())
