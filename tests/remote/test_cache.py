"""The remote block cache on bad disks and with bad files: a full disk (a real small tmpfs, where
mount namespaces are allowed), every file operation failing in turn, any byte of its table flipped,
hostile table files, damaged bytes that were cached, and a process killed without closing it."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig
from texstream.errors import PackFormatError
from texstream.pack.reader import PackReader
from texstream.remote.cache import BlockCache, CacheOp, CacheUnavailable, FailNth, fault_hook, parse_cache_files
from texstream.remote.nginx import LocalNginx

from .conftest import fast_remote

BLOCK = 16 << 10


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pack of ~60 blocks of 16 KiB, most of them past the first request's 64 KiB."""
    out = tmp_path_factory.mktemp("cache-pack") / "c.tpk"
    bake_procedural(out, 1024, "terrain", 5, BakeConfig(tile_size=64, jobs=1, progress=False))
    return out


@pytest.fixture(scope="module")
def long_index_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pack whose index (5461 tiles, 128 KiB) runs past the first request: read through the cache."""
    out = tmp_path_factory.mktemp("cache-pack") / "i.tpk"
    bake_procedural(out, 4096, "checker", 5, BakeConfig(tile_size=64, jobs=1, progress=False))
    return out


def some_tiles(reader: PackReader) -> list[bytes]:
    """Every 97th tile."""
    return [reader.read_tile(*reader.tile_position(i)) for i in range(0, reader.header.tile_count, 97)]


def tiles(reader: PackReader) -> list[bytes]:
    return [reader.read_tile(*reader.tile_position(i)) for i in range(reader.header.tile_count)]


def serve(served: Path, src: Path, name: str = "c.tpk") -> Path:
    dst = served / name
    shutil.copyfile(src, dst)
    dst.chmod(0o644)
    return dst


def digest(parts: list[bytes]) -> str:
    return hashlib.sha256(b"".join(parts)).hexdigest()


# ---- a full disk --------------------------------------------------------------------------------------
FULL_DISK_SCRIPT = textwrap.dedent(
    """
    import hashlib, os, sys
    mount, url = sys.argv[1], sys.argv[2]
    with open(os.path.join(mount, "filler"), "wb") as f:  # leave 64 KiB free
        st = os.statvfs(mount)
        f.write(b"x" * (st.f_bavail * st.f_frsize - (64 << 10)))
    from texstream.config import RemoteConfig
    from texstream.pack.reader import PackReader
    cfg = RemoteConfig(cache_dir=os.path.join(mount, "remote"), block_kb=16, connect_timeout_s=2.0)
    with PackReader(url, cfg) as r:  # the default 1 GiB bound: a table far larger than what is free
        data = [r.read_tile(*r.tile_position(i)) for i in range(r.header.tile_count)]
    print(hashlib.sha256(b"".join(data)).hexdigest())
    """
)


def _namespace_prefix(mount: Path) -> list[str]:
    """A command prefix running in a private mount namespace with a 4 MiB tmpfs at `mount`; skips
    where user or mount namespaces (or the unshare tool) are not available."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed")
    prefix = [
        unshare,
        "--user",
        "--map-root-user",
        "--mount",
        "sh",
        "-c",
        'mount -t tmpfs -o size=4m tmpfs "$0" && exec "$@"',
        str(mount),
    ]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {probe.stderr.strip()}")
    return prefix


def test_a_full_disk_runs_without_the_cache_never_kills(
    nginx: LocalNginx, served: Path, pack: Path, tmp_path: Path
) -> None:
    serve(served, pack)
    mount = tmp_path / "small-disk"
    mount.mkdir()
    prefix = _namespace_prefix(mount)
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK_SCRIPT)
    run = subprocess.run(
        [*prefix, sys.executable, str(script), str(mount), nginx.url("c.tpk")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"exit {run.returncode} ({-run.returncode if run.returncode < 0 else ''}): {run.stderr}"
    with PackReader(pack) as local:
        assert run.stdout.strip() == digest(tiles(local))
    cache_lines = [line for line in run.stderr.splitlines() if "cache" in line]
    assert len(cache_lines) == 1 and "without a disk cache" in cache_lines[0], run.stderr
    assert "No space left on device" in cache_lines[0] and "Traceback" not in run.stderr


# ---- every file operation failing in turn ---------------------------------------------------------------
def _cold_then_warm(url: str, cache: Path) -> list[list[bytes]]:
    cfg = fast_remote(cache, block_kb=16, cache_mb=0.5)  # 32 slots: eviction and a snapshot on the way
    out = []
    for _ in range(2):
        with PackReader(url, cfg) as r:
            out.append([r.read_tile(*r.tile_position(i)) for i in range(0, r.header.tile_count, 13)])
    return out


class _CountOps:
    def __init__(self) -> None:
        self.counts: dict[CacheOp, int] = {}

    def __call__(self, op: CacheOp, path: str) -> None:
        self.counts[op] = self.counts.get(op, 0) + 1


@pytest.mark.parametrize("errnum", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_each_failing_file_operation_turns_the_cache_off_once(
    nginx: LocalNginx, served: Path, pack: Path, tmp_path: Path, errnum: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The first, second and last operation of each kind fails in turn: every read still right, one
    warning naming the error, no temporary file left, and the folder usable by the next open."""
    serve(served, pack)
    url = nginx.url("c.tpk")
    expect = _cold_then_warm(url, tmp_path / "clean")
    with fault_hook(_CountOps()) as counting:
        _cold_then_warm(url, tmp_path / "count")
    assert set(counting.counts) == {
        CacheOp.OPEN,
        CacheOp.PREAD,
        CacheOp.PWRITE,
        CacheOp.FSYNC,
        CacheOp.RENAME,
        CacheOp.TRUNCATE,
    }
    for op, total in counting.counts.items():
        for n in sorted({1, 2, total}):
            folder = tmp_path / f"cache-{op.value}-{n}"
            hook = FailNth(n, errnum, frozenset({op}))
            caplog.clear()
            with caplog.at_level(logging.WARNING), fault_hook(hook):
                assert _cold_then_warm(url, folder) == expect, f"{op} {n}: {hook.failed}"
            assert hook.failed is not None
            warned = [m for m in caplog.messages if "disk cache" in m]
            assert len(warned) == 1 and os.strerror(errnum) in warned[0], (op, n, caplog.messages)
            assert not list(folder.glob("*.tmp")), f"{op} {n} left a temporary file"
            with PackReader(url, fast_remote(folder, block_kb=16, cache_mb=0.5)) as again:  # usable again
                assert again.remote is not None and again.remote.stats().cache is not None
                assert [
                    again.read_tile(*again.tile_position(i)) for i in range(0, again.header.tile_count, 13)
                ] == expect[0]


# ---- damaged files --------------------------------------------------------------------------------------
FILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import numpy as np
    from texstream.remote.cache import BlockCache
    folder, blocks, kill = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "kill"
    cache = BlockCache(folder, 8 * 16384, 16384)
    pack_id, url_id = BlockCache.pack_ids("http://example.invalid/p.tpk", "v1")
    cache.adopt(pack_id, url_id, blocks)
    rng = np.random.default_rng(3)
    data = [rng.integers(0, 256, 16384, np.uint8).tobytes() for _ in range(blocks)]
    cache.put(pack_id, url_id, 0, b"".join(data[:4]))  # one write of four blocks
    cache.put(pack_id, url_id, 5, data[5])
    if kill:  # as if the process died: the table is only in the journal
        os.kill(os.getpid(), signal.SIGKILL)
    cache.close()
    """
)


def _filled_cache(folder: Path, blocks: int, kill: bool) -> tuple[int, list[bytes]]:
    """Blocks 0-3 and 5 cached by another process (killed before closing, or closed)."""
    run = subprocess.run(
        [sys.executable, "-c", FILL_SCRIPT, str(folder), str(blocks), "kill" if kill else "close"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == (-signal.SIGKILL if kill else 0), run.stderr
    rng = np.random.default_rng(3)
    data = [rng.integers(0, 256, BLOCK, np.uint8).tobytes() for _ in range(blocks)]
    return BlockCache.pack_ids("http://example.invalid/p.tpk", "v1")[0], data


def _read_all(folder: Path, pack_id: int, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    cache = BlockCache(folder, 8 * BLOCK, BLOCK)
    try:
        cache.adopt(pack_id, 1, blocks)
        out = np.zeros((blocks, BLOCK), np.uint8)
        found = cache.read_blocks(pack_id, np.arange(blocks), np.full(blocks, BLOCK), out)
    finally:
        cache.close()
    return found, out


@pytest.mark.parametrize("kill", [False, True], ids=["snapshot", "journal"])
def test_any_flipped_byte_of_the_table_is_a_miss_never_wrong_bytes(tmp_path: Path, kill: bool) -> None:
    folder = tmp_path / "cache"
    pack_id, data = _filled_cache(folder, 6, kill)
    table = ("index.dat", "journal.dat")
    saved = {name: (folder / name).read_bytes() for name in table if (folder / name).exists()}
    assert ("index.dat" in saved) != kill
    found, _ = _read_all(folder, pack_id, 6)
    assert found.tolist() == [True, True, True, True, False, True]
    for name, original in saved.items():
        for at in range(0, len(original), 5):  # a byte of every field of every record and header
            for other in table:
                (folder / other).unlink(missing_ok=True)
            for other, content in saved.items():
                (folder / other).write_bytes(content)
            damaged = bytearray(original)
            damaged[at] ^= 0x41
            (folder / name).write_bytes(damaged)
            found, out = _read_all(folder, pack_id, 6)
            for b in np.flatnonzero(found).tolist():
                assert out[b].tobytes() == data[b], f"{name} byte {at}: block {b} came back wrong"


def test_table_files_from_anywhere_parse_without_error() -> None:
    rng = np.random.default_rng(9)
    for size in (0, 1, 39, 40, 41, 88, 432, 433, 5000):
        for _ in range(20):
            junk = rng.integers(0, 256, size, np.uint8).tobytes()
            image = parse_cache_files(junk, junk, block_bytes=BLOCK, slots=8)
            assert image.entries.size == 8 and not (image.entries["pack"] != 0).any()
    image = parse_cache_files(None, None, block_bytes=BLOCK, slots=8)
    assert image.generation == 0 and not image.journal_ok


def test_bytes_flipped_in_the_slab_are_fetched_again(
    nginx: LocalNginx, served: Path, long_index_pack: Path, tmp_path: Path
) -> None:
    serve(served, long_index_pack)
    cache = tmp_path / "cache"
    cfg = fast_remote(cache, block_kb=16)
    with PackReader(nginx.url("c.tpk"), cfg) as r:
        expect = some_tiles(r)
        index_end = r.header.index_offset + r.header.tile_count * 24
    assert index_end > 6 * BLOCK  # past the first request: the index is read through the cache
    slab = cache / "blocks.dat"
    raw = bytearray(slab.read_bytes())
    for at in range(0, len(raw), 97):  # bytes flipped all over the slab between runs
        raw[at] ^= 0x10
    slab.write_bytes(raw)
    with PackReader(nginx.url("c.tpk"), cfg) as r:
        assert some_tiles(r) == expect
        assert r.remote is not None and r.remote.stats().cache_misses > 0


def test_damaged_bytes_that_were_cached_are_fetched_again(
    nginx: LocalNginx, served: Path, long_index_pack: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server once served a damaged index (same version: size and time unchanged), which went into
    the cache; once the server serves the right bytes again the pack opens, without clearing the cache."""
    good = long_index_pack.read_bytes()
    with PackReader(long_index_pack) as local:
        expect = some_tiles(local)
        index_at = local.header.index_offset
    served_file = serve(served, long_index_pack)
    stamp = served_file.stat()
    damaged = bytearray(good)
    damaged[index_at + 100_000] ^= 0xFF  # a block past the first request
    served_file.write_bytes(damaged)
    os.utime(served_file, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    cfg = fast_remote(tmp_path / "cache", block_kb=16)
    with pytest.raises(PackFormatError, match="index"):
        PackReader(nginx.url("c.tpk"), cfg)  # fetched once more, still damaged: corrupt
    served_file.write_bytes(good)
    os.utime(served_file, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    with caplog.at_level(logging.WARNING), PackReader(nginx.url("c.tpk"), cfg) as r:
        assert some_tiles(r) == expect
    assert any("read again from the server" in m for m in caplog.messages)


# ---- a killed process ---------------------------------------------------------------------------------
def test_blocks_cached_by_a_killed_process_are_found(
    nginx: LocalNginx, served: Path, pack: Path, tmp_path: Path
) -> None:
    serve(served, pack)
    cache = tmp_path / "cache"
    script = textwrap.dedent(
        f"""
        import os, signal
        from texstream.pack.reader import PackReader
        from tests.remote.conftest import fast_remote
        r = PackReader({nginx.url("c.tpk")!r}, fast_remote({str(cache)!r}, block_kb=16))
        for i in range(r.header.tile_count):
            r.read_tile(*r.tile_position(i))
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert not (cache / "index.dat").exists()  # never closed: everything is in the journal
    with PackReader(nginx.url("c.tpk"), fast_remote(cache, block_kb=16)) as r, PackReader(pack) as local:
        assert tiles(r) == tiles(local)
        s = r.remote.stats()
        assert s.requests == 1 and s.cache_misses == 0 and s.cache_hits > 0


def test_odd_files_in_the_folder_never_hang_or_crash(tmp_path: Path) -> None:
    """A FIFO named like the snapshot is ignored (never opened for a blocking read) and replaced; a
    symlink named like the journal makes the folder unavailable (one clear reason), not followed."""
    folder = tmp_path / "cache"
    folder.mkdir()
    os.mkfifo(folder / "index.dat")
    cache = BlockCache(folder, 8 * BLOCK, BLOCK)
    pack_id, url_id = BlockCache.pack_ids("http://example.invalid/p.tpk", "v1")
    cache.adopt(pack_id, url_id, 2)
    cache.put(pack_id, url_id, 0, b"\1" * BLOCK)
    cache.close()
    assert (folder / "index.dat").is_file()
    found, out = _read_all(folder, pack_id, 2)
    assert found.tolist() == [True, False] and out[0].tobytes() == b"\1" * BLOCK
    (folder / "journal.dat").unlink()
    (folder / "journal.dat").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CacheUnavailable, match=r"journal\.dat: Too many levels of symbolic links"):
        BlockCache(folder, 8 * BLOCK, BLOCK)
    assert not (tmp_path / "elsewhere").exists()
