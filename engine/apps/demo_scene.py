"""`texstream demo scene [FILE.glb]`: a flight around a glTF scene whose materials stream.

With a file, its scene is loaded by `texstream.scene.gltf.load_gltf` (each image baked once into the
pack cache). Without one, a built-in scene is made procedurally, so nothing is downloaded: a ground
of terrain colour and normals, checkered pillars with a metallic-roughness map, stone spheres with
their own normal maps and glowing panels, in four materials over six procedural textures (the
largest ``2 x --texture-size`` a side: 8192² by default), baked once into the cache.

The scene is placed in the demo's world (z < 0 is up, the ground at z = 0, about 1000 units across)
by one root matrix, so the demo's flight controls and overlay work as over the terrain; the scripted
flight circles the scene, diving in close to its objects and climbing out again.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import moderngl
import numpy as np

from ..config import BakeConfig, cache_dir
from ..pack.format import AddressMode, Supercompression, TexelFormat
from ..runtime.streamer import Streamer
from ..scene.camera import look_at, perspective
from ..scene.gltf import GltfMaterial, GltfScene, close_material, load_gltf, open_material
from ..scene.gltf_file import GltfDocument, MaterialSpec, MeshInstance, PrimitiveData, Wrap
from ..scene.paths import UP, CameraPath, Keyframe, Pose
from .progress import ImagePackBar

log = logging.getLogger(__name__)

__all__ = ["SceneDemo", "builtin_scene", "scene_and_flight", "scene_flight"]

WORLD_EXTENT = 1000.0  # demo world units across the scene (the fly camera's speeds are made for this)
MIN_TEXTURE, MAX_TEXTURE = 256, 8192
FOLDER = "scene"  # under the cache folder: the built-in scene's packs
# glTF (y up) to the demo's world (z < 0 up): x stays, y -> -z, z -> y (a rotation: handedness kept)
Y_UP_TO_DEMO = np.array([[1, 0, 0, 0], [0, 0, 1, 0], [0, -1, 0, 0], [0, 0, 0, 1]], float)


@dataclass(frozen=True, kw_only=True)
class _Texture:
    """A procedural pack of the built-in scene."""

    pattern: str
    size: int
    seed: int
    texel_format: TexelFormat
    srgb: bool

    @property
    def filename(self) -> str:
        space = "srgb" if self.srgb else "linear"
        return f"{self.pattern}-{self.size}-{self.texel_format.name.lower()}-{space}-s{self.seed}-wrap.tpk"


def _textures(size: int) -> dict[str, dict[str, _Texture]]:
    """Material -> role -> texture of the built-in scene, `size` the common side (the ground's is twice it)."""
    bc1, bc5 = TexelFormat.BC1, TexelFormat.BC5
    return {
        "ground": {
            "base_color": _Texture(pattern="terrain", size=2 * size, seed=11, texel_format=bc1, srgb=True),
            "normal": _Texture(pattern="normals", size=size, seed=11, texel_format=bc5, srgb=False),
        },
        "pillars": {
            "base_color": _Texture(pattern="checker", size=size, seed=12, texel_format=bc1, srgb=True),
            # a normal map's channels read as roughness (G) and metal (B): smooth and rough patches
            "metallic_roughness": _Texture(pattern="normals", size=size // 2, seed=13, texel_format=bc1, srgb=False),
        },
        "stone": {
            "base_color": _Texture(pattern="terrain", size=size, seed=14, texel_format=bc1, srgb=True),
            "normal": _Texture(pattern="normals", size=size, seed=14, texel_format=bc5, srgb=False),
        },
        "panels": {
            "base_color": _Texture(pattern="checker", size=size // 2, seed=15, texel_format=bc1, srgb=True),
            "emissive": _Texture(pattern="checker", size=size // 2, seed=15, texel_format=bc1, srgb=True),
        },
    }


MATERIALS = {
    "ground": MaterialSpec(name="ground", metallic_factor=0.0, roughness_factor=0.9),
    "pillars": MaterialSpec(name="pillars", metallic_factor=0.5, roughness_factor=1.0),
    "stone": MaterialSpec(name="stone", metallic_factor=0.0, roughness_factor=0.7, normal_scale=1.5),
    "panels": MaterialSpec(name="panels", metallic_factor=0.0, roughness_factor=0.5, emissive_factor=(0.6, 0.5, 0.3)),
}


def ensure_textures(size: int, progress: bool = True, folder: Path | None = None) -> dict[str, dict[str, Path]]:
    """The built-in scene's packs (material -> role -> path), baking those the cache lacks."""
    from ..bake.pipeline import bake_procedural

    folder = (folder or cache_dir()) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, dict[str, Path]] = {}
    started, baked = time.perf_counter(), 0
    for material, roles in _textures(size).items():
        for role, tex in roles.items():
            path = folder / tex.filename
            if not path.exists():
                if not baked:
                    log.warning("baking the built-in scene's textures (first use; cached in %s)", folder)
                config = BakeConfig(
                    texel_format=tex.texel_format,
                    srgb=tex.srgb,
                    address_mode=AddressMode.WRAP,  # they repeat across their objects
                    supercompression=Supercompression.ZSTD,
                    tile_size=128,
                    progress=progress,
                )
                bake_procedural(path, tex.size, tex.pattern, tex.seed, config)
                baked += 1
            out.setdefault(material, {})[role] = path
    if baked:
        log.warning("baked %d textures in %.1f s", baked, time.perf_counter() - started)
    return out


# ---- procedural geometry (glTF conventions: y up, uv from the image's top-left) -----------------
def _primitive(mesh: int, positions, normals, uvs, indices) -> PrimitiveData:  # noqa: ANN001
    return PrimitiveData(
        mesh=mesh,
        positions=np.ascontiguousarray(positions, np.float32),
        normals=np.ascontiguousarray(normals, np.float32),
        uvs=np.ascontiguousarray(uvs, np.float32),
        tangents=None,
        indices=np.ascontiguousarray(indices, np.uint32),
        mode=4,
        material=mesh,
    )


def plane(mesh: int, half: float, repeats: float) -> PrimitiveData:
    p = np.array([[-half, 0, -half], [half, 0, -half], [half, 0, half], [-half, 0, half]])
    uv = np.array([[0, 0], [repeats, 0], [repeats, repeats], [0, repeats]])
    return _primitive(mesh, p, np.tile([0, 1, 0], (4, 1)), uv, [0, 2, 1, 0, 3, 2])


def box(mesh: int, repeats: tuple[float, float] = (1.0, 1.0)) -> PrimitiveData:
    """A unit cube (-0.5..0.5), each face its own four vertices and the whole image (times `repeats`)."""
    positions, normals, uvs, indices = [], [], [], []
    for axis in range(3):
        for sign in (-1.0, 1.0):
            n = np.zeros(3)
            n[axis] = sign
            u_axis, v_axis = [a for a in range(3) if a != axis]
            for du, dv in ((0, 0), (1, 0), (1, 1), (0, 1)):
                p = n * 0.5
                p[u_axis] = du - 0.5
                p[v_axis] = dv - 0.5
                positions.append(p)
                normals.append(n)
                uvs.append((du * repeats[0], (1 - dv) * repeats[1]))
            base = len(positions) - 4
            quad = [0, 1, 2, 0, 2, 3]
            # counter-clockwise seen from outside: flip when the face's (u, v, n) frame is left-handed
            e = np.cross(np.eye(3)[u_axis], np.eye(3)[v_axis]) @ n
            indices += [base + i for i in (quad if e > 0 else [0, 2, 1, 0, 3, 2])]
    return _primitive(mesh, positions, normals, uvs, indices)


def sphere(mesh: int, rings: int = 32, segments: int = 64) -> PrimitiveData:
    """A unit-radius sphere; u around it (twice), v from the north pole down."""
    theta = np.linspace(0, math.pi, rings + 1)[:, None]
    phi = np.linspace(0, 2 * math.pi, segments + 1)[None, :]
    n = np.stack(
        [np.sin(theta) * np.cos(phi), np.cos(theta) * np.ones_like(phi), -np.sin(theta) * np.sin(phi)], axis=-1
    ).reshape(-1, 3)
    uv = np.stack(np.broadcast_arrays(phi / math.pi, theta / math.pi), axis=-1).reshape(-1, 2)
    r, s = np.meshgrid(np.arange(rings), np.arange(segments), indexing="ij")
    a = (r * (segments + 1) + s).ravel()
    b, c, d = a + segments + 1, a + 1, a + segments + 2
    indices = np.stack([a, b, c, c, b, d], axis=1).ravel()
    return _primitive(mesh, n, n, uv, indices)


def _place(translate: tuple[float, float, float], scale: tuple[float, float, float]) -> np.ndarray:
    m = np.diag([*scale, 1.0])
    m[:3, 3] = translate
    return m


def builtin_scene(ctx: moderngl.Context, streamer: Streamer, size: int, progress: bool = True) -> GltfScene:
    """The built-in scene: 40 x 40 m of ground, a ring of pillars, spheres and panels (module docstring)."""
    if not (isinstance(size, int) and MIN_TEXTURE <= size <= MAX_TEXTURE and size & (size - 1) == 0):
        raise ValueError(f"scene texture size must be a power of two within {MIN_TEXTURE}..{MAX_TEXTURE}, got {size!r}")
    packs = ensure_textures(size, progress)
    names = list(MATERIALS)
    prims = [plane(0, 20.0, 4.0), box(1, (1.0, 3.0)), sphere(2), box(3)]
    instances = [MeshInstance(mesh=0, node=0, world=np.identity(4))]
    for i in range(8):  # pillars on a ring, spheres between them, panels outside
        a = 2 * math.pi * i / 8
        x, z = 9.0 * math.cos(a), 9.0 * math.sin(a)
        instances.append(MeshInstance(mesh=1, node=1 + i, world=_place((x, 3.0, z), (1.2, 6.0, 1.2))))
        b = a + math.pi / 8
        radius = 1.0 + 0.6 * (i % 3)
        instances.append(
            MeshInstance(
                mesh=2,
                node=9 + i,
                world=_place((6.0 * math.cos(b), radius, 6.0 * math.sin(b)), (radius, radius, radius)),
            )
        )
        instances.append(
            MeshInstance(mesh=3, node=17 + i, world=_place((15.0 * math.cos(b), 2.0, 15.0 * math.sin(b)), (3, 4, 0.2)))
        )
    instances.append(MeshInstance(mesh=2, node=25, world=_place((0.0, 3.0, 0.0), (3.0, 3.0, 3.0))))
    document = GltfDocument(path=cache_dir() / FOLDER, primitives=prims, instances=instances, materials=[], images=[])
    materials: list[GltfMaterial] = []
    try:
        for name in names:
            tset = open_material(streamer, packs[name], 1.0)
            textures = dict(tset.members) if tset is not None else {}
            wrap = {role: (Wrap.REPEAT, Wrap.REPEAT) for role in textures}
            materials.append(GltfMaterial(spec=MATERIALS[name], textures=textures, wrap=wrap, texture_set=tset))
        materials.append(GltfMaterial(spec=MaterialSpec(name="default"), textures={}, wrap={}))
        return GltfScene(ctx, streamer, document, materials)
    except BaseException:
        for m in materials:
            close_material(m)
        raise


class SceneDemo:
    """A `GltfScene` as one of the demo's scenes: placed in the demo's world by one root matrix, drawn
    from a `Pose`, with the demo's `debug` switch."""

    def __init__(self, scene: GltfScene) -> None:
        self.scene = scene
        lo, hi = scene.bounds
        extent = float(max(hi[0] - lo[0], hi[2] - lo[2], hi[1] - lo[1], 1e-6))
        self.scale = WORLD_EXTENT / extent
        centre = (lo + hi) / 2
        shift = np.identity(4)
        shift[:3, 3] = (-centre[0], -lo[1], -centre[2])  # centred, standing on z = 0
        self.root = Y_UP_TO_DEMO @ np.diag([self.scale] * 3 + [1.0]) @ shift
        self.extent = (hi - lo) * self.scale  # glTF axes (x, y up, z)

    @property
    def debug(self) -> int:
        return self.scene.debug

    @debug.setter
    def debug(self, value: int) -> None:
        self.scene.debug = value

    @property
    def size(self) -> tuple[float, float]:
        return float(self.extent[0]), float(self.extent[2])

    def draw(self, pose: Pose, fb_size: tuple[int, int]) -> None:
        near = max(0.05, abs(float(pose.eye[2])) * 0.01)
        far = WORLD_EXTENT * 20.0
        view = look_at(pose.eye, pose.target, UP)
        self.scene.draw(view, perspective(60.0, fb_size[0] / max(1, fb_size[1]), near, far), model=self.root)

    def release(self) -> None:
        self.scene.release()


def scene_flight(extent: np.ndarray, seconds: float = 30.0) -> CameraPath:
    """Around the scene (its extent in demo units, glTF axes), diving close and climbing out."""
    w, height, d = (float(v) for v in extent)
    radius = max(w, d) / 2
    keys = []
    n = 9
    for i in range(n):
        a = 2 * math.pi * i / (n - 1) + 0.3
        close = i % 2 == 1
        r = radius * (0.45 if close else 1.1)
        alt = max(height * (0.35 if close else 1.2), radius * (0.08 if close else 0.45))
        eye = (r * math.cos(a), r * math.sin(a), -alt)
        look = radius * (0.15 if close else 0.0)
        target = (look * math.cos(a + 1.2), look * math.sin(a + 1.2), -height * 0.3)
        keys.append(Keyframe(seconds * i / (n - 1), eye, target))
    return CameraPath("scene", keys)


def scene_and_flight(
    ctx: moderngl.Context, streamer: Streamer, packs: tuple[str, ...], texture_size: int, progress: bool
) -> tuple[SceneDemo, CameraPath]:
    """The demo's scene: the glTF file in `packs` (at most one), else the built-in scene."""
    if len(packs) > 1:
        raise ValueError(f"the scene demo takes one glTF file (.glb or .gltf), got {len(packs)}")
    if packs:
        bar = ImagePackBar() if progress else None  # the file's images are baked on first use
        try:
            scene = load_gltf(packs[0], streamer, ctx, progress=bar)
        finally:
            if bar is not None:
                bar.close()
    else:
        scene = builtin_scene(ctx, streamer, texture_size, progress)
    demo = SceneDemo(scene)
    return demo, scene_flight(demo.extent)
