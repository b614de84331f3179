"""Byte layout of a texstream tile pack (versions 2 and 3; version 1 still reads); docs/FORMAT.md is the prose version.

Everything is little-endian. A pack is::

    header        128 bytes, fixed (HEADER_STRUCT), ends in an xxh3-64 of its first 120 bytes
    level table   level_count x 16 bytes: width, height, tiles_x, tiles_y (u32 each)
    index         tile_count x 24 bytes: offset u64, stored_size u32, raw_size u32, check u64
    payload       one blob per tile at `offset`, each start aligned to `alignment`
    metadata      UTF-8 JSON object (source name, creation parameters), after the payload

The index is ordered level-major, then row-major inside a level, so the entry of (level, x, y) is
``level_first[level] + y * tiles_x[level] + x``: O(1), no search. Since version 2 an entry's check is
``xxh3-64(raw tile) ^ position_mix(i)`` for its position i, so a tile's checksum binds its place: two
swapped entries fail both tiles' checks. Readers undo the mix when they load the index (version 1
stored the bare xxh3-64), so `PackReader.index["checksum"]` is always the raw tile's xxh3-64.
Version 3 is version 2's layout for texel formats added since (BC6H): a pack is written with the
oldest version that has its format (`version_for`), so readers that do not know a format refuse its
packs as "written by a newer texstream" while packs of the older formats stay readable by them.

Level geometry: level l is ``max(1, ceil(W / 2**l)) x max(1, ceil(H / 2**l))`` texels (ceil, so a
texel of level l covers exactly texels 2i and 2i+1 of level l-1, the missing one at an odd edge
taken by the address mode). Levels go down until the whole level fits in one tile. Every tile is
stored as a full slot of ``S = T + 2B`` texels square: its T x T content plus a B-texel border
copied from its neighbours (clamped or wrapped at the level's edge, and past the level's true size).
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import PackFormatError

MAGIC = b"TEXSTRM\x1a"
VERSION = 3  # the newest version the writer writes (`version_for`: the oldest that has a pack's format)
READ_VERSIONS = (1, 2, 3)  # what the reader reads (1: index checks are the bare xxh3-64)
HEADER_SIZE = 128
LEVEL_ENTRY_SIZE = 16
INDEX_ENTRY_SIZE = 24

# Caps that keep a hostile header from asking for absurd work or memory.
MAX_DIMENSION = 1 << 24  # 16,777,216 texels a side
# The runtime's page-table entries hold the level in 4 bits (runtime/tiles.py MAX_LEVELS), so a pack
# of more levels cannot be streamed: the longer side is at most tile size x 2^15 texels.
MAX_LEVELS = 16
# At most 2^26 tiles (a level 0 of ~7,000 x 7,000 tiles: 900k texels a side at tile size 128): the
# index (24 bytes a tile) stays under 1.5 GiB in memory and the streamer's page table (4 bytes a tile
# of VRAM, plus ~30 bytes a tile of per-tile state on the host) under 256 MiB.
MAX_TILES = 1 << 26
MAX_BORDER = 32
TILE_SIZES = (64, 128, 256)
MIN_ALIGNMENT = 16
MAX_ALIGNMENT = 1 << 16
MAX_METADATA = 1 << 20

HEADER_STRUCT = struct.Struct(
    "<8s"  # magic
    "H"  # version
    "H"  # header size
    "I"  # flags (bit 0: sRGB)
    "I"  # width
    "I"  # height
    "B"  # texel format
    "B"  # address mode
    "B"  # supercompression
    "B"  # level count
    "H"  # tile content size T
    "H"  # border B
    "I"  # payload alignment
    "I"  # metadata size
    "Q"  # level table offset
    "Q"  # index offset
    "Q"  # tile count
    "Q"  # metadata offset
    "Q"  # payload offset
    "Q"  # payload end
    "Q"  # xxh3-64 of the index bytes
    "Q"  # xxh3-64 of the level table bytes
    "16s"  # reserved, zero
)
assert HEADER_STRUCT.size == HEADER_SIZE - 8  # the header checksum (u64) follows
CHECKSUM_STRUCT = struct.Struct("<Q")

FLAG_SRGB = 1

INDEX_DTYPE = np.dtype([("offset", "<u8"), ("stored_size", "<u4"), ("raw_size", "<u4"), ("checksum", "<u8")])
LEVEL_DTYPE = np.dtype([("width", "<u4"), ("height", "<u4"), ("tiles_x", "<u4"), ("tiles_y", "<u4")])
assert INDEX_DTYPE.itemsize == INDEX_ENTRY_SIZE and LEVEL_DTYPE.itemsize == LEVEL_ENTRY_SIZE


class NamedIntEnum(enum.IntEnum):
    """An IntEnum that also accepts a member's name in any case (``"zstd"``, ``"BC7"``), as configs do."""

    @classmethod
    def _missing_(cls, value: object) -> object:
        if isinstance(value, str):
            return cls.__members__.get(value.upper())
        return None


class TexelFormat(NamedIntEnum):
    """How the texels of a tile are encoded."""

    RGBA8 = 0
    BC1 = 1
    BC3 = 2
    BC4 = 3
    BC5 = 4
    BC7 = 5
    BC6H = 6  # unsigned half-float RGB (HDR), linear; pack format version 3

    @property
    def block_bytes(self) -> int:
        """Bytes per 4x4 block (64 for RGBA8, whose 'block' is 16 texels of 4 bytes)."""
        return {0: 64, 1: 8, 2: 16, 3: 8, 4: 16, 5: 16, 6: 16}[int(self)]

    @property
    def channels(self) -> int:
        """Meaningful channels: 4 for colour formats, 1 for BC4, 2 for BC5, 3 for BC6H."""
        return {3: 1, 4: 2, 6: 3}.get(int(self), 4)

    @property
    def float_texels(self) -> bool:
        """True when texels are floating point (BC6H): baked from float sources, never 8-bit."""
        return self is TexelFormat.BC6H

    @property
    def first_version(self) -> int:
        """The first pack format version that has this format."""
        return 3 if self is TexelFormat.BC6H else 1

    @property
    def compressed(self) -> bool:
        return self is not TexelFormat.RGBA8

    @property
    def colour(self) -> bool:
        """True when the data is colour that may be sRGB; BC4/BC5 (data) and BC6H (HDR) are linear only."""
        return self not in (TexelFormat.BC4, TexelFormat.BC5, TexelFormat.BC6H)

    @classmethod
    def parse(cls, name: str) -> TexelFormat:
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(
                f"unknown texel format {name!r} (choose from {', '.join(f.name.lower() for f in cls)})"
            ) from None


class AddressMode(NamedIntEnum):
    """What lies past the edge of the image: its edge texels (clamp) or its other side (wrap)."""

    CLAMP = 0
    WRAP = 1

    @classmethod
    def parse(cls, name: str) -> AddressMode:
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown address mode {name!r} (choose clamp or wrap)") from None


class Supercompression(NamedIntEnum):
    """Lossless compression applied on top of the texel encoding, per tile."""

    NONE = 0
    ZSTD = 1
    LZ4 = 2

    @classmethod
    def parse(cls, name: str) -> Supercompression:
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown supercompression {name!r} (choose none, zstd or lz4)") from None

    def stored_min(self, raw_size: int) -> int:
        """Fewest bytes a stored tile of `raw_size` bytes can take (1 when supercompressed)."""
        return raw_size if self is Supercompression.NONE else 1

    def stored_bound(self, raw_size: int) -> int:
        """Largest stored size a tile of `raw_size` bytes may have (the codec's worst case)."""
        if self is Supercompression.NONE:
            return raw_size
        if self is Supercompression.ZSTD:
            return raw_size + (raw_size >> 7) + 512
        return raw_size + raw_size // 255 + 64


_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def position_mix(positions: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer of ``i + 1`` for each index position i (uint64, vectorized).

    A version-2 index stores ``xxh3-64(raw) ^ position_mix(i)`` at position i; XOR with the same
    value undoes it. The finalizer is a bijection with full avalanche, so entries moved to another
    position fail their check whatever their content.
    """
    z = np.asarray(positions, np.int64).astype(np.uint64) + np.uint64(1)
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def level_dims(width: int, height: int, level: int) -> tuple[int, int]:
    """Texel size of `level` (ceil halving, never below 1)."""
    step = 1 << level
    return max(1, -(-width // step)), max(1, -(-height // step))


def level_count_for(width: int, height: int, tile_size: int) -> int:
    """Number of levels from full size down to the first level that fits in one tile."""
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    count = 1
    w, h = width, height
    while max(w, h) > tile_size:
        count += 1
        w, h = level_dims(width, height, count - 1)
    return count


@dataclass(frozen=True, kw_only=True)
class PackHeader:
    """The parameters of a pack; everything else about its layout derives from them."""

    width: int
    height: int
    texel_format: TexelFormat = TexelFormat.BC1
    srgb: bool = True
    tile_size: int = 128
    border: int = 4
    address_mode: AddressMode = AddressMode.CLAMP
    supercompression: Supercompression = Supercompression.NONE
    alignment: int = MIN_ALIGNMENT
    level_count: int = 0  # 0: derived from the size (down to one tile)

    def __post_init__(self) -> None:
        for name in ("width", "height"):
            v = getattr(self, name)
            if not isinstance(v, int) or not 1 <= v <= MAX_DIMENSION:
                raise ValueError(f"{name} must be an integer in 1..{MAX_DIMENSION}, got {v!r}")
        if self.tile_size not in TILE_SIZES:
            raise ValueError(f"tile size must be one of {TILE_SIZES}, got {self.tile_size!r}")
        if not (0 <= self.border <= MAX_BORDER and self.border % 4 == 0):
            raise ValueError(f"border must be a multiple of 4 in 0..{MAX_BORDER}, got {self.border!r}")
        a = self.alignment
        if not (MIN_ALIGNMENT <= a <= MAX_ALIGNMENT and a & (a - 1) == 0):
            raise ValueError(f"alignment must be a power of two in {MIN_ALIGNMENT}..{MAX_ALIGNMENT}, got {a!r}")
        object.__setattr__(self, "texel_format", TexelFormat(self.texel_format))
        object.__setattr__(self, "address_mode", AddressMode(self.address_mode))
        object.__setattr__(self, "supercompression", Supercompression(self.supercompression))
        if self.srgb and not self.texel_format.colour:
            raise ValueError(f"{self.texel_format.name.lower()} holds linear data and cannot be sRGB")
        full = level_count_for(self.width, self.height, self.tile_size)
        if self.level_count == 0:
            object.__setattr__(self, "level_count", full)
        elif self.level_count != full:
            raise ValueError(f"level count must be {full} for {self.width}x{self.height}, got {self.level_count}")
        size = f"{self.width} x {self.height} texels in {self.tile_size}-texel tiles"
        if full > MAX_LEVELS:
            raise ValueError(
                f"{size} needs {full} levels; the streamer holds at most {MAX_LEVELS} "
                f"(a side of at most {self.tile_size << (MAX_LEVELS - 1):,} texels at this tile size)"
            )
        if self.tile_count > MAX_TILES:
            side = self.tile_size * math.isqrt(MAX_TILES * 3 // 4)
            raise ValueError(
                f"{size} is {self.tile_count:,} tiles; a pack holds at most {MAX_TILES:,} "
                f"(about {side:,} x {side:,} texels at this tile size)"
            )

    # ---- derived geometry -------------------------------------------------------------------
    @property
    def slot_size(self) -> int:
        """Texels a side of one stored tile: content plus border on both sides."""
        return self.tile_size + 2 * self.border

    @property
    def tile_raw_size(self) -> int:
        """Bytes of one tile's texel data before supercompression."""
        blocks = self.slot_size // 4
        return blocks * blocks * self.texel_format.block_bytes

    def level_dims(self, level: int) -> tuple[int, int]:
        self._check_level(level)
        return level_dims(self.width, self.height, level)

    def tiles_in_level(self, level: int) -> tuple[int, int]:
        w, h = self.level_dims(level)
        t = self.tile_size
        return -(-w // t), -(-h // t)

    @cached_property
    def level_table(self) -> np.ndarray:
        """Structured array (LEVEL_DTYPE) of every level's size and tile grid."""
        table = np.zeros(self.level_count, LEVEL_DTYPE)
        for lv in range(self.level_count):
            w, h = level_dims(self.width, self.height, lv)
            table[lv] = (w, h, -(-w // self.tile_size), -(-h // self.tile_size))
        return table

    @cached_property
    def level_first(self) -> np.ndarray:
        """Index of each level's first tile, plus the total tile count at the end."""
        counts = self.level_table["tiles_x"].astype(np.int64) * self.level_table["tiles_y"]
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    @property
    def tile_count(self) -> int:
        return int(self.level_first[-1])

    def tile_index(self, level: int, x: int, y: int) -> int:
        """Position of tile (level, x, y) in the index; raises ValueError when out of range."""
        tx, ty = self.tiles_in_level(level)
        if not (0 <= x < tx and 0 <= y < ty):
            raise ValueError(f"tile ({x}, {y}) is outside level {level}'s {tx}x{ty} tile grid")
        return int(self.level_first[level]) + y * tx + x

    def _check_level(self, level: int) -> None:
        if not 0 <= level < self.level_count:
            raise ValueError(f"level {level} is outside 0..{self.level_count - 1}")

    @property
    def index_offset(self) -> int:
        return HEADER_SIZE + self.level_count * LEVEL_ENTRY_SIZE

    @property
    def payload_offset(self) -> int:
        end = self.index_offset + self.tile_count * INDEX_ENTRY_SIZE
        return -(-end // self.alignment) * self.alignment

    def describe(self) -> dict:
        """Plain dict for `texstream info --json` and logs."""
        return {
            "width": self.width,
            "height": self.height,
            "format": self.texel_format.name.lower(),
            "srgb": self.srgb,
            "tile_size": self.tile_size,
            "border": self.border,
            "slot_size": self.slot_size,
            "levels": self.level_count,
            "address_mode": self.address_mode.name.lower(),
            "supercompression": self.supercompression.name.lower(),
            "alignment": self.alignment,
            "tile_count": self.tile_count,
            "tile_raw_size": self.tile_raw_size,
        }


def version_for(header: PackHeader) -> int:
    """The version a pack of `header` is written as: 2, or the first version of its texel format
    when that is later (3 for BC6H), so older readers refuse only what they cannot read."""
    return max(2, header.texel_format.first_version)


def pack_header_bytes(
    header: PackHeader,
    *,
    metadata_offset: int,
    metadata_size: int,
    payload_end: int,
    index_checksum: int,
    level_checksum: int,
    version: int | None = None,
) -> bytes:
    """Serialize the 128-byte header, checksum included (`version`: `version_for(header)` unless
    given, which only tests do)."""
    import xxhash

    if version is None:
        version = version_for(header)
    body = HEADER_STRUCT.pack(
        MAGIC,
        version,
        HEADER_SIZE,
        FLAG_SRGB if header.srgb else 0,
        header.width,
        header.height,
        int(header.texel_format),
        int(header.address_mode),
        int(header.supercompression),
        header.level_count,
        header.tile_size,
        header.border,
        header.alignment,
        metadata_size,
        HEADER_SIZE,
        header.index_offset,
        header.tile_count,
        metadata_offset,
        header.payload_offset,
        payload_end,
        index_checksum,
        level_checksum,
        b"\0" * 16,
    )
    return body + CHECKSUM_STRUCT.pack(xxhash.xxh3_64_intdigest(body))


@dataclass(frozen=True)
class RawHeader:
    """Header fields as read from disk, checked against the header's geometry and the file's size."""

    header: PackHeader
    version: int
    metadata_offset: int
    metadata_size: int
    payload_end: int
    index_checksum: int
    level_checksum: int


# First bytes of files people give where a pack belongs, for the hint (what a file is, not its bytes).
_KNOWN_FILES = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"II*\x00", "a TIFF image"),
    (b"MM\x00*", "a TIFF image"),
    (b"v/1\x01", "an OpenEXR image"),
    (b"GIF8", "a GIF image"),
    (b"BM", "a BMP image"),
    (b"DDS ", "a DDS texture"),
    (b"\xabKTX", "a KTX texture"),
    (b"8BPS", "a Photoshop image"),
)


def not_a_pack(data: bytes) -> PackFormatError:
    """The error for a file that is not a pack: what it looks like, and how to make a pack of it."""
    kind = next((name for magic, name in _KNOWN_FILES if data.startswith(magic)), None)
    if kind is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        kind = "a WebP image"
    if kind is None:
        return PackFormatError("not a texstream pack; packs are made with: texstream bake SRC OUT.tpk")
    return PackFormatError(f"not a texstream pack but {kind}; bake it into one first: texstream bake SRC OUT.tpk")


def parse_header_bytes(data: bytes, file_size: int) -> RawHeader:
    """Parse and validate the 128-byte header against the file's size; PackFormatError on any flaw.

    Every size the header implies (level table, index, the least payload its tiles can take,
    metadata) is checked against the file's size here, before anyone allocates or reads by it.
    """
    import xxhash

    if data[: len(MAGIC)] != MAGIC[: len(data)]:  # an empty file is "too short", below
        raise not_a_pack(data)
    if len(data) < HEADER_SIZE:
        raise PackFormatError(f"file is {file_size} bytes, too short for a {HEADER_SIZE}-byte pack header")
    body = data[: HEADER_SIZE - 8]
    fields = HEADER_STRUCT.unpack(body)
    (
        magic,
        version,
        header_size,
        flags,
        width,
        height,
        fmt,
        addr,
        sc,
        levels,
        tile,
        border,
        align,
        meta_size,
        level_off,
        index_off,
        tile_count,
        meta_off,
        payload_off,
        payload_end,
        index_sum,
        level_sum,
        reserved,
    ) = fields
    if magic != MAGIC:
        raise not_a_pack(data)
    if version > max(READ_VERSIONS):
        raise PackFormatError(
            f"written by a newer texstream (format {version}; this one reads formats up to "
            f"{max(READ_VERSIONS)}): upgrade texstream"
        )
    if version not in READ_VERSIONS:
        known = ", ".join(str(v) for v in READ_VERSIONS)
        raise PackFormatError(f"unsupported pack format version {version} (this reader knows versions {known})")
    (stored_sum,) = CHECKSUM_STRUCT.unpack(data[HEADER_SIZE - 8 : HEADER_SIZE])
    if stored_sum != xxhash.xxh3_64_intdigest(body):
        raise PackFormatError("header checksum mismatch (the first 128 bytes are damaged)")
    if header_size != HEADER_SIZE:
        raise PackFormatError(f"header size field is {header_size}, expected {HEADER_SIZE}")
    if flags & ~FLAG_SRGB:
        raise PackFormatError(f"unknown flag bits 0x{flags:x} in the header")
    if reserved != b"\0" * 16:
        raise PackFormatError("reserved header bytes are not zero")
    enums = (
        (TexelFormat, fmt, "texel format"),
        (AddressMode, addr, "address mode"),
        (Supercompression, sc, "supercompression"),
    )
    for enum_cls, value, name in enums:
        if value not in enum_cls._value2member_map_:
            raise PackFormatError(f"{name} code {value} is not known")
    if not 1 <= levels <= MAX_LEVELS:
        raise PackFormatError(f"level count {levels} is outside 1..{MAX_LEVELS}")
    first = TexelFormat(fmt).first_version
    if version < first:
        raise PackFormatError(
            f"texel format {TexelFormat(fmt).name.lower()} needs pack format {first}, the header says {version}"
        )
    try:
        header = PackHeader(
            width=width,
            height=height,
            texel_format=TexelFormat(fmt),
            srgb=bool(flags & FLAG_SRGB),
            tile_size=tile,
            border=border,
            address_mode=AddressMode(addr),
            supercompression=Supercompression(sc),
            alignment=align,
            level_count=levels,
        )
    except ValueError as exc:
        raise PackFormatError(f"invalid header: {exc}") from None
    expected = {
        "level table offset": (level_off, HEADER_SIZE),
        "index offset": (index_off, header.index_offset),
        "tile count": (tile_count, header.tile_count),
        "payload offset": (payload_off, header.payload_offset),
    }
    for name, (got, want) in expected.items():
        if got != want:
            raise PackFormatError(f"{name} is {got}, the header's geometry implies {want}")
    # The least payload its tiles can take: each starts on its own alignment boundary, with at least
    # `stored_min` bytes (the raw size when uncompressed).
    least = header.supercompression.stored_min(header.tile_raw_size)
    step = -(-least // header.alignment) * header.alignment
    need = header.payload_offset + (header.tile_count - 1) * step + least
    if need > file_size:
        raise PackFormatError(
            f"file is {file_size:,} bytes, but a pack of {header.tile_count:,} tiles "
            f"({width} x {height}, {header.texel_format.name.lower()}) takes at least {need:,} (truncated?)"
        )
    if not need <= payload_end <= file_size:
        raise PackFormatError(f"payload end {payload_end} is outside {need}..{file_size} (file truncated?)")
    if meta_size > MAX_METADATA:
        raise PackFormatError(f"metadata size {meta_size} exceeds the {MAX_METADATA}-byte cap")
    if meta_size and meta_off < payload_end:
        raise PackFormatError(f"metadata offset {meta_off} is before the payload end {payload_end}")
    end = meta_off + meta_size if meta_size else payload_end
    if end > file_size:
        raise PackFormatError(
            f"metadata range {meta_off}+{meta_size} is outside {payload_end}..{file_size} (file truncated?)"
        )
    if end < file_size:
        raise PackFormatError(
            f"file is {file_size:,} bytes, but the pack its header describes ends at {end:,} "
            f"({file_size - end:,} unknown bytes after it)"
        )
    return RawHeader(header, version, meta_off, meta_size, payload_end, index_sum, level_sum)
