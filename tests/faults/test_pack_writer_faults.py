"""Every file operation of the pack writer, failed in turn: one clear error, the old pack untouched."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import numpy as np

from texstream.errors import EngineError
from texstream.pack import PackHeader, PackReader, PackWriter, Supercompression, TexelFormat
from texstream.testing.faults import Fault, inject

from .sweep import same_bytes, sweep

log = logging.getLogger(__name__)

# Uncompressed RGBA8 tiles of 72² texels: ~1.8 MiB of payload, so the writer's 1 MiB buffer fills
# and writes several times before the index and header.
HEADER = PackHeader(
    width=512, height=512, tile_size=64, texel_format=TexelFormat.RGBA8, supercompression=Supercompression.NONE
)


def write_pack(path: Path) -> None:
    rng = np.random.default_rng(7)
    with PackWriter(path, HEADER, {"source": "fault sweep"}) as w:
        for level in range(HEADER.level_count):
            tx, ty = HEADER.tiles_in_level(level)
            for y in range(ty):
                for x in range(tx):
                    w.add_tile(level, x, y, rng.integers(0, 255, HEADER.tile_raw_size, dtype=np.uint8).tobytes())


def test_every_operation_of_the_pack_writer_fails_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "good.tpk"
    write_pack(out)

    def check(exc: BaseException, fault: Fault) -> None:
        assert isinstance(exc, EngineError | OSError), f"{fault}: {exc!r}"
        message = str(exc)
        assert "\n" not in message, f"{fault}: {message!r}"
        assert str(out) in message or getattr(exc, "filename", None) == str(out), f"{fault}: {message!r}"
        if isinstance(exc, OSError) and not isinstance(exc, EngineError):
            assert exc.errno in (fault.errno, errno.ENOSPC), f"{fault}: {exc!r}"

    report = sweep(lambda: write_pack(out), folder=tmp_path, check_error=check, check_output=same_bytes(out))
    log.info("pack writer: %s", report)
    assert report.kinds.keys() >= {"open", "write", "fsync", "chmod", "replace"}
    with PackReader(out) as r:
        assert r.header.tile_count == HEADER.tile_count


def test_a_fault_in_a_folder_sync_after_the_rename_keeps_the_new_pack(tmp_path: Path) -> None:
    """The rename published the pack: a failing sync of its folder is no reason to report a failure."""
    out = tmp_path / "p.tpk"
    with inject(Fault(at=2, kinds=frozenset({"fsync"}))) as log_:
        write_pack(out)
    assert [op.kind for op in log_.injected] == ["fsync"]
    assert sorted(os.listdir(tmp_path)) == ["p.tpk"]
