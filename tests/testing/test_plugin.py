"""The `texstream.testing` pytest plugin as a user meets it: a fresh project with one short test file,
run by pytest in a subprocess. It passes headless on llvmpipe, fails readably (PSNR, images written)
when its texture changes, and `--texstream-update-golden` rewrites the golden image."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from texstream.testing import IDENTICAL_DB, ImageMismatch, assert_image_close, psnr, read_png

ROOT = Path(__file__).resolve().parents[2]
TESTED_BLOCK = re.compile(r"<!-- tests/testing/test_plugin.py runs this block -->\n```python\n(.*?)```", re.S)
SEED = "seed=1,"


def docs_example() -> str:
    """docs/testing.md's example test file, as printed."""
    (block,) = TESTED_BLOCK.findall((ROOT / "docs" / "testing.md").read_text(encoding="utf-8"))
    assert block.count(SEED) == 1  # the runs below change the texture through it
    return block


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("user-project")
    (root / "test_render.py").write_text(docs_example())
    return root


def run_pytest(root: Path, *args: str, target: str = "test_render.py") -> subprocess.CompletedProcess:
    # the user's environment (its Python path, GL libraries), without the outer pytest's settings
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(TEXSTREAM_REQUIRE="gl", COLUMNS="1000")  # summary lines whole
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rA",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(root),
            "--texstream-require-gl",
            *args,
            str(root / target),
        ],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        timeout=300,
    )


def test_a_fresh_project_passes_fails_readably_and_updates_its_golden(project: Path, gl_context: object) -> None:
    golden = project / "golden" / "test_terrain.png"
    first = run_pytest(project)  # no golden image yet: a clear failure
    assert first.returncode == 1 and "no golden image" in first.stdout and "--texstream-update-golden" in first.stdout

    update = run_pytest(project, "--texstream-update-golden")
    assert update.returncode == 0, update.stdout + update.stderr
    assert golden.is_file()
    stored = read_png(golden)

    again = run_pytest(project)
    assert again.returncode == 0, again.stdout + again.stderr

    # the texture changed: the golden comparison fails
    (project / "test_render.py").write_text(docs_example().replace(SEED, "seed=2,"))
    changed = run_pytest(project)
    assert changed.returncode == 1
    assert "PSNR" in changed.stdout and "is below 40 dB" in changed.stdout, changed.stdout
    written = sorted((project / "texstream-artifacts").rglob("*.png"))
    assert {p.name for p in written} == {
        "test_terrain-actual.png",
        "test_terrain-expected.png",
        "test_terrain-diff.png",
    }
    assert all(str(p) in changed.stdout for p in written)  # the message names them

    regen = run_pytest(project, "--texstream-update-golden")
    assert regen.returncode == 0
    assert psnr(read_png(golden), stored) < 40  # rewritten with the new texture
    assert run_pytest(project).returncode == 0


FIXTURE_TESTS = """
import pytest
import texstream as ts


def test_released_simple_framebuffer(gl_context, streamer):
    fbo = gl_context.simple_framebuffer((16, 16))
    fbo.use()
    fbo.clear(0.5, 0.5, 0.5)
    fbo.release()  # leaves its two renderbuffers: moderngl's Framebuffer.release() does


@pytest.mark.texstream_strict_gl
def test_released_simple_framebuffer_strict(gl_context, streamer):
    fbo = gl_context.simple_framebuffer((16, 16))
    fbo.release()


KEPT = []  # streamers a test holds on to without releasing them


def test_unreleased_streamer(gl_context, streamer):
    KEPT.append(ts.Streamer(gl_context))  # never released and still referenced: its GL objects stay


@pytest.mark.texstream_golden
def test_fails_before_golden(gl_context, streamer, golden):
    ts.Streamer(gl_context)
    assert 1 == 2, "the test's own failure"


@pytest.mark.texstream_golden(folder="../../../outside")
def test_golden_three_levels_up(golden):
    golden(None)


@pytest.mark.texstream_golden(folder="OUTSIDE_ABSOLUTE")
def test_golden_absolute_elsewhere(golden):
    golden(None)


@pytest.mark.texstream_golden(folder="images")
def test_golden_relative_to_the_test_file(golden):
    import numpy as np

    golden(np.full((4, 4, 3), 200, np.uint8))
"""


def _outcomes(stdout: str) -> dict[str, str]:
    """`-rA` summary lines: {test name: 'PASSED' or 'FAILED - message' or 'ERROR - message'}."""
    found: dict[str, str] = {}
    for line in stdout.splitlines():
        m = re.match(r"(PASSED|FAILED|ERROR) \S+::(\w+)(?: - (.*))?$", line)
        if m:
            kind, name, message = m.groups()
            found[name] = (
                (found.get(name, "") + " | " if name in found else "") + kind + (f" - {message}" if message else "")
            )
    return found


def test_fixtures_blame_texstream_objects_and_keep_golden_images_inside(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, gl_context: object
) -> None:
    """Run from the project's root, tests in a subfolder: a released simple_framebuffer passes
    (strict checking fails it, with the hint); an unreleased Streamer fails, blamed on texstream; a
    failed test gets no second error; golden folders resolve against the test file's folder and
    never outside the rootdir."""
    root = tmp_path / "project"
    tests = root / "tests" / "render"
    tests.mkdir(parents=True)
    outside = tmp_path_factory.mktemp("elsewhere")
    (tests / "test_fixtures.py").write_text(FIXTURE_TESTS.replace("OUTSIDE_ABSOLUTE", str(outside)))
    done = run_pytest(root, "--texstream-update-golden", target="tests/render/test_fixtures.py")
    got = _outcomes(done.stdout)
    assert got["test_released_simple_framebuffer"] == "PASSED", done.stdout
    strict = got["test_released_simple_framebuffer_strict"]
    assert strict.startswith("PASSED | ERROR") and "{'framebuffers'" not in strict, done.stdout
    assert "made by the test left behind (strict check): {'renderbuffers': 2}" in done.stdout
    assert "fbo.color_attachments and fbo.depth_attachment" in done.stdout
    assert got["test_unreleased_streamer"].startswith("PASSED | ERROR"), done.stdout
    assert "GL objects made by texstream left behind after the test" in done.stdout
    assert got["test_fails_before_golden"].startswith("FAILED"), done.stdout
    assert "ERROR" not in got["test_fails_before_golden"] and "never called golden" not in done.stdout
    for name in ("test_golden_three_levels_up", "test_golden_absolute_elsewhere"):
        assert got[name].startswith("ERROR"), (name, done.stdout)
        assert "outside the project's rootdir" in got[name], (name, done.stdout)
    assert list(outside.iterdir()) == [] and not (tmp_path / "outside").exists()
    assert got["test_golden_relative_to_the_test_file"] == "PASSED", done.stdout
    assert (tests / "images" / "test_golden_relative_to_the_test_file.png").is_file()


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
