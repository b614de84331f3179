"""Uncompressed strip TIFFs read straight from the file by the bake's workers (`tiff_strips`): the
same RGBA rows libvips gives, any rows in any order; anything else left to libvips; hostile tags
and a file changed under the bake refused."""

from __future__ import annotations

import dataclasses
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from texstream.bake.source import VipsSource
from texstream.bake.tiff_strips import StripRows, worker_rows
from texstream.errors import SourceError

from .conftest import ASSETS, load_photo


def _vips_tiff(folder: Path, bands: int, **options: object) -> Path:
    import pyvips

    rgba = load_photo("coffee.png")[:203, :301].copy()
    rgba[..., 3] = np.linspace(0, 255, rgba.shape[1]).astype(np.uint8)[None, :]
    grey = rgba[..., :1]
    arr = {1: grey, 2: np.concatenate([grey, rgba[..., 3:]], axis=2), 3: rgba[..., :3], 4: rgba}[bands]
    img = pyvips.Image.new_from_array(np.ascontiguousarray(arr)).copy(interpretation="b-w" if bands < 3 else "srgb")
    path = folder / f"img-{bands}-{len(options)}.tif"
    img.tiffsave(str(path), **{"compression": "none", **options})
    return path


def _hand_tiff(path: Path, rows: np.ndarray, rows_per_strip: int, *, reverse: bool, bad_offset: bool = False) -> None:
    """A little-endian RGB(A) strip TIFF with its strips stored in reverse order (not back to back)."""
    h, w, spp = rows.shape
    strips = [rows[y : y + rows_per_strip].tobytes() for y in range(0, h, rows_per_strip)]
    order = list(range(len(strips)))[::-1] if reverse else list(range(len(strips)))
    data, offsets, at = b"", [0] * len(strips), 8
    for k in order:
        offsets[k] = at
        data += strips[k]
        at += len(strips[k])
    if bad_offset:
        offsets[-1] = at + 1000
    n = len(strips)
    extra = at  # arrays that do not fit an entry follow the strips
    arrays = struct.pack(f"<{spp}H", *([8] * spp)) + struct.pack(f"<{n}I", *offsets)
    arrays += struct.pack(f"<{n}I", *(len(s) for s in strips))
    bits_at, off_at, cnt_at = extra, extra + 2 * spp, extra + 2 * spp + 4 * n
    ifd = extra + len(arrays)
    entries = [
        (256, 4, 1, w),
        (257, 4, 1, h),
        (258, 3, spp, bits_at),
        (259, 3, 1, 1),
        (262, 3, 1, 2),
        (273, 4, n, off_at if n > 1 else offsets[0]),
        (277, 3, 1, spp),
        (278, 4, 1, rows_per_strip),
        (279, 4, n, cnt_at if n > 1 else len(strips[0])),
        (284, 3, 1, 1),
    ] + ([(338, 3, 1, 2)] if spp == 4 else [])
    body = struct.pack("<H", len(entries))
    for tag, kind, count, value in entries:
        packed = struct.pack("<H", value) + b"\0\0" if kind == 3 and count == 1 else struct.pack("<I", value)
        body += struct.pack("<HHI", tag, kind, count) + packed
    body += struct.pack("<I", 0)
    path.write_bytes(b"II*\0" + struct.pack("<I", ifd) + data + arrays + body)


def _strips_of(path: Path) -> StripRows | None:
    return worker_rows(VipsSource(path))


@pytest.mark.parametrize("bands", [1, 2, 3, 4])
@pytest.mark.parametrize("options", [{}, {"bigtiff": True}], ids=["tiff", "bigtiff"])
def test_rows_are_the_ones_libvips_gives(tmp_path: Path, bands: int, options: dict) -> None:
    path = _vips_tiff(tmp_path, bands, **options)
    strips = _strips_of(path)
    assert strips is not None and strips.channels == bands
    whole = VipsSource(path).read_rows(0, 203)
    for y0, y1 in [(150, 203), (0, 1), (7, 90), (0, 203), (202, 203)]:  # any order, any rows
        assert np.array_equal(strips.read_rows(y0, y1), whole[y0:y1])


@pytest.mark.parametrize("reverse", [True, False])
def test_strips_anywhere_in_the_file(tmp_path: Path, reverse: bool) -> None:
    rows = load_photo("chelsea.png")[:61, :77].copy()
    path = tmp_path / "hand.tif"
    _hand_tiff(path, rows, rows_per_strip=8, reverse=reverse)
    strips = _strips_of(path)
    assert strips is not None and (strips.base < 0) == reverse
    assert np.array_equal(strips.read_rows(0, 61), VipsSource(path).read_rows(0, 61))
    assert np.array_equal(strips.read_rows(5, 30), rows[5:30])


@pytest.mark.parametrize(
    "options", [{"compression": "deflate"}, {"tile": True, "tile_width": 64, "tile_height": 64}, {"cast": "ushort"}]
)
def test_other_layouts_are_left_to_libvips(tmp_path: Path, options: dict) -> None:
    import pyvips

    img = pyvips.Image.new_from_file(str(ASSETS / "chelsea.png"))
    if options.pop("cast", None):
        img = img.cast("ushort") * 257
    path = tmp_path / "other.tif"
    img.tiffsave(str(path), **{"compression": "none", **options})
    source = VipsSource(path)
    assert worker_rows(source) is None
    assert source.read_rows(0, 10).shape == (10, source.width, 4)  # streamed through libvips as before


def test_hostile_tags_are_refused(tmp_path: Path) -> None:
    rows = load_photo("chelsea.png")[:40, :50].copy()
    path = tmp_path / "bad.tif"
    _hand_tiff(path, rows, rows_per_strip=8, reverse=False, bad_offset=True)  # a strip past the end
    assert StripRows.of(path, "bad.tif", 50, 40) is None
    _hand_tiff(path, rows, rows_per_strip=8, reverse=False)
    assert StripRows.of(path, "bad.tif", 50, 41) is None  # not the size libvips reported
    data = bytearray(path.read_bytes())
    ifd = struct.unpack("<I", data[4:8])[0]
    data[ifd : ifd + 2] = struct.pack("<H", 60000)  # an entry count far past the file's end
    path.write_bytes(bytes(data))
    assert StripRows.of(path, "bad.tif", 50, 40) is None
    path.write_bytes(b"II*\0" + struct.pack("<I", 1 << 30))
    assert StripRows.of(path, "bad.tif", 50, 40) is None


def test_a_file_changed_under_the_bake_is_refused(tmp_path: Path) -> None:
    """A worker opens the file itself: another version at the path (its size or time differ from
    what the bake opened) is refused with one line."""
    path = _vips_tiff(tmp_path, 3)
    strips = _strips_of(path)
    assert strips is not None
    os.utime(path, ns=(strips.mtime_ns + 10**9, strips.mtime_ns + 10**9))
    opened_then = dataclasses.replace(strips, mtime_ns=strips.mtime_ns)
    assert StripRows.of(path, strips.name, strips.width, strips.height) != opened_then
    worker_view = dataclasses.replace(strips, path=f"{tmp_path}/./{path.name}")  # not open in this process yet
    with pytest.raises(SourceError, match="changed since the bake opened it"):
        worker_view.read_rows(0, 5)
