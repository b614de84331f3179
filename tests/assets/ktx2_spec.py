"""A KTX2 checker written from the KTX 2.0 specification, field by field, sharing no code with
texstream's reader or writer: identifier, header, index, level index (offsets, lengths, order, mip
padding), data format descriptor, key/value data. Returns the levels' decompressed bytes."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import zstandard

IDENTIFIER = bytes([0xAB, 0x4B, 0x54, 0x58, 0x20, 0x32, 0x30, 0xBB, 0x0D, 0x0A, 0x1A, 0x0A])
# VkFormat -> (block bytes, sRGB, KHR_DF_MODEL_*) for the BC formats (Vulkan spec, Khronos DF spec 1.3)
VK_FORMAT_BC6H_UFLOAT_BLOCK = 143
BC_FORMATS = {
    VK_FORMAT_BC6H_UFLOAT_BLOCK: (16, False, 133),
    131: (8, False, 128),
    132: (8, True, 128),
    133: (8, False, 128),
    134: (8, True, 128),
    137: (16, False, 130),
    138: (16, True, 130),
    139: (8, False, 131),
    141: (16, False, 132),
    145: (16, False, 134),
    146: (16, True, 134),
}


@dataclass
class Ktx2File:
    vk_format: int
    width: int
    height: int
    scheme: int
    levels: list[bytes]  # level 0 first, decompressed
    key_values: dict[str, bytes]
    srgb: bool


def check_ktx2(data: bytes) -> Ktx2File:
    """Assert the layout rules; return the content."""
    assert data[:12] == IDENTIFIER, "file identifier"
    vk, type_size, w, h, depth, layers, faces, count, scheme = struct.unpack_from("<9I", data, 12)
    assert vk in BC_FORMATS, f"vkFormat {vk}"
    block, srgb, model = BC_FORMATS[vk]
    assert type_size == 1, "typeSize is 1 for block-compressed formats"
    assert w > 0 and h > 0 and depth == 0 and layers == 0 and faces == 1
    assert count >= 1 and count <= max(w, h).bit_length()
    assert scheme in (0, 2), f"supercompressionScheme {scheme}"
    dfd_off, dfd_len, kvd_off, kvd_len = struct.unpack_from("<4I", data, 48)
    sgd_off, sgd_len = struct.unpack_from("<2Q", data, 64)
    assert dfd_off == 80 + 24 * count, "the DFD follows the level index"
    assert dfd_off % 4 == 0
    assert sgd_off == 0 and sgd_len == 0, "no global data for none/zstd"
    # ---- DFD
    (total,) = struct.unpack_from("<I", data, dfd_off)
    assert total == dfd_len, "dfdTotalSize equals dfdByteLength"
    first, version, block_size = struct.unpack_from("<IHH", data, dfd_off + 4)
    assert first == 0, "vendorId 0 (Khronos), descriptorType 0 (basic)"
    assert version == 2, "KHR_DF_VERSIONNUMBER_1_3"
    assert block_size == total - 4 and (block_size - 24) % 16 == 0
    dmodel, primaries, transfer, flags = data[dfd_off + 12 : dfd_off + 16]
    assert dmodel == model, f"colorModel {dmodel} for vkFormat {vk}"
    assert transfer == (2 if srgb else 1), "transferFunction sRGB/linear matches the vkFormat"
    assert primaries == 1 and flags == 0
    assert tuple(data[dfd_off + 16 : dfd_off + 20]) == (3, 3, 0, 0), "texelBlockDimension: 4x4x1x1, each less one"
    planes = data[dfd_off + 20 : dfd_off + 28]
    assert planes[0] == (block if scheme == 0 else 0), "bytesPlane0: block bytes (0 when supercompressed)"
    assert not any(planes[1:])
    bits = 0
    for k in range((block_size - 24) // 16):
        off, length_m1, channel_type = struct.unpack_from("<HBB", data, dfd_off + 28 + 16 * k)
        lower, upper = struct.unpack_from("<II", data, dfd_off + 28 + 16 * k + 8)
        assert off == bits, "samples cover the block in order"
        bits += length_m1 + 1
        # channelType: bits 0-3 the channel id, bits 4-7 the qualifiers LINEAR (0x10), EXPONENT (0x20),
        # SIGNED (0x40), FLOAT (0x80). Khronos DF 1.3 section 5.18: a float sample's sampleLower and
        # sampleUpper hold IEEE 754 single-precision bit patterns; for BC6H UFLOAT the tables give 0.0
        # and 1.0 (the values that map to 0 and 1; HDR values may lie outside).
        if vk == VK_FORMAT_BC6H_UFLOAT_BLOCK:
            assert channel_type & 0x0F == 0, "BC6H: KHR_DF_CHANNEL_BC6H_COLOR"
            assert channel_type & 0xF0 == 0x80, "BC6H UFLOAT: the FLOAT qualifier, not SIGNED"
            as_float = struct.unpack("<2f", struct.pack("<2I", lower, upper))
            assert as_float == (0.0, 1.0), f"UFLOAT sample range {as_float}"
        else:
            assert channel_type & 0xC0 == 0, "UNORM: neither FLOAT nor SIGNED"
            assert lower == 0 and upper == 0xFFFFFFFF, "UNORM sample range"
    assert bits == 8 * block, "samples cover the whole block"
    # ---- key/value data
    kv: dict[str, bytes] = {}
    if kvd_len:
        assert kvd_off == dfd_off + dfd_len, "key/value data follows the DFD"
        p, end = kvd_off, kvd_off + kvd_len
        keys = []
        while p < end:
            (n,) = struct.unpack_from("<I", data, p)
            entry = data[p + 4 : p + 4 + n]
            key, _, value = entry.partition(b"\0")
            keys.append(key.decode("utf-8"))
            kv[keys[-1]] = value
            p += 4 + n
            pad = -p % 4
            assert data[p : p + pad] == b"\0" * pad, "valuePadding is zero"
            p += pad
        assert p == end, "kvdByteLength covers the entries and their padding"
        assert keys == sorted(keys), "keys sorted by code point"
        if "KTXwriter" in kv:
            assert kv["KTXwriter"].endswith(b"\0"), "KTXwriter is NUL-terminated"
    else:
        assert kvd_off == 0
    meta_end = (kvd_off + kvd_len) if kvd_len else dfd_off + dfd_len
    # ---- level index
    align = block if scheme == 0 else 1  # lcm(texel block size, 4) for 8/16-byte blocks; 1 when supercompressed
    entries = [struct.unpack_from("<3Q", data, 80 + 24 * lv) for lv in range(count)]
    pos = meta_end
    for lv in reversed(range(count)):  # the smallest level is stored first
        off, length, raw = entries[lv]
        lw, lh = max(1, w >> lv), max(1, h >> lv)
        assert raw == -(-lw // 4) * -(-lh // 4) * block, f"uncompressedByteLength of level {lv}"
        if scheme == 0:
            assert length == raw
        assert off % align == 0, f"level {lv} offset {off} not aligned to {align}"
        assert off >= pos and off - pos < max(align, 1), f"level {lv}: only mip padding before it"
        assert data[pos:off] == b"\0" * (off - pos)
        pos = off + length
    assert pos == len(data), "level 0 ends the file"
    levels = []
    for lv in range(count):
        off, length, raw = entries[lv]
        chunk = data[off : off + length]
        if scheme == 2:
            chunk = zstandard.ZstdDecompressor().decompress(chunk, max_output_size=raw)
        assert len(chunk) == raw
        levels.append(chunk)
    return Ktx2File(vk_format=vk, width=w, height=h, scheme=scheme, levels=levels, key_values=kv, srgb=srgb)
