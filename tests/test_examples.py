"""Every runnable example under demos/ runs, exits 0 and draws the right picture.

Each example runs in a subprocess (it makes its own GL context), headless: through EGL, through
moderngl-window's headless window, or in a GLFW window on a private Xvfb server. The scene examples
draw the same scripted zoom, so their last frames are compared with one reference frame rendered
with every tile resident (`embed_headless_egl.py --all-resident`).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from texstream.bake import bake_file, bake_procedural
from texstream.config import BakeConfig
from texstream.testing import assert_image_close

from .require import skip_unless_required

DEMOS = Path(__file__).resolve().parents[1] / "demos"
SIZE = 256  # frame width and height: small, so llvmpipe renders fast
FRAMES = 30
CLEAR = (26, 26, 31)  # the examples' clear colour (0.1, 0.1, 0.12) in 8 bits


def load(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def assert_not_blank(image: np.ndarray) -> None:
    """Something was drawn: the picture varies and is mostly not the clear colour."""
    assert image.std() > 10, f"a flat image (std {image.std():.1f})"
    background = np.all(np.abs(image.astype(np.int16) - CLEAR) <= 2, axis=-1)
    assert background.mean() < 0.5, f"{background.mean():.0%} of the pixels are the clear colour"


def headless_env(cache: Path) -> dict[str, str]:
    """No display, no debug tracebacks, and texstream's cache folder in the test's temp dir."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "TEXSTREAM_DEBUG")}
    env["TEXSTREAM_CACHE"] = str(cache)
    return env


def run_example(name: str, *args: str, env: dict[str, str], cwd: Path, timeout: float = 300) -> str:
    proc = subprocess.run(
        [sys.executable, str(DEMOS / name), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


# ---- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def egl(gl_context: object) -> None:
    """Skips (through conftest's gl_context) where there is no headless OpenGL 4.5 context."""


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The examples' own default pack: a 1024² BC1 terrain, 64-texel tiles (5 levels, 341 tiles)."""
    path = tmp_path_factory.mktemp("examples-pack") / "terrain.tpk"
    bake_procedural(path, 1024, "terrain", seed=1, config=BakeConfig(tile_size=64, jobs=1, progress=False))
    return path


@pytest.fixture(scope="module")
def reference(pack: Path, egl: None, tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """The scripted zoom's last frame with every tile resident."""
    out = tmp_path_factory.mktemp("examples-reference")
    run_example(
        "embed_headless_egl.py",
        str(pack),
        "--all-resident",
        "--size",
        str(SIZE),
        "--frames",
        str(FRAMES),
        "--out",
        "reference.png",
        env=headless_env(out),
        cwd=out,
    )
    image = load(out / "reference.png")
    assert image.shape == (SIZE, SIZE, 3)
    assert_not_blank(image)
    return image


# ---- how each example runs headless -----------------------------------------------------------------
@dataclass(frozen=True)
class Example:
    """How the test runs one example: its arguments (PACK and OUT filled in), and how close its last
    frame must be to the reference (None: not the reference scene, only checked for content)."""

    args: tuple[str, ...]
    out: str
    min_psnr: float | None
    needs: tuple[str, ...] = ()  # "xvfb": in a GLFW window on Xvfb; "moderngl_window": that package


# The scene examples' last frame: embed_headless_egl settles before writing, so it matches the reference
# to rounding (45 dB, as every streamed frame after convergence); the windowed ones write the frame the
# zoom ends on, where a slow machine may still show a coarser level (20 dB: still the same picture,
# which three levels coarser scores 23 dB and upside down 14 dB).
EXAMPLES: dict[str, Example] = {
    "embed_minimal.py": Example(("PACK",), "embed_minimal.png", None),
    "embed_headless_egl.py": Example(
        ("PACK", "--size", str(SIZE), "--frames", str(FRAMES), "--out", "OUT"), "egl.png", 45.0
    ),
    "embed_moderngl_window.py": Example(
        (
            "PACK",
            "--window",
            "headless",
            "--backend",
            "egl",
            "--size",
            f"{SIZE}x{SIZE}",
            "--frames",
            str(FRAMES),
            "--out",
            "OUT",
        ),
        "mglw.png",
        20.0,
        needs=("moderngl_window",),
    ),
    "embed_glfw.py": Example(
        ("PACK", "--size", f"{SIZE}x{SIZE}", "--frames", str(FRAMES), "--out", "OUT"),
        "glfw.png",
        20.0,
        needs=("xvfb",),
    ),
}


def test_every_example_is_run_here() -> None:
    found = sorted(p.name for p in DEMOS.glob("*.py") if not p.name.startswith("_"))
    assert found == sorted(EXAMPLES), "add each new demos/*.py to EXAMPLES (and each removed one out of it)"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs_headless(
    name: str,
    pack: Path,
    reference: np.ndarray,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    texstream_artifacts: Path,
) -> None:
    example = EXAMPLES[name]
    env = headless_env(tmp_path / "cache")
    if "moderngl_window" in example.needs:
        if importlib.util.find_spec("moderngl_window") is None:
            skip_unless_required("demos", "moderngl-window is not installed (pip install -e '.[demos]')")
    if "xvfb" in example.needs:
        display = request.getfixturevalue("xvfb")
        env.pop("XDG_SESSION_TYPE", None)  # pyglfw would pick its Wayland build
        env.update(DISPLAY=display, PYGLFW_LIBRARY_VARIANT="x11")
    args = [{"PACK": str(pack), "OUT": example.out}.get(a, a) for a in example.args]
    run_example(name, *args, env=env, cwd=tmp_path)

    image = load(tmp_path / example.out)
    assert_not_blank(image)
    if example.min_psnr is not None:  # against the all-resident frame, images kept when it fails
        assert_image_close(image, reference, example.min_psnr, name=name, out_dir=texstream_artifacts)


def test_example_bakes_its_own_pack_without_one(egl: None, reference: np.ndarray, tmp_path: Path) -> None:
    """No pack given: the procedural terrain is baked into TEXSTREAM_CACHE and is the same picture."""
    cache = tmp_path / "cache"
    run_example(
        "embed_headless_egl.py",
        "--size",
        str(SIZE),
        "--frames",
        str(FRAMES),
        "--out",
        "egl.png",
        env=headless_env(cache),
        cwd=tmp_path,
    )
    assert (cache / "examples" / "terrain-1024.tpk").is_file()
    assert_image_close(load(tmp_path / "egl.png"), reference, 45.0, name="egl-own-pack")


def test_headless_example_shows_an_image_right_side_up(egl: None, tmp_path: Path) -> None:
    """The examples' screen-filling triangle has v = 0 at the bottom of the screen, moderngl's habit:
    the image's top-left quadrant (red) must land in the screen's top-left, not its bottom-left. The
    zoom ends on the image's centre, where all four quadrants meet."""
    colours = {"red": (220, 40, 40), "green": (40, 200, 60), "blue": (40, 60, 220), "white": (235, 235, 235)}
    image = np.zeros((256, 256, 3), np.uint8)
    image[:128, :128], image[:128, 128:] = colours["red"], colours["green"]
    image[128:, :128], image[128:, 128:] = colours["blue"], colours["white"]
    Image.fromarray(image).save(tmp_path / "quadrants.png")
    bake_file(tmp_path / "quadrants.png", tmp_path / "quadrants.tpk", BakeConfig(tile_size=64, jobs=1, progress=False))
    run_example(
        "embed_headless_egl.py",
        str(tmp_path / "quadrants.tpk"),
        *("--size", "64", "--frames", "2", "--out", "out.png"),
        env=headless_env(tmp_path),
        cwd=tmp_path,
    )
    frame = load(tmp_path / "out.png").astype(int)

    def nearest(y: int, x: int) -> str:
        c = frame[y, x]
        return min(colours, key=lambda n: sum((int(a) - b) ** 2 for a, b in zip(c, colours[n], strict=True)))

    corners = {"top-left": (8, 8), "top-right": (8, 56), "bottom-left": (56, 8), "bottom-right": (56, 56)}
    seen = {name: nearest(*at) for name, at in corners.items()}
    assert seen == {"top-left": "red", "top-right": "green", "bottom-left": "blue", "bottom-right": "white"}
