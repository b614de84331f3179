"""Hostile files and the writer's file hygiene: sizes checked before anything is allocated, special
files refused at open, bounded metadata JSON, position-bound tile checks, modes and stale temps."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import xxhash

from texstream.errors import PackFormatError, TileCorruptError
from texstream.pack import PackHeader, PackReader, PackWriter, Supercompression, TexelFormat
from texstream.pack.extract import write_image
from texstream.pack.format import (
    HEADER_SIZE,
    INDEX_DTYPE,
    MAX_LEVELS,
    MAX_TILES,
    pack_header_bytes,
    position_mix,
)
from texstream.pack.reader import METADATA_MAX_DEPTH, parse_metadata
from texstream.pack.writer import remove_stale_temps

from .test_pack import _edit_header, make_pack, resign


@pytest.fixture
def pack(tmp_path: Path) -> tuple[Path, PackHeader, dict]:
    h = PackHeader(width=300, height=150, tile_size=64, supercompression=Supercompression.ZSTD)
    p = tmp_path / "p.tpk"
    return p, h, make_pack(p, h)


def _index_bounds(h: PackHeader) -> tuple[int, int]:
    return h.index_offset, h.index_offset + h.tile_count * INDEX_DTYPE.itemsize


def to_version_1(data: bytearray, h: PackHeader) -> bytearray:
    """What a version-1 writer made of the same tiles: bare xxh3-64 checks in the index, version 1."""
    a, b = _index_bounds(h)
    index = np.frombuffer(bytes(data[a:b]), INDEX_DTYPE).copy()
    index["checksum"] ^= position_mix(np.arange(index.size))
    data[a:b] = index.tobytes()
    return _edit_header(data, version=1)


# ---- 1. sizes checked against the file before any allocation ---------------------------------------
# Peak RSS from VmHWM, which starts afresh at exec: ru_maxrss survives exec, so a child forked from a
# large test process would report the parent's size.
_RSS_PROBE = """
import sys
from texstream.errors import PackFormatError
from texstream.pack import PackReader
try:
    PackReader(sys.argv[1])
except PackFormatError as exc:
    print(exc)
with open("/proc/self/status") as f:
    print(next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) // 1024)
"""


def _open_in_child(path: Path) -> tuple[str, int]:
    """(error message, peak RSS in MiB) of opening `path` in a fresh process."""
    res = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    message, rss = res.stdout.strip().splitlines()
    return message, int(rss)


def test_sparse_file_under_a_huge_plausible_index_fails_on_its_first_entries(tmp_path: Path) -> None:
    # 400000^2 texels in 64-texel tiles: 52M tiles, a 1.25 GB index; the 2.1 GB sparse file is large
    # enough for it, but every entry reads as zero. The index used to be read whole (>1 GiB RSS).
    h = PackHeader(width=400_000, height=400_000, tile_size=64, supercompression=Supercompression.LZ4)
    size = 2_100_000_000
    level_bytes = h.level_table.tobytes()
    head = pack_header_bytes(
        h,
        metadata_offset=size,
        metadata_size=0,
        payload_end=size,
        index_checksum=1,
        level_checksum=xxhash.xxh3_64_intdigest(level_bytes),
    )
    p = tmp_path / "sparse.tpk"
    with p.open("wb") as f:
        f.write(head + level_bytes)
        f.truncate(size)
    message, rss = _open_in_child(p)
    assert str(p) in message and "index entry of tile (0, 0, 0): raw size 0" in message
    assert rss < 400, f"{rss} MiB resident opening a sparse file"


def test_valid_pack_extended_by_a_sparse_tail_names_the_real_problem(pack: tuple[Path, PackHeader, dict]) -> None:
    p, _, _ = pack
    end = p.stat().st_size
    os.truncate(p, 2_100_000_000)
    message, rss = _open_in_child(p)
    assert str(p) in message and f"ends at {end:,}" in message and "unknown bytes after it" in message
    assert rss < 400


def test_zero_file_is_not_a_pack(tmp_path: Path) -> None:
    p = tmp_path / "zeros.tpk"
    with p.open("wb") as f:
        f.truncate(2_100_000_000)
    with pytest.raises(PackFormatError, match="not a texstream pack"):
        PackReader(p)


def test_header_needing_more_bytes_than_the_file_has(pack: tuple[Path, PackHeader, dict]) -> None:
    p, h, _ = pack
    data = bytearray(p.read_bytes())
    # A geometry 1600x as large, with consistent offsets: its index alone runs past this small file.
    big = PackHeader(width=12000, height=6000, tile_size=64, supercompression=Supercompression.ZSTD)
    data = _edit_header(
        data,
        width=12000,
        height=6000,
        levels=big.level_count,
        index_off=big.index_offset,
        tile_count=big.tile_count,
        payload_off=big.payload_offset,
    )
    p.write_bytes(bytes(data))
    with pytest.raises(PackFormatError, match=r"takes at least [\d,]+ \(truncated\?\)"):
        PackReader(p)


def test_uncompressed_pack_must_hold_every_raw_tile(tmp_path: Path) -> None:
    h = PackHeader(width=256, height=256, tile_size=64, supercompression=Supercompression.NONE)
    p = tmp_path / "u.tpk"
    make_pack(p, h)
    data = bytearray(p.read_bytes())
    with PackReader(p) as r:
        cut = r.payload_end - h.tile_raw_size  # one raw tile short, header re-signed to match
    del data[cut:]
    p.write_bytes(bytes(_edit_header(data, payload_end=cut, meta_size=0, meta_off=cut)))
    with pytest.raises(PackFormatError, match="takes at least"):
        PackReader(p)


# ---- 2. sizes the format and the streamer cannot hold ----------------------------------------------
def test_format_level_cap_is_the_streamers() -> None:
    from texstream.runtime.tiles import MAX_IDS
    from texstream.runtime.tiles import MAX_LEVELS as RUNTIME_LEVELS

    assert MAX_LEVELS == RUNTIME_LEVELS and MAX_TILES < MAX_IDS


@pytest.mark.parametrize(
    "width, tile, match",
    [
        (1 << 24, 64, "needs 19 levels; the streamer holds at most 16"),
        (4_000_000, 128, r"is 1,302,102,809 tiles; a pack holds at most 67,108,864"),
        (1 << 20, 128, "a pack holds at most"),
    ],
)
def test_header_refuses_what_cannot_be_streamed(width: int, tile: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PackHeader(width=width, height=width, tile_size=tile)


def test_reader_refuses_a_huge_header_in_one_line(pack: tuple[Path, PackHeader, dict]) -> None:
    p, _, _ = pack
    # 2^20 x 2^20 in 128-texel tiles: 14 levels (streamable) but 89M tiles.
    p.write_bytes(bytes(_edit_header(bytearray(p.read_bytes()), width=1 << 20, height=1 << 20, tile=128, levels=14)))
    with pytest.raises(PackFormatError, match="invalid header: .* a pack holds at most") as info:
        PackReader(p)
    assert "\n" not in str(info.value)


def test_writer_refuses_a_huge_header_before_making_a_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at most"):
        PackWriter(tmp_path / "x.tpk", PackHeader(width=4_000_000, height=4_000_000))
    assert list(tmp_path.iterdir()) == []


# ---- 3. metadata JSON with depth and number limits -------------------------------------------------
def _with_metadata(p: Path, meta: bytes) -> None:
    with PackReader(p) as r:
        end = r.payload_end
    data = bytearray(p.read_bytes())
    data[end:] = meta
    p.write_bytes(bytes(_edit_header(data, meta_size=len(meta), meta_off=end)))


@pytest.mark.parametrize(
    "meta, match",
    [
        (b"[" * 100_000, "nests 100000 deep"),
        (b'{"a": ' + b"[" * 65 + b"]" * 65 + b"}", "nests 66 deep"),
        (b'{"n": ' + b"9" * 500_000 + b"}", "500000-character number"),
        (b'{"n": -1.' + b"5" * 5000 + b"}", "character number"),
        (b'{"a": "\xff"}', "UTF-8"),
        (b'{"a": 1', "not valid JSON"),
        (b"[1, 2]", "JSON object"),
    ],
)
def test_hostile_metadata_is_a_one_line_pack_error(
    pack: tuple[Path, PackHeader, dict], meta: bytes, match: str
) -> None:
    p, _, _ = pack
    _with_metadata(p, meta)
    with pytest.raises(PackFormatError, match=match) as info:
        PackReader(p)
    assert "\n" not in str(info.value)


def test_metadata_within_the_limits_reads(pack: tuple[Path, PackHeader, dict]) -> None:
    p, _, _ = pack
    deep = b"[" * (METADATA_MAX_DEPTH - 1) + b"]" * (METADATA_MAX_DEPTH - 1)
    meta = b'{"s": "[[[[{{{{\\"[[[[\\\\", "deep": ' + deep + b', "n": 12345678901234567890, "f": -2.5e-3}'
    _with_metadata(p, meta)
    with PackReader(p) as r:
        assert r.metadata["s"] == '[[[[{{{{"[[[[\\' and r.metadata["n"] == 12345678901234567890
        assert r.metadata["f"] == -2.5e-3 and isinstance(r.metadata["deep"], list)


def test_metadata_depth_ignores_brackets_inside_strings() -> None:
    assert parse_metadata(b'{"a": "' + b"[" * 10_000 + b'"}') == {"a": "[" * 10_000}
    with pytest.raises(PackFormatError, match="deep"):  # an escaped quote does not end the string
        parse_metadata(b'{"a": "\\"", "b": ' + b"[" * 100 + b"]" * 100 + b"}")


# ---- 4. special files refused at open, never a hang -------------------------------------------------
def _open_with_deadline(path: Path, seconds: float = 10.0) -> BaseException | None:
    result: list[BaseException | None] = []

    def go() -> None:
        try:
            PackReader(path).close()
            result.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            result.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert result, f"opening {path} did not return within {seconds} s"
    return result[0]


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.tpk"
    os.mkfifo(fifo)
    exc = _open_with_deadline(fifo)
    assert isinstance(exc, PackFormatError) and "is a FIFO, not a file" in str(exc)


@pytest.mark.parametrize("where, what", [("dir", "a folder"), ("/dev/zero", "a character device")])
def test_folders_and_devices_are_refused(tmp_path: Path, where: str, what: str) -> None:
    path = tmp_path if where == "dir" else Path(where)
    if not path.exists():
        pytest.skip(f"{path} does not exist here")
    exc = _open_with_deadline(path)
    assert isinstance(exc, PackFormatError) and f"is {what}, not a file" in str(exc)


# ---- 5. the tile check binds the tile's position (version 2) ----------------------------------------
def test_position_mix_is_splitmix64_of_i_plus_1() -> None:
    def ref(i: int) -> int:
        m = (1 << 64) - 1
        z = (i + 1) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    got = position_mix(np.array([0, 1, 2, 12345, MAX_TILES - 1]))
    assert got.dtype == np.uint64 and [int(v) for v in got] == [ref(i) for i in (0, 1, 2, 12345, MAX_TILES - 1)]


def test_index_interface_is_the_raw_checksum(pack: tuple[Path, PackHeader, dict]) -> None:
    p, h, tiles = pack
    with PackReader(p) as r:
        assert r.version == 2 and not r.index.flags.writeable and r.index.dtype == INDEX_DTYPE
        for (lv, x, y), raw in tiles.items():
            assert int(r.index["checksum"][h.tile_index(lv, x, y)]) == xxhash.xxh3_64_intdigest(raw)
            assert r.entry(lv, x, y).checksum == xxhash.xxh3_64_intdigest(raw)
    a, b = _index_bounds(h)
    on_disk = np.frombuffer(p.read_bytes()[a:b], INDEX_DTYPE)
    assert not np.array_equal(on_disk["checksum"], r.index["checksum"])  # stored mixed


def test_swapped_index_entries_are_both_caught(pack: tuple[Path, PackHeader, dict]) -> None:
    p, h, tiles = pack
    i, j = h.tile_index(0, 1, 0), h.tile_index(1, 0, 1)
    a, b = _index_bounds(h)
    data = bytearray(p.read_bytes())
    index = np.frombuffer(bytes(data[a:b]), INDEX_DTYPE).copy()
    index[[i, j]] = index[[j, i]]
    data[a:b] = index.tobytes()
    p.write_bytes(bytes(resign(data)))  # the index checksum is resealed: only the binding can tell
    with PackReader(p) as r:
        bad = r.verify()
        assert sorted((lv, x, y) for lv, x, y, _ in bad) == [(0, 1, 0), (1, 0, 1)]
        assert all("checksum mismatch" in why for *_, why in bad)
        with pytest.raises(TileCorruptError, match="checksum"):
            r.read_tile(0, 1, 0)
        assert r.read_tile(0, 0, 0) == tiles[(0, 0, 0)]
        # What the I/O threads compare: the raw tile at an entry's offset against its index check.
        e = r.entry(0, 1, 0)
        stored = os.pread(r.fileno(), e.stored_size, e.offset)
        import zstandard

        assert xxhash.xxh3_64_intdigest(zstandard.ZstdDecompressor().decompress(stored)) != e.checksum


def test_version_1_packs_still_read(pack: tuple[Path, PackHeader, dict]) -> None:
    p, h, tiles = pack
    p.write_bytes(bytes(to_version_1(bytearray(p.read_bytes()), h)))
    with PackReader(p) as r:
        assert r.version == 1 and r.verify() == []
        for (lv, x, y), raw in tiles.items():
            assert r.read_tile(lv, x, y) == raw
            assert r.entry(lv, x, y).checksum == xxhash.xxh3_64_intdigest(raw)


def test_v1_index_read_as_v2_fails_every_tile(pack: tuple[Path, PackHeader, dict]) -> None:
    p, h, _ = pack
    data = to_version_1(bytearray(p.read_bytes()), h)
    p.write_bytes(bytes(_edit_header(data, version=2)))
    with PackReader(p) as r:
        assert len(r.verify()) == h.tile_count


# ---- 6. output modes follow the umask ----------------------------------------------------------------
@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_outputs_get_0666_less_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        out = tmp_path / "m.tpk"
        make_pack(out, PackHeader(width=64, height=64, tile_size=64, texel_format=TexelFormat.BC1))
        img = tmp_path / "m.png"
        write_image(np.zeros((4, 4, 4), np.uint8), img)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == mode
    assert stat.S_IMODE(img.stat().st_mode) == mode


# ---- 7. temporary files carry the writer's pid; dead writers' are removed ----------------------------
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temp_name_carries_the_pid(tmp_path: Path) -> None:
    h = PackHeader(width=64, height=64, tile_size=64)
    w = PackWriter(tmp_path / "o.tpk", h)
    try:
        assert w._tmp.name.startswith(f".o.tpk.{os.getpid()}.") and w._tmp.name.endswith(".tmp")
    finally:
        w.abort()


def test_stale_temps_of_dead_writers_removed_live_ones_kept(tmp_path: Path) -> None:
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = _dead_pid()
        names = {
            "dead": f".o.tpk.{dead}.abc_12.tmp",
            "live": f".o.tpk.{live.pid}.k3j9x.tmp",
            "mine": f".o.tpk.{os.getpid()}.zz9.tmp",
            "other output": f".other.tpk.{dead}.abc.tmp",
            "no pid": ".o.tpk.q8w7e6r5.tmp",
            "not a temp": f".o.tpk.{dead}.abc.keep",
        }
        for name in names.values():
            (tmp_path / name).write_bytes(b"partial")
        assert remove_stale_temps(tmp_path / "o.tpk") == [tmp_path / names["dead"]]
        left = {p.name for p in tmp_path.iterdir()}
        assert left == set(names.values()) - {names["dead"]}
    finally:
        live.kill()
        live.wait()


def test_a_writer_killed_outright_leaves_a_temp_the_next_writer_removes(tmp_path: Path) -> None:
    out = tmp_path / "k.tpk"
    script = (
        "import os, signal, sys\n"
        "from texstream.pack import PackHeader, PackWriter\n"
        "h = PackHeader(width=256, height=256, tile_size=64)\n"
        "w = PackWriter(sys.argv[1], h)\n"
        "w.add_tile(0, 0, 0, bytes(h.tile_raw_size))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    res = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, timeout=120)
    assert res.returncode == -signal.SIGKILL
    stale = list(tmp_path.iterdir())
    assert len(stale) == 1 and stale[0].name.startswith(".k.tpk.") and stale[0].name.endswith(".tmp")
    make_pack(out, PackHeader(width=64, height=64, tile_size=64))
    assert [p.name for p in tmp_path.iterdir()] == ["k.tpk"]
    assert PackReader(out).verify() == []


def test_header_bytes_version_must_be_known() -> None:
    h = PackHeader(width=64, height=64, tile_size=64)
    body = pack_header_bytes(
        h, metadata_offset=0, metadata_size=0, payload_end=0, index_checksum=0, level_checksum=0, version=7
    )
    assert len(body) == HEADER_SIZE
    from texstream.pack.format import parse_header_bytes

    with pytest.raises(
        PackFormatError,
        match=r"written by a newer texstream \(format 7; this one reads formats up to 3\): upgrade texstream$",
    ):
        parse_header_bytes(body, 1 << 20)


# ---- files that are not packs say how to make one -----------------------------------------------
@pytest.mark.parametrize(
    ("first_bytes", "kind"),
    [
        (b"\x89PNG\r\n\x1a\n" + bytes(200), "a PNG image"),
        (b"\xff\xd8\xff\xe0" + bytes(200), "a JPEG image"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 " + bytes(200), "a WebP image"),
    ],
)
def test_an_image_given_as_a_pack_points_to_bake(tmp_path: Path, first_bytes: bytes, kind: str) -> None:
    p = tmp_path / "photo.tpk"
    p.write_bytes(first_bytes)
    with pytest.raises(PackFormatError) as info:
        PackReader(p)
    assert (
        str(info.value) == f"{p}: not a texstream pack but {kind}; bake it into one first: texstream bake SRC OUT.tpk"
    )


@pytest.mark.parametrize("content", [os.urandom(4096), b"hello\n"], ids=["random", "short"])
def test_any_other_file_points_to_bake_without_its_bytes(tmp_path: Path, content: bytes) -> None:
    p = tmp_path / "thing.tpk"
    p.write_bytes(content)
    with pytest.raises(PackFormatError) as info:
        PackReader(p)
    assert str(info.value) == f"{p}: not a texstream pack; packs are made with: texstream bake SRC OUT.tpk"


def test_a_pack_from_a_newer_texstream_says_upgrade(tmp_path: Path) -> None:
    p = tmp_path / "future.tpk"
    make_pack(p, PackHeader(width=64, height=64, tile_size=64))
    p.write_bytes(_edit_header(bytearray(p.read_bytes()), version=9))
    with pytest.raises(PackFormatError) as info:
        PackReader(p)
    assert (
        str(info.value)
        == f"{p}: written by a newer texstream (format 9; this one reads formats up to 3): upgrade texstream"
    )
