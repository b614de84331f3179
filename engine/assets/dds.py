"""DDS reader: the legacy FourCC header (DXT1, DXT5, ATI1/BC4U, ATI2/BC5U) and the DX10 extension
(BC1/BC3/BC4/BC5/BC7, UNORM and _SRGB; BC6H_UF16, unsigned half-float HDR), 2D textures with any number of mip levels.

Layout: "DDS " magic, a 124-byte DDS_HEADER (its pixel format at byte 72 of the header), then for a
FourCC of "DX10" a 20-byte DDS_HEADER_DXT10, then level 0's blocks followed by each smaller level's.
Cube maps, volumes, texture arrays, uncompressed and other block formats are refused in one line.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ..errors import SourceError
from ..pack.format import TexelFormat
from .blocks import (
    REENCODE_ADVICE,
    BlockLevel,
    BlockTexture,
    as_blocks,
    check_level_count,
    check_size,
    floor_dims,
    level_bytes,
    open_regular,
    read_exact,
)

MAGIC = b"DDS "
HEADER = struct.Struct("<7I44x8I4I4x")  # size, flags, height, width, pitch, depth, mips; pixel format; caps
DX10 = struct.Struct("<5I")  # dxgi format, resource dimension, misc flag, array size, misc flags 2
assert HEADER.size == 124 and DX10.size == 20

DDSD_MIPMAPCOUNT = 0x20000
DDSD_DEPTH = 0x800000
DDPF_FOURCC = 0x4
DDSCAPS2_CUBEMAP = 0x200
DDSCAPS2_VOLUME = 0x200000
DX10_TEXTURE2D = 3
DX10_MISC_CUBE = 0x4


def _fourcc(text: str) -> int:
    return int.from_bytes(text.encode("ascii"), "little")


# Legacy FourCCs: block format; sRGB is not recorded (None).
LEGACY: dict[int, tuple[str, TexelFormat]] = {
    _fourcc("DXT1"): ("DXT1", TexelFormat.BC1),
    _fourcc("DXT5"): ("DXT5", TexelFormat.BC3),
    _fourcc("ATI1"): ("ATI1", TexelFormat.BC4),
    _fourcc("BC4U"): ("BC4U", TexelFormat.BC4),
    _fourcc("ATI2"): ("ATI2", TexelFormat.BC5),
    _fourcc("BC5U"): ("BC5U", TexelFormat.BC5),
}
LEGACY_REFUSED: dict[int, str] = {
    _fourcc("DXT2"): "DXT2 (BC2, premultiplied)",
    _fourcc("DXT3"): "DXT3 (BC2)",
    _fourcc("DXT4"): "DXT4 (BC3, premultiplied)",
    _fourcc("BC4S"): "BC4S (signed BC4)",
    _fourcc("BC5S"): "BC5S (signed BC5)",
    _fourcc("ETC1"): "ETC1",
    _fourcc("ETC2"): "ETC2",
}

# DXGI_FORMAT codes: name, block format, sRGB. Typeless formats read as UNORM.
DXGI: dict[int, tuple[str, TexelFormat, bool]] = {
    70: ("BC1_TYPELESS", TexelFormat.BC1, False),
    71: ("BC1_UNORM", TexelFormat.BC1, False),
    72: ("BC1_UNORM_SRGB", TexelFormat.BC1, True),
    76: ("BC3_TYPELESS", TexelFormat.BC3, False),
    77: ("BC3_UNORM", TexelFormat.BC3, False),
    78: ("BC3_UNORM_SRGB", TexelFormat.BC3, True),
    79: ("BC4_TYPELESS", TexelFormat.BC4, False),
    80: ("BC4_UNORM", TexelFormat.BC4, False),
    82: ("BC5_TYPELESS", TexelFormat.BC5, False),
    83: ("BC5_UNORM", TexelFormat.BC5, False),
    97: ("BC7_TYPELESS", TexelFormat.BC7, False),
    98: ("BC7_UNORM", TexelFormat.BC7, False),
    99: ("BC7_UNORM_SRGB", TexelFormat.BC7, True),
    95: ("BC6H_UF16", TexelFormat.BC6H, False),
}
DXGI_REFUSED: dict[int, str] = {
    73: "BC2_UNORM",
    74: "BC2_UNORM_SRGB",
    75: "BC2_TYPELESS",
    81: "BC4_SNORM",
    84: "BC5_SNORM",
    # BC6H typeless does not say whether its half floats are signed, and packs hold unsigned BC6H only.
    94: "BC6H_TYPELESS (signed or unsigned is not recorded)",
    96: "BC6H_SF16 (signed half floats; packs hold unsigned BC6H_UF16)",
}


def read_dds(path: str | Path) -> BlockTexture:
    """Parse a DDS file; SourceError (one line naming the file) for anything malformed or unsupported."""
    path = Path(path)
    f, file_size = open_regular(path)
    with f:
        if file_size < 4 + HEADER.size:
            raise SourceError(f"{path}: not a DDS file (only {file_size} bytes, a header is 128)")
        head = read_exact(f, path, 0, 4 + HEADER.size, "header")
        if head[:4] != MAGIC:
            raise SourceError(f"{path}: not a DDS file (no 'DDS ' magic)")
        fields = HEADER.unpack(head[4:])
        size, flags, height, width, _pitch, depth, mips = fields[:7]
        pf_size, pf_flags, fourcc = fields[7:10]
        caps2 = fields[16]
        if size != 124 or pf_size != 32:
            raise SourceError(f"{path}: malformed DDS header (header size {size}, pixel format size {pf_size})")
        if caps2 & DDSCAPS2_CUBEMAP:
            raise SourceError(f"{path}: cube maps are not supported; {REENCODE_ADVICE}")
        if caps2 & DDSCAPS2_VOLUME or (flags & DDSD_DEPTH and depth > 1):
            raise SourceError(f"{path}: volume textures are not supported")
        if not pf_flags & DDPF_FOURCC:
            raise SourceError(f"{path}: uncompressed DDS cannot be re-tiled without encoding; {REENCODE_ADVICE}")
        offset = 4 + HEADER.size
        srgb: bool | None
        if fourcc == _fourcc("DX10"):
            if file_size < offset + DX10.size:
                raise SourceError(f"{path}: DX10 header is truncated")
            dxgi, dimension, misc, array_size, _misc2 = DX10.unpack(
                read_exact(f, path, offset, DX10.size, "DX10 header")
            )
            offset += DX10.size
            if dxgi in DXGI_REFUSED:
                raise SourceError(f"{path}: {DXGI_REFUSED[dxgi]} has no pack format; {REENCODE_ADVICE}")
            if dxgi not in DXGI:
                raise SourceError(f"{path}: DXGI format {dxgi} is not BC1/BC3/BC4/BC5/BC6H/BC7; {REENCODE_ADVICE}")
            if dimension != DX10_TEXTURE2D:
                raise SourceError(f"{path}: resource dimension {dimension} is not a 2D texture")
            if misc & DX10_MISC_CUBE:
                raise SourceError(f"{path}: cube maps are not supported; {REENCODE_ADVICE}")
            if array_size > 1:  # 0 is what some writers (Pillow) put for a single texture
                raise SourceError(f"{path}: texture arrays ({array_size} layers) are not supported")
            name, fmt, srgb = DXGI[dxgi]
        elif fourcc in LEGACY:
            (name, fmt), srgb = LEGACY[fourcc], None
        elif fourcc in LEGACY_REFUSED:
            raise SourceError(f"{path}: {LEGACY_REFUSED[fourcc]} has no pack format; {REENCODE_ADVICE}")
        else:
            code = fourcc.to_bytes(4, "little")
            shown = code.decode("ascii") if code.isascii() and code.decode("ascii").isprintable() else str(fourcc)
            raise SourceError(f"{path}: FourCC {shown!r} is not a block format texstream re-tiles; {REENCODE_ADVICE}")
        check_size(path, width, height)
        count = mips if flags & DDSD_MIPMAPCOUNT and mips > 0 else 1
        check_level_count(path, count, width, height)
        dims = [floor_dims(width, height, lv) for lv in range(count)]
        sizes = [level_bytes(w, h, fmt) for w, h in dims]
        needed = offset + sum(sizes)
        if needed > file_size:  # checked before anything is allocated
            raise SourceError(
                f"{path}: truncated: {count} levels of {name} at {width} x {height} need {needed:,} bytes, "
                f"the file has {file_size:,}"
            )
        levels = []
        for (w, h), n in zip(dims, sizes, strict=True):
            levels.append(BlockLevel(w, h, as_blocks(read_exact(f, path, offset, n, "level data"), w, h, fmt)))
            offset += n
    return BlockTexture(path=path, container="dds", format_name=name, texel_format=fmt, srgb=srgb, levels=tuple(levels))
