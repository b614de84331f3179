"""The source download with each file operation failing in turn: one error naming the file, no
temporary file left, the copy of an earlier version untouched, and the next download succeeds."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from texstream.errors import EngineError
from texstream.remote import download as download_module
from texstream.remote.download import download
from texstream.remote.nginx import LocalNginx
from texstream.testing.faults import Fault, record

from .sweep import sweep

log = logging.getLogger(__name__)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranges of 32 KiB: a 100 KiB file takes four writes."""
    monkeypatch.setattr(download_module, "CHUNK", 32 << 10)


def test_every_operation_of_a_download_fails_cleanly(
    nginx: LocalNginx, served: Path, tmp_path: Path, small_chunks: None
) -> None:
    rng = np.random.default_rng(5)
    source = served / "source.bin"
    source.write_bytes(rng.bytes(50_000))
    folder = tmp_path / "sources"
    url = nginx.url("source.bin")
    older = download(url, folder)  # the earlier version's copy: it must survive every failure
    new_bytes = rng.bytes(100_000)
    source.write_bytes(new_bytes)
    os.utime(source, (1_700_000_000, 1_700_000_000))  # another Last-Modified: another version
    target = folder / download(url, folder).path.name
    target.unlink()
    assert older.path.is_file() and older.path != target

    def check(exc: BaseException, fault: Fault) -> None:
        assert isinstance(exc, EngineError), f"{fault}: {exc!r}"
        message = str(exc)
        assert "\n" not in message, f"{fault}: {message!r}"
        assert str(target) in message or str(folder) in message, f"{fault}: {message!r}"
        assert os.strerror(fault.errno) in message, f"{fault}: {message!r}"

    def check_output() -> None:
        assert target.read_bytes() == new_bytes

    report = sweep(
        lambda: download(url, folder), folder=folder, check_error=check, check_output=check_output, reset=target.unlink
    )
    log.info("download: %s", report)
    assert report.kinds.keys() >= {"open", "pwrite", "fsync", "replace"}


def test_a_download_is_synced_before_it_is_renamed_into_place(
    nginx: LocalNginx, served: Path, tmp_path: Path, small_chunks: None
) -> None:
    """After a crash the name holds the whole file or nothing: never a file of the right size (which a
    later bake would take as downloaded) whose blocks never reached the disk."""
    (served / "s.bin").write_bytes(b"x" * 70_000)
    with record() as ops:
        got = download(nginx.url("s.bin"), tmp_path / "sources")
    kinds = [op.kind for op in ops.operations]
    assert kinds.count("pwrite") == 3
    assert "replace" in kinds
    last_write, renamed = max(i for i, k in enumerate(kinds) if k == "pwrite"), kinds.index("replace")
    assert "fsync" in kinds[last_write:renamed], kinds
    assert got.path.read_bytes() == b"x" * 70_000
