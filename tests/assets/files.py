"""Test files: DDS and KTX2 of blocks encoded by etcpak (not the baker's encoder; BC6H, which etcpak
does not encode, by ispc-texcomp's "slow" profile called directly, where the baker uses "fast"),
written by small test-only writers that follow the containers' documentation, not texstream's reader.

Mip levels use floor halving (what both containers define) and are made by plain 2x2 averaging of
the previous level, so they differ from what the baker's filter would make.
"""

from __future__ import annotations

import struct
from pathlib import Path

import etcpak
import numpy as np
import texture2ddecoder
import zstandard

from texstream.pack.format import TexelFormat

BLOCK_BYTES = {
    TexelFormat.BC1: 8,
    TexelFormat.BC3: 16,
    TexelFormat.BC4: 8,
    TexelFormat.BC5: 16,
    TexelFormat.BC7: 16,
    TexelFormat.BC6H: 16,
}


def picture(width: int, height: int, seed: int = 0, alpha: bool = False) -> np.ndarray:
    """Smooth colour with noise (and varying alpha when asked): (h, w, 4) uint8."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 0.5 + 0.5 * np.sin(x / 61.0 + seed)
    g = 0.5 + 0.5 * np.cos(y / 47.0)
    b = 0.5 + 0.5 * np.sin((x + y) / 83.0)
    a = 0.5 + 0.5 * np.cos(x / 67.0 - y / 53.0) if alpha else np.ones_like(x)
    img = np.stack([r, g, b, a], -1) * 255 + rng.normal(0, 2, (height, width, 4)) * np.array([1, 1, 1, alpha])
    return np.ascontiguousarray(np.clip(img, 0, 255).astype(np.uint8))


def hdr_picture(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Smooth high dynamic range colour, mostly in [0, 1] with highlights up to ~6: (h, w, 4) float32, alpha 1."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 0.5 + 0.45 * np.sin(x / 29.0 + seed)
    g = 0.5 + 0.45 * np.cos(y / 23.0)
    b = 0.4 + 0.35 * np.sin((x + y) / 41.0)
    spot = 5.0 * np.exp(-(((x - width * 0.3) / 9.0) ** 2 + ((y - height * 0.6) / 7.0) ** 2))
    img = np.stack([r + spot, g + 0.5 * spot, b, np.ones_like(x)], -1) + rng.normal(0, 0.01, (height, width, 4))
    img[..., 3] = 1.0
    return np.ascontiguousarray(np.maximum(img, 0.0).astype(np.float32))


def encode_blocks(fmt: TexelFormat, img: np.ndarray) -> np.ndarray:
    """etcpak blocks of `img` padded to whole blocks by repeating its last row and column:
    (ceil(h/4), ceil(w/4), block bytes). BC6H: float texels, ispc-texcomp's slow profile."""
    h, w = img.shape[:2]
    hp, wp = -(-h // 4) * 4, -(-w // 4) * 4
    padded = np.ascontiguousarray(np.pad(img, ((0, hp - h), (0, wp - w), (0, 0)), mode="edge"))
    if fmt is TexelFormat.BC6H:
        import ispc_texcomp

        half = np.ascontiguousarray(padded.astype(np.float16))
        surface = ispc_texcomp.RGBASurface(half, wp, hp, wp * 8)
        data = ispc_texcomp.compress_blocks_bc6h(surface, ispc_texcomp.BC6HEncSettings.from_profile("slow"))
    elif fmt is TexelFormat.BC7:
        data = etcpak.compress_bc7(padded, wp, hp, None)
    else:
        fn = {
            TexelFormat.BC1: etcpak.compress_bc1,
            TexelFormat.BC3: etcpak.compress_bc3,
            TexelFormat.BC4: etcpak.compress_bc4,
            TexelFormat.BC5: etcpak.compress_bc5,
        }[fmt]
        data = fn(padded, wp, hp)
    return np.frombuffer(bytes(data), np.uint8).reshape(hp // 4, wp // 4, BLOCK_BYTES[fmt])


def decode_blocks(fmt: TexelFormat, blocks: np.ndarray, width: int, height: int) -> np.ndarray:
    """texture2ddecoder's RGBA texels of a level's blocks, cut to its true size (BC6H: its 8-bit
    texels, each channel clamped to [0, 1] and scaled by 255, alpha 255)."""
    rows, cols = blocks.shape[:2]
    fn = {
        TexelFormat.BC6H: texture2ddecoder.decode_bc6,
        TexelFormat.BC1: texture2ddecoder.decode_bc1,
        TexelFormat.BC3: texture2ddecoder.decode_bc3,
        TexelFormat.BC4: texture2ddecoder.decode_bc4,
        TexelFormat.BC5: texture2ddecoder.decode_bc5,
        TexelFormat.BC7: texture2ddecoder.decode_bc7,
    }[fmt]
    bgra = np.frombuffer(fn(np.ascontiguousarray(blocks).tobytes(), 4 * cols, 4 * rows), np.uint8)
    return bgra.reshape(4 * rows, 4 * cols, 4)[:height, :width][..., [2, 1, 0, 3]]


def mip_chain(img: np.ndarray, count: int) -> list[np.ndarray]:
    """`count` levels, floor halving, 2x2 means (the odd last row/column dropped); float images in float."""
    levels = [img]
    for _ in range(count - 1):
        if img.dtype == np.float32:
            prev = levels[-1]
            h, w = max(1, prev.shape[0] // 2), max(1, prev.shape[1] // 2)
            p = np.repeat(prev, 2, 0) if prev.shape[0] == 1 else prev
            p = np.repeat(p, 2, 1) if p.shape[1] == 1 else p
            p = p[: 2 * h, : 2 * w]
            levels.append(np.ascontiguousarray((p[0::2, 0::2] + p[1::2, 0::2] + p[0::2, 1::2] + p[1::2, 1::2]) / 4))
            continue
        prev = levels[-1].astype(np.uint16)
        h, w = max(1, prev.shape[0] // 2), max(1, prev.shape[1] // 2)
        if prev.shape[0] == 1:
            prev = np.concatenate([prev, prev])
        if prev.shape[1] == 1:
            prev = np.concatenate([prev, prev], axis=1)
        p = prev[: 2 * h, : 2 * w]
        levels.append(((p[0::2, 0::2] + p[1::2, 0::2] + p[0::2, 1::2] + p[1::2, 1::2] + 2) // 4).astype(np.uint8))
    return levels


def block_levels(fmt: TexelFormat, img: np.ndarray, count: int) -> list[np.ndarray]:
    return [encode_blocks(fmt, lv) for lv in mip_chain(img, count)]


# ---- DDS (Microsoft's DDS_HEADER / DDS_HEADER_DXT10 documentation) ------------------------------------
DXGI_CODES = {
    (TexelFormat.BC1, False): 71,
    (TexelFormat.BC1, True): 72,
    (TexelFormat.BC3, False): 77,
    (TexelFormat.BC3, True): 78,
    (TexelFormat.BC4, False): 80,
    (TexelFormat.BC5, False): 83,
    (TexelFormat.BC7, False): 98,
    (TexelFormat.BC7, True): 99,
    (TexelFormat.BC6H, False): 95,  # DXGI_FORMAT_BC6H_UF16
}
LEGACY_FOURCC = {TexelFormat.BC1: b"DXT1", TexelFormat.BC3: b"DXT5", TexelFormat.BC4: b"ATI1", TexelFormat.BC5: b"ATI2"}


def dds_bytes(
    fmt: TexelFormat,
    width: int,
    height: int,
    levels: list[np.ndarray],
    *,
    srgb: bool = False,
    legacy: bool = False,
    fourcc: bytes | None = None,
    dxgi: int | None = None,
    caps2: int = 0,
    array_size: int = 1,
    mip_count: int | None = None,
) -> bytes:
    flags = 0x1 | 0x2 | 0x4 | 0x1000 | 0x80000 | 0x20000  # caps, height, width, pixelformat, linearsize, mipmapcount
    count = len(levels) if mip_count is None else mip_count
    pf_fourcc = fourcc if fourcc is not None else (LEGACY_FOURCC[fmt] if legacy else b"DX10")
    header = struct.pack("<7I", 124, flags, height, width, levels[0].nbytes if levels else 0, 0, count)
    header += b"\0" * 44
    header += struct.pack("<2I4s5I", 32, 0x4, pf_fourcc, 0, 0, 0, 0, 0)
    header += struct.pack("<4I4x", 0x1000 | 0x400008, caps2, 0, 0)
    assert len(header) == 124
    ext = b""
    if pf_fourcc == b"DX10":
        ext = struct.pack("<5I", DXGI_CODES[(fmt, srgb)] if dxgi is None else dxgi, 3, 0, array_size, 0)
    return b"DDS " + header + ext + b"".join(np.ascontiguousarray(b).tobytes() for b in levels)


def write_dds(path: Path, fmt: TexelFormat, width: int, height: int, levels: list[np.ndarray], **kw: object) -> Path:
    path.write_bytes(dds_bytes(fmt, width, height, levels, **kw))
    return path


# ---- KTX2 (Khronos KTX 2.0 specification, sections 3.1-3.12) ---------------------------------------------
KTX2_ID = bytes([0xAB, 0x4B, 0x54, 0x58, 0x20, 0x32, 0x30, 0xBB, 0x0D, 0x0A, 0x1A, 0x0A])
VK_CODES = {
    (TexelFormat.BC1, False): 131,
    (TexelFormat.BC1, True): 132,
    (TexelFormat.BC3, False): 137,
    (TexelFormat.BC3, True): 138,
    (TexelFormat.BC4, False): 139,
    (TexelFormat.BC5, False): 141,
    (TexelFormat.BC7, False): 145,
    (TexelFormat.BC7, True): 146,
    (TexelFormat.BC6H, False): 143,  # VK_FORMAT_BC6H_UFLOAT_BLOCK
}


def ktx2_file_bytes(
    fmt: TexelFormat,
    width: int,
    height: int,
    levels: list[np.ndarray],
    *,
    srgb: bool = False,
    zstd: bool = False,
    vk_format: int | None = None,
    scheme: int | None = None,
    dfd_model: int = 128,
    faces: int = 1,
    level_count: int | None = None,
) -> bytes:
    """A minimal KTX2: header, index, level index, a basic DFD with no samples, no key/value data."""
    count = len(levels) if level_count is None else level_count
    raw = [np.ascontiguousarray(b).tobytes() for b in levels]
    stored = [zstandard.ZstdCompressor(level=3).compress(r) for r in raw] if zstd else raw
    dfd_block = struct.pack("<IHH8B8B", 0, 2, 24, dfd_model, 1, 2 if srgb else 1, 0, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    dfd = struct.pack("<I", 4 + len(dfd_block)) + dfd_block
    dfd_offset = 80 + 24 * len(levels)
    pos = dfd_offset + len(dfd)
    body = b""
    offsets = [0] * len(levels)
    for lv in reversed(range(len(levels))):  # smallest level first, 16-byte aligned (a multiple of any lcm)
        pad = -pos % 16
        body += b"\0" * pad
        pos += pad
        offsets[lv] = pos
        body += stored[lv]
        pos += len(stored[lv])
    head = KTX2_ID + struct.pack(
        "<9I",
        VK_CODES[(fmt, srgb)] if vk_format is None else vk_format,
        1,
        width,
        height,
        0,
        0,
        faces,
        count,
        (2 if zstd else 0) if scheme is None else scheme,
    )
    head += struct.pack("<4I2Q", dfd_offset, len(dfd), 0, 0, 0, 0)
    index = b"".join(struct.pack("<3Q", offsets[i], len(stored[i]), len(raw[i])) for i in range(len(levels)))
    return head + index + dfd + body


def write_ktx2(path: Path, fmt: TexelFormat, width: int, height: int, levels: list[np.ndarray], **kw: object) -> Path:
    path.write_bytes(ktx2_file_bytes(fmt, width, height, levels, **kw))
    return path
