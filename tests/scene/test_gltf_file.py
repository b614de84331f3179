"""Reading glTF files without GL: files written by trimesh and pygltflib, node transforms, flat
normals, and hostile files refused in one `GltfError` line before anything large is allocated."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from texstream.errors import GltfError
from texstream.scene.gltf_file import Wrap, parse_gltf, read_gltf

from .files import glb_bytes, pygltflib_quad, triangle_document, trimesh_scene


def test_a_trimesh_glb_reads_with_its_embedded_images(tmp_path: Path) -> None:
    doc = read_gltf(trimesh_scene(tmp_path / "scene.glb", size=64))
    assert len(doc.primitives) == 2 and len(doc.instances) == 2
    box, plane = doc.primitives
    assert box.positions.shape[1] == 3 and box.uvs is not None and box.normals.shape == box.positions.shape
    assert np.allclose(np.linalg.norm(box.normals, axis=1), 1.0, atol=1e-3)
    assert plane.uvs is not None and plane.uvs.max() == pytest.approx(2.0)  # the plane repeats its image
    assert [sorted(m.textures) for m in doc.materials] == [["base_color"], ["base_color"]]
    assert all(img.data is not None and img.data[:4] == b"\x89PNG" for img in doc.images)


def test_a_pygltflib_gltf_reads_external_data_uri_and_buffer_view_images(tmp_path: Path) -> None:
    path = pygltflib_quad(tmp_path / "quad", size=64, wrap=int(Wrap.CLAMP))
    doc = read_gltf(path)
    (material,) = doc.materials
    assert set(material.textures) == {"base_color", "normal", "metallic_roughness"}
    assert all(ref.wrap_s is Wrap.CLAMP and ref.wrap_t is Wrap.CLAMP for ref in material.textures.values())
    external, data_uri, view = doc.images
    assert external.path == tmp_path / "quad" / "albedo.png" and external.data is None
    assert data_uri.data[:4] == b"\x89PNG" and data_uri.mime == "image/png"
    assert view.data[:4] == b"\x89PNG"
    (prim,) = doc.primitives
    assert prim.indices.tolist() == [0, 1, 2, 0, 2, 3]
    assert prim.uvs[3].tolist() == [0.0, 0.0] and prim.positions[3].tolist() == [-1.0, 1.0, 0.0]  # top-left


def test_node_transforms_are_flattened_into_world_matrices(tmp_path: Path) -> None:
    nodes = [
        {"children": [1], "translation": [10, 0, 0]},
        {"mesh": 0, "rotation": [0, 0, 0.7071068, 0.7071068], "scale": [2, 2, 2]},  # 90 degrees about z
        {"mesh": 0, "matrix": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 5, 6, 7, 1]},  # column-major translation
    ]
    doc, blob = triangle_document(nodes=nodes, scenes=[{"nodes": [0, 2]}])
    parsed = parse_gltf(glb_bytes(doc, blob), tmp_path / "t.glb")
    a, b = (inst.world for inst in parsed.instances)
    assert np.allclose(a @ [1, 0, 0, 1], [10, 2, 0, 1], atol=1e-5)  # x -> 2y, then moved by the parent
    assert np.allclose(b @ [0, 0, 0, 1], [5, 6, 7, 1])


def test_primitives_without_normals_get_flat_ones(tmp_path: Path) -> None:
    doc, blob = triangle_document()
    (prim,) = parse_gltf(glb_bytes(doc, blob), tmp_path / "t.glb").primitives
    assert prim.indices is None and len(prim.positions) == 3  # unwelded: one vertex per corner
    assert np.allclose(prim.normals, [[0, 0, 1]] * 3)


def _mutated(change: str) -> bytes:
    doc, blob = triangle_document()
    doc = copy.deepcopy(doc)
    if change == "truncated":
        return glb_bytes(doc, blob)[:-8]
    if change == "chunk past the end":
        data = bytearray(glb_bytes(doc, blob))
        data[12:16] = (1 << 30).to_bytes(4, "little")
        return bytes(data)
    if change == "not gltf":
        return b"\x00\x01garbage"
    if change == "json garbage":
        return b'{"asset": {"version": "2.0"}, "meshes": 5'
    if change == "json list":
        return b"[1, 2, 3]"
    if change == "version 1":
        doc["asset"]["version"] = "1.0"
    elif change == "huge count":
        doc["accessors"][0]["count"] = 1 << 40
    elif change == "count past view":
        doc["accessors"][0]["count"] = 1000
    elif change == "view past buffer":
        doc["bufferViews"][0]["byteLength"] = 10**9
    elif change == "buffer longer than data":
        doc["buffers"][0]["byteLength"] = 10**6
    elif change == "missing buffer file":
        doc["buffers"][0]["uri"] = "nowhere.bin"
    elif change == "remote buffer":
        doc["buffers"][0]["uri"] = "https://example.com/x.bin"
    elif change == "bad base64":
        doc["buffers"][0]["uri"] = "data:application/octet-stream;base64,@@@@"
    elif change == "bad accessor index":
        doc["meshes"][0]["primitives"][0]["indices"] = 99
    elif change == "negative index":
        doc["meshes"][0]["primitives"][0]["indices"] = -1
    elif change == "index past vertices":
        blob = blob[:36] + np.array([0, 1, 7, 0], np.uint16).tobytes()
    elif change == "bad component type":
        doc["accessors"][0]["componentType"] = 1234
    elif change == "float indices":
        doc["accessors"][1]["componentType"] = 5126
    elif change == "sparse":
        doc["accessors"][0]["sparse"] = {
            "count": 1,
            "indices": {"bufferView": 1, "componentType": 5123},
            "values": {"bufferView": 0},
        }
    elif change == "node cycle":
        doc["nodes"] = [{"children": [1]}, {"children": [0], "mesh": 0}]
    elif change == "bad matrix":
        doc["nodes"][0]["matrix"] = [1, 2, 3]
    elif change == "nan translation":
        doc["nodes"][0]["translation"] = [0, float("nan"), 0]
    elif change == "no position":
        doc["meshes"][0]["primitives"][0]["attributes"] = {}
    elif change == "bad stride":
        doc["bufferViews"][0]["byteStride"] = 6
    elif change == "missing material":
        doc["meshes"][0]["primitives"][0]["material"] = 3
    elif change == "missing image file":
        doc.update(images=[{"uri": "gone.png"}], textures=[{"source": 0}])
        doc["materials"] = [{"pbrMetallicRoughness": {"baseColorTexture": {"index": 0}}}]
    elif change == "bad wrap":
        doc.update(images=[{"bufferView": 1}], textures=[{"source": 0, "sampler": 0}], samplers=[{"wrapS": 7}])
        doc["materials"] = [{"pbrMetallicRoughness": {"baseColorTexture": {"index": 0}}}]
    elif change == "bad alpha mode":
        doc["materials"] = [{"alphaMode": "SOMETIMES"}]
    else:
        raise AssertionError(change)
    return glb_bytes(doc, blob)


HOSTILE = {
    "truncated": "truncated GLB",
    "chunk past the end": "past the file",
    "not gltf": "not a glTF file",
    "json garbage": "not a valid glTF document",
    "json list": "not a glTF object",
    "version 1": "only 2.x",
    "huge count": "accessors[0].count",
    "count past view": "accessors[0]: 1,000 elements need",
    "view past buffer": "bufferViews[0]",
    "buffer longer than data": "buffers[0]: holds",
    "missing buffer file": "nowhere.bin is missing",
    "remote buffer": "only files beside the document",
    "bad base64": "bad base64",
    "bad accessor index": "index 99 is not one of the 2",
    "negative index": "index -1 is not one of the 2",
    "index past vertices": "an index 7 past its 3 vertices",
    "bad component type": "componentType 1234",
    "float indices": "componentType 5126 cannot hold",
    "sparse": "sparse accessors are not supported",
    "node cycle": "not a set of trees",
    "bad matrix": "expected 16 numbers",
    "nan translation": "not a finite number",
    "no position": "no POSITION",
    "bad stride": "byteStride",
    "missing material": "material 3",
    "missing image file": "gone.png is missing",
    "bad wrap": "wrap mode 7",
    "bad alpha mode": "alphaMode 'SOMETIMES'",
}


@pytest.mark.parametrize("change", list(HOSTILE))
def test_hostile_files_are_refused_in_one_line(change: str, tmp_path: Path) -> None:
    data = _mutated(change)
    if change.startswith("json"):
        path = tmp_path / "bad.gltf"
    else:
        path = tmp_path / "bad.glb"
    path.write_bytes(data)
    with pytest.raises(GltfError) as err:
        read_gltf(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(path)), message
    assert HOSTILE[change] in message, message


def test_missing_and_folder_paths_are_one_line(tmp_path: Path) -> None:
    for path, words in ((tmp_path / "none.glb", "no such file"), (tmp_path, "a folder")):
        with pytest.raises(GltfError, match=words):
            read_gltf(path)


def test_a_gltf_json_file_reads_its_external_buffer(tmp_path: Path) -> None:
    doc, blob = triangle_document()
    doc["buffers"][0]["uri"] = "tri%20angle.bin"  # percent-encoded, as URIs are
    (tmp_path / "tri angle.bin").write_bytes(blob)
    (tmp_path / "t.gltf").write_text(json.dumps(doc))
    assert len(read_gltf(tmp_path / "t.gltf").primitives) == 1
