"""Fuzz targets: one function per parser of outside bytes, each taking one input (bytes).

A target's contract: whatever the input, the parser either accepts it or raises its documented error
class with a one-line message; any other exception, a hang or a huge allocation is a crash. The
targets are plain functions, so the same inputs replay without a fuzzer (tests/fuzz/test_fuzz.py
replays the seed corpus and every saved crash); tests/fuzz/run.py drives them with atheris.

Inputs start with a control byte where the format has checksums a mutation would almost never get
past (header, level table, index): its bits say which checksums the target recomputes before
parsing, so the fuzzer reaches the checks behind them as well as the checksum checks themselves.

Targets
-------
header         `parse_header_bytes` (the 128-byte pack header against the file's size)
pack           `PackReader` on a whole file: header, level table, index, metadata, then every tile
               read and `verify` (PackFormatError / TileCorruptError only)
metadata       `parse_metadata` (the JSON after the payload)
tile           `codec.decompress` of one stored tile (TileCorruptError only, exact size on success)
content_range  `parse_content_range` / `parse_content_length` (the HTTP headers of a range answer)
http           `HttpTransport.probe` / `fetch` on a whole hostile answer (status, headers, body),
               sent through the transport's `pool` hook without a network
cache          the remote cache's folder (its files, as the cache itself names them) opened,
               read and written
hdr            `parse_hdr` on a whole Radiance HDR file: header, resolution line, flat and
               run-length encoded scanlines (SourceError only; what it accepts is consistent),
               decoded by the Python decoder (which the fuzzer's coverage sees) and, when it is
               built, by the compiled one, which must give the same texels or the same refusal
gltf           `parse_gltf` on a whole .glb or .gltf (container, JSON, every accessor, node and
               material), external files looked for in an empty folder (GltfError only)
"""

from __future__ import annotations

import errno
import io
import os
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import xxhash

from texstream.assets.hdr import parse_hdr, use_scanline_decoder
from texstream.errors import GltfError, PackFormatError, SourceError, TileCorruptError
from texstream.pack import codec
from texstream.pack.format import HEADER_SIZE, HEADER_STRUCT, Supercompression, parse_header_bytes
from texstream.pack.reader import PackReader, parse_metadata
from texstream.scene.gltf_file import parse_gltf

__all__ = ["TARGETS", "ContractViolation", "pack_bytes", "run_one"]

MAX_TILES_READ = 64  # tiles read per pack input (a fuzzed header may declare thousands)
FIX_HEADER = 1  # control bit: recompute the header's checksum
FIX_TABLES = 2  # control bit: recompute the level-table and index checksums the header records


class ContractViolation(AssertionError):
    """A documented error whose message breaks the one-line rule (raised as a crash)."""


def _one_line(exc: BaseException) -> None:
    text = str(exc)
    if not text or "\n" in text:
        raise ContractViolation(f"{type(exc).__name__} message is not one line: {text!r}")


def _scratch_dir() -> Path:
    """A private folder for the files targets write (memory-backed where the system has one)."""
    global _SCRATCH
    if _SCRATCH is None:
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        _SCRATCH = Path(tempfile.mkdtemp(prefix="texstream-fuzz-", dir=base))
    return _SCRATCH


_SCRATCH: Path | None = None


# ---- pack ---------------------------------------------------------------------------------------------
def pack_bytes(data: bytes) -> bytes:
    """The pack file a `header` or `pack` input stands for: its control byte applied, then dropped."""
    if not data:
        return b""
    control, body = data[0], bytearray(data[1:])
    if len(body) < HEADER_SIZE:
        return bytes(body)
    fields = list(HEADER_STRUCT.unpack(bytes(body[: HEADER_SIZE - 8])))
    if control & FIX_TABLES:
        levels, index_off, count = fields[9], fields[15], fields[16]
        level_end = HEADER_SIZE + 16 * levels
        if level_end <= len(body):
            fields[21] = xxhash.xxh3_64_intdigest(bytes(body[HEADER_SIZE:level_end]))
        if count < len(body) and index_off + 24 * count <= len(body):
            fields[20] = xxhash.xxh3_64_intdigest(bytes(body[index_off : index_off + 24 * count]))
        body[: HEADER_SIZE - 8] = HEADER_STRUCT.pack(*fields)
    if control & (FIX_HEADER | FIX_TABLES):
        head = bytes(body[: HEADER_SIZE - 8])
        body[HEADER_SIZE - 8 : HEADER_SIZE] = struct.pack("<Q", xxhash.xxh3_64_intdigest(head))
    return bytes(body)


def target_header(data: bytes) -> None:
    body = pack_bytes(data)
    try:
        raw = parse_header_bytes(body, len(body))
    except PackFormatError as exc:
        _one_line(exc)
        return
    h = raw.header
    # What the parse accepted must describe a layout that fits the file it came with.
    assert h.payload_offset <= raw.payload_end <= len(body), (h.payload_offset, raw.payload_end, len(body))
    assert raw.metadata_offset + raw.metadata_size <= len(body)


def target_pack(data: bytes) -> None:
    path = _scratch_dir() / "input.tpk"
    path.write_bytes(pack_bytes(data))
    try:
        reader = PackReader(path)
    except PackFormatError as exc:
        _one_line(exc)
        return
    with reader:
        assert isinstance(reader.metadata, dict)
        h = reader.header
        read = 0
        for level in range(h.level_count):
            tiles_x, tiles_y = h.tiles_in_level(level)
            for y in range(tiles_y):
                for x in range(tiles_x):
                    if read == MAX_TILES_READ:
                        break
                    read += 1
                    try:
                        raw = reader.read_tile(level, x, y)
                    except TileCorruptError as exc:
                        _one_line(exc)
                        continue
                    assert len(raw) == h.tile_raw_size
        if h.tile_count <= MAX_TILES_READ:
            for *_, why in reader.verify():
                assert why and "\n" not in why, why


def target_metadata(data: bytes) -> None:
    try:
        meta = parse_metadata(data)
    except PackFormatError as exc:
        _one_line(exc)
        return
    assert isinstance(meta, dict)


# ---- tiles --------------------------------------------------------------------------------------------
# Raw tile sizes of real packs (64- to 256-texel tiles, BC1 to RGBA8, with and without borders), and a
# few small ones so short inputs can decode.
RAW_SIZES = (16, 64, 2048, 2592, 8192, 10368, 32768, 65536, 147456, 278784)


def tile_input(data: bytes) -> tuple[Supercompression, int, bytes]:
    """(codec, raw size, stored bytes) a `tile` input stands for."""
    if len(data) < 2:
        return Supercompression.NONE, RAW_SIZES[0], b""
    return Supercompression(data[0] % 3), RAW_SIZES[data[1] % len(RAW_SIZES)], data[2:]


def target_tile(data: bytes) -> None:
    mode, raw_size, stored = tile_input(data)
    try:
        out = codec.decompress(stored, mode, raw_size)
    except TileCorruptError as exc:
        _one_line(exc)
        return
    assert len(out) == raw_size, (len(out), raw_size)


# ---- HTTP ---------------------------------------------------------------------------------------------
def _split(data: bytes, parts: int) -> list[bytes]:
    pieces = data.split(b"\0", parts - 1)
    return pieces + [b""] * (parts - len(pieces))


def _header_text(raw: bytes) -> str | None:
    """A header value as urllib3 gives it (ISO-8859-1 text); a lone 0xff byte means 'absent'."""
    return None if raw == b"\xff" else raw.decode("latin-1")


def target_content_range(data: bytes) -> None:
    from texstream.remote.transport import PermanentError, parse_content_length, parse_content_range

    content_range, content_length = _split(data, 2)
    try:
        first, last, total = parse_content_range(content_range.decode("latin-1"), _header_text(content_length))
    except PermanentError as exc:
        _one_line(exc)
    else:
        assert 0 <= first <= last < total, (first, last, total)
    try:
        length = parse_content_length(_header_text(content_length))
    except PermanentError as exc:
        _one_line(exc)
    else:
        assert length is None or length >= 0


STATUSES = (206, 200, 206, 412, 416, 404, 403, 429, 503, 301, 418, 206)


class _Answer:
    """A stand-in for urllib3's PoolManager: every request gets the same hostile answer."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.answer = (status, headers, body)

    def request(self, method: str, url: str, **kwargs: object) -> object:
        import urllib3

        status, headers, body = self.answer
        return urllib3.HTTPResponse(
            body=io.BytesIO(body), headers=headers, status=status, preload_content=False, decode_content=False
        )

    def clear(self) -> None:
        pass


def target_http(data: bytes) -> None:
    """A whole answer to a probe or a fetch: control bytes pick the status, which call, its range;
    the rest is Content-Range, Content-Length, ETag, Last-Modified and the body, split at NUL bytes."""
    from texstream.remote import RemoteVersion
    from texstream.remote.transport import HttpTransport, PermanentError, RemoteError, TransientError

    if len(data) < 4:
        return
    status = STATUSES[data[0] % len(STATUSES)]
    fetch = data[1] & 1
    start, length = data[2] * 7, 1 + data[3] * 3
    content_range, content_length, etag, modified, body = _split(data[4:], 5)
    headers = {}
    for name, raw in (
        ("Content-Range", content_range),
        ("Content-Length", content_length),
        ("ETag", etag),
        ("Last-Modified", modified),
    ):
        text = _header_text(raw)
        if text is not None and "\r" not in text and "\n" not in text:
            headers[name] = text
    transport = HttpTransport(
        "http://127.0.0.1:9/pack.tpk",
        max_requests=1,
        connect_timeout_s=1.0,
        read_timeout_s=1.0,
        pool=_Answer(status, headers, body),
    )
    version = RemoteVersion(size=start + length + data[1] // 2, etag='"v1"' if data[1] & 2 else None)
    try:
        if fetch:
            got = transport.fetch(start, length, version, deadline=float("inf"))
            assert len(got) == length, (len(got), length)
        else:
            seen, got = transport.probe(length, deadline=float("inf"))
            assert len(got) == min(length, seen.size), (len(got), length, seen.size)
    except (TransientError, PermanentError, RemoteError) as exc:
        _one_line(exc)
        if isinstance(exc, TransientError | PermanentError):
            assert exc.errnum in errno.errorcode, exc.errnum
    finally:
        transport.close()


# ---- the remote cache ---------------------------------------------------------------------------------
CACHE_BLOCK = 4096
CACHE_CAPACITY = 8 * CACHE_BLOCK
_cache_files: list[str] | None = None


def _cache_layout() -> list[str]:
    """The names of the files the cache keeps in its folder, learned from the cache itself: a fresh
    folder is opened, given two blocks and closed (so a new layout needs no change here)."""
    global _cache_files
    if _cache_files is None:
        from texstream.remote.cache import BlockCache

        folder = _scratch_dir() / "cache-layout"
        cache = BlockCache(folder, CACHE_CAPACITY, CACHE_BLOCK)
        try:
            cache.adopt(3, 5, 2)
            cache.put(3, 5, 0, b"x" * CACHE_BLOCK)
            cache.put(3, 5, 1, b"y" * 100)
        finally:
            cache.close()
        _cache_files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != "lock")
    return _cache_files


CACHE_FILE_SEPARATOR = b"\xff\xfe\xfd\xfc"


def cache_folder_files(data: bytes) -> dict[str, bytes]:
    """The folder a `cache` input stands for: its parts (split at CACHE_FILE_SEPARATOR), one per
    cache file in name order; a part that is b"\\xff" alone, or missing, keeps the file out."""
    names = _cache_layout()
    parts = data.split(CACHE_FILE_SEPARATOR, len(names) - 1)
    parts += [b"\xff"] * (len(names) - len(parts))
    return {name: part for name, part in zip(names, parts, strict=True) if part != b"\xff"}


def target_cache(data: bytes) -> None:
    import shutil

    from texstream.remote import cache as cache_module

    unavailable = getattr(cache_module, "CacheUnavailable", OSError)
    folder = _scratch_dir() / "cache"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for name, content in cache_folder_files(data).items():
        (folder / name).write_bytes(content)
    try:
        cache = cache_module.BlockCache(folder, CACHE_CAPACITY, CACHE_BLOCK)
    except unavailable as exc:
        _one_line(exc)
        return
    try:
        pack_id, url_id = cache.pack_ids("http://127.0.0.1:9/pack.tpk", "1\0\0")
        for pack, url, count in ((3, 5, 2), (pack_id, url_id, 12)):  # the layout run's pack, then a new one
            cache.adopt(pack, url, count)
            blocks = np.arange(count, dtype=np.int64)
            out = np.zeros((count, CACHE_BLOCK), np.uint8)
            found = cache.read_blocks(pack, blocks, np.full(count, CACHE_BLOCK, np.int64), out)
            assert found.dtype == bool and found.shape == (count,)
        sizes = [1 + block * 300 for block in range(12)]
        for block in range(12):  # more blocks than slots: evictions
            cache.put(pack_id, url_id, block, bytes([block]) * sizes[block])
        out = np.zeros((1, CACHE_BLOCK), np.uint8)
        if cache.read_blocks(pack_id, np.array([11]), np.array([sizes[11]]), out)[0]:
            assert out[0, : sizes[11]].tobytes() == bytes([11]) * sizes[11]
        stats = cache.stats()
        assert 0 <= stats.used_bytes <= stats.capacity_bytes, stats
    finally:
        cache.close()


HDR_MAX_TEXELS = 1 << 20  # the hdr target's texel cap (the reader's own default is 64 M texels)


def _hdr_outcome(data: bytes, decoder: str) -> tuple[str, object]:
    previous = use_scanline_decoder(decoder)
    try:
        image = parse_hdr(data, "fuzz.hdr", max_texels=HDR_MAX_TEXELS)
    except SourceError as exc:
        _one_line(exc)
        return "refused", str(exc)
    finally:
        use_scanline_decoder(*previous)
    rgb = image.rgb
    assert rgb.dtype == np.float32 and rgb.ndim == 3 and rgb.shape[2] == 3, (rgb.shape, rgb.dtype)
    assert 1 <= rgb.shape[0] * rgb.shape[1] <= HDR_MAX_TEXELS
    assert bool(np.isfinite(rgb).all() and (rgb >= 0).all())  # RGBE holds finite non-negative values only
    return "image", (rgb.shape, rgb.tobytes(), image.exposure)


def target_hdr(data: bytes) -> None:
    from texstream.native import hdr_functions

    python = _hdr_outcome(data, "python")
    if hdr_functions() is not None:
        compiled = _hdr_outcome(data, "native")
        assert compiled == python, f"compiled decoder: {compiled[0]}, Python: {python[0]}"


# ---- gltf ---------------------------------------------------------------------------------------------
def target_gltf(data: bytes) -> None:
    folder = _scratch_dir() / "gltf"
    folder.mkdir(exist_ok=True)
    try:
        doc = parse_gltf(data, folder / "input.glb")
    except GltfError as exc:
        _one_line(exc)
        return
    for prim in doc.primitives:
        assert prim.positions.dtype == np.float32 and prim.positions.shape[1] == 3
        assert prim.normals.shape == prim.positions.shape
        if prim.indices is not None and prim.indices.size:
            assert int(prim.indices.max()) < len(prim.positions)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "header": target_header,
    "pack": target_pack,
    "metadata": target_metadata,
    "tile": target_tile,
    "content_range": target_content_range,
    "http": target_http,
    "cache": target_cache,
    "hdr": target_hdr,
    "gltf": target_gltf,
}


def run_one(target: str, data: bytes) -> None:
    """Feed one input to a target (what the fuzzer does per input, and the replay tests)."""
    TARGETS[target](data)
