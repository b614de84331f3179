"""`texstream bake FILE.dds|FILE.ktx2` and `texstream export`, through the command line's main()."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from texstream.apps.cli import main
from texstream.pack.format import TexelFormat
from texstream.pack.reader import PackReader

from .files import block_levels, hdr_picture, picture, write_dds, write_ktx2
from .ktx2_spec import check_ktx2

F = TexelFormat


@pytest.fixture
def bc7_dds(tmp_path: Path) -> Path:
    return write_dds(tmp_path / "in.dds", F.BC7, 128, 128, block_levels(F.BC7, picture(128, 128), 8), srgb=True)


def test_bake_a_dds_copies_its_blocks(tmp_path: Path, bc7_dds: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.tpk"
    assert main(["bake", str(bc7_dds), str(out), "--tile", "64", "--address", "wrap", "--no-progress"]) == 0
    assert "2 copied without re-encoding" in capsys.readouterr().out
    with PackReader(out) as r:
        assert r.header.texel_format is F.BC7 and r.header.srgb and r.header.level_count == 2
        assert r.metadata["levels_copied"] == [0, 1] and r.metadata["source_format"] == "BC7_UNORM_SRGB"


def test_bake_a_ktx2_named_otherwise_is_recognised_by_its_identifier(tmp_path: Path) -> None:
    src = write_ktx2(tmp_path / "texture.bin", F.BC4, 64, 64, block_levels(F.BC4, picture(64, 64), 1))
    assert main(["bake", str(src), str(tmp_path / "o.tpk"), "--no-progress"]) == 0
    with PackReader(tmp_path / "o.tpk") as r:
        assert r.header.texel_format is F.BC4 and not r.header.srgb


@pytest.mark.parametrize(
    ("extra", "match"),
    [(["--format", "bc1"], "copied, not re-encoded"), (["--linear"], "BC7_UNORM_SRGB"), (["--tile", "100"], "tile")],
)
def test_bake_options_that_contradict_the_file(
    tmp_path: Path, bc7_dds: Path, capsys: pytest.CaptureFixture[str], extra: list[str], match: str
) -> None:
    assert main(["bake", str(bc7_dds), str(tmp_path / "o.tpk"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err
    assert not (tmp_path / "o.tpk").exists()


def test_export_then_check_then_bake_back(tmp_path: Path, bc7_dds: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pack, ktx = tmp_path / "a.tpk", tmp_path / "a.ktx2"
    assert main(["bake", str(bc7_dds), str(pack), "--tile", "64", "--no-progress"]) == 0
    assert main(["export", str(pack), str(ktx), "--supercompression", "zstd"]) == 0
    assert "2 of 2 levels" in capsys.readouterr().out
    assert check_ktx2(ktx.read_bytes()).scheme == 2
    assert main(["bake", str(ktx), str(tmp_path / "b.tpk"), "--tile", "64", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["info", "--json", str(tmp_path / "b.tpk")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["metadata"]["source_container"] == "ktx2" and info["metadata"]["levels_copied"] == [0, 1]


@pytest.mark.parametrize(
    ("args", "code", "match"),
    [
        (["--max-size", "1K"], 1, "export limit"),
        (["--max-size", "lots"], 2, "--max-size"),
        (["--supercompression", "lz4"], 2, "none or zstd"),
    ],
)
def test_export_refusals(
    tmp_path: Path, bc7_dds: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, match: str
) -> None:
    pack = tmp_path / "a.tpk"
    assert main(["bake", str(bc7_dds), str(pack), "--tile", "64", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["export", str(pack), str(tmp_path / "a.ktx2"), *args]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err
    assert sorted(os.listdir(tmp_path)) == ["a.tpk", "in.dds"]


def test_export_wants_a_ktx2_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "x.tpk", str(tmp_path / "a.png")]) == 2
    assert ".ktx2" in capsys.readouterr().err


def test_a_bc6h_dds_bakes_and_exports_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    levels = block_levels(F.BC6H, hdr_picture(128, 96), 7)
    src = write_dds(tmp_path / "sky.dds", F.BC6H, 128, 96, levels)
    pack, ktx = tmp_path / "sky.tpk", tmp_path / "sky.ktx2"
    assert main(["bake", str(src), str(pack), "--tile", "64", "--no-progress"]) == 0
    assert "bc6h, 2 levels (2 copied without re-encoding" in capsys.readouterr().out
    assert main(["export", str(pack), str(ktx)]) == 0
    exported = check_ktx2(ktx.read_bytes())
    assert exported.vk_format == 143 and exported.levels == [b.tobytes() for b in levels[:2]]
    assert main(["bake", str(src), str(tmp_path / "x.tpk"), "--format", "bc7"]) == 2
    assert "holds BC6H_UF16 blocks, which are copied, not re-encoded" in capsys.readouterr().err
