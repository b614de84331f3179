"""The `texstream.testing` pytest plugin as a user meets it: a fresh project with one short test file,
run by pytest in a subprocess. It passes headless on llvmpipe, fails readably (PSNR, images written)
when its texture changes, and `--texstream-update-golden` rewrites the golden image."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from texstream.bake import bake_procedural
from texstream.config import BakeConfig
from texstream.testing import IDENTICAL_DB, ImageMismatch, assert_image_close, psnr, read_png

USER_TEST = """
import os
import pytest
import texstream as ts
from texstream.apps.render import PlaneRenderer
from texstream.scene.camera import View
from texstream.testing import all_resident, assert_image_close, converge

@pytest.mark.texstream_golden(min_psnr=40)
def test_terrain(gl_context, streamer, golden, texstream_artifacts):
    vt = streamer.open(os.environ["PACK"])
    renderer = PlaneRenderer(gl_context, (128, 128))
    try:
        frame = converge(streamer, lambda: renderer.draw(vt, View(0.5, 0.5, 0.25)) or renderer.read())
        with ts.Streamer(gl_context) as ref:
            whole_vt = ref.open(os.environ["PACK"])
            whole = all_resident(ref, lambda: renderer.draw(whole_vt, View(0.5, 0.5, 0.25)) or renderer.read())
        assert_image_close(frame, whole, 45, name="vs-all-resident", out_dir=texstream_artifacts)
        golden(frame)
    finally:
        renderer.release()
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("user-project")
    (root / "test_render.py").write_text(USER_TEST)
    for seed in (1, 2):
        bake_procedural(
            root / f"terrain{seed}.tpk", 1024, "terrain", seed, BakeConfig(tile_size=64, jobs=1, progress=False)
        )
    return root


def run_pytest(root: Path, pack: str, *args: str) -> subprocess.CompletedProcess:
    # the user's environment (its Python path, GL libraries), without the outer pytest's settings
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PACK=str(root / pack), TEXSTREAM_REQUIRE="gl")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(root),
            "--texstream-require-gl",
            *args,
            str(root / "test_render.py"),
        ],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        timeout=300,
    )


def test_a_fresh_project_passes_fails_readably_and_updates_its_golden(project: Path, gl_context: object) -> None:
    golden = project / "golden" / "test_terrain.png"
    first = run_pytest(project, "terrain1.tpk")  # no golden image yet: a clear failure
    assert first.returncode == 1 and "no golden image" in first.stdout and "--texstream-update-golden" in first.stdout

    update = run_pytest(project, "terrain1.tpk", "--texstream-update-golden")
    assert update.returncode == 0, update.stdout + update.stderr
    assert golden.is_file()
    stored = read_png(golden)

    again = run_pytest(project, "terrain1.tpk")
    assert again.returncode == 0, again.stdout + again.stderr

    changed = run_pytest(project, "terrain2.tpk")  # the texture changed: the golden comparison fails
    assert changed.returncode == 1
    assert "PSNR" in changed.stdout and "is below 40 dB" in changed.stdout, changed.stdout
    written = sorted((project / "texstream-artifacts").rglob("*.png"))
    assert {p.name for p in written} == {
        "test_terrain-actual.png",
        "test_terrain-expected.png",
        "test_terrain-diff.png",
    }
    assert all(str(p) in changed.stdout for p in written)  # the message names them

    regen = run_pytest(project, "terrain2.tpk", "--texstream-update-golden")
    assert regen.returncode == 0
    assert psnr(read_png(golden), stored) < 40  # rewritten with the new texture
    assert run_pytest(project, "terrain2.tpk").returncode == 0


def test_marker_without_a_comparison_fails(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        textwrap.dedent("""
        import pytest

        @pytest.mark.texstream_golden
        def test_forgot(golden):
            pass
    """)
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 1 and "never called golden(image)" in proc.stdout


def test_assert_image_close_writes_and_names_the_images(tmp_path: Path) -> None:
    a = np.zeros((8, 8, 3), np.uint8)
    b = a.copy()
    assert assert_image_close(a, b, 45) == IDENTICAL_DB
    b[2:4, 2:4] = 200
    with pytest.raises(ImageMismatch) as err:
        assert_image_close(a, b, 45, name="case", out_dir=tmp_path)
    assert set(err.value.paths) == {"actual", "expected", "diff"}
    assert all(p.is_file() and str(p) in str(err.value) for p in err.value.paths.values())
    with pytest.raises(AssertionError, match="8x8 image against a 4x4 reference"):
        assert_image_close(a, a[:4, :4], 45)
