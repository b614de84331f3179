"""The gallery scene: every object draws its own virtual texture (instanced per cache pool), and
`texstream demo gallery` runs headless at a small size, baking its textures once into the cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import moderngl
import numpy as np
import pytest
from PIL import Image

from texstream.apps.assets import GALLERY_FOLDER, gallery_recipes
from texstream.apps.demo import DemoConfig
from texstream.bake.pipeline import bake
from texstream.bake.source import ArraySource
from texstream.config import BakeConfig, BudgetConfig, StreamerConfig
from texstream.pack.format import TexelFormat
from texstream.runtime.streamer import Streamer
from texstream.scene.gallery import GalleryLayout, GalleryScene, gallery_flight
from texstream.scene.paths import Pose
from texstream.telemetry import validate_frame, validate_summary
from texstream.units import MIB

OBJECTS = 100
TEXTURE = 512
BUDGET_MB = 16


# ---- layout and flight ---------------------------------------------------------------------------
def test_layout_places_every_object_apart() -> None:
    layout = GalleryLayout(OBJECTS)
    rects = layout.rects()
    assert rects.shape == (OBJECTS, 4) and layout.columns * layout.rows >= OBJECTS
    assert layout.columns > layout.rows  # longer along the flight
    w, h = layout.extent
    assert (rects[:, 0] >= 0).all() and (rects[:, 0] + rects[:, 2] <= w).all()
    assert (rects[:, 1] >= 0).all() and (rects[:, 1] + rects[:, 3] <= h).all()
    corners = {(float(x), float(y)) for x, y in rects[:, :2]}
    assert len(corners) == OBJECTS, "two objects share a place"
    with pytest.raises(ValueError, match="at least one object"):
        GalleryLayout(0)


def test_flight_crosses_the_field() -> None:
    layout = GalleryLayout(128)
    path = gallery_flight(layout, seconds=30.0)
    assert path.duration == 30.0
    eyes = np.array([path.pose(t).eye for t in np.linspace(0, 30, 61)])
    w, h = layout.extent
    assert eyes[:, 0].max() - eyes[:, 0].min() > 0.8 * w and eyes[:, 1].max() - eyes[:, 1].min() > 0.5 * h
    assert (eyes[:, 2] < 0).all(), "the camera must stay above the ground"


def test_recipes_give_each_object_its_own_texture() -> None:
    recipes = gallery_recipes(OBJECTS, 4096)
    assert len({r.filename for r in recipes}) == OBJECTS
    assert len({(r.pattern, r.seed) for r in recipes}) == OBJECTS
    assert len({r.pattern for r in recipes}) >= 3


# ---- each object samples its own texture ---------------------------------------------------------
@pytest.mark.gl
def test_each_object_shows_its_own_texture(gl_context: moderngl.Context, tmp_path: Path) -> None:
    """Twelve flat-coloured textures in two cache pools (BC1 and RGBA8): seen from above, each canvas
    shows its own texture's colour, so no instance reads another's page table, size or cache."""
    count = 12
    rng = np.random.default_rng(7)
    colours = rng.integers(30, 226, size=(count, 3)).astype(np.uint8)
    paths = []
    for i, colour in enumerate(colours):
        fmt = TexelFormat.RGBA8 if i % 3 == 0 else TexelFormat.BC1
        img = np.broadcast_to(colour, (256, 256, 3)).copy()
        path = tmp_path / f"flat{i}.tpk"
        bake(ArraySource(img, f"flat{i}"), path, BakeConfig(texel_format=fmt, tile_size=64, jobs=1, progress=False))
        paths.append(path)
    layout = GalleryLayout(count)
    size = (480, 240)
    cfg = StreamerConfig(budget=BudgetConfig(budget_mb=24), io_threads=2, ring_mb=2)
    with Streamer(gl_context, cfg) as streamer:
        textures = [streamer.open(p) for p in paths]
        assert len(streamer.pools) == 2
        scene = GalleryScene(gl_context, textures, layout)
        scene.fog_distance = 1e9  # colours exactly as sampled
        color = gl_context.renderbuffer(size, 4)
        fbo = gl_context.framebuffer(color_attachments=[color])
        try:
            w, h = layout.extent
            pose = Pose(np.array([w / 2, h / 2, -max(w, h) * 0.75]), np.array([w / 2, h / 2 + 1e-3, 0.0]))
            for _ in range(4):
                streamer.update()
                fbo.use()
                fbo.clear(0.0, 0.0, 0.0, 1.0)
                scene.draw(pose, size)
            img = np.frombuffer(fbo.read(components=3, alignment=1), np.uint8).reshape(size[1], size[0], 3)
            vp = pose.view_projection(size[0] / size[1], far=np.hypot(w, h) * 3.0)
            centre_px: list[tuple[int, int]] = []
            for i, (x, y, rw, rh) in enumerate(layout.rects()):
                clip = vp @ np.array([x + rw / 2, y + rh / 2, 0.0, 1.0])
                px = int((clip[0] / clip[3] * 0.5 + 0.5) * size[0])
                py = int((clip[1] / clip[3] * 0.5 + 0.5) * size[1])  # read back bottom row first, as GL
                got = img[py - 2 : py + 3, px - 2 : px + 3].reshape(-1, 3).astype(int)
                centre_px.append((py, px))
                assert np.abs(got - colours[i]).max() <= 6, f"object {i}: {got.mean(0)} instead of {colours[i]}"
            views = {}
            for mode in (1, 2):  # the residency debug views (vt_debug_tint) tint every canvas
                scene.debug = mode
                streamer.update()
                fbo.use()
                fbo.clear(0.0, 0.0, 0.0, 1.0)
                scene.draw(pose, size)
                views[mode] = np.frombuffer(fbo.read(components=3, alignment=1), np.uint8).reshape(img.shape)
            centres = tuple(np.array(c) for c in zip(*centre_px, strict=True))  # (rows, columns)
            for mode, view in views.items():
                moved = np.abs(view[centres].astype(int) - img[centres]).max(axis=1)
                assert (moved > 20).all(), f"debug view {mode} leaves canvases untinted: {moved}"
            assert (views[1][centres] != views[2][centres]).any(), "the two debug views are the same"
        finally:
            scene.release()
            if gl_context.fbo is fbo:
                gl_context.detect_framebuffer(0).use()
            fbo.release()
            color.release()


# ---- `texstream demo gallery`, headless -----------------------------------------------------------
def gallery_cli(cache: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "TEXSTREAM_DEBUG")}
    env["TEXSTREAM_CACHE"] = str(cache)
    sizes = ["--objects", str(OBJECTS), "--texture-size", str(TEXTURE), "--budget-mb", str(BUDGET_MB)]
    cmd = [sys.executable, "-m", "texstream", "demo", "gallery", "--headless", *sizes, "--out", str(out), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.usefixtures("gl_context")  # skips (or fails, where GL is required) without headless GL
def test_gallery_runs_headless_and_reuses_its_textures(tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    frames = 10
    proc = gallery_cli(cache, out, "--frames", str(frames), "--size", "320x180")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    packs = sorted((cache / GALLERY_FOLDER).glob("*.tpk"))
    assert len(packs) == OBJECTS
    baked = {p: p.stat().st_mtime_ns for p in packs}

    summary = json.loads((out / "summary.json").read_text())
    validate_summary(summary)
    assert summary["textures"] == OBJECTS and summary["failed"] == 0
    assert summary["vram_peak_bytes"] <= summary["budget_bytes"] == BUDGET_MB * MIB
    records = [json.loads(line) for line in (out / "telemetry.jsonl").read_text().splitlines()]
    assert len(records) == frames
    for r in records:
        validate_frame(r)
        assert r["vram_bytes"] <= r["budget_bytes"]
    assert records[-1]["time_s"] == pytest.approx(30.0)  # the frames cover the whole flight
    assert records[-1]["total_uploads"] > 0
    assert max(r["working_set_bytes"] for r in records) > 0
    assert all(0 < r["stream_cache_bytes"] < r["budget_bytes"] for r in records)

    report = json.loads((out / "run.json").read_text())
    assert report["scene"] == "gallery" and report["textures"] == OBJECTS and report["frames"] == frames
    assert report["texels"] == OBJECTS * TEXTURE * TEXTURE
    assert report["all_resident_bytes"] > report["texels"] // 2  # BC1: half a byte a texel, plus the mips
    assert report["budget_bytes"] == BUDGET_MB * MIB and report["vram_peak_bytes"] <= report["budget_bytes"]
    assert 0 < report["update_ms_p50"] <= report["update_ms_p95"] <= report["update_ms_p99"]
    assert report["fps"] > 0 and report["resident_tiles"] == records[-1]["resident_tiles"]
    assert f"gallery: {OBJECTS} textures" in proc.stdout and "update() p50" in proc.stdout

    shots = sorted(out.glob("frame_*.png"))
    assert len(shots) == frames
    for shot in shots[::3]:
        img = np.asarray(Image.open(shot).convert("RGB"))
        assert img.std() > 10 and len(np.unique(img.reshape(-1, 3), axis=0)) > 200

    again = gallery_cli(cache, tmp_path / "again", "--frames", "2", "--size", "160x90")
    assert again.returncode == 0, again.stderr
    assert "baking" not in again.stderr
    assert {p: p.stat().st_mtime_ns for p in packs} == baked, "the cached textures were baked again"


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"objects": 0}, "gallery objects"),
        ({"objects": 257}, "gallery objects"),
        ({"texture_size": 1000}, "power of two"),
        ({"texture_size": 128}, "power of two"),
        ({"packs": ("a.tpk",)}, "bakes its own textures"),
    ],
)
def test_gallery_config_rejects_bad_values(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        DemoConfig(scene="gallery", **kwargs)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--objects", "0"], "gallery objects"),
        (["--objects", "300"], "within 1..256"),
        (["--texture-size", "3000"], "power of two"),
        (["pack.tpk"], "bakes its own textures"),
    ],
)
def test_gallery_bad_arguments_are_one_line(tmp_path: Path, args: list[str], words: str) -> None:
    cmd = [sys.executable, "-m", "texstream", "demo", "gallery", *args, "--headless", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("texstream demo: ") and words in lines[0], proc.stderr
