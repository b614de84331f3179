"""glTF files written by independent tools for the loader's tests: trimesh's exporter (a textured
box and plane in one GLB, images embedded) and pygltflib (a quad whose material has an external
PNG base colour, a data-URI normal map and a metallic-roughness image in a buffer view)."""

from __future__ import annotations

import base64
import io
import json
import struct
from pathlib import Path

import numpy as np
from PIL import Image


def pattern(size: int, seed: int, *, alpha: bool = False) -> Image.Image:
    """A colourful image with detail at every scale (so streamed levels show), ``size`` a side."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    r = 0.5 + 0.5 * np.sin(x * 40 + seed)
    g = 0.5 + 0.5 * np.cos(y * 23 + 3 * x)
    b = ((x * 8).astype(int) + (y * 8).astype(int)) % 2 * 0.6 + 0.2
    rgb = np.stack([r, g, b], axis=2) * 200 + rng.integers(0, 55, (size, size, 3))
    img = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB")
    return img.convert("RGBA") if alpha else img


def normal_image(size: int) -> Image.Image:
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    nx, ny = 0.3 * np.sin(x * 30), 0.3 * np.cos(y * 30)
    nz = np.sqrt(1 - nx * nx - ny * ny)
    rgb = (np.stack([nx, ny, nz], axis=2) * 0.5 + 0.5) * 255
    return Image.fromarray(rgb.astype(np.uint8), "RGB")


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def trimesh_scene(path: Path, size: int = 256) -> Path:
    """A GLB by trimesh's exporter: a textured box and a textured plane beside it."""
    import trimesh
    from trimesh.visual.material import PBRMaterial
    from trimesh.visual.texture import TextureVisuals

    box = trimesh.creation.box(extents=(1.0, 1.0, 1.0))
    # per-face UVs: unweld so each face spans the whole image
    box.unmerge_vertices()
    uv = np.zeros((len(box.vertices), 2))
    normals = box.face_normals
    for f, face in enumerate(box.faces):
        n = np.abs(normals[f])
        axes = [a for a in range(3) if n[a] < 0.5]
        for v in face:
            p = box.vertices[v]
            uv[v] = (p[axes[0]] + 0.5, p[axes[1]] + 0.5)
    box.visual = TextureVisuals(uv=uv, material=PBRMaterial(baseColorTexture=pattern(size, 1), metallicFactor=0.0))
    plane = trimesh.Trimesh(
        vertices=[[-2, -0.5, -2], [2, -0.5, -2], [2, -0.5, 2], [-2, -0.5, 2]],
        faces=[[0, 2, 1], [0, 3, 2]],
        process=False,
    )
    plane.visual = TextureVisuals(
        uv=np.array([[0, 0], [2, 0], [2, 2], [0, 2]], float),  # the image twice across: REPEAT
        material=PBRMaterial(baseColorTexture=pattern(size, 2), metallicFactor=0.0, roughnessFactor=0.8),
    )
    scene = trimesh.Scene()
    scene.add_geometry(box, node_name="box")
    scene.add_geometry(plane, node_name="plane")
    path.write_bytes(scene.export(file_type="glb"))
    return path


def pygltflib_quad(
    folder: Path, size: int = 256, *, wrap: int = 10497, uv_max: float = 1.0, albedo: Image.Image | None = None
) -> Path:
    """A .gltf by pygltflib: one quad (x, y in -1..1 at z = 0, facing +z) with a material of an
    external PNG base colour, a data-URI normal map and a buffer-view metallic-roughness image.
    Its uv follow glTF: (0, 0) at the image's top-left corner, shown at the quad's top-left."""
    import pygltflib as g

    folder.mkdir(parents=True, exist_ok=True)
    (albedo or pattern(size, 5)).save(folder / "albedo.png")
    normal_uri = "data:image/png;base64," + base64.b64encode(png_bytes(normal_image(size // 2))).decode()
    mr = png_bytes(Image.fromarray(np.full((size // 2, size // 2, 3), (0, 140, 30), np.uint8), "RGB"))

    pos = np.array([[-1, -1, 0], [1, -1, 0], [1, 1, 0], [-1, 1, 0]], np.float32)
    nrm = np.tile(np.float32([0, 0, 1]), (4, 1))
    # glTF uv: v = 0 is the image's top row, so the quad's top edge (y = 1) gets v = 0
    uv = np.array([[0, uv_max], [uv_max, uv_max], [uv_max, 0], [0, 0]], np.float32)
    idx = np.array([0, 1, 2, 0, 2, 3], np.uint16)
    blobs = [pos.tobytes(), nrm.tobytes(), uv.tobytes(), idx.tobytes() + b"\0\0", mr]
    offsets = np.cumsum([0] + [len(b) for b in blobs])
    blob = b"".join(blobs)
    views = [g.BufferView(buffer=0, byteOffset=int(offsets[i]), byteLength=len(blobs[i])) for i in range(5)]
    views[3].byteLength = idx.nbytes
    doc = g.GLTF2(
        asset=g.Asset(version="2.0"),
        scene=0,
        scenes=[g.Scene(nodes=[0])],
        nodes=[g.Node(mesh=0)],
        meshes=[
            g.Mesh(
                primitives=[
                    g.Primitive(attributes=g.Attributes(POSITION=0, NORMAL=1, TEXCOORD_0=2), indices=3, material=0)
                ]
            )
        ],
        accessors=[
            g.Accessor(bufferView=0, componentType=5126, count=4, type="VEC3", min=[-1, -1, 0], max=[1, 1, 0]),
            g.Accessor(bufferView=1, componentType=5126, count=4, type="VEC3"),
            g.Accessor(bufferView=2, componentType=5126, count=4, type="VEC2"),
            g.Accessor(bufferView=3, componentType=5123, count=6, type="SCALAR"),
        ],
        bufferViews=views,
        buffers=[g.Buffer(byteLength=len(blob), uri="quad.bin")],
        images=[g.Image(uri="albedo.png"), g.Image(uri=normal_uri), g.Image(bufferView=4, mimeType="image/png")],
        samplers=[g.Sampler(wrapS=wrap, wrapT=wrap)],
        textures=[g.Texture(source=0, sampler=0), g.Texture(source=1, sampler=0), g.Texture(source=2, sampler=0)],
        materials=[
            g.Material(
                pbrMetallicRoughness=g.PbrMetallicRoughness(
                    baseColorTexture=g.TextureInfo(index=0), metallicRoughnessTexture=g.TextureInfo(index=2)
                ),
                normalTexture=g.NormalMaterialTexture(index=1),
            )
        ],
    )
    (folder / "quad.bin").write_bytes(blob)
    out = folder / "quad.gltf"
    doc.save_json(str(out))
    return out


def glb_bytes(document: dict, blob: bytes = b"") -> bytes:
    """A GLB container around a JSON document and a BIN chunk (for hand-made hostile files)."""
    text = json.dumps(document).encode()
    text += b" " * (-len(text) % 4)
    blob += b"\0" * (-len(blob) % 4)
    chunks = struct.pack("<II", len(text), 0x4E4F534A) + text
    if blob:
        chunks += struct.pack("<II", len(blob), 0x004E4942) + blob
    return struct.pack("<4sII", b"glTF", 2, 12 + len(chunks)) + chunks


def triangle_document(**overrides: object) -> tuple[dict, bytes]:
    """A minimal valid glTF document (one indexed triangle, no material) and its binary chunk;
    `overrides` replace top-level members (for hostile variants)."""
    pos = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], np.float32).tobytes()
    idx = np.array([0, 1, 2, 0], np.uint16).tobytes()
    doc = {
        "asset": {"version": "2.0"},
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [{"attributes": {"POSITION": 0}, "indices": 1}]}],
        "accessors": [
            {"bufferView": 0, "componentType": 5126, "count": 3, "type": "VEC3"},
            {"bufferView": 1, "componentType": 5123, "count": 3, "type": "SCALAR"},
        ],
        "bufferViews": [
            {"buffer": 0, "byteOffset": 0, "byteLength": 36},
            {"buffer": 0, "byteOffset": 36, "byteLength": 6},
        ],
        "buffers": [{"byteLength": 44}],
    }
    doc.update(overrides)
    return doc, pos + idx
