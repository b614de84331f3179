"""glTF 2.0 scenes drawn with streamed textures: ``scene = load_gltf("city.glb", streamer)``, then
``scene.draw(view, projection)`` every frame after ``streamer.update()``.

`load_gltf` reads the file (`texstream.scene.gltf_file`: every range checked, one `GltfError` line
for anything wrong), makes one vertex array per primitive, and opens each material's textures as
streamed virtual textures: each image is baked once into the content-addressed pack cache
(`texstream.assets.pack_for_image`; images embedded in a GLB or a data URI are first written to a
temporary file, removed once baked; the scene leases each pack until `GltfScene.release`), with
settings chosen by the texture's role:

=====================  =====================================================================
base colour, emissive  sRGB colour (BC1, or BC7 when the image has alpha)
normal                 BC5, linear (x, y; z is rebuilt in the shader)
metallic-roughness     BC1, linear (G roughness, B metal); an occlusion map in the same image
                       (R) shares its pack
occlusion              BC4, linear (R)
=====================  =====================================================================

Each pack is baked with the address mode of its sampler (wrap when both axes repeat, else clamp;
mirrored and mixed axes are folded in the shader) and opened with ``Origin.TOP_LEFT``, glTF's uv
convention, whatever the engine's default. A material's textures are opened together
(`open_material`) as one texture set.

Drawing: one program (``shaders/gltf_vs.glsl``, ``gltf_fs.glsl``: metallic-roughness shading with
normal mapping, every texture sampled through ``vt_sample_grad``), draws grouped by material, opaque
and masked primitives first, then blended ones. Per frame Python sets a few uniforms per draw; no
per-tile or per-vertex work.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import moderngl
import numpy as np
import xxhash

from ..assets.image_packs import ProgressCallback, default_pack_cache, pack_for_image
from ..assets.image_settings import ImageBakeSettings
from ..assets.pack_cache import PackCache
from ..config import cache_dir
from ..gl.shaders import program as load_program
from ..gl.shaders import shader_file
from ..pack.format import AddressMode, TexelFormat
from ..pack.writer import create_temp
from ..runtime.origin import Origin
from ..runtime.streamer import Streamer, TextureSet, VirtualTexture
from .gltf_file import DEFAULT_MATERIAL, AlphaMode, GltfDocument, ImageSource, MaterialSpec, TextureRef, Wrap, read_gltf

log = logging.getLogger(__name__)

__all__ = ["ROLES", "GltfMaterial", "GltfScene", "load_gltf"]

ROLES = ("base_color", "normal", "metallic_roughness", "occlusion", "emissive")
ROLE_BIT = {role: 1 << i for i, role in enumerate(ROLES)}  # shaders/gltf_fs.glsl GLTF_HAS_*
UNIFORM = {role: f"u_{role}" for role in ROLES}
WRAP_CODE = {Wrap.CLAMP: 0, Wrap.REPEAT: 1, Wrap.MIRROR: 2}  # shaders/gltf_fs.glsl GLTF_WRAP_*
IMAGE_FOLDER = "gltf-images"  # under the cache folder: embedded images while they are baked
MIME_SUFFIX = {"image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp", "image/ktx2": ".ktx2"}
MODES = (
    moderngl.POINTS,
    moderngl.LINES,
    moderngl.LINE_LOOP,
    moderngl.LINE_STRIP,
    moderngl.TRIANGLES,
    moderngl.TRIANGLE_STRIP,
    moderngl.TRIANGLE_FAN,
)


@dataclass(frozen=True, kw_only=True)
class GltfMaterial:
    """A material as drawn: its factors (`spec`) and its open textures by role.

    Attributes
    ----------
    spec : MaterialSpec
        The file's factors, alpha mode and texture references.
    textures : Mapping[str, VirtualTexture]
        Role (`ROLES`) -> the streamed texture; roles the material lacks are absent.
    wrap : Mapping[str, tuple[int, int]]
        Role -> the sampler's wrap modes along u and v (`Wrap`).
    texture_set : TextureSet or None
        The set the textures belong to (it closes them), or None for a material without textures.
    occlusion_in_mr : bool
        The occlusion map is the metallic-roughness texture's R channel (one texture for both).
    """

    spec: MaterialSpec
    textures: Mapping[str, VirtualTexture]
    wrap: Mapping[str, tuple[Wrap, Wrap]]
    texture_set: TextureSet | None = None
    occlusion_in_mr: bool = False

    @property
    def maps(self) -> int:
        """The roles it has, as `ROLE_BIT` bits (its shader variant's GLTF_MAPS)."""
        return sum(ROLE_BIT[role] for role in self.textures)


def open_material(
    streamer: Streamer, sources: Mapping[str, str | os.PathLike[str]], priority: float
) -> TextureSet | None:
    """One material's textures (role -> pack) opened as one texture set (one feedback stream per
    material) with glTF's top-left uv origin; None for a material without textures."""
    if not sources:
        return None
    return streamer.open_set(dict(sources), priority=priority, origin=Origin.TOP_LEFT)


def close_material(material: GltfMaterial) -> None:
    """Close a material's textures (its set), if it has any."""
    if material.texture_set is not None:
        material.texture_set.close()


def role_settings(role: str, ref: TextureRef, shares_metal_roughness: bool = False) -> ImageBakeSettings:
    """How the image of a texture of `role` is baked (module table), with its sampler's address mode."""
    both_repeat = ref.wrap_s is Wrap.REPEAT and ref.wrap_t is Wrap.REPEAT
    address = AddressMode.WRAP if both_repeat else AddressMode.CLAMP
    if role in ("base_color", "emissive"):
        return ImageBakeSettings(srgb=True, address_mode=address)
    if role == "normal":
        return ImageBakeSettings(texel_format=TexelFormat.BC5, srgb=False, address_mode=address)
    if role == "occlusion" and not shares_metal_roughness:
        return ImageBakeSettings(texel_format=TexelFormat.BC4, srgb=False, address_mode=address)
    return ImageBakeSettings(texel_format=TexelFormat.BC1, srgb=False, address_mode=address)


def _baked_image(image: ImageSource, bake: Callable[[Path], Path], folder: Path | None = None) -> Path:
    """`bake(file)` for `image`'s file: its own, or (for bytes) a private temporary file in the cache
    folder, removed once baked: the pack cache keys packs by the bytes' digest, so a later load finds
    the pack without the file, and nothing accumulates beside the packs."""
    if image.path is not None:
        return bake(image.path)
    assert image.data is not None
    suffix = MIME_SUFFIX.get(image.mime or "", "")
    if not suffix:
        suffix = ".png" if image.data[:4] == b"\x89PNG" else ".jpg" if image.data[:2] == b"\xff\xd8" else ".img"
    folder = folder or cache_dir() / IMAGE_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temp(folder / f"{xxhash.xxh3_128_hexdigest(image.data)}{suffix}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(image.data)
        named = tmp.with_name(tmp.name + suffix)  # the reader tells formats by the suffix as well
        os.replace(tmp, named)
        tmp = named
        return bake(tmp)
    finally:
        tmp.unlink(missing_ok=True)


def load_gltf(
    path: str | os.PathLike[str],
    streamer: Streamer,
    ctx: moderngl.Context | None = None,
    *,
    priority: float | Mapping[str, float] = 1.0,
    progress: ProgressCallback | None = None,
    cache: PackCache | None = None,
    jobs: int = 0,
) -> GltfScene:
    """Load a ``.gltf`` or ``.glb`` scene for drawing with streamed textures.

    Parameters
    ----------
    path
        The scene file; external buffers and images are read relative to its folder.
    streamer
        Streams every material texture (each image baked once into the pack cache first).
    ctx
        The context to build vertex arrays in; default ``streamer.ctx``.
    priority
        The texture sets' priority (where the streamer supports texture sets): one for every
        material, or material name -> priority (materials not named: 1.0), e.g. ``{"hero": 2.0}``
        to keep one material sharp under pressure.
    progress, cache, jobs
        As for `texstream.assets.pack_for_image`, for the images baked on first use.

    Returns
    -------
    GltfScene
        Owns its GL objects and its textures (``scene.release()`` closes both).

    Raises
    ------
    GltfError
        The file is malformed, truncated, refers to something missing or claims absurd sizes.
    SourceError, BudgetError, EngineError
        An image cannot be baked, or the streamer cannot hold the textures.
    """
    if isinstance(priority, Mapping):
        bad = {k: v for k, v in priority.items() if not isinstance(v, int | float) or not v > 0}
        if bad:
            raise ValueError(f"material priorities must be positive numbers, got {bad}")
    elif isinstance(priority, bool) or not isinstance(priority, int | float) or not priority > 0:
        raise ValueError(f"priority must be a positive number, got {priority!r}")
    document = read_gltf(path)
    ctx = ctx or streamer.ctx
    packs: dict[tuple[int, str], Path] = {}
    lease_cache = cache or default_pack_cache()  # holds a lease on each pack until the scene is released

    def pack_of(role: str, ref: TextureRef, spec: MaterialSpec) -> Path:
        mr = spec.textures.get("metallic_roughness")
        settings = role_settings(role, ref, role == "occlusion" and mr is not None and mr.image == ref.image)
        key = (ref.image, repr(settings))
        if key not in packs:
            image = document.images[ref.image]
            packs[key] = _baked_image(
                image,
                lambda file: pack_for_image(file, settings=settings, progress=progress, cache=lease_cache, jobs=jobs),
            )
        return packs[key]

    materials: list[GltfMaterial] = []
    try:
        for spec in [*document.materials, DEFAULT_MATERIAL]:
            refs = dict(spec.textures)
            in_mr = refs.get("occlusion") is not None and refs.get("occlusion") == refs.get("metallic_roughness")
            if in_mr:  # an occlusion-roughness-metal image: its R channel, from the same texture
                del refs["occlusion"]
            sources = {role: pack_of(role, ref, spec) for role, ref in refs.items()}
            wanted = priority.get(spec.name, 1.0) if isinstance(priority, Mapping) else priority
            tset = open_material(streamer, sources, float(wanted))
            textures = dict(tset.members) if tset is not None else {}
            wrap = {role: (ref.wrap_s, ref.wrap_t) for role, ref in refs.items()}
            materials.append(
                GltfMaterial(spec=spec, textures=textures, wrap=wrap, texture_set=tset, occlusion_in_mr=in_mr)
            )
        return GltfScene(ctx, streamer, document, materials, _PackLeases(lease_cache, list(packs.values())))
    except BaseException:
        for m in materials:
            close_material(m)
        _PackLeases(lease_cache, list(packs.values())).release()
        raise


@dataclass
class _PackLeases:
    """The cache leases `pack_for_image` took for a scene's packs (one per call), given back once."""

    cache: PackCache
    packs: list[Path]

    def release(self) -> None:
        for pack in self.packs:
            self.cache.release(pack)
        self.packs = []


ProgramKey = tuple[int, bool, bool]  # (GLTF_MAPS, GLTF_OCCLUSION_IN_MR, GLTF_DEBUG)


@dataclass
class _Draw:
    content: list[tuple[moderngl.Buffer, str, str]]  # vertex buffers: (buffer, format, attribute)
    index: moderngl.Buffer | None
    mode: int
    material: int
    model: bytes  # float32 4x4, column-major (GL)
    normal_matrix: bytes  # float32 3x3, column-major
    mirrored: bool  # the world matrix flips handedness: front faces wind clockwise
    has_tangents: bool
    vaos: dict[ProgramKey, moderngl.VertexArray]  # one per shader variant it was drawn with


def _set(program: moderngl.Program, name: str, value: object) -> None:
    """Set a uniform the variant has (a variant without a texture drops the uniforms of its factor)."""
    member = program.get(name, None)
    if member is not None:
        member.value = value


class GltfScene:
    """A loaded glTF scene: its primitives as vertex arrays, its materials' streamed textures.

    Attributes
    ----------
    materials : list of GltfMaterial
        One per material of the file, then the default material (primitives without one).
    bounds : tuple of numpy.ndarray
        World-space (min, max) corners of every placed primitive (before the `draw` model matrix).
    light_direction : numpy.ndarray
        Towards the sun, world space (glTF: +y up).
    debug : int
        0 shaded, 1 colour by resident mip level, 2 by residency (``vt_debug_tint``).
    """

    def __init__(
        self,
        ctx: moderngl.Context,
        streamer: Streamer,
        document: GltfDocument,
        materials: list[GltfMaterial],
        leases: _PackLeases | None = None,
    ) -> None:
        self.ctx, self.streamer, self.path = ctx, streamer, document.path
        self._leases = leases
        self.materials = materials
        self.light_direction = np.array([0.35, 0.85, 0.4])
        self.light_colour = (3.0, 2.9, 2.7)
        self.ambient = ((0.30, 0.34, 0.40), (0.12, 0.11, 0.10))  # sky, ground (linear)
        self.debug = 0
        self._draws: list[_Draw] = []
        self._buffers: list[moderngl.Buffer] = []
        self._programs: dict[ProgramKey, moderngl.Program] = {}
        self._released = False
        try:
            corners = self._build(document)
            for m in materials:  # compiled now rather than at the first frame
                self._program(self._key(m))
        except BaseException:
            self.release(close_textures=False)
            raise
        corners = np.concatenate(corners) if corners else np.zeros((1, 3))
        self.bounds = (corners.min(axis=0), corners.max(axis=0))

    @property
    def textures(self) -> list[VirtualTexture]:
        """Every open texture of the scene."""
        return [vt for m in self.materials for vt in m.textures.values()]

    def _key(self, material: GltfMaterial) -> ProgramKey:
        return material.maps, material.occlusion_in_mr, self.debug != 0 and "base_color" in material.textures

    def _program(self, key: ProgramKey) -> moderngl.Program:
        prog = self._programs.get(key)
        if prog is None:
            maps, in_mr, debug = key
            defines = {"GLTF_MAPS": maps, "GLTF_OCCLUSION_IN_MR": int(in_mr), "GLTF_DEBUG": int(debug)}
            prog = self._programs[key] = load_program(
                self.ctx,
                vertex=shader_file("texstream/gltf_vs.glsl"),
                fragment=shader_file("texstream/gltf_fs.glsl"),
                defines=defines,
            )
        return prog

    def _build(self, document: GltfDocument) -> list[np.ndarray]:
        """Vertex buffers per primitive (shared by its mesh's instances); world corners of each draw."""
        ctx = self.ctx
        default = len(self.materials) - 1
        meshes: dict[int, list[tuple]] = {}
        for prim in document.primitives:
            content = [(prim.positions, "3f", "in_position"), (prim.normals, "3f", "in_normal")]
            if prim.uvs is not None:
                content.append((prim.uvs, "2f", "in_uv"))
            if prim.tangents is not None:
                content.append((prim.tangents, "4f", "in_tangent"))
            buffers = []
            for arr, fmt, name in content:
                self._buffers.append(ctx.buffer(arr.tobytes()))
                buffers.append((self._buffers[-1], fmt, name))
            index = None
            if prim.indices is not None:
                index = ctx.buffer(prim.indices.tobytes())
                self._buffers.append(index)
            lo, hi = prim.positions.min(axis=0), prim.positions.max(axis=0)
            box = np.array([[(lo, hi)[(k >> a) & 1][a] for a in range(3)] for k in range(8)], np.float64)
            meshes.setdefault(prim.mesh, []).append((prim, buffers, index, box))
        corners = []
        for inst in document.instances:
            linear = inst.world[:3, :3]
            det = float(np.linalg.det(linear))
            normal_matrix = np.linalg.inv(linear).T if abs(det) > 1e-12 else linear
            for prim, buffers, index, box in meshes.get(inst.mesh, []):
                self._draws.append(
                    _Draw(
                        content=buffers,
                        index=index,
                        mode=MODES[prim.mode],
                        material=default if prim.material is None else prim.material,
                        model=inst.world.T.astype(np.float32).tobytes(),
                        normal_matrix=normal_matrix.T.astype(np.float32).tobytes(),
                        mirrored=det < 0,
                        has_tangents=prim.tangents is not None,
                        vaos={},
                    )
                )
                corners.append(box @ linear.T + inst.world[:3, 3])
        blend = {i for i, m in enumerate(self.materials) if m.spec.alpha_mode is AlphaMode.BLEND}
        self._draws.sort(key=lambda d: (d.material in blend, d.material))
        return corners

    def draw(self, view: np.ndarray, projection: np.ndarray, *, model: np.ndarray | None = None) -> None:
        """Draw the scene into the bound framebuffer (depth test on; blended materials last). It
        leaves depth test, face culling and blending off, the depth mask on and front faces
        counter-clockwise; the framebuffer needs a depth attachment.

        Parameters
        ----------
        view, projection : numpy.ndarray
            The camera's 4 x 4 matrices, row-major (as `texstream.scene.camera.look_at` and
            `perspective` make them; numpy's ``@`` order: clip = projection @ view @ world).
        model : numpy.ndarray, optional
            A 4 x 4 placing the whole scene in the caller's world (applied after the node matrices).
        """
        if self._released:
            raise RuntimeError("GltfScene.draw() after release()")
        ctx = self.ctx
        root = np.identity(4) if model is None else np.asarray(model, np.float64)
        eye = np.linalg.inv(np.asarray(view, np.float64) @ root)[:3, 3]  # in the scene's own world
        frame = {
            "u_view_proj": (np.asarray(projection) @ view @ root).T.astype(np.float32).tobytes(),
            "u_eye": tuple(float(v) for v in eye),
            "u_light_dir": tuple(float(v) for v in self.light_direction / np.linalg.norm(self.light_direction)),
            "u_light_colour": self.light_colour,
            "u_ambient_sky": self.ambient[0],
            "u_ambient_ground": self.ambient[1],
            "u_debug": self.debug,
        }
        ctx.enable(moderngl.DEPTH_TEST)
        current, blending, prog, key = -1, False, None, None
        try:
            for d in self._draws:
                if d.material != current:
                    current = d.material
                    material = self.materials[current]
                    key = self._key(material)
                    prog = self._program(key)
                    for name, value in frame.items():
                        if isinstance(value, bytes):
                            prog[name].write(value)
                        else:
                            _set(prog, name, value)
                    blending = self._use_material(prog, material, blending)
                assert prog is not None and key is not None
                vao = d.vaos.get(key)
                if vao is None:
                    vao = d.vaos[key] = ctx.vertex_array(prog, d.content, index_buffer=d.index, index_element_size=4)
                ctx.front_face = "cw" if d.mirrored else "ccw"
                prog["u_model"].write(d.model)
                prog["u_normal_matrix"].write(d.normal_matrix)
                _set(prog, "u_has_tangents", d.has_tangents)
                vao.render(d.mode)
        finally:
            ctx.front_face = "ccw"
            ctx.disable(moderngl.BLEND | moderngl.CULL_FACE | moderngl.DEPTH_TEST)
            ctx.depth_mask = True

    def _use_material(self, prog: moderngl.Program, material: GltfMaterial, blending: bool) -> bool:
        ctx, spec = self.ctx, material.spec
        for role, vt in material.textures.items():
            vt.bind(prog, UNIFORM[role])
            s, t = material.wrap[role]
            prog[f"{UNIFORM[role]}_wrap"].value = (WRAP_CODE[s], WRAP_CODE[t])
        _set(prog, "u_base_color_factor", spec.base_color_factor)
        _set(prog, "u_metal_rough", (spec.metallic_factor, spec.roughness_factor))
        _set(prog, "u_normal_scale", spec.normal_scale)
        _set(prog, "u_occlusion_strength", spec.occlusion_strength)
        _set(prog, "u_emissive_factor", spec.emissive_factor)
        _set(prog, "u_alpha_cutoff", spec.alpha_cutoff if spec.alpha_mode is AlphaMode.MASK else -1.0)
        if spec.double_sided:
            ctx.disable(moderngl.CULL_FACE)
        else:
            ctx.enable(moderngl.CULL_FACE)
        blend = spec.alpha_mode is AlphaMode.BLEND
        if blend and not blending:
            ctx.enable(moderngl.BLEND)
            ctx.blend_func = moderngl.SRC_ALPHA, moderngl.ONE_MINUS_SRC_ALPHA
            ctx.depth_mask = False
        elif blending and not blend:
            ctx.disable(moderngl.BLEND)
            ctx.depth_mask = True
        return blend

    def release(self, *, close_textures: bool = True) -> None:
        """Free the GL objects and (unless told not to) close the scene's textures; idempotent."""
        if self._released:
            return
        self._released = True
        for d in self._draws:
            for vao in d.vaos.values():
                vao.release()
        self._draws.clear()
        for b in self._buffers:
            b.release()
        self._buffers.clear()
        for prog in self._programs.values():
            prog.release()
        self._programs.clear()
        if close_textures:  # (after the streamer's release: already closed, nothing to do)
            for m in self.materials:
                close_material(m)
        if self._leases is not None:  # the packs may be evicted by the cache once no texture reads them
            self._leases.release()
