"""A full disk during a bake: one line naming the output and its temporary file, nothing left behind,
the previous pack at the output untouched."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pytest

from texstream.errors import EngineError
from texstream.pack import PackHeader, PackWriter, TexelFormat

ASSETS = Path(__file__).resolve().parents[2] / "assets"


class FullAfter:
    """A file that takes `room` bytes and then fails every write with ENOSPC, as a full disk does."""

    def __init__(self, fd: int, room: int) -> None:
        self.file: BinaryIO = os.fdopen(fd, "w+b", buffering=0)
        self.room = room

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self.file, name)


def _write_pack(path: Path, room: int | None) -> None:
    header = PackHeader(width=256, height=256, tile_size=64, border=4, texel_format=TexelFormat.RGBA8)
    kwargs = {} if room is None else {"open_file": lambda fd: FullAfter(fd, room)}
    rng = np.random.default_rng(1)
    with PackWriter(path, header, {"note": "x"}, **kwargs) as w:  # type: ignore[arg-type]
        for level in range(header.level_count):
            tx, ty = header.tiles_in_level(level)
            for y in range(ty):
                for x in range(tx):
                    w.add_tile(level, x, y, rng.integers(0, 255, header.tile_raw_size, np.uint8).tobytes())


@pytest.mark.parametrize("room", [0, 1000, 100_000, 300_000, 420_000])
def test_a_full_disk_names_the_file_and_leaves_the_old_pack(tmp_path: Path, room: int) -> None:
    out = tmp_path / "out.tpk"
    out.write_bytes(b"the previous pack")
    with pytest.raises(EngineError) as info:
        _write_pack(out, room)
    message = str(info.value)
    assert message.startswith(f"cannot write {out}: No space left on device (writing its temporary file .out.tpk.")
    assert message.endswith(".tmp, removed)") and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tpk"]  # no temporary file
    assert out.read_bytes() == b"the previous pack"


def test_the_sweep_reaches_every_stage(tmp_path: Path) -> None:
    """The sizes above fail from the first write (the zeroed header) to the last tiles: the whole
    pack needs more room than the largest, and a writer given room to spare writes it."""
    _write_pack(tmp_path / "whole.tpk", None)
    size = (tmp_path / "whole.tpk").stat().st_size
    assert 420_000 < size < 500_000
    _write_pack(tmp_path / "room.tpk", 2 * size)  # the header region is written twice
    assert (tmp_path / "room.tpk").read_bytes() != b"" and (tmp_path / "room.tpk").stat().st_size == size


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))


def test_the_cli_bake_names_the_file_it_could_not_write(tmp_path: Path) -> None:
    """A real bake into a file-size limit (one job: the limit would also stop the workers' shared
    memory from growing): exit 1, one line naming the output and its temporary file, nothing left."""
    done = subprocess.run(
        [sys.executable, "-m", "texstream", "bake", str(ASSETS / "astronaut.png"), "out.tpk"]
        + ["--format", "rgba8", "--jobs", "1", "--no-progress"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_file_size,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("texstream bake: cannot write out.tpk: File too large (writing its temporary file ")
    assert done.stderr.endswith(", removed)\n") and done.stderr.count("\n") == 1, done.stderr
    assert list(tmp_path.iterdir()) == []
