"""A glTF 2.0 file (``.gltf`` or ``.glb``) read into plain arrays and material descriptions, with
no GL and no streamer: what `texstream.scene.gltf.load_gltf` draws.

The document model is pygltflib's; the container (the GLB header and chunks), every index and every
byte range is checked here before anything is read or allocated, because a file from elsewhere is
hostile until proven otherwise: an accessor may claim more elements than its buffer holds, a buffer
may name a missing file, a node may be its own ancestor. Each such case is one `GltfError` line
naming the file and the offending object (``accessors[3]``), never a traceback or a huge allocation.

What is read:

- meshes: every primitive's POSITION, NORMAL, TEXCOORD_0 and TANGENT (float, or normalized /
  quantized integers), its indices of any component type; primitives without normals get flat
  ones (as the specification requires), triangles unwelded for it;
- nodes: the default scene's node trees (every root node when there is no scene), each node's
  matrix or translation / rotation / scale flattened into one world matrix per mesh instance;
- materials: metallic-roughness factors and their five textures (base colour, normal,
  metallic-roughness, occlusion, emissive), each with its image and sampler wrap modes;
- images: embedded in a GLB or a buffer view, data URIs, and files relative to the document.

Not read: skins, morph targets, animations, cameras, sparse accessors (refused in one line),
texture coordinate sets other than 0 (TEXCOORD_0 is used instead, with a warning).
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import logging
import math
import os
import struct
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import GltfError, first_line

log = logging.getLogger(__name__)

__all__ = [
    "AlphaMode",
    "GltfDocument",
    "ImageSource",
    "MaterialSpec",
    "MeshInstance",
    "PrimitiveData",
    "TextureRef",
    "Wrap",
    "parse_gltf",
    "read_gltf",
]

GLB_MAGIC = b"glTF"
GLB_JSON, GLB_BIN = 0x4E4F534A, 0x004E4942
MAX_FILE_BYTES = 2 << 30  # a .gltf / .glb / .bin is read whole: larger ones are refused
MAX_ELEMENTS = 1 << 24  # elements an accessor may hold (16 M vertices or indices)
MAX_UNBACKED_ELEMENTS = 1 << 16  # an accessor with no buffer view is zeros: allocated, so kept small
MAX_VERTICES = 1 << 24  # vertices of one primitive after flat normals unweld its triangles
MAX_INSTANCES = 1 << 16  # mesh instances the node trees may place
MAX_NODE_DEPTH = 256

COMPONENT = {5120: np.int8, 5121: np.uint8, 5122: np.int16, 5123: np.uint16, 5125: np.uint32, 5126: np.float32}
NORMALIZE = {5120: 127.0, 5121: 255.0, 5122: 32767.0, 5123: 65535.0}
TYPE_COMPONENTS = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4}  # matrices are never vertex data here
ATTRIBUTES = {"POSITION": 3, "NORMAL": 3, "TEXCOORD_0": 2, "TANGENT": 4}  # name -> components
MODES = range(7)  # POINTS, LINES, LINE_LOOP, LINE_STRIP, TRIANGLES, TRIANGLE_STRIP, TRIANGLE_FAN
TRIANGLES = 4


class Wrap(enum.IntEnum):
    """A glTF sampler's wrap mode (its GL enum value)."""

    CLAMP = 33071
    MIRROR = 33648
    REPEAT = 10497


class AlphaMode(enum.Enum):
    OPAQUE = "OPAQUE"
    MASK = "MASK"
    BLEND = "BLEND"


@dataclass(frozen=True, kw_only=True)
class ImageSource:
    """One image: a file next to the document, or bytes (a GLB chunk, a buffer view, a data URI)."""

    index: int
    name: str
    path: Path | None = None
    data: bytes | None = None
    mime: str | None = None


@dataclass(frozen=True, kw_only=True)
class TextureRef:
    """A material's use of a texture: which image, how it wraps along u (S) and v (T)."""

    image: int
    wrap_s: Wrap = Wrap.REPEAT
    wrap_t: Wrap = Wrap.REPEAT


@dataclass(frozen=True, kw_only=True)
class MaterialSpec:
    """A glTF material's factors and textures (roles: base_color, normal, metallic_roughness,
    occlusion, emissive)."""

    name: str
    base_color_factor: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)
    metallic_factor: float = 1.0
    roughness_factor: float = 1.0
    normal_scale: float = 1.0
    occlusion_strength: float = 1.0
    emissive_factor: tuple[float, float, float] = (0.0, 0.0, 0.0)
    alpha_mode: AlphaMode = AlphaMode.OPAQUE
    alpha_cutoff: float = 0.5
    double_sided: bool = False
    textures: dict[str, TextureRef] = field(default_factory=dict)


DEFAULT_MATERIAL = MaterialSpec(name="default")  # the specification's material for primitives without one


@dataclass(frozen=True, kw_only=True)
class PrimitiveData:
    """One primitive's vertex arrays (float32, C-contiguous) and indices (uint32 or None)."""

    mesh: int
    positions: np.ndarray  # (n, 3)
    normals: np.ndarray  # (n, 3)
    uvs: np.ndarray | None  # (n, 2)
    tangents: np.ndarray | None  # (n, 4)
    indices: np.ndarray | None  # (m,)
    mode: int
    material: int | None


@dataclass(frozen=True, kw_only=True)
class MeshInstance:
    """A mesh placed by a node: its world matrix (4 x 4, row-major float64)."""

    mesh: int
    node: int
    world: np.ndarray


@dataclass(frozen=True, kw_only=True)
class GltfDocument:
    """Everything `load_gltf` needs from a file, checked."""

    path: Path
    primitives: list[PrimitiveData]  # in mesh order; PrimitiveData.mesh names the mesh
    instances: list[MeshInstance]
    materials: list[MaterialSpec]
    images: list[ImageSource]


def read_gltf(path: str | os.PathLike[str]) -> GltfDocument:
    """Read and check a ``.gltf`` or ``.glb`` file.

    Raises
    ------
    GltfError
        one line naming the file and the problem: unreadable, not glTF, a broken reference, a
        byte range past its buffer, an absurd count, or a feature not supported
    """
    p = Path(path)
    try:
        size = os.path.getsize(p)
        if size > MAX_FILE_BYTES:
            raise GltfError(f"{p}: {size:,} bytes, over the {MAX_FILE_BYTES:,}-byte limit of a glTF file")
        data = p.read_bytes()
    except FileNotFoundError:
        raise GltfError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise GltfError(f"{p}: a folder, not a glTF file") from None
    except OSError as exc:
        raise GltfError(f"{p}: cannot read: {exc.strerror or exc}") from None
    return parse_gltf(data, p)


def parse_gltf(data: bytes, path: Path, base: Path | None = None) -> GltfDocument:
    """Parse a glTF file's bytes; external files are looked for in `base` (default: the file's folder)."""
    json_text, blob = _container(data, path)
    return _Reader(path, base if base is not None else path.parent, json_text, blob).document()


def _container(data: bytes, path: Path) -> tuple[str, bytes | None]:
    """The JSON text and the BIN chunk (GLB) or the whole text (.gltf)."""
    if data[:4] != GLB_MAGIC:
        if data[:1] not in (b"{", b"[", b" ", b"\t", b"\r", b"\n", b"\xef"):
            raise GltfError(f"{path}: not a glTF file (neither GLB nor JSON)")
        try:
            return data.decode("utf-8-sig"), None
        except UnicodeDecodeError as exc:
            raise GltfError(f"{path}: not UTF-8 JSON: {exc.reason} at byte {exc.start}") from None
    if len(data) < 20:
        raise GltfError(f"{path}: truncated GLB: {len(data)} bytes, no room for a header and a chunk")
    _, version, length = struct.unpack_from("<4sII", data)
    if version != 2:
        raise GltfError(f"{path}: GLB version {version}; only glTF 2.0 is supported")
    if length > len(data):
        raise GltfError(f"{path}: truncated GLB: its header says {length:,} bytes, the file has {len(data):,}")
    offset, chunks = 12, []
    while offset + 8 <= length:
        chunk_length, chunk_type = struct.unpack_from("<II", data, offset)
        start, end = offset + 8, offset + 8 + chunk_length
        if end > length:
            raise GltfError(f"{path}: GLB chunk {len(chunks)} ends at byte {end:,}, past the file's {length:,}")
        chunks.append((chunk_type, start, end))
        offset = end + (-end % 4)
    if not chunks or chunks[0][0] != GLB_JSON:
        raise GltfError(f"{path}: GLB without a JSON chunk first")
    _, start, end = chunks[0]
    try:
        text = data[start:end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GltfError(f"{path}: GLB JSON chunk is not UTF-8: {exc.reason}") from None
    blob = next((data[s:e] for t, s, e in chunks[1:] if t == GLB_BIN), None)
    return text, blob


def _quaternion_matrix(q: list[float]) -> np.ndarray:
    x, y, z, w = q
    n = math.sqrt(x * x + y * y + z * z + w * w) or 1.0
    x, y, z, w = x / n, y / n, z / n, w / n
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


class _Reader:
    """One document's checks and reads; `document()` gives the result."""

    def __init__(self, path: Path, base: Path, json_text: str, blob: bytes | None) -> None:
        from pygltflib import GLTF2

        self.path, self.base, self.blob = path, base, blob
        try:
            raw = json.loads(json_text)
            if not isinstance(raw, dict):
                raise GltfError(f"{path}: the JSON is a {type(raw).__name__}, not a glTF object")
            self.doc = GLTF2.gltf_from_json(json_text)
        except GltfError:
            raise
        except RecursionError:
            raise GltfError(f"{path}: JSON nested too deeply") from None
        except Exception as exc:  # json / dataclasses-json / pygltflib errors of every kind
            raise GltfError(f"{path}: not a valid glTF document: {first_line(exc)}") from None
        version = str(getattr(self.doc.asset, "version", "") or "")
        if not version.startswith("2."):
            raise GltfError(f"{path}: glTF version {version or 'missing'}; only 2.x is supported")
        self._buffers: dict[int, bytes] = {}

    # ---- checked scalars ------------------------------------------------------------------------
    def fail(self, what: str, problem: str) -> GltfError:
        return GltfError(f"{self.path}: {what}: {problem}")

    def index(self, value: object, items: list, what: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(items):
            raise self.fail(what, f"index {value!r} is not one of the {len(items)} defined")
        return value

    def integer(self, value: object, what: str, lo: int, hi: int, default: int | None = None) -> int:
        if value is None and default is not None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.fail(what, f"{value!r} is not an integer in {lo:,}..{hi:,}")
        return value

    def number(self, value: object, what: str, default: float) -> float:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(what, f"{value!r} is not a finite number")
        return float(value)

    def numbers(self, value: object, n: int, what: str, default: tuple[float, ...]) -> tuple[float, ...]:
        if value is None:
            return default
        if not isinstance(value, list) or len(value) != n:
            raise self.fail(what, f"expected {n} numbers, got {str(value)[:60]}")
        return tuple(self.number(v, what, 0.0) for v in value)

    def listed(self, value: object, what: str) -> list:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(what, f"expected a list, got {type(value).__name__}")
        return value

    # ---- buffers --------------------------------------------------------------------------------
    def buffer(self, i: int) -> bytes:
        if i in self._buffers:
            return self._buffers[i]
        what = f"buffers[{i}]"
        buf = self.doc.buffers[i]
        length = self.integer(buf.byteLength, f"{what}.byteLength", 1, MAX_FILE_BYTES)
        uri = buf.uri
        if uri is None:
            if i != 0 or self.blob is None:
                raise self.fail(what, "no uri and no GLB binary chunk to stand for it")
            data = self.blob
        else:
            data = self.uri_bytes(uri, what)
        if len(data) < length:
            raise self.fail(what, f"holds {len(data):,} bytes, less than its byteLength {length:,}")
        self._buffers[i] = data = data[:length]
        return data

    def uri_bytes(self, uri: object, what: str) -> bytes:
        if not isinstance(uri, str):
            raise self.fail(what, f"uri {uri!r} is not a string")
        if uri.startswith("data:"):
            head, sep, payload = uri.partition(",")
            if not sep or not head.endswith(";base64"):
                raise self.fail(what, "a data URI that is not base64")
            try:
                return base64.b64decode(payload, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise self.fail(what, f"bad base64 in its data URI ({exc})") from None
        return self.file_bytes(self.file_path(uri, what), what)

    def file_path(self, uri: str, what: str) -> Path:
        parsed = urllib.parse.urlsplit(uri)
        if parsed.scheme and len(parsed.scheme) > 1:  # (one letter: a Windows drive)
            raise self.fail(what, f"uri {uri[:80]!r}: only files beside the document and data URIs are read")
        return self.base / urllib.parse.unquote(parsed.path)

    def file_bytes(self, p: Path, what: str) -> bytes:
        try:
            size = os.path.getsize(p)
            if size > MAX_FILE_BYTES:
                raise self.fail(what, f"{p.name} is {size:,} bytes, over the {MAX_FILE_BYTES:,}-byte limit")
            return p.read_bytes()
        except FileNotFoundError:
            raise self.fail(what, f"{p} is missing") from None
        except OSError as exc:
            raise self.fail(what, f"cannot read {p}: {exc.strerror or exc}") from None

    def view(self, i: object, what: str) -> tuple[bytes, int, int, int | None]:
        """(buffer bytes, offset, length, byteStride) of buffer view `i`, its range checked."""
        i = self.index(i, self.doc.bufferViews, f"{what}.bufferView")
        bv = self.doc.bufferViews[i]
        where = f"bufferViews[{i}]"
        data = self.buffer(self.index(bv.buffer, self.doc.buffers, f"{where}.buffer"))
        offset = self.integer(bv.byteOffset, f"{where}.byteOffset", 0, MAX_FILE_BYTES, default=0)
        length = self.integer(bv.byteLength, f"{where}.byteLength", 1, MAX_FILE_BYTES)
        if offset + length > len(data):
            raise self.fail(where, f"bytes {offset:,}..{offset + length:,} lie past its buffer's {len(data):,}")
        stride = None if bv.byteStride is None else self.integer(bv.byteStride, f"{where}.byteStride", 4, 252)
        if stride is not None and stride % 4:
            raise self.fail(where, f"byteStride {stride} is not a multiple of 4")
        return data, offset, length, stride

    def accessor(self, i: object, what: str, allowed: tuple[int, ...]) -> np.ndarray:
        """Accessor `i` as an (count, components) array of its component type, every range checked."""
        i = self.index(i, self.doc.accessors, what)
        acc = self.doc.accessors[i]
        where = f"accessors[{i}]"
        if acc.sparse is not None:
            raise self.fail(where, "sparse accessors are not supported")
        ctype = acc.componentType
        if ctype not in COMPONENT:
            raise self.fail(where, f"componentType {ctype!r} is not a glTF component type")
        if ctype not in allowed:
            raise self.fail(where, f"componentType {ctype} cannot hold {what}")
        comps = TYPE_COMPONENTS.get(acc.type) if isinstance(acc.type, str) else None
        if comps is None:
            raise self.fail(where, f"type {acc.type!r} cannot hold {what}")
        dtype = np.dtype(COMPONENT[ctype]).newbyteorder("<")
        if acc.bufferView is None:
            count = self.integer(acc.count, f"{where}.count", 1, MAX_UNBACKED_ELEMENTS)
            return np.zeros((count, comps), dtype)
        count = self.integer(acc.count, f"{where}.count", 1, MAX_ELEMENTS)
        data, offset, length, stride = self.view(acc.bufferView, where)
        start = self.integer(acc.byteOffset, f"{where}.byteOffset", 0, MAX_FILE_BYTES, default=0)
        element = comps * dtype.itemsize
        stride = stride or element
        if stride < element:
            raise self.fail(where, f"elements of {element} bytes in a view of byteStride {stride}")
        if start % dtype.itemsize:
            raise self.fail(where, f"byteOffset {start} is not a multiple of its component size")
        end = start + stride * (count - 1) + element
        if end > length:
            raise self.fail(where, f"{count:,} elements need {end:,} bytes of a {length:,}-byte buffer view")
        arr = np.ndarray((count, comps), dtype, buffer=data, offset=offset + start, strides=(stride, dtype.itemsize))
        return np.ascontiguousarray(arr)

    def floats(self, i: object, what: str, comps: int) -> np.ndarray:
        """A vertex attribute as float32, integer types normalized when the accessor says so."""
        acc_index = self.index(i, self.doc.accessors, what)
        arr = self.accessor(acc_index, what, tuple(COMPONENT))
        if arr.shape[1] != comps:
            raise self.fail(f"accessors[{acc_index}]", f"{what} needs {comps} components, it has {arr.shape[1]}")
        acc = self.doc.accessors[acc_index]
        if arr.dtype.kind == "f":
            return arr.astype(np.float32)
        scale = NORMALIZE.get(acc.componentType) if acc.normalized else None
        out = arr.astype(np.float32)
        return np.maximum(out / scale, -1.0) if scale else out

    # ---- the document ---------------------------------------------------------------------------
    def document(self) -> GltfDocument:
        doc = self.doc
        for name in ("accessors", "bufferViews", "buffers", "meshes", "nodes", "materials", "textures", "images"):
            self.listed(getattr(doc, name), name)
        primitives = [p for m in range(len(doc.meshes)) for p in self.mesh(m)]
        instances = self.instances()
        images = [self.image(i) for i in range(len(doc.images))]
        materials = [self.material(i) for i in range(len(doc.materials))]
        for p in primitives:
            if p.material is not None and p.material >= len(materials):
                raise self.fail(f"meshes[{p.mesh}]", f"material {p.material} is not one of the {len(materials)}")
        return GltfDocument(
            path=self.path, primitives=primitives, instances=instances, materials=materials, images=images
        )

    def mesh(self, m: int) -> list[PrimitiveData]:
        mesh = self.doc.meshes[m]
        out = []
        for k, prim in enumerate(self.listed(mesh.primitives, f"meshes[{m}].primitives")):
            what = f"meshes[{m}].primitives[{k}]"
            attrs = prim.attributes
            get = attrs.get if isinstance(attrs, dict) else (lambda name, a=attrs: getattr(a, name, None))
            if get("POSITION") is None:
                raise self.fail(what, "no POSITION attribute")
            arrays = {
                name: self.floats(get(name), f"{what}.{name}", comps)
                for name, comps in ATTRIBUTES.items()
                if get(name) is not None
            }
            n = len(arrays["POSITION"])
            for name, arr in arrays.items():
                if len(arr) != n:
                    raise self.fail(what, f"{name} has {len(arr):,} elements, POSITION {n:,}")
            if get("TEXCOORD_1") is not None:
                log.debug("%s: %s: TEXCOORD_1 is not used", self.path, what)
            mode = self.integer(prim.mode, f"{what}.mode", 0, 6, default=TRIANGLES)
            indices = None
            if prim.indices is not None:
                indices = self.accessor(prim.indices, f"{what}.indices", (5121, 5123, 5125))[:, 0].astype(np.uint32)
                if indices.shape[0] and int(indices.max()) >= n:
                    raise self.fail(what, f"an index {int(indices.max()):,} past its {n:,} vertices")
            material = None if prim.material is None else self.integer(prim.material, f"{what}.material", 0, 1 << 20)
            if "NORMAL" not in arrays:
                arrays, indices = self.flat_normals(arrays, indices, mode, what)
            out.append(
                PrimitiveData(
                    mesh=m,
                    positions=arrays["POSITION"],
                    normals=arrays["NORMAL"],
                    uvs=arrays.get("TEXCOORD_0"),
                    tangents=arrays.get("TANGENT"),
                    indices=indices,
                    mode=mode,
                    material=material,
                )
            )
        return out

    def flat_normals(
        self, arrays: dict[str, np.ndarray], indices: np.ndarray | None, mode: int, what: str
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """Flat normals: triangles unwelded, each corner given its face's normal (other modes: +z)."""
        n = len(arrays["POSITION"])
        if mode != TRIANGLES:
            return {**arrays, "NORMAL": np.tile(np.float32([0, 0, 1]), (n, 1))}, indices
        corners = indices if indices is not None else np.arange(n, dtype=np.uint32)
        corners = corners[: len(corners) - len(corners) % 3]
        if len(corners) > MAX_VERTICES:
            raise self.fail(what, f"{len(corners):,} corners to give flat normals, over the {MAX_VERTICES:,} limit")
        out = {name: arr[corners] for name, arr in arrays.items()}
        tri = out["POSITION"].reshape(-1, 3, 3).astype(np.float64)
        face = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
        length = np.linalg.norm(face, axis=1, keepdims=True)
        face = np.where(length > 0, face / np.where(length > 0, length, 1.0), np.float64([0, 0, 1]))
        out["NORMAL"] = np.repeat(face, 3, axis=0).astype(np.float32)
        return out, None

    def local_matrix(self, i: int) -> np.ndarray:
        node = self.doc.nodes[i]
        what = f"nodes[{i}]"
        if node.matrix is not None:
            return np.array(self.numbers(node.matrix, 16, f"{what}.matrix", ())).reshape(4, 4).T  # column-major
        t = self.numbers(node.translation, 3, f"{what}.translation", (0.0, 0.0, 0.0))
        r = self.numbers(node.rotation, 4, f"{what}.rotation", (0.0, 0.0, 0.0, 1.0))
        s = self.numbers(node.scale, 3, f"{what}.scale", (1.0, 1.0, 1.0))
        m = np.identity(4)
        m[:3, :3] = _quaternion_matrix(list(r)) * np.array(s)[None, :]
        m[:3, 3] = t
        return m

    def instances(self) -> list[MeshInstance]:
        doc = self.doc
        nodes = doc.nodes
        children = {}
        for i, node in enumerate(nodes):
            children[i] = [self.index(c, nodes, f"nodes[{i}].children") for c in self.listed(node.children, "children")]
        if doc.scenes:
            s = self.integer(doc.scene, "scene", 0, len(doc.scenes) - 1, default=0)
            roots = [self.index(r, nodes, f"scenes[{s}].nodes") for r in self.listed(doc.scenes[s].nodes, "nodes")]
        else:
            child = {c for cs in children.values() for c in cs}
            roots = [i for i in range(len(nodes)) if i not in child]
        out: list[MeshInstance] = []
        seen: set[int] = set()
        stack = [(r, np.identity(4), 0) for r in reversed(roots)]
        while stack:
            i, parent, depth = stack.pop()
            if i in seen:
                raise self.fail(f"nodes[{i}]", "reached twice: the node hierarchy is not a set of trees")
            if depth > MAX_NODE_DEPTH:
                raise self.fail(f"nodes[{i}]", f"nested more than {MAX_NODE_DEPTH} deep")
            seen.add(i)
            world = parent @ self.local_matrix(i)
            mesh = nodes[i].mesh
            if mesh is not None:
                out.append(MeshInstance(mesh=self.index(mesh, doc.meshes, f"nodes[{i}].mesh"), node=i, world=world))
                if len(out) > MAX_INSTANCES:
                    raise GltfError(f"{self.path}: more than {MAX_INSTANCES:,} mesh instances")
            stack.extend((c, world, depth + 1) for c in reversed(children[i]))
        return out

    def image(self, i: int) -> ImageSource:
        img = self.doc.images[i]
        what = f"images[{i}]"
        mime = img.mimeType if isinstance(img.mimeType, str) else None
        name = img.name if isinstance(img.name, str) and img.name else f"image{i}"
        if img.uri is not None:
            if not isinstance(img.uri, str):
                raise self.fail(what, f"uri {img.uri!r} is not a string")
            if img.uri.startswith("data:"):
                mime = mime or img.uri[5:].partition(";")[0] or None
                return ImageSource(index=i, name=name, data=self.uri_bytes(img.uri, what), mime=mime)
            p = self.file_path(img.uri, what)
            if not p.is_file():
                raise self.fail(what, f"{p} is missing")
            return ImageSource(index=i, name=p.name, path=p, mime=mime)
        if img.bufferView is None:
            raise self.fail(what, "neither a uri nor a bufferView")
        data, offset, length, _ = self.view(img.bufferView, what)
        return ImageSource(index=i, name=name, data=data[offset : offset + length], mime=mime)

    def texture(self, info: object, what: str) -> TextureRef | None:
        if info is None:
            return None
        doc = self.doc
        t = self.index(getattr(info, "index", None), doc.textures, f"{what}.index")
        coord = getattr(info, "texCoord", None)
        if coord not in (None, 0):
            log.warning("%s: %s uses TEXCOORD_%s; TEXCOORD_0 is drawn instead", self.path, what, coord)
        tex = doc.textures[t]
        if tex.source is None:
            log.warning("%s: textures[%d] has no image this loader reads (an extension's?): not drawn", self.path, t)
            return None
        image = self.index(tex.source, doc.images, f"textures[{t}].source")
        wrap_s = wrap_t = Wrap.REPEAT
        if tex.sampler is not None:
            s = doc.samplers[self.index(tex.sampler, doc.samplers, f"textures[{t}].sampler")]
            wrap_s, wrap_t = (self.wrap(v, f"textures[{t}] sampler") for v in (s.wrapS, s.wrapT))
        return TextureRef(image=image, wrap_s=wrap_s, wrap_t=wrap_t)

    def wrap(self, value: object, what: str) -> Wrap:
        if value is None:
            return Wrap.REPEAT
        try:
            return Wrap(value)
        except ValueError:
            raise self.fail(what, f"wrap mode {value!r} is not 33071, 33648 or 10497") from None

    def material(self, i: int) -> MaterialSpec:
        m = self.doc.materials[i]
        what = f"materials[{i}]"
        pbr = m.pbrMetallicRoughness
        textures: dict[str, TextureRef] = {}
        uses = {
            "base_color": (getattr(pbr, "baseColorTexture", None), f"{what}.baseColorTexture"),
            "metallic_roughness": (getattr(pbr, "metallicRoughnessTexture", None), f"{what}.metallicRoughnessTexture"),
            "normal": (m.normalTexture, f"{what}.normalTexture"),
            "occlusion": (m.occlusionTexture, f"{what}.occlusionTexture"),
            "emissive": (m.emissiveTexture, f"{what}.emissiveTexture"),
        }
        for role, (info, where) in uses.items():
            ref = self.texture(info, where) if info is not None and getattr(info, "index", None) is not None else None
            if ref is not None:
                textures[role] = ref
        try:
            alpha = AlphaMode(m.alphaMode or "OPAQUE")
        except ValueError:
            raise self.fail(what, f"alphaMode {m.alphaMode!r} is not OPAQUE, MASK or BLEND") from None
        return MaterialSpec(
            name=m.name if isinstance(m.name, str) and m.name else f"material{i}",
            base_color_factor=self.numbers(
                getattr(pbr, "baseColorFactor", None), 4, f"{what}.baseColorFactor", (1.0, 1.0, 1.0, 1.0)
            ),
            metallic_factor=self.number(getattr(pbr, "metallicFactor", None), f"{what}.metallicFactor", 1.0),
            roughness_factor=self.number(getattr(pbr, "roughnessFactor", None), f"{what}.roughnessFactor", 1.0),
            normal_scale=self.number(getattr(m.normalTexture, "scale", None), f"{what}.normalTexture.scale", 1.0),
            occlusion_strength=self.number(
                getattr(m.occlusionTexture, "strength", None), f"{what}.occlusionTexture.strength", 1.0
            ),
            emissive_factor=self.numbers(m.emissiveFactor, 3, f"{what}.emissiveFactor", (0.0, 0.0, 0.0)),
            alpha_mode=alpha,
            alpha_cutoff=self.number(m.alphaCutoff, f"{what}.alphaCutoff", 0.5),
            double_sided=bool(m.doubleSided),
            textures=textures,
        )
