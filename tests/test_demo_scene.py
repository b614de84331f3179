"""`texstream demo scene`: a glTF file (written by trimesh) or the built-in procedural scene flown
headless and in a window under Xvfb, one-line errors for bad files, and the built-in geometry's
winding and placement in the demo's world."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from texstream.apps.demo_scene import SceneDemo, box, plane, scene_flight, sphere

from .scene.files import trimesh_scene
from .test_demo import demo_cli, headless_env, x11_env

SMALL = ("--size", "192x108", "--budget-mb", "48")


def _frames_ok(out: Path, count: int) -> None:
    frames = sorted(out.glob("frame_*.png"))
    assert len(frames) == count
    img = np.asarray(Image.open(frames[-1]).convert("RGB")).astype(int)
    assert img.std() > 10 and len(np.unique(img.reshape(-1, 3), axis=0)) > 100, "the frame shows no scene"


def test_a_trimesh_glb_flies_headless(tmp_path: Path) -> None:
    glb = trimesh_scene(tmp_path / "scene.glb", size=512)  # 16 tiles a texture: finer levels stream in
    out = tmp_path / "frames"
    # 12 frames: the I/O threads' reads land within a few frames even on a loaded machine
    proc = demo_cli("scene", str(glb), "--headless", "--frames", "12", "--out", str(out), *SMALL, env=headless_env())
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    _frames_ok(out, 12)
    report = json.loads((out / "run.json").read_text())
    assert report["scene"] == "scene" and report["textures"] == 2 and report["uploads"] > 0


def test_the_builtin_scene_bakes_once_and_flies(tmp_path: Path) -> None:
    env = headless_env() | {"TEXSTREAM_CACHE": str(tmp_path / "cache")}
    args = ("scene", "--headless", "--frames", "3", "--texture-size", "256", "--no-overlay", *SMALL)
    first = demo_cli(*args, "--out", str(tmp_path / "a"), env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    _frames_ok(tmp_path / "a", 3)
    report = json.loads((tmp_path / "a" / "run.json").read_text())
    assert report["textures"] == 7  # four materials, eight roles; the panels' two share one pack
    packs = sorted((tmp_path / "cache" / "scene").glob("*.tpk"))
    assert len(packs) == 7
    stamps = [p.stat().st_mtime_ns for p in packs]
    second = demo_cli(*args, "--out", str(tmp_path / "b"), env=env, timeout=300)
    assert second.returncode == 0, second.stderr
    assert [p.stat().st_mtime_ns for p in packs] == stamps  # the second run baked nothing


@pytest.mark.parametrize(
    ("files", "words"),
    [(["missing.glb"], "missing.glb: no such file"), (["a.glb", "b.glb"], "one glTF file")],
)
def test_bad_files_are_one_line(files: list[str], words: str, tmp_path: Path) -> None:
    for name in files:
        if name != "missing.glb":
            (tmp_path / name).write_bytes(b"glTF")
    proc = demo_cli("scene", *[str(tmp_path / f) for f in files], "--headless", *SMALL, env=headless_env())
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_the_scene_demo_opens_a_window_under_xvfb(xvfb: str, tmp_path: Path) -> None:
    glb = trimesh_scene(tmp_path / "scene.glb", size=64)
    out = tmp_path / "frames"
    telemetry = tmp_path / "window.jsonl"
    env = x11_env(xvfb, TEXSTREAM_DEMO_FRAMES="8")
    proc = demo_cli("scene", str(glb), "--telemetry", str(telemetry), "--out", str(out), *SMALL, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "headless" not in proc.stderr and not out.exists(), "it rendered headless instead of opening a window"
    assert len(telemetry.read_text().splitlines()) == 8


@pytest.mark.parametrize("make", [lambda: box(0), lambda: sphere(0, 8, 16), lambda: plane(0, 1.0, 1.0)])
def test_builtin_geometry_winds_counter_clockwise_seen_from_outside(make) -> None:  # noqa: ANN001
    prim = make()
    tri = prim.positions[prim.indices.reshape(-1, 3)]
    face = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    normal = prim.normals[prim.indices.reshape(-1, 3)].mean(axis=1)
    big = np.linalg.norm(face, axis=1) > 1e-6  # (the sphere's poles have degenerate triangles)
    assert (np.einsum("ij,ij->i", face[big], normal[big]) > 0).all()


class _Bounds:
    bounds = (np.array([-2.0, 0.5, -1.0]), np.array([2.0, 3.0, 1.0]))
    debug = 0


def test_the_scene_stands_on_the_demo_ground_and_the_flight_circles_it() -> None:
    demo = SceneDemo(_Bounds())  # type: ignore[arg-type]
    lo, hi = _Bounds.bounds
    corners = np.array([[x, y, z, 1.0] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])])
    world = corners @ demo.root.T
    assert np.isclose(world[:, 2].max(), 0.0)  # the lowest point (glTF y) on the ground, z = 0
    assert world[:, 2].min() < 0  # glTF up is the demo's -z
    assert np.isclose(world[:, 0].min(), -500.0) and np.isclose(world[:, 0].max(), 500.0)
    path = scene_flight(demo.extent)
    for t in np.linspace(0, path.duration, 13):
        eye = path.pose(float(t)).eye
        assert eye[2] < 0 and np.hypot(eye[0], eye[1]) > 100  # above the ground, around the scene


@pytest.mark.gl
def test_a_files_images_bake_with_a_progress_bar_on_a_terminal(
    gl_context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    """`demo scene FILE` shows the image bakes' progress (as the other commands do for images)."""
    from texstream import BudgetConfig, Streamer, StreamerConfig
    from texstream.apps import demo_scene

    events: list[object] = []

    class RecordingBar:
        def __call__(self, event: object) -> None:
            events.append(event)

        def close(self) -> None:
            events.append("closed")

    monkeypatch.setenv("TEXSTREAM_CACHE", str(tmp_path / "cache"))  # a fresh cache: the images bake now
    monkeypatch.setattr(demo_scene, "ImagePackBar", RecordingBar)
    glb = trimesh_scene(tmp_path / "scene.glb", size=128)
    with Streamer(gl_context, StreamerConfig(budget=BudgetConfig(budget_mb=32))) as streamer:
        demo, _flight = demo_scene.scene_and_flight(gl_context, streamer, (str(glb),), 512, progress=True)
        demo.scene.release()
    stages = {getattr(e, "stage", None) for e in events}
    assert events[-1] == "closed" and len(stages - {None}) >= 2, stages
