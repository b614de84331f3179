"""Rows of an uncompressed strip TIFF read straight from the file, by any process, in any order.

libvips reads a strip TIFF top to bottom (random access decodes the whole image first), so a bake
whose main process streams such a file through `source.VipsSource` spends most of its CPU there,
serially, while the workers wait. An *uncompressed*, 8-bit, interleaved TIFF needs no decoding at
all: its rows are bytes at known offsets. `StripRows.of` reads the first image's tags (classic and
BigTIFF, either byte order), accepts only the layouts whose bytes libvips would hand over unchanged
(grey, grey + alpha, RGB, RGBA; no predictor, no associated alpha, upright), and returns a small
picklable description that every bake worker reads its own bands through (``os.preadv`` into the
band's buffer). Anything else (compressed, tiled, 16-bit, CMYK, palette, rotated, odd tags) returns
None and the file is streamed through libvips as before.

Every number read from the file is checked against the file's size and the image's dimensions as
libvips reported them before any buffer is sized by it; a worker checks the file's size and
modification time before reading, so it never reads another version of the file.
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import SourceError
from .source import Source, VipsSource, _expand

log = logging.getLogger(__name__)

__all__ = ["StripRows", "worker_rows"]

# TIFF field types -> (bytes per value, struct code)
_TYPES = {1: (1, "B"), 3: (2, "H"), 4: (4, "I"), 16: (8, "Q")}
_MAX_ENTRIES = 4096  # directory entries read (a real first IFD has a few dozen)

_WIDTH, _LENGTH, _BITS, _COMPRESSION, _PHOTOMETRIC, _FILL_ORDER = 256, 257, 258, 259, 262, 266
_STRIP_OFFSETS, _ORIENTATION, _SAMPLES, _ROWS_PER_STRIP, _STRIP_BYTES = 273, 274, 277, 278, 279
_PLANAR, _PREDICTOR, _TILE_WIDTH, _EXTRA_SAMPLES, _SAMPLE_FORMAT = 284, 317, 322, 338, 339
_SUB_IFDS, _JPEG_TABLES = 330, 347


class _NotPlain(Exception):
    """The file is not a TIFF whose rows can be read as stored bytes."""


def _read_directory(f, size: int) -> dict[int, np.ndarray]:  # noqa: ANN001 (a binary file)
    head = f.read(16)
    if len(head) < 8 or head[:2] not in (b"II", b"MM"):
        raise _NotPlain("no TIFF header")
    end = "<" if head[:2] == b"II" else ">"
    magic = struct.unpack(end + "H", head[2:4])[0]
    if magic == 42:
        offset_code, count_code, entry_size, value_bytes = "I", "H", 12, 4
        ifd = struct.unpack(end + "I", head[4:8])[0]
    elif magic == 43 and len(head) == 16:
        if struct.unpack(end + "HH", head[4:8]) != (8, 0):
            raise _NotPlain("odd BigTIFF header")
        offset_code, count_code, entry_size, value_bytes = "Q", "Q", 20, 8
        ifd = struct.unpack(end + "Q", head[8:16])[0]
    else:
        raise _NotPlain("not a TIFF")
    count_size = struct.calcsize(count_code)
    if not 8 <= ifd <= size - count_size:
        raise _NotPlain("directory offset outside the file")
    f.seek(ifd)
    n = struct.unpack(end + count_code, f.read(count_size))[0]
    if not 1 <= n <= _MAX_ENTRIES or ifd + count_size + n * entry_size > size:
        raise _NotPlain("directory entry count out of range")
    raw = f.read(n * entry_size)
    tags: dict[int, np.ndarray] = {}
    for k in range(n):
        e = raw[k * entry_size : (k + 1) * entry_size]
        tag, kind = struct.unpack(end + "HH", e[:4])
        count = struct.unpack(end + offset_code, e[4 : 4 + value_bytes])[0]
        if kind not in _TYPES:
            continue  # a field the layout does not depend on (names, resolutions, profiles)
        width, code = _TYPES[kind]
        nbytes = count * width
        if nbytes > size:
            raise _NotPlain(f"tag {tag} is larger than the file")
        if nbytes <= value_bytes:
            data = e[4 + value_bytes : 4 + value_bytes + nbytes]
        else:
            at = struct.unpack(end + offset_code, e[4 + value_bytes :])[0]
            if at + nbytes > size:
                raise _NotPlain(f"tag {tag} points outside the file")
            f.seek(at)
            data = f.read(nbytes)
        tags[tag] = np.frombuffer(data, np.dtype(end + code)).astype(np.int64)
    return tags


def _one(tags: dict[int, np.ndarray], tag: int, default: int | None = None) -> int:
    v = tags.get(tag)
    if v is None:
        if default is None:
            raise _NotPlain(f"tag {tag} missing")
        return default
    if v.size != 1:
        raise _NotPlain(f"tag {tag} has {v.size} values")
    return int(v[0])


@dataclass(frozen=True)
class StripRows:
    """An uncompressed strip TIFF's rows as RGBA8 (the `Source` protocol, ``parallel``).

    Pickles to a few hundred bytes when the strips lie back to back (as libvips, Pillow and most
    writers store them), else with the strip offsets.
    """

    path: str
    name: str
    width: int
    height: int
    channels: int  # samples per pixel: 1 grey, 2 grey + alpha, 3 RGB, 4 RGBA
    size: int  # the file's size and modification time when the bake opened it
    mtime_ns: int
    rows_per_strip: int
    base: int  # offset of row 0 when the strips are contiguous, else -1
    offsets: tuple[int, ...] = ()  # each strip's offset when they are not
    parallel: bool = field(default=True, init=False)

    @property
    def row_bytes(self) -> int:
        return self.width * self.channels

    @classmethod
    def of(cls, path: str | os.PathLike[str], name: str, width: int, height: int) -> StripRows | None:
        """The description of `path` when its first image is `width` x `height` and plainly stored,
        else None (libvips then streams it)."""
        path = os.path.abspath(path)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                tags = _read_directory(f, st.st_size)
            return cls._from_tags(tags, path, name, width, height, st.st_size, st.st_mtime_ns)
        except (OSError, struct.error, _NotPlain) as exc:
            log.debug("%s: rows read through libvips (%s)", path, exc)
            return None

    @classmethod
    def _from_tags(
        cls, tags: dict[int, np.ndarray], path: str, name: str, width: int, height: int, size: int, mtime_ns: int
    ) -> StripRows:
        if (_one(tags, _WIDTH), _one(tags, _LENGTH)) != (width, height):
            raise _NotPlain("dimensions differ from libvips'")
        if _TILE_WIDTH in tags or _SUB_IFDS in tags or _JPEG_TABLES in tags:
            raise _NotPlain("tiled, or with sub-images or JPEG tables")
        if _one(tags, _COMPRESSION, 1) != 1 or _one(tags, _PREDICTOR, 1) != 1:
            raise _NotPlain("compressed")
        if _one(tags, _PLANAR, 1) != 1 or _one(tags, _FILL_ORDER, 1) != 1 or _one(tags, _ORIENTATION, 1) != 1:
            raise _NotPlain("planar, bit-reversed or rotated")
        spp = _one(tags, _SAMPLES, 1)
        photometric = _one(tags, _PHOTOMETRIC)
        extra = tags.get(_EXTRA_SAMPLES, np.zeros(0, np.int64))
        if (photometric, spp) not in ((1, 1), (1, 2), (2, 3), (2, 4)):
            raise _NotPlain(f"photometric {photometric} with {spp} samples")
        if extra.size != (spp % 2 == 0) or (extra.size and int(extra[0]) == 1):
            raise _NotPlain("extra samples other than one unassociated alpha")
        bits = tags.get(_BITS, np.ones(1, np.int64))
        sample_format = tags.get(_SAMPLE_FORMAT, np.ones(1, np.int64))
        if not (np.all(bits == 8) and np.all(sample_format == 1)) or bits.size not in (1, spp):
            raise _NotPlain("not 8-bit unsigned samples")
        rps = min(_one(tags, _ROWS_PER_STRIP, height), height)
        strips = -(-height // max(1, rps))
        offsets, counts = tags.get(_STRIP_OFFSETS), tags.get(_STRIP_BYTES)
        if rps < 1 or offsets is None or counts is None or offsets.size != strips or counts.size != strips:
            raise _NotPlain("strip tables do not match the image")
        row_bytes = width * spp
        rows = np.minimum(rps, height - np.arange(strips) * rps)
        if np.any(counts < rows * row_bytes) or np.any(offsets < 8) or np.any(offsets + rows * row_bytes > size):
            raise _NotPlain("a strip lies outside the file or is short")
        contiguous = bool(np.all(offsets[1:] == offsets[:-1] + rps * row_bytes))
        return cls(
            path,
            name,
            width,
            height,
            spp,
            size,
            mtime_ns,
            rps,
            int(offsets[0]) if contiguous else -1,
            () if contiguous else tuple(int(v) for v in offsets),
        )

    def read_rows(self, y0: int, y1: int) -> np.ndarray:
        """Rows [y0, y1) as a (y1 - y0, width, 4) uint8 RGBA array."""
        if not 0 <= y0 < y1 <= self.height:
            raise ValueError(f"row range {y0}..{y1} is outside 0..{self.height} of {self.name}")
        fd = _open_checked(self.path, self.size, self.mtime_ns)
        n = y1 - y0
        stored = np.empty((n, self.width, self.channels), np.uint8)
        flat = memoryview(stored).cast("B")
        rb = self.row_bytes
        if self.base >= 0:
            _pread_into(fd, flat, self.base + y0 * rb, self.path)
        else:
            rps = self.rows_per_strip
            y = y0
            while y < y1:
                s = y // rps
                stop = min(y1, (s + 1) * rps)
                _pread_into(fd, flat[(y - y0) * rb : (stop - y0) * rb], self.offsets[s] + (y - s * rps) * rb, self.path)
                y = stop
        return stored if self.channels == 4 else _expand(stored)


def worker_rows(source: Source) -> StripRows | None:
    """For a `VipsSource` of an upright uncompressed 8-bit strip TIFF, a `StripRows` that reads the
    same rows straight from the file, in any order and any process (the bake's workers read their
    own bands through it); else None. Its first strip is compared with libvips' decode of it."""
    if not isinstance(source, VipsSource) or not source.loader.startswith("tiffload") or source.orientation != 1:
        return None
    strips = StripRows.of(source.path, source.name, source.width, source.height)
    if strips is None or (strips.size, strips.mtime_ns) != source.file_stamp or strips.channels != source.channels:
        return None
    import pyvips

    n = min(source.height, strips.rows_per_strip, 64)
    try:
        img = pyvips.Image.new_from_file(str(source.path), access="sequential", fail_on="error")
        first = _expand(source._fetch(source._convert(img)[0], 0, n))
    except (pyvips.Error, SourceError):
        return None
    if not np.array_equal(first, strips.read_rows(0, n)):
        log.info("%s: the stored rows differ from libvips' decode; streaming it through libvips", source.path)
        return None
    return strips


def _pread_into(fd: int, buf: memoryview, offset: int, path: str) -> None:
    done = 0
    while done < len(buf):
        if hasattr(os, "preadv"):
            got = os.preadv(fd, [buf[done:]], offset + done)
        else:  # no preadv (macOS before 11): one copy more
            chunk = os.pread(fd, len(buf) - done, offset + done)
            got = len(chunk)
            buf[done : done + got] = chunk
        if got <= 0:
            raise SourceError(f"{path}: ends early (the file changed while it was baked)")
        done += got


_OPEN: dict[tuple[str, int, int], int] = {}  # (path, size, mtime) -> descriptor, in this process
_KEEP_OPEN = 4


def _open_checked(path: str, size: int, mtime_ns: int) -> int:
    """A read-only descriptor of `path` in this process (kept open: a worker reads many bands of
    one file), refused when the file is not the version the bake opened."""
    key = (path, size, mtime_ns)
    fd = _OPEN.get(key)
    if fd is not None:
        return fd
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SourceError(f"{path}: cannot open: {exc.strerror}") from None
    st = os.fstat(fd)
    if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
        os.close(fd)
        raise SourceError(f"{path} changed since the bake opened it (size or modification time differs)")
    while len(_OPEN) >= _KEEP_OPEN:
        os.close(_OPEN.pop(next(iter(_OPEN))))
    _OPEN[key] = fd
    return fd
