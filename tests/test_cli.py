"""The command line: every command end to end, one-line errors with the documented exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from texstream.apps.cli import main
from texstream.pack import PackReader
from texstream.testing import psnr

ASSETS = Path(__file__).resolve().parent.parent / "assets"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "texstream", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def photo_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "coffee.tpk"
    assert main(["bake", str(ASSETS / "coffee.png"), str(out), "--tile", "64", "--jobs", "2", "--no-progress"]) == 0
    return out


def test_bake_info_verify_extract(photo_pack: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["info", str(photo_pack), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    src = np.asarray(Image.open(ASSETS / "coffee.png").convert("RGB"))
    assert (info["width"], info["height"]) == (src.shape[1], src.shape[0])
    assert info["format"] == "bc1" and info["srgb"] and info["supercompression"] == "zstd"
    assert info["metadata"]["source"].endswith("coffee.png") or "coffee" in json.dumps(info["metadata"])
    assert main(["verify", str(photo_pack)]) == 0
    out = tmp_path / "level0.png"
    assert main(["extract", str(photo_pack), str(out), "--level", "0"]) == 0
    decoded = np.asarray(Image.open(out).convert("RGB"))
    assert decoded.shape == src.shape
    assert psnr(decoded, src) >= 30.0  # BC1 on a photograph
    part = tmp_path / "part.png"
    assert main(["extract", str(photo_pack), str(part), "--level", "0", "--region", "10,20,100,50"]) == 0
    np.testing.assert_array_equal(np.asarray(Image.open(part).convert("RGB")), decoded[20:70, 10:110])


def test_small_bake_runs_in_process_importing_only_what_it_needs(tmp_path: Path) -> None:
    """`texstream bake` of a small image bakes in its own process (no workers) and imports neither GL,
    the streamer, the network code, the worker-process machinery nor the procedural generators:
    those imports were a third of a 2048² bake's command-line time."""
    out = tmp_path / "coffee.tpk"
    code = (
        "import json, sys\n"
        "from texstream.apps.cli import main\n"
        f"code = main(['bake', {str(ASSETS / 'coffee.png')!r}, {str(out)!r}])\n"
        "print(json.dumps([code, sorted(sys.modules)]))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    *summary, loaded = res.stdout.splitlines()
    code, modules = json.loads(loaded)
    assert code == 0 and "on 1 jobs" in summary[-1]
    unwanted = (
        "moderngl", "glfw", "pyvips", "tqdm", "multiprocessing", "http", "ssl", "texstream.gl",
        "texstream.runtime", "texstream.scene", "texstream.telemetry", "texstream.remote.remote_file",
        "texstream.remote.transport", "texstream.remote.cache", "texstream.bake.procedural",
        "texstream.bake.cluster", "texstream.bake.tiff_strips", "texstream.assets.image_packs",
    )  # fmt: skip
    assert not [m for m in modules if any(m == u or m.startswith(f"{u}.") for u in unwanted)]
    with PackReader(out) as reader:
        assert reader.verify() == []


@pytest.mark.parametrize("given", [None, "3"])
def test_the_command_line_starts_one_blas_thread_unless_told(given: str | None) -> None:
    """OpenBLAS starting a thread per core as numpy loads cost ~40 ms of CPU time a command."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    code = "import os, texstream.apps.cli, numpy; print(os.environ['OPENBLAS_NUM_THREADS'])"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == (given or "1")


def test_verify_lists_corrupt_tiles(photo_pack: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.tpk"
    data = bytearray(photo_pack.read_bytes())
    with PackReader(photo_pack) as r:
        e = r.entry(0, 1, 1)
    data[e.offset + 5] ^= 0xFF
    bad.write_bytes(bytes(data))
    assert main(["verify", str(bad)]) == 1
    captured = capsys.readouterr()
    assert "level 0 (1, 1)" in captured.out and "1 of" in captured.err


@pytest.mark.parametrize(
    "argv, code, needle",
    [
        (["bake", "missing.png", "out.tpk"], 1, "missing.png"),
        (["bake", "{asset}", "out.tpk", "--format", "bc9"], 2, "bc9"),
        (["bake", "{asset}", "out.tpk", "--tile", "100"], 2, "tile size"),
        (["bake", "{asset}", "out.tpk", "--format", "bc7", "--bc7-quality", "ultra"], 2, "bc7 quality must be one of"),
        (["bake", "{asset}", "out.txt"], 2, ".tpk"),
        (["info", "missing.tpk"], 1, "does not exist"),
        (["info", "{text}"], 1, "not a texstream pack"),  # an image is baked into the pack cache instead
        (["extract", "{pack}", "o.png", "--level", "99"], 1, "level 99"),
        (["extract", "{pack}", "o.png", "--region", "1,2,3"], 2, "region"),
        (["generate", "o.tpk", "--size", "0"], 2, "size"),
        (["render", "{pack}", "--out", "o.png", "--view", "a,b"], 2, "view"),
        (["frobnicate"], 2, "invalid choice"),
    ],
)
def test_errors_are_one_line(photo_pack: Path, tmp_path: Path, argv: list, code: int, needle: str) -> None:
    argv = [a.format(asset=ASSETS / "coffee.png", pack=photo_pack, text=__file__) for a in argv]
    os.chdir(tmp_path)
    res = run_cli(*argv)
    assert res.returncode == code, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert needle in lines[0]
    assert not list(tmp_path.glob("*.tpk"))


def test_generate_checker(tmp_path: Path) -> None:
    out = tmp_path / "g.tpk"
    assert (
        main(
            [
                "generate",
                str(out),
                "--size",
                "300",
                "--height",
                "200",
                "--pattern",
                "checker",
                "--format",
                "rgba8",
                "--supercompression",
                "lz4",
                "--no-progress",
                "--jobs",
                "1",
            ]
        )
        == 0
    )
    with PackReader(out) as r:
        assert (r.header.width, r.header.height) == (300, 200)
        assert r.metadata.get("pattern") == "checker" or "checker" in json.dumps(r.metadata)


def test_sigterm_during_bake_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "big.tpk"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "texstream",
            "generate",
            str(out),
            "--size",
            "8192",
            "--format",
            "bc7",
            "--no-progress",
            "--jobs",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".big.tpk.*")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    assert list(tmp_path.iterdir()) == []


def _one_line(res: subprocess.CompletedProcess, code: int, needle: str) -> None:
    assert res.returncode == code, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert needle in lines[0], lines[0]


def test_generate_refuses_what_cannot_be_streamed_before_making_a_file(tmp_path: Path) -> None:
    res = run_cli("generate", str(tmp_path / "huge.tpk"), "--size", "4000000", "--no-progress")
    _one_line(res, 2, "a pack holds at most 67,108,864")
    res = run_cli("generate", str(tmp_path / "huge.tpk"), "--size", "4000000", "--tile", "64", "--no-progress")
    _one_line(res, 2, "the streamer holds at most 16")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def small_pack(tmp_path: Path) -> Path:
    from texstream.pack import PackHeader

    from .pack.test_pack import make_pack

    p = tmp_path / "s.tpk"
    make_pack(p, PackHeader(width=200, height=100, tile_size=64))
    return p


@pytest.mark.parametrize("command", ["info", "verify"])
def test_special_files_are_refused_without_hanging(tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "pipe.tpk"
    os.mkfifo(fifo)
    _one_line(run_cli(command, str(fifo)), 1, "is a FIFO, not a file")
    _one_line(run_cli(command, str(tmp_path)), 1, "is a folder, not a file")
    if Path("/dev/zero").exists():
        _one_line(run_cli(command, "/dev/zero"), 1, "is a character device, not a file")


@pytest.mark.parametrize(
    "meta, needle", [(b"[" * 100_000, "nests 100000 deep"), (b'{"n": ' + b"7" * 500_000 + b"}", "number")]
)
def test_hostile_metadata_is_bad_data_not_a_usage_error(small_pack: Path, meta: bytes, needle: str) -> None:
    from texstream.pack import PackReader

    from .pack.test_pack import _edit_header

    with PackReader(small_pack) as r:
        end = r.payload_end
    data = bytearray(small_pack.read_bytes())
    data[end:] = meta
    small_pack.write_bytes(bytes(_edit_header(data, meta_size=len(meta), meta_off=end)))
    for command in ("info", "verify"):
        _one_line(run_cli(command, str(small_pack)), 1, needle)


def test_sparse_tail_is_named_in_one_line(small_pack: Path) -> None:
    os.truncate(small_pack, 2_100_000_000)
    for command in ("info", "verify"):
        res = run_cli(command, str(small_pack))
        _one_line(res, 1, "unknown bytes after it")
        assert str(small_pack) in res.stderr


def test_info_names_the_version(small_pack: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["info", str(small_pack)]) == 0
    assert "texstream pack v2" in capsys.readouterr().out
    assert main(["info", str(small_pack), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == 2


def test_bake_picks_the_format_and_warns_once_when_alpha_is_dropped(tmp_path: Path) -> None:
    rgba = np.asarray(Image.open(ASSETS / "coffee.png").convert("RGBA"))[:128, :128].copy()
    opaque, cut = tmp_path / "opaque.png", tmp_path / "cut.png"
    Image.fromarray(rgba).save(opaque)  # RGBA, every alpha 255
    rgba[40:90, 30:100, 3] = 0
    Image.fromarray(rgba).save(cut)
    common = ["--tile", "64", "--jobs", "1", "--no-progress", "--bc7-quality", "fast"]
    for src, fmt in ((opaque, "bc1"), (cut, "bc7")):
        out = tmp_path / f"{src.stem}.tpk"
        done = run_cli("bake", str(src), str(out), *common)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        with PackReader(out) as r:
            assert r.header.texel_format.name.lower() == fmt and r.metadata["format_auto"] is True
            assert r.metadata["alpha"] is (fmt == "bc7")
    done = run_cli("bake", str(cut), str(tmp_path / "forced.tpk"), "--format", "bc1", *common)
    assert done.returncode == 0
    assert done.stderr.splitlines() == [
        "texstream.bake.format_choice: cut.png has alpha; bc1 drops it (use --format bc3 or bc7)"
    ]
    with PackReader(tmp_path / "forced.tpk") as r:
        assert r.header.texel_format.name == "BC1" and r.metadata["format_auto"] is False and r.metadata["alpha"]


def test_bake_takes_each_bc7_quality_level(tmp_path: Path) -> None:
    """--bc7-quality picks the level: the pack records it and holds the bytes `bake` gives for it."""
    from texstream.bake import ArraySource, bake
    from texstream.config import BC7_QUALITIES, BakeConfig

    rgb = np.asarray(Image.open(ASSETS / "astronaut.png").convert("RGB"))[:96, :120].copy()
    src = tmp_path / "crop.png"
    Image.fromarray(rgb).save(src)
    rgba = np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)])
    packs = {}
    for level in ("balanced", "fast"):
        out = tmp_path / f"{level}.tpk"
        argv = ["bake", str(src), str(out), "--format", "bc7", "--bc7-quality", level, "--tile", "64", "--jobs", "1"]
        assert main([*argv, "--no-progress"]) == 0
        with PackReader(out) as r:
            assert r.metadata["bc7_quality"] == level and r.header.texel_format.name == "BC7"
        cfg = BakeConfig(texel_format="bc7", bc7_quality=level, tile_size=64, jobs=1, progress=False)
        bake(ArraySource(rgba, "crop"), tmp_path / "api.tpk", cfg)
        with PackReader(out) as a, PackReader(tmp_path / "api.tpk") as b:
            packs[level] = a.read_tile(0, 0, 0)
            assert packs[level] == b.read_tile(0, 0, 0)
    assert packs["balanced"] != packs["fast"]
    assert BakeConfig().bc7_quality == "normal" and BC7_QUALITIES == ("fast", "balanced", "normal", "slow")


def test_version_and_module_entry() -> None:
    import texstream

    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"texstream {texstream.__version__}"


def test_global_options_after_the_command(small_pack: Path) -> None:
    proc = run_cli("info", str(small_pack), "-v")
    assert proc.returncode == 0 and "texstream pack" in proc.stdout, proc.stderr


@pytest.mark.parametrize("command", [["render", "x.tpk", "--out", "x.png"], ["demo"]])
def test_bad_frame_size_names_the_option(command: list[str]) -> None:
    proc = run_cli(*command, "--size", "banana")
    assert proc.returncode == 2 and "--size must be WxH" in proc.stderr and "invalid literal" not in proc.stderr
