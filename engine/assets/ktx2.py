"""KTX 2.0 reader and writer for BC1/BC3/BC4/BC5/BC7 (UNORM and sRGB) and BC6H (unsigned float) 2D textures.

Layout (KTX 2.0 specification): a 12-byte identifier, nine u32 header fields (vkFormat, typeSize,
pixelWidth, pixelHeight, pixelDepth, layerCount, faceCount, levelCount, supercompressionScheme), the
index (dfdByteOffset/Length u32, kvdByteOffset/Length u32, sgdByteOffset/Length u64), the level index
(levelCount entries of byteOffset, byteLength, uncompressedByteLength, u64 each, level 0 first), the
data format descriptor, key/value data, supercompression global data, then the levels' data, smallest
level first. Level ``l`` is ``max(1, w >> l) x max(1, h >> l)`` texels.

The reader takes supercompression none, Zstandard or zlib (each level decompressed with its output
bounded by the size the level must have). Basis Universal (BasisLZ/ETC1S, UASTC), ASTC, ETC, PVRTC
and uncompressed formats are refused in one line saying what to do instead.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path
from typing import BinaryIO

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

IDENTIFIER = b"\xabKTX 20\xbb\r\n\x1a\n"
HEADER = struct.Struct("<12s9I4I2Q")  # identifier, header, index
LEVEL = struct.Struct("<3Q")
assert HEADER.size == 80 and LEVEL.size == 24

INFLATE_STEP = 1 << 26  # decompress 64 MiB at a time
# Supercompressed levels may inflate far beyond the file's size (a solid colour compresses ~10^4:1),
# so their total is capped: 4 GiB of blocks is a 65536^2 BC7 level 0.
MAX_INFLATED_BYTES = 1 << 32
SUPERCOMPRESSION_NONE, SUPERCOMPRESSION_BASISLZ, SUPERCOMPRESSION_ZSTD, SUPERCOMPRESSION_ZLIB = 0, 1, 2, 3

# VkFormat -> (name, pack format, sRGB)
VK_FORMATS: dict[int, tuple[str, TexelFormat, bool]] = {
    131: ("BC1_RGB_UNORM_BLOCK", TexelFormat.BC1, False),
    132: ("BC1_RGB_SRGB_BLOCK", TexelFormat.BC1, True),
    133: ("BC1_RGBA_UNORM_BLOCK", TexelFormat.BC1, False),
    134: ("BC1_RGBA_SRGB_BLOCK", TexelFormat.BC1, True),
    137: ("BC3_UNORM_BLOCK", TexelFormat.BC3, False),
    138: ("BC3_SRGB_BLOCK", TexelFormat.BC3, True),
    139: ("BC4_UNORM_BLOCK", TexelFormat.BC4, False),
    141: ("BC5_UNORM_BLOCK", TexelFormat.BC5, False),
    145: ("BC7_UNORM_BLOCK", TexelFormat.BC7, False),
    146: ("BC7_SRGB_BLOCK", TexelFormat.BC7, True),
    143: ("BC6H_UFLOAT_BLOCK", TexelFormat.BC6H, False),
}
# What the writer uses for each pack format: BC1 with its 1-bit alpha (the decoders' view of the blocks).
VK_FOR_PACK: dict[tuple[TexelFormat, bool], int] = {
    (TexelFormat.BC1, False): 133,
    (TexelFormat.BC1, True): 134,
    (TexelFormat.BC3, False): 137,
    (TexelFormat.BC3, True): 138,
    (TexelFormat.BC4, False): 139,
    (TexelFormat.BC5, False): 141,
    (TexelFormat.BC7, False): 145,
    (TexelFormat.BC7, True): 146,
    (TexelFormat.BC6H, False): 143,
}

# Data format descriptor: Khronos basic descriptor block, colour models and channel ids per format.
DF_MODEL = {
    TexelFormat.BC1: 128,
    TexelFormat.BC3: 130,
    TexelFormat.BC4: 131,
    TexelFormat.BC5: 132,
    TexelFormat.BC7: 134,
    TexelFormat.BC6H: 133,  # KHR_DF_MODEL_BC6H
}
DF_MODEL_ETC1S, DF_MODEL_UASTC = 163, 166
DF_PRIMARIES_BT709 = 1
DF_TRANSFER_LINEAR, DF_TRANSFER_SRGB = 1, 2
DF_SAMPLE_LINEAR = 0x10  # channel qualifier: this sample is linear even when the transfer is sRGB
DF_SAMPLE_FLOAT = 0x80  # channel qualifier: the sample's values are floating point
# A float sample's sampleLower/sampleUpper hold IEEE 754 single-precision bit patterns (Khronos Data
# Format specification): 0.0 and 1.0 for unsigned BC6H, what the Khronos format tables give it.
FLOAT_ZERO, FLOAT_ONE = 0x00000000, 0x3F800000
# per format: (bit offset, bit length, channel id, is alpha) for each sample
DF_SAMPLES = {
    TexelFormat.BC1: [(0, 64, 15, True)],  # BC1A alpha channel: RGBA BC1
    TexelFormat.BC3: [(0, 64, 15, True), (64, 64, 0, False)],  # alpha block, then colour block
    TexelFormat.BC4: [(0, 64, 0, False)],
    TexelFormat.BC5: [(0, 64, 0, False), (64, 64, 1, False)],  # red block, then green block
    TexelFormat.BC7: [(0, 128, 0, False)],
    TexelFormat.BC6H: [(0, 128, 0, False)],  # one float sample over the whole block (unsigned: no SIGNED bit)
}


def _refusal(vk: int) -> str | None:
    """A one-line reason for a VkFormat that is not one of ours (None: unknown)."""
    if 147 <= vk <= 152:
        return f"ETC2 (vkFormat {vk})"
    if 153 <= vk <= 156:
        return f"EAC (vkFormat {vk})"
    if 157 <= vk <= 184 or 1000066000 <= vk <= 1000066013:
        return f"ASTC (vkFormat {vk})"
    if 1000054000 <= vk <= 1000054007:
        return f"PVRTC (vkFormat {vk})"
    if vk in (135, 136):
        return f"BC2 (vkFormat {vk})"
    if vk in (140, 142):
        return f"signed BC4/BC5 (vkFormat {vk})"
    if vk == 144:
        return f"signed BC6H (BC6H_SFLOAT_BLOCK, vkFormat {vk}; packs hold unsigned BC6H)"
    if 1 <= vk <= 130:
        return f"uncompressed (vkFormat {vk})"
    return None


def read_ktx2(path: str | Path) -> BlockTexture:
    """Parse a KTX2 file; SourceError (one line naming the file) for anything malformed or unsupported."""
    path = Path(path)
    f, file_size = open_regular(path)
    with f:
        if file_size < HEADER.size:
            raise SourceError(f"{path}: not a KTX2 file (only {file_size} bytes, a header is {HEADER.size})")
        fields = HEADER.unpack(read_exact(f, path, 0, HEADER.size, "header"))
        ident, vk, _type_size, width, height, depth, layers, faces, count, scheme = fields[:10]
        dfd_offset, dfd_length = fields[10], fields[11]
        if ident != IDENTIFIER:
            raise SourceError(f"{path}: not a KTX2 file (bad identifier)")
        if scheme == SUPERCOMPRESSION_BASISLZ:
            raise SourceError(
                f"{path}: Basis Universal (BasisLZ/ETC1S) cannot be re-tiled losslessly; {REENCODE_ADVICE}"
            )
        if scheme not in (SUPERCOMPRESSION_NONE, SUPERCOMPRESSION_ZSTD, SUPERCOMPRESSION_ZLIB):
            raise SourceError(f"{path}: unknown supercompression scheme {scheme}")
        if vk == 0:  # VK_FORMAT_UNDEFINED: the DFD says what the blocks are (UASTC, ETC1S, ...)
            model = _dfd_model(f, path, file_size, dfd_offset, dfd_length)
            what = {DF_MODEL_UASTC: "Basis Universal UASTC", DF_MODEL_ETC1S: "Basis Universal ETC1S"}.get(
                model, f"vkFormat 0 with colour model {model}"
            )
            raise SourceError(f"{path}: {what} cannot be re-tiled losslessly; {REENCODE_ADVICE}")
        if vk not in VK_FORMATS:
            why = _refusal(vk)
            if why is None:
                raise SourceError(f"{path}: unknown vkFormat {vk}")
            raise SourceError(f"{path}: {why} cannot be re-tiled into a pack losslessly; {REENCODE_ADVICE}")
        name, fmt, srgb = VK_FORMATS[vk]
        if height == 0:
            raise SourceError(f"{path}: 1D textures are not supported")
        if depth > 1:
            raise SourceError(f"{path}: 3D textures are not supported")
        if layers > 1:
            raise SourceError(f"{path}: texture arrays ({layers} layers) are not supported")
        if faces != 1:
            raise SourceError(f"{path}: cube maps ({faces} faces) are not supported; {REENCODE_ADVICE}")
        check_size(path, width, height)
        count = max(1, count)  # 0: one level, the reader is asked to make the rest
        check_level_count(path, count, width, height)
        if HEADER.size + count * LEVEL.size > file_size:
            raise SourceError(f"{path}: truncated: the level index of {count} levels does not fit in the file")
        index = read_exact(f, path, HEADER.size, count * LEVEL.size, "level index")
        if scheme != SUPERCOMPRESSION_NONE:
            total = sum(level_bytes(*floor_dims(width, height, lv), fmt) for lv in range(count))
            if total > MAX_INFLATED_BYTES:
                raise SourceError(
                    f"{path}: {count} supercompressed levels of {width} x {height} {name} would inflate to "
                    f"{total:,} bytes, over the {MAX_INFLATED_BYTES:,}-byte limit"
                )
        levels = []
        for lv in range(count):
            offset, length, raw_length = LEVEL.unpack_from(index, lv * LEVEL.size)
            w, h = floor_dims(width, height, lv)
            expected = level_bytes(w, h, fmt)
            if raw_length != expected:
                raise SourceError(
                    f"{path}: level {lv} ({w} x {h} {name}) declares {raw_length:,} bytes, it must be {expected:,}"
                )
            if length == 0 or offset + length > file_size:
                raise SourceError(
                    f"{path}: truncated: level {lv} lies at bytes {offset:,}..{offset + length:,}, "
                    f"the file has {file_size:,}"
                )
            if scheme == SUPERCOMPRESSION_NONE and length != expected:
                raise SourceError(f"{path}: level {lv} holds {length:,} bytes, it must be {expected:,}")
            stored = read_exact(f, path, offset, length, f"level {lv}")
            data = _inflate(stored, scheme, expected, path, lv)
            levels.append(BlockLevel(w, h, as_blocks(data, w, h, fmt)))
    return BlockTexture(
        path=path, container="ktx2", format_name=name, texel_format=fmt, srgb=srgb, levels=tuple(levels)
    )


def _dfd_model(f: BinaryIO, path: Path, file_size: int, offset: int, length: int) -> int:
    """The colorModel of the DFD's first (basic) descriptor block: byte 12 of the DFD, after its total
    size (u32), vendorId/descriptorType (u32), versionNumber and descriptorBlockSize (u16 each)."""
    if length < 16 or offset + length > file_size:
        raise SourceError(f"{path}: vkFormat 0 with no readable data format descriptor")
    return read_exact(f, path, offset, 16, "data format descriptor")[12]


def _inflate(stored: bytes, scheme: int, expected: int, path: Path, level: int) -> bytes:
    """A level's bytes, decompressed in bounded steps: memory grows only with output the data really
    produces, and never past `expected` + 1 byte (to see an overrun)."""
    if scheme == SUPERCOMPRESSION_NONE:
        return stored
    out = bytearray()
    try:
        if scheme == SUPERCOMPRESSION_ZSTD:
            import zstandard

            reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(stored), read_across_frames=True)
            while len(out) <= expected:
                chunk = reader.read(min(INFLATE_STEP, expected + 1 - len(out)))  # read(n) allocates n bytes
                if not chunk:
                    break
                out += chunk
        else:
            inflater = zlib.decompressobj()
            pending = stored
            while len(out) <= expected:
                chunk = inflater.decompress(pending, min(INFLATE_STEP, expected + 1 - len(out)))
                pending = inflater.unconsumed_tail
                if not chunk:
                    break
                out += chunk
    except Exception as exc:  # the codecs raise their own types on bad input
        text = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SourceError(f"{path}: level {level} does not decompress: {text}") from None
    if len(out) != expected:
        more = "more than " if len(out) > expected else ""
        raise SourceError(
            f"{path}: level {level} decompresses to {more}{min(len(out), expected):,} bytes, it must be {expected:,}"
        )
    return bytes(out)


# ---- writer -----------------------------------------------------------------------------------------
def dfd_bytes(fmt: TexelFormat, srgb: bool, supercompressed: bool) -> bytes:
    """The data format descriptor (total size, then one Khronos basic descriptor block)."""
    samples = DF_SAMPLES[fmt]
    block_size = 24 + 16 * len(samples)
    body = struct.pack(
        "<IHH4B4B8B",
        0,  # vendorId 0 (Khronos), descriptorType 0 (basic)
        2,  # versionNumber: KHR_DF_VERSIONNUMBER_1_3
        block_size,
        DF_MODEL[fmt],
        DF_PRIMARIES_BT709,
        DF_TRANSFER_SRGB if srgb else DF_TRANSFER_LINEAR,
        0,  # flags: straight alpha
        3,
        3,
        0,
        0,  # texelBlockDimension0..3: 4 x 4 x 1 x 1, each stored less one
        0 if supercompressed else fmt.block_bytes,
        0,
        0,
        0,
        0,
        0,
        0,
        0,  # bytesPlane0..7 (0 when supercompressed)
    )
    for bit_offset, bit_length, channel, alpha in samples:
        qualifiers = DF_SAMPLE_LINEAR if (alpha and srgb) else 0
        lower, upper = 0, 0xFFFFFFFF  # UNORM: the whole range of the bits
        if fmt.float_texels:
            qualifiers |= DF_SAMPLE_FLOAT
            lower, upper = FLOAT_ZERO, FLOAT_ONE
        body += struct.pack("<HBB4BII", bit_offset, bit_length - 1, channel | qualifiers, 0, 0, 0, 0, lower, upper)
    return struct.pack("<I", 4 + len(body)) + body


def _key_value(key: str, value: bytes) -> bytes:
    kv = key.encode() + b"\0" + value
    entry = struct.pack("<I", len(kv)) + kv
    return entry + b"\0" * (-len(entry) % 4)


def ktx2_bytes(
    fmt: TexelFormat, srgb: bool, width: int, height: int, levels: list[bytes], *, scheme: int, writer: str
) -> list[bytes]:
    """The parts of a KTX2 file, in order (header and metadata first, then the levels smallest first).

    `levels` are each level's (already supercompressed, for zstd) bytes, level 0 first.
    """
    raw = [level_bytes(*floor_dims(width, height, lv), fmt) for lv in range(len(levels))]
    if scheme == SUPERCOMPRESSION_NONE and [len(b) for b in levels] != raw:
        raise ValueError("level sizes do not match the texture's geometry")
    dfd = dfd_bytes(fmt, srgb, scheme != SUPERCOMPRESSION_NONE)
    kvd = _key_value("KTXwriter", writer.encode() + b"\0")
    dfd_offset = HEADER.size + LEVEL.size * len(levels)
    kvd_offset = dfd_offset + len(dfd)
    pos = kvd_offset + len(kvd)
    # mip padding: uncompressed levels start on lcm(block bytes, 4); supercompressed ones need none
    align = fmt.block_bytes if scheme == SUPERCOMPRESSION_NONE else 1
    offsets = [0] * len(levels)
    parts_tail: list[bytes] = []
    for lv in reversed(range(len(levels))):  # the smallest level comes first in the file
        pad = -pos % align
        parts_tail.append(b"\0" * pad)
        pos += pad
        offsets[lv] = pos
        parts_tail.append(levels[lv])
        pos += len(levels[lv])
    header = HEADER.pack(
        IDENTIFIER,
        VK_FOR_PACK[(fmt, srgb)],
        1,  # typeSize: 1 for block-compressed formats
        width,
        height,
        0,  # pixelDepth: a 2D texture
        0,  # layerCount: not an array
        1,  # faceCount
        len(levels),
        scheme,
        dfd_offset,
        len(dfd),
        kvd_offset,
        len(kvd),
        0,  # sgdByteOffset: no global data for none/zstd
        0,
    )
    index = b"".join(LEVEL.pack(offsets[lv], len(levels[lv]), raw[lv]) for lv in range(len(levels)))
    return [header, index, dfd, kvd, *parts_tail]
