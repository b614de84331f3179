"""`texstream demo` end to end: headless frames + telemetry, the overlay, a real window under Xvfb,
the fallback without a display, and one-line errors for bad arguments.

Every demo runs in a subprocess (it makes its own GL context; in this process that would steal the
session's `gl_context`). The packs are small procedural ones baked once per module.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from texstream.apps.demo import DemoConfig, FlightControl, FrameWriter
from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig
from texstream.errors import EngineError
from texstream.pack.format import TexelFormat
from texstream.scene.paths import flythrough
from texstream.scene.terrain import sky_clear_colour
from texstream.telemetry import Overlay, validate_frame, validate_summary
from texstream.units import MIB

BUDGET_MB = 24
SUMMARY_TITLE = "texstream GPU memory summary"


# ---- helpers ---------------------------------------------------------------------------------------
def demo_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "texstream", "demo", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )


def headless_env() -> dict[str, str]:
    """The environment without any display (and no debug tracebacks)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "TEXSTREAM_DEBUG")}
    env.pop("TEXSTREAM_DEMO_FRAMES", None)
    return env


def load(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB")).astype(np.int16)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_memory_summary(stdout: str, budget_bytes: int) -> int:
    """The table printed on exit: its title and totals line; returns the bytes held at the end."""
    assert SUMMARY_TITLE in stdout, stdout
    totals = [line for line in stdout.splitlines() if line.startswith("Total held = ")]
    assert len(totals) == 1, stdout
    words = totals[0].split()  # Total held = N bytes of a B-byte budget
    held, budget = int(words[3]), int(words[7].split("-")[0])
    assert budget == budget_bytes
    assert 0 < held <= budget
    return held


def assert_one_line_error(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("texstream demo: "), proc.stderr
    assert proc.stdout == ""


# ---- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 1024^2 BC1 terrain and its BC5 normal map, 64-texel tiles (5 levels, 341 tiles each)."""
    d = tmp_path_factory.mktemp("demo-packs")
    albedo, normals = d / "terrain.tpk", d / "normals.tpk"
    bake_procedural(albedo, 1024, "terrain", 1, BakeConfig(tile_size=64, jobs=1, progress=False))
    bake_procedural(
        normals, 1024, "normals", 1, BakeConfig(tile_size=64, jobs=1, progress=False, texel_format=TexelFormat.BC5)
    )
    return albedo, normals


@pytest.fixture(scope="module")
def egl(gl_context: object) -> None:
    """Skips (through conftest's gl_context) where there is no headless OpenGL 4.5 context."""


@pytest.fixture(scope="module")
def headless_run(
    packs: tuple[Path, Path], egl: None, tmp_path_factory: pytest.TempPathFactory
) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("demo-headless")
    proc = demo_cli(
        *map(str, packs),
        "--headless",
        "--frames",
        "60",
        "--out",
        str(out),
        "--size",
        "320x180",
        "--budget-mb",
        str(BUDGET_MB),
        env=headless_env(),
    )
    assert proc.returncode == 0, proc.stderr
    return proc, out


OVERLAY_SIZE = (640, 360)  # the HUD panel is ~370 px wide: at 320x180 it would cover nearly everything
OVERLAY_FRAMES = 24


@pytest.fixture(scope="module")
def overlay_pair(packs: tuple[Path, Path], egl: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same flythrough rendered with and without the overlay: (with, without) output folders."""
    outs = []
    for extra in ((), ("--no-overlay",)):
        out = tmp_path_factory.mktemp("demo-overlay")
        proc = demo_cli(
            *map(str, packs),
            "--headless",
            "--frames",
            str(OVERLAY_FRAMES),
            "--out",
            str(out),
            "--size",
            "{}x{}".format(*OVERLAY_SIZE),
            "--budget-mb",
            str(BUDGET_MB),
            *extra,
            env=headless_env(),
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(out)
    return outs[0], outs[1]


def x11_env(display: str, **extra: str) -> dict[str, str]:
    env = headless_env()
    env.pop("XDG_SESSION_TYPE", None)  # pyglfw would pick its Wayland build
    env.update(DISPLAY=display, PYGLFW_LIBRARY_VARIANT="x11", **extra)
    return env


# ---- 1. headless run through the CLI ---------------------------------------------------------------
def test_headless_cli_writes_frames_telemetry_and_summary(
    headless_run: tuple[subprocess.CompletedProcess, Path],
) -> None:
    proc, out = headless_run
    budget = BUDGET_MB * MIB
    assert "Traceback" not in proc.stderr and "running headless" not in proc.stderr  # --headless: no notice

    frames = sorted(out.glob("*.png"))
    assert [p.name for p in frames] == [f"frame_{i:04d}.png" for i in range(60)]
    for p in (frames[0], frames[-1]):
        assert Image.open(p).size == (320, 180)

    records = read_jsonl(out / "telemetry.jsonl")
    assert len(records) == 60
    for r in records:
        validate_frame(r)
        assert r["budget_bytes"] == budget and r["budget_source"] == "config"
        assert r["vram_bytes"] <= r["vram_peak_bytes"] <= budget
        assert r["failed"] == 0
    assert [r["frame"] for r in records] == list(range(records[0]["frame"], records[0]["frame"] + 60))
    # the 60 frames are spread over the whole 30-second flight: the frame clock is the flight's
    assert records[-1]["time_s"] == pytest.approx(30.0)
    assert [r["dt_s"] for r in records] == pytest.approx([0.5] * 60)
    assert records[-1]["total_uploads"] > 0  # it streamed

    summary = json.loads((out / "summary.json").read_text())
    validate_summary(summary)
    assert summary["frames"] == 60 and summary["textures"] == 2
    assert summary["budget_bytes"] == budget
    assert 0 < summary["vram_peak_bytes"] <= budget and summary["vram_peak_fraction"] <= 1.0
    assert summary["uploads"] > 0 and summary["failed"] == 0 and summary["corrupt_tiles"] == 0

    held = check_memory_summary(proc.stdout, budget)
    assert held == summary["vram_final_bytes"]  # the table is taken after the summary, nothing in between
    assert "terrain.tpk" in proc.stdout and "normals.tpk" in proc.stdout
    report = json.loads((out / "run.json").read_text())
    assert report["scene"] == "terrain" and report["frames"] == 60 and report["flight_seconds"] == 30.0
    assert report["textures"] == 2 and report["texels"] == 2 * 1024 * 1024
    assert report["budget_bytes"] == budget and report["vram_peak_bytes"] == summary["vram_peak_bytes"]
    assert report["update_ms_p50"] <= report["update_ms_p95"] <= report["update_ms_p99"]
    assert report["resident_tiles"] == records[-1]["resident_tiles"]
    assert "update() p50" in proc.stdout and "terrain: 2 textures" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == f"frames: {out.resolve()}"  # the folder is the last line


# ---- 2. the frames show a scene, and the overlay only touches its panel --------------------------
def test_frames_are_not_garbage(
    headless_run: tuple[subprocess.CompletedProcess, Path], overlay_pair: tuple[Path, Path]
) -> None:
    _, out = headless_run
    first, last = load(out / "frame_0000.png"), load(out / f"frame_{59:04d}.png")
    for img in (first, last):
        assert img.std() > 10 and len(np.unique(img.reshape(-1, 3), axis=0)) > 200
    assert np.abs(first - last).mean() > 2  # the camera moves
    # spread over the whole flight, every third of the run shows another view
    thirds = [load(out / f"frame_{i:04d}.png") for i in (0, 20, 40, 59)]
    diffs = [np.abs(a - b).mean() for i, a in enumerate(thirds) for b in thirds[i + 1 :]]
    assert min(diffs) > 2, diffs

    _, plain = overlay_pair  # no HUD: the whole picture is scene
    img = load(plain / f"frame_{OVERLAY_FRAMES - 1:04d}.png")
    h = img.shape[0]
    sky = np.round(np.array(sky_clear_colour()) * 255)
    top = img[: h // 10].reshape(-1, 3)
    assert np.abs(top - sky).max(axis=1).mean() < 8, "the top of the frame should be the sky (clear) colour"
    ground = img[-h // 4 :].reshape(-1, 3)
    assert ground.mean() > 40, "the ground is (nearly) black"
    assert (ground.max(axis=1) < 16).mean() < 0.01, "black pixels in the ground"
    assert np.abs(ground - sky).max(axis=1).mean() > 30, "the ground looks like the sky: no terrain drawn"
    assert ground.std(axis=0).min() > 5, "the ground is flat colour: no texture"
    # the terrain shading lands in the albedo's colours (green land / blue sea), not a debug tint
    assert ground[:, 2].mean() < 200 and ground[:, 1].mean() > 40


def test_overlay_changes_only_its_panel(overlay_pair: tuple[Path, Path]) -> None:
    with_hud, without = overlay_pair
    name = f"frame_{OVERLAY_FRAMES - 1:04d}.png"  # same frame of the same deterministic flythrough
    a, b = load(with_hud / name), load(without / name)
    assert a.shape == b.shape == (OVERLAY_SIZE[1], OVERLAY_SIZE[0], 3)
    diff = np.abs(a - b).max(axis=2)
    ys, xs = np.nonzero(diff > 24)
    assert ys.size, "the overlay drew nothing"
    margin = inspect.signature(Overlay).parameters["margin"].default  # top-left corner, `margin` pixels in
    x0, y0, x1, y1 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
    assert (x0, y0) == (margin, margin)
    assert x1 < OVERLAY_SIZE[0] * 0.75, f"the panel spans {x0}..{x1} of {OVERLAY_SIZE[0]} px"
    assert (diff[y0:y1, x0:x1] > 24).mean() > 0.8, "the panel should cover its rectangle"
    outside = np.ones_like(diff, bool)
    outside[y0:y1, x0:x1] = False
    assert outside.sum() > 0.3 * diff.size
    assert diff[outside].mean() < 0.5 and (diff[outside] <= 4).mean() > 0.995, "the overlay changed the scene"


# ---- 3. a real window under Xvfb ----------------------------------------------------------------------
def test_windowed_demo_under_xvfb(packs: tuple[Path, Path], xvfb: str, tmp_path: Path) -> None:
    telemetry = tmp_path / "window.jsonl"
    out = tmp_path / "frames"
    proc = demo_cli(
        *map(str, packs),
        "--size",
        "320x180",
        "--budget-mb",
        str(BUDGET_MB),
        "--telemetry",
        str(telemetry),
        "--out",
        str(out),
        env=x11_env(xvfb, TEXSTREAM_DEMO_FRAMES="30"),
        cwd=tmp_path,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "headless" not in proc.stderr, proc.stderr
    assert not out.exists(), "it rendered headless instead of opening a window"
    check_memory_summary(proc.stdout, BUDGET_MB * MIB)
    records = read_jsonl(telemetry)
    assert len(records) == 30  # TEXSTREAM_DEMO_FRAMES frames, each recorded
    for r in records:
        validate_frame(r)
        assert r["vram_peak_bytes"] <= r["budget_bytes"] == BUDGET_MB * MIB
    assert records[-1]["total_uploads"] > 0


WINDOW_SCRIPT = """
import sys
import glfw
from texstream.apps.demo import DemoConfig, run_window

albedo, normals, telemetry = sys.argv[1:4]
K = glfw
# poll number -> what happens then (keys through the demo's own key callback)
SCRIPT = {3: [K.KEY_H], 5: [K.KEY_M], 7: [K.KEY_R], 9: [K.KEY_F], 11: [K.KEY_EQUAL], 14: [K.KEY_MINUS],
          16: ["resize"], 17: [K.KEY_SPACE], 24: [K.KEY_P], 27: [K.KEY_ESCAPE]}
key_callbacks = []
real_set_key_callback, real_poll = glfw.set_key_callback, glfw.poll_events
polls = 0

def set_key_callback(window, callback):
    key_callbacks.append((window, callback))
    return real_set_key_callback(window, callback)

def poll_events():
    global polls
    real_poll()
    polls += 1
    for what in SCRIPT.get(polls, []):
        window, callback = key_callbacks[-1]
        if what == "resize":
            glfw.set_window_size(window, 400, 240)
        else:
            callback(window, what, 0, glfw.PRESS, 0)
            callback(window, what, 0, glfw.RELEASE, 0)

glfw.set_key_callback, glfw.poll_events = set_key_callback, poll_events
run_window(DemoConfig(packs=(albedo, normals), size=(320, 180), budget_mb=24, telemetry=telemetry))
print("polls", polls)
"""


def test_window_keys_resize_and_screenshot(packs: tuple[Path, Path], xvfb: str, tmp_path: Path) -> None:
    """Drives the window loop through its key callback: overlay/debug/freeze toggles, budget + and -,
    a resize, replay off, a screenshot (P) and Esc to quit."""
    script = tmp_path / "drive.py"
    script.write_text(textwrap.dedent(WINDOW_SCRIPT))
    telemetry = tmp_path / "window.jsonl"
    proc = subprocess.run(
        [sys.executable, str(script), *map(str, packs), str(telemetry)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=180,
        env=x11_env(xvfb, TEXSTREAM_DEMO_FRAMES="200"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "polls 27", "Esc did not end the loop"
    check_memory_summary(proc.stdout, BUDGET_MB * MIB)

    budgets = [r["budget_bytes"] for r in read_jsonl(telemetry)]
    assert budgets[0] == budgets[-1] == BUDGET_MB * MIB
    assert int(BUDGET_MB * 1.25 * MIB) in budgets  # '+' raised it by 25 %, '-' lowered it again

    shots = sorted(tmp_path.glob("texstream-*.png"))
    assert len(shots) == 1 and f"screenshot {shots[0].name}" in proc.stdout
    img = load(shots[0])
    assert img.shape == (240, 400, 3), "the screenshot should have the resized window's size"
    assert img.std() > 10
    # the scene fills the resized window: the ground reaches the new bottom-right corner
    sky = np.round(np.array(sky_clear_colour()) * 255)
    corner = img[-40:, -60:].reshape(-1, 3)
    assert np.abs(corner - sky).max(axis=1).mean() > 20, "the bottom-right corner is only sky: stale viewport"
    # debug view 2 (R: residency) is on and the overlay is off (H): a green tint, no dark panel
    assert img[-60:, :, 1].mean() > img[-60:, :, 0].mean()
    assert (img.max(axis=2) < 40).mean() < 0.01


# ---- 4. no display: headless, with a notice ---------------------------------------------------------
def test_no_display_runs_headless(packs: tuple[Path, Path], egl: None, tmp_path: Path) -> None:
    out = tmp_path / "frames"
    proc = demo_cli(
        str(packs[0]),
        "--frames",
        "3",
        "--out",
        str(out),
        "--size",
        "160x90",
        "--budget-mb",
        str(BUDGET_MB),
        env=headless_env(),
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "headless" in lines[0], proc.stderr
    assert len(list(out.glob("frame_*.png"))) == 3
    assert len(read_jsonl(out / "telemetry.jsonl")) == 3
    validate_summary(json.loads((out / "summary.json").read_text()))
    check_memory_summary(proc.stdout, BUDGET_MB * MIB)


# ---- 5. bad arguments: one line, no traceback ----------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--size", "10"], 2, "--size"),
        (["--size", "axb"], 2, "--size"),
        (["--size", "0x0"], 2, "frame size 0x0"),
        (["--size", "99999x100"], 2, "frame size 99999x100"),
        (["--frames", "0"], 2, "--frames"),
        (["--frames", "x"], 2, "--frames"),
        (["--seconds", "0"], 2, "--seconds"),
        (["--seconds", "nan"], 2, "--seconds"),
        (["--budget-mb", "0"], 2, "--budget-mb"),
        (["--budget-mb", "inf"], 2, "budget"),
        (["--budget-mb", "0.5"], 1, "budget"),  # too small even for the feedback buffers
        (["MISSING"], 1, "does not exist"),
        (["FOLDER"], 1, "folder"),
        (["NOT_A_PACK"], 1, "not a texstream pack"),
    ],
)
def test_bad_arguments_one_line(
    packs: tuple[Path, Path], egl: None, tmp_path: Path, args: list[str], code: int, words: str
) -> None:
    junk = tmp_path / "junk.tpk"
    junk.write_bytes(b"not a pack at all" * 10)
    names = {"MISSING": str(tmp_path / "missing.tpk"), "FOLDER": str(tmp_path), "NOT_A_PACK": str(junk)}
    args = [names.get(a, a) for a in args]
    pack = [] if args[0] in names.values() else [str(packs[0])]
    proc = demo_cli(*pack, *args, "--headless", "--out", str(tmp_path / "out"), env=headless_env())
    assert_one_line_error(proc)
    assert proc.returncode == code
    assert words in proc.stderr


def test_broken_display_is_one_line(packs: tuple[Path, Path], tmp_path: Path) -> None:
    """DISPLAY names no server: GLFW's own reason in one line (no GLFW warnings), exit 1."""
    env = headless_env()
    env.update(DISPLAY=":4093", PYGLFW_LIBRARY_VARIANT="x11")
    proc = demo_cli(str(packs[0]), "--size", "160x90", env=env)
    assert_one_line_error(proc)
    assert proc.returncode == 1 and "use --headless" in proc.stderr


@pytest.mark.parametrize(
    "kwargs",
    [
        {"size": (0, 10)},
        {"size": (10, 16385)},
        {"size": (1.5, 10)},
        {"budget_mb": float("nan")},
        {"budget_mb": -1.0},
        {"frames": 0},
        {"seconds": 0.0},
        {"seconds": float("inf")},
        {"scene": "moon"},
    ],
)
def test_demo_config_rejects_bad_values(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        DemoConfig(**kwargs)


# ---- 6. who flies the window's camera ------------------------------------------------------------------
STILL = np.zeros(3)


def test_flight_plays_first_and_says_how_to_take_over() -> None:
    path = flythrough(4096, 4096, seconds=30.0)
    control = FlightControl(path, now=100.0)
    assert control.playing
    pose = control.pose(112.0, 0.016, STILL, None)
    np.testing.assert_allclose(pose.eye, path.pose(12.0).eye)
    hint = control.hint(112.0)
    assert hint is not None and "12 / 30 s" in hint and "Space" in hint
    # the hint names exactly the input the flight ignores: mouse moves without the right button
    assert "ignored unless the right button is held" in hint
    control.pose(113.0, 0.016, STILL, None, fast=True)  # Shift alone, a mouse move without the button
    assert control.playing
    np.testing.assert_allclose(control.pose(114.0, 0.016, STILL, None).eye, path.pose(14.0).eye)


@pytest.mark.parametrize(
    ("move", "look"),
    [(np.array([1.0, 0.0, 0.0]), None), (np.array([0.0, 0.0, 1.0]), None), (STILL, (0.0, 0.0))],
)
def test_keys_or_mouse_during_the_flight_take_the_camera(move: np.ndarray, look: tuple | None) -> None:
    path = flythrough(4096, 4096, seconds=30.0)
    control = FlightControl(path, now=0.0)
    before = control.pose(5.0, 0.016, STILL, None)
    after = control.pose(5.1, 0.1, move, look)
    assert not control.playing
    # the camera continues from where the flight was, moved by the input only (no jump along the path)
    assert np.linalg.norm(after.eye - before.eye) <= 120.0 * 0.1 + 1e-6
    if np.any(move):
        assert np.linalg.norm(after.eye - before.eye) > 1.0
    later = control.pose(9.0, 0.016, STILL, None)
    np.testing.assert_allclose(later.eye, after.eye)  # the flight does not resume by itself
    hint = control.hint(9.0)
    assert hint is not None and "WASD" in hint and "replay" in hint
    assert control.hint(60.0) is None  # the controls hint fades after a while


def test_space_hands_over_and_replays() -> None:
    path = flythrough(4096, 4096, seconds=30.0)
    control = FlightControl(path, now=0.0)
    control.toggle(3.0)
    assert not control.playing
    control.toggle(10.0)  # replay from the start
    assert control.playing
    np.testing.assert_allclose(control.pose(10.0, 0.016, STILL, None).eye, path.pose(0.0).eye)
    control.pose(41.0, 0.016, STILL, None)  # past the end: the camera is the user's
    assert not control.playing


# ---- 7. the headless frames are written off the render loop ---------------------------------------------
def frame_pixels(seed: int, size: tuple[int, int]) -> np.ndarray:
    """An RGBA frame, top row first, opaque (the PNG files are RGB)."""
    rgba = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 4), dtype=np.uint8)
    rgba[..., 3] = 255
    return rgba


def test_frame_writer_writes_every_frame_right_side_up(tmp_path: Path) -> None:
    size = (37, 21)  # odd sizes: no row padding hides a stride mistake
    frames = [frame_pixels(i, size) for i in range(5)]
    with FrameWriter(tmp_path, size, depth=2) as writer:  # a queue shorter than the run: put() waits
        for i, rgba in enumerate(frames):
            writer.put(i, rgba[::-1].tobytes())  # bottom row first, as a framebuffer read gives it
    assert writer.written == 5
    for i, rgba in enumerate(frames):
        np.testing.assert_array_equal(load(tmp_path / f"frame_{i:04d}.png"), rgba[..., :3])
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"frame_{i:04d}.png" for i in range(5)]  # no temps


def test_frame_writer_reports_a_failed_write_on_the_caller_thread(tmp_path: Path) -> None:
    out, size = tmp_path / "gone", (8, 8)
    out.mkdir()
    writer = FrameWriter(out, size, depth=1)
    out.rmdir()  # the folder vanishes under the run
    with pytest.raises(EngineError, match="gone"):
        for i in range(4):  # fails at a later put() or at close(), never hangs on the full queue
            writer.put(i, frame_pixels(i, size).tobytes())
        writer.close()
    with pytest.raises(EngineError):
        writer.close()  # idempotent, and keeps saying why


def test_frame_writer_keeps_the_runs_own_error(tmp_path: Path) -> None:
    size = (8, 8)
    with pytest.raises(KeyboardInterrupt):
        with FrameWriter(tmp_path, size) as writer:
            writer.put(0, frame_pixels(0, size).tobytes())
            raise KeyboardInterrupt
    assert not list(tmp_path.glob(".*.tmp"))  # nothing half-written


@pytest.mark.parametrize(("size", "nbytes"), [((4, 4), 63), ((4, 4), 65)])
def test_frame_writer_rejects_a_frame_of_the_wrong_size(tmp_path: Path, size: tuple[int, int], nbytes: int) -> None:
    with FrameWriter(tmp_path, size) as writer, pytest.raises(ValueError, match="64 bytes"):
        writer.put(0, bytes(nbytes))
