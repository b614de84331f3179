"""Writes the seed corpus under tests/fuzz/corpus/<target>/: valid inputs made by the real writers
(pack writer, codecs, the cache itself), truncated ones and edge cases. Deterministic; run
``python -m tests.fuzz.make_corpus`` from the repository root after a format change. The folders
also hold inputs a long fuzz run found that reach new code (named by their sha1, added with
``python -m tests.fuzz.run one TARGET --merge-from .cache/fuzz/TARGET``); this script leaves them."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np

from texstream.pack import PackHeader, PackWriter, Supercompression
from texstream.pack import codec as codecs
from texstream.pack.format import AddressMode, TexelFormat

from .harness import CACHE_FILE_SEPARATOR, FIX_HEADER, FIX_TABLES, RAW_SIZES, cache_folder_files

CORPUS = Path(__file__).parent / "corpus"


def _pack(header: PackHeader, metadata: dict, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "seed.tpk"
        with PackWriter(path, header, metadata) as w:
            for lv in range(header.level_count):
                tx, ty = header.tiles_in_level(lv)
                for y in range(ty):
                    for x in range(tx):
                        w.add_tile(lv, x, y, rng.integers(0, 4, header.tile_raw_size, dtype=np.uint8).tobytes())
        return path.read_bytes()


def packs() -> dict[str, bytes]:
    small = dict(width=64, height=64, tile_size=64, border=0)
    return {
        "bc1-none": _pack(PackHeader(**small), {"source": "seed"}, 1),
        "bc1-lz4-2levels": _pack(
            PackHeader(width=100, height=40, tile_size=64, border=4, supercompression=Supercompression.LZ4),
            {"source": "seed", "n": [1, 2.5, {"k": "v"}]},
            2,
        ),
        "bc4-zstd-wrap": _pack(
            PackHeader(
                width=130,
                height=70,
                tile_size=64,
                border=0,
                texel_format=TexelFormat.BC4,
                srgb=False,
                address_mode=AddressMode.WRAP,
                supercompression=Supercompression.ZSTD,
                alignment=64,
            ),
            {},
            3,
        ),
        "rgba8-lz4": _pack(
            PackHeader(**small, texel_format=TexelFormat.RGBA8, supercompression=Supercompression.LZ4), {"a": 1}, 4
        ),
    }


def corpus() -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {t: {} for t in ("header", "pack", "metadata", "tile")}
    out.update({t: {} for t in ("content_range", "http", "cache")})
    for name, data in packs().items():
        for control in (0, FIX_HEADER | FIX_TABLES):
            out["pack"][f"{name}-c{control}"] = bytes([control]) + data
        out["header"][name] = bytes([FIX_HEADER]) + data[:128] + b"\0" * 64
        for cut in (0, 64, 127, 128, 200, len(data) // 2, len(data) - 1):
            out["pack"][f"{name}-cut{cut}"] = bytes([FIX_HEADER | FIX_TABLES]) + data[:cut]
    out["header"]["empty"] = b""
    out["header"]["zeros"] = bytes(129)

    meta = out["metadata"]
    meta["object"] = json.dumps({"source": "a.png", "params": {"q": 3, "f": 0.5, "s": [1, 2, None, True]}}).encode()
    meta["unicode"] = json.dumps({"名前": "é\u2028"}, ensure_ascii=False).encode()
    meta["deep"] = b"[" * 70 + b"]" * 70
    meta["escapes"] = b'{"a": "\\"[[[\\\\", "b": 1e308, "c": -0.0}'
    meta["long-number"] = b'{"n": ' + b"9" * 80 + b"}"
    meta["not-utf8"] = b'{"a": "\xff\xfe"}'
    meta["array"] = b"[1, 2, 3]"

    tile = out["tile"]
    rng = np.random.default_rng(5)
    for size_i in (0, 1, 2):
        raw = rng.integers(0, 4, RAW_SIZES[size_i], dtype=np.uint8).tobytes()
        for mode in Supercompression:
            tile[f"{mode.name.lower()}-{RAW_SIZES[size_i]}"] = bytes([int(mode), size_i]) + codecs.compress(raw, mode)
    tile["zstd-no-size"] = bytes([1, 1]) + bytes.fromhex("28b52ffd0000") + b"\0" * 8

    cr = out["content_range"]
    for name, (text, length) in {
        "ok": ("bytes 0-127/4096", "128"),
        "no-length": ("bytes 100-199/200", "\xff"),
        "mismatch": ("bytes 0-9/10", "11"),
        "star": ("bytes */4096", "0"),
        "backwards": ("bytes 9-0/10", "10"),
    }.items():
        cr[name] = text.encode("latin-1") + b"\0" + length.encode("latin-1")

    http = out["http"]

    def answer(status_i: int, flags: int, start_q: int, length_q: int, *parts: bytes) -> bytes:
        return bytes([status_i, flags, start_q, length_q]) + b"\0".join(parts)

    # probe of 0..3 (length 1 + 1*3 = 4): a 206 with the right range, a 200 of a short file
    http["probe-206"] = answer(0, 0, 0, 1, b"bytes 0-3/100", b"4", b'"v1"', b"Tue, 01 Dec 2026", b"abcd")
    http["probe-200"] = answer(1, 0, 0, 1, b"\xff", b"3", b"\xff", b"\xff", b"abc")
    # fetch of 7..10 from a 12-byte version with an ETag (flags: fetch, etag, size extra 1)
    http["fetch-206"] = answer(0, 3, 1, 1, b"bytes 7-10/12", b"4", b'"v1"', b"\xff", b"wxyz")
    http["fetch-short-body"] = answer(0, 3, 1, 1, b"bytes 7-10/12", b"\xff", b'"v1"', b"\xff", b"wx")
    http["fetch-412"] = answer(3, 3, 1, 1, b"\xff", b"0", b'"v2"', b"\xff", b"")
    http["fetch-503"] = answer(8, 1, 1, 1, b"\xff", b"\xff", b"\xff", b"\xff", b"busy")

    with tempfile.TemporaryDirectory() as tmp:
        from texstream.remote.cache import BlockCache

        from .harness import CACHE_BLOCK, CACHE_CAPACITY

        folder = Path(tmp) / "c"
        cache = BlockCache(folder, CACHE_CAPACITY, CACHE_BLOCK)
        pack_id, url_id = cache.pack_ids("http://127.0.0.1:9/pack.tpk", "1\0\0")
        cache.adopt(pack_id, url_id, 3)
        cache.adopt(3, 5, 2)
        cache.put(pack_id, url_id, 0, b"a" * 50)
        cache.put(pack_id, url_id, 2, b"b" * CACHE_BLOCK)
        cache.put(3, 5, 1, b"c" * 10)
        cache.close()
        files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != "lock")
        contents = [(folder / n).read_bytes() for n in files]
        # Trailing zeros of the (sparse) block file say nothing: keep the seeds small.
        trimmed = [c.rstrip(b"\0") if len(c) > 1024 else c for c in contents]
        out["cache"]["filled"] = CACHE_FILE_SEPARATOR.join(trimmed)
        out["cache"]["geometry-only"] = CACHE_FILE_SEPARATOR.join(c if len(c) < 1024 else b"\xff" for c in contents)
        assert cache_folder_files(out["cache"]["filled"]).keys() <= set(files)
    out["cache"]["empty"] = b""

    from tests.assets.hdr_files import hdr_bytes, sky

    hdr = out["hdr"] = {}
    picture = sky(24, 6)  # run-length encoded (width 8..32767), and flat
    hdr["rle"] = hdr_bytes(picture)
    hdr["flat"] = hdr_bytes(picture, rle=False)
    hdr["narrow-flat"] = hdr_bytes(picture[:, :5])
    hdr["bottom-up-mirrored"] = hdr_bytes(picture, resolution="+Y 6 -X 24", header="EXPOSURE=2.0")
    hdr["rle-cut"] = hdr["rle"][: len(hdr["rle"]) * 2 // 3]
    hdr["header-only"] = b"#?RGBE\nFORMAT=32-bit_rle_rgbe\n\n-Y 1 +X 1\n"
    # Runs that would write past the last scanline's end (a decoder that trusts counts overflows its
    # output here): a repeat of 127 and a literal of 100 in an 8-texel row.
    one_row = b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y 1 +X 8\n\x02\x02\x00\x08"
    hdr["repeat-past-end"] = one_row + b"\xff\x05" + bytes(16)  # long enough to pass the size check
    hdr["literal-past-end"] = one_row + b"\x64" + bytes(range(100))
    out["gltf"] = gltf_seeds()
    return out


def gltf_seeds() -> dict[str, bytes]:
    """A triangle as GLB and as .gltf with a data-URI buffer; one with every attribute, a textured
    material, a sampler and a node hierarchy; and a truncated GLB."""
    import base64

    from tests.scene.files import glb_bytes, triangle_document

    doc, blob = triangle_document()
    tri = glb_bytes(doc, blob)
    uri = {**doc, "buffers": [{"byteLength": 44, "uri": "data:application/octet-stream;base64,"}]}
    uri["buffers"][0]["uri"] += base64.b64encode(blob).decode()
    png = bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d4944415478da63f8cfc0f01f0005000201e2d4d5f60000000049454e44ae426082"
    )
    extra = np.array([[0, 0, 1]] * 3, np.float32).tobytes() + np.array([[0, 0], [1, 0], [0, 1]], np.float32).tobytes()
    extra += np.array([[1, 0, 0, 1]] * 3, np.float32).tobytes()
    full_blob = blob + extra + png
    n0 = len(blob)
    full = {
        **doc,
        "nodes": [
            {"children": [1], "translation": [1, 2, 3]},
            {"mesh": 0, "rotation": [0, 0, 0, 1], "scale": [2, 2, 2]},
        ],
        "meshes": [
            {
                "primitives": [
                    {
                        "attributes": {"POSITION": 0, "NORMAL": 2, "TEXCOORD_0": 3, "TANGENT": 4},
                        "indices": 1,
                        "material": 0,
                    }
                ]
            }
        ],
        "accessors": [
            *doc["accessors"],
            {"bufferView": 2, "componentType": 5126, "count": 3, "type": "VEC3"},
            {"bufferView": 3, "componentType": 5126, "count": 3, "type": "VEC2"},
            {"bufferView": 4, "componentType": 5126, "count": 3, "type": "VEC4"},
        ],
        "bufferViews": [
            *doc["bufferViews"],
            {"buffer": 0, "byteOffset": n0, "byteLength": 36},
            {"buffer": 0, "byteOffset": n0 + 36, "byteLength": 24},
            {"buffer": 0, "byteOffset": n0 + 60, "byteLength": 48},
            {"buffer": 0, "byteOffset": n0 + 108, "byteLength": len(png)},
        ],
        "buffers": [{"byteLength": len(full_blob)}],
        "images": [{"bufferView": 5, "mimeType": "image/png"}],
        "samplers": [{"wrapS": 33071, "wrapT": 33648}],
        "textures": [{"source": 0, "sampler": 0}],
        "materials": [
            {
                "pbrMetallicRoughness": {"baseColorTexture": {"index": 0}, "metallicRoughnessTexture": {"index": 0}},
                "normalTexture": {"index": 0, "scale": 0.5},
                "occlusionTexture": {"index": 0},
                "emissiveTexture": {"index": 0},
                "alphaMode": "MASK",
                "doubleSided": True,
            }
        ],
    }
    return {
        "triangle-glb": tri,
        "triangle-gltf": json.dumps(uri).encode(),
        "full-glb": glb_bytes(full, full_blob),
        "truncated-glb": tri[:40],
    }


def main() -> None:
    for target, inputs in corpus().items():
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in inputs.items():
            for old in folder.glob(f"{name}-????????"):  # this seed's earlier version (the fuzzer's own
                old.unlink()  # additions, named by their sha1, stay)
            digest = hashlib.sha1(data).hexdigest()[:8]
            (folder / f"{name}-{digest}").write_bytes(data)
    total = sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file())
    print(f"seed corpus: {sum(len(v) for v in corpus().values())} inputs, {total:,} bytes under {CORPUS}")


if __name__ == "__main__":
    main()
