"""The fault-injection hook itself: which operation fails, with what, and nothing once it is off."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from texstream import _io
from texstream.testing.faults import Fault, inject, record

OPERATIONS = sorted(set(_io.__all__) - {"FaultHook", "hooked", "set_fault_hook", "sync_folder"})


def test_outside_a_block_the_operations_are_the_plain_functions(tmp_path: Path) -> None:
    plain = {name: getattr(_io, name) for name in OPERATIONS}
    assert (plain["pwrite"], plain["fsync"], plain["replace"], plain["open"]) == (
        os.pwrite,
        os.fsync,
        os.replace,
        os.open,
    )
    with inject(Fault(at=1)):
        assert [name for name in OPERATIONS if getattr(_io, name) is plain[name]] == []  # every one checked
    assert {name: getattr(_io, name) for name in OPERATIONS} == plain  # and every one back
    with pytest.raises(ZeroDivisionError), inject(Fault(at=5)):
        1 / 0  # noqa: B018 - an error inside the block takes the hook off too
    assert _io.pwrite is os.pwrite and not _io.hooked()


def test_the_nth_operation_of_a_kind_fails_with_the_chosen_errno(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        with inject(Fault(at=3, errno=errno.ENOSPC, kinds=frozenset({"pwrite"}))) as log:
            _io.fsync(fd)  # another kind: not counted
            assert _io.pwrite(fd, b"a", 0) == 1
            assert _io.pwrite(fd, b"b", 1) == 1
            with pytest.raises(OSError) as raised:
                _io.pwrite(fd, b"c", 2)
            assert _io.pwrite(fd, b"d", 3) == 1  # once: the fourth goes through
        assert raised.value.errno == errno.ENOSPC and raised.value.filename is None  # as write(2) reports it
        assert [(op.kind, op.failed) for op in log.operations] == [
            ("fsync", False),
            ("pwrite", False),
            ("pwrite", False),
            ("pwrite", True),
            ("pwrite", False),
        ]
        assert os.pread(fd, 8, 0) == b"ab\0d"
    finally:
        os.close(fd)


def test_a_persistent_fault_fails_every_operation_from_the_nth_on(tmp_path: Path) -> None:
    with inject(Fault(at=2, errno=errno.EDQUOT, persistent=True)) as log:
        _io.makedirs(tmp_path / "a")
        for name in ("b", "c"):
            with pytest.raises(OSError) as raised:
                _io.makedirs(tmp_path / name)
            assert raised.value.errno == errno.EDQUOT and raised.value.filename == str(tmp_path / name)
    assert [op.failed for op in log.operations] == [False, True, True]
    assert sorted(os.listdir(tmp_path)) == ["a"]


def test_a_buffered_file_fails_where_its_bytes_reach_the_disk(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    with inject(Fault(at=1, errno=errno.ENOSPC, kinds=frozenset({"write"}))) as log:
        f = _io.fdopen(fd, "w+b", buffering=1 << 16)
        f.write(b"x" * 100)  # buffered: no write(2) yet
        assert log.count() == 0
        with pytest.raises(OSError) as raised:
            f.flush()
        f.close()
    assert raised.value.errno == errno.ENOSPC
    assert log.count({"write"}) >= 1 and log.injected[0].kind == "write"


def test_a_dry_run_counts_without_failing(tmp_path: Path) -> None:
    with record() as log:
        fd, name = _io.mkstemp(dir=tmp_path)
        _io.pwrite(fd, b"abc", 0)
        _io.fsync(fd)
        os.close(fd)
        _io.replace(name, tmp_path / "done")
    assert [op.kind for op in log.operations] == ["open", "pwrite", "fsync", "replace"]
    assert log.injected == [] and (tmp_path / "done").read_bytes() == b"abc"


def test_one_injection_at_a_time() -> None:
    with inject(None), pytest.raises(RuntimeError, match="already active"), inject(Fault(at=1)):
        pass
    assert not _io.hooked()


def test_faults_are_refused_with_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown operation kinds"):
        Fault(at=1, kinds=frozenset({"wirte"}))
    with pytest.raises(ValueError, match="counts from 1"):
        Fault(at=0)


def test_injected_errors_name_what_the_system_call_would(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a")
    with inject(Fault(at=1, kinds=frozenset({"replace"}))), pytest.raises(OSError) as raised:
        _io.replace(tmp_path / "a", tmp_path / "b")
    assert (raised.value.filename, raised.value.filename2) == (str(tmp_path / "a"), str(tmp_path / "b"))
    assert (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    with inject(Fault(at=1, errno=errno.EACCES)), pytest.raises(PermissionError) as denied:
        _io.open(tmp_path / "c", os.O_RDWR | os.O_CREAT)
    assert denied.value.filename == str(tmp_path / "c") and not (tmp_path / "c").exists()
