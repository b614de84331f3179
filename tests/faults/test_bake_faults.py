"""`texstream bake` and `texstream generate` with each file operation failing in turn: one line, no
half-written pack, the previous pack untouched, and the next bake succeeds."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from texstream.apps.cli import main
from texstream.remote.nginx import LocalNginx
from texstream.testing.faults import Fault, inject

from .sweep import same_bytes, sweep

log = logging.getLogger(__name__)


class CommandFailed(Exception):
    def __init__(self, code: int, stderr: str) -> None:
        super().__init__(f"exit {code}: {stderr!r}")
        self.code, self.stderr = code, stderr


@pytest.fixture
def tiny_image(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    path = tmp_path / "tiny.png"
    Image.fromarray(rng.integers(0, 255, (96, 160, 3), dtype=np.uint8)).save(path)
    return path


@pytest.mark.parametrize("command", ["bake", "generate"])
def test_every_operation_of_a_bake_fails_with_one_line(
    tmp_path: Path, tiny_image: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out_folder = tmp_path / "out"
    out_folder.mkdir()
    out = out_folder / "tiny.tpk"
    common = ["--jobs", "1", "--no-progress", "--tile", "64"]
    argv = (
        ["bake", str(tiny_image), str(out), *common]
        if command == "bake"
        else ["generate", str(out), "--size", "512", "--format", "rgba8", "--supercompression", "none", *common]
    )

    def run() -> None:
        capsys.readouterr()
        code = main(argv)
        err = capsys.readouterr().err
        if code != 0:
            raise CommandFailed(code, err)

    def check(exc: BaseException, fault: Fault) -> None:
        assert isinstance(exc, CommandFailed), f"{fault}: {exc!r}"
        assert exc.code == 1, f"{fault}: {exc}"
        lines = exc.stderr.splitlines()
        assert len(lines) == 1, f"{fault}: {exc.stderr!r}"
        line = lines[0]
        assert line.startswith(f"texstream {command}: ") and str(out) in line, f"{fault}: {line!r}"
        assert os.strerror(fault.errno) in line, f"{fault}: {line!r}"

    run()
    report = sweep(run, folder=out_folder, check_error=check, check_output=same_bytes(out))
    log.info("%s: %s", command, report)
    assert report.failed > 0


def test_a_disk_that_fills_during_a_parallel_bake_ends_it_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With worker processes running: they are stopped, the pack is not half-written, the next bake works."""
    out = tmp_path / "p.tpk"
    argv = ["generate", str(out), "--size", "600", "--jobs", "2", "--no-progress", "--tile", "64"]
    with inject(Fault(at=1, errno=errno.ENOSPC, kinds=frozenset({"write"}), persistent=True)) as log_:
        code = main(argv)
    err = capsys.readouterr().err
    assert log_.injected
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("texstream generate: ") and str(out) in err and os.strerror(errno.ENOSPC) in err, err
    assert os.listdir(tmp_path) == []
    assert main(argv) == 0 and os.listdir(tmp_path) == ["p.tpk"]


def test_every_operation_of_a_bake_from_a_url_fails_with_one_line(
    tmp_path: Path,
    tiny_image: Path,
    nginx: LocalNginx,
    served: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The download and the bake in one command: a failure in either is one line naming the file."""
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    monkeypatch.setenv("TEXSTREAM_CACHE", str(work / "cache"))
    shutil.copy(tiny_image, served / "tiny.png")
    out = work / "out" / "tiny.tpk"
    argv = ["bake", nginx.url("tiny.png"), str(out), "--jobs", "1", "--no-progress", "--tile", "64"]
    sources = work / "cache" / "sources"

    def run() -> None:
        capsys.readouterr()
        code = main(argv)
        err = capsys.readouterr().err
        if code != 0:
            raise CommandFailed(code, err)

    def check(exc: BaseException, fault: Fault) -> None:
        assert isinstance(exc, CommandFailed) and exc.code == 1, f"{fault}: {exc!r}"
        lines = exc.stderr.splitlines()
        assert len(lines) == 1, f"{fault}: {exc.stderr!r}"
        line = lines[0]
        assert line.startswith("texstream bake: "), f"{fault}: {line!r}"
        assert str(out) in line or str(sources) in line, f"{fault}: {line!r}"
        assert os.strerror(fault.errno) in line, f"{fault}: {line!r}"

    def forget_download() -> None:  # each run downloads again
        shutil.rmtree(sources)

    def keep_only_whole_downloads() -> None:
        """A bake that failed after its download keeps the downloaded file: whole, never a temporary one."""
        if sources.exists():
            for p in sources.iterdir():
                assert p.name.endswith("-tiny.png") and p.read_bytes() == tiny_image.read_bytes(), p
            forget_download()

    run()
    forget_download()
    report = sweep(
        run,
        folder=work,
        check_error=check,
        check_output=same_bytes(out),
        reset=forget_download,
        after_failure=keep_only_whole_downloads,
    )
    log.info("bake from a URL: %s", report)
    assert {"pwrite", "write", "replace"} <= report.kinds.keys()
