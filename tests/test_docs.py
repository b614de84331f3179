"""The documentation: the site builds with ``mkdocs build --strict`` (a broken link, a missing page,
an unresolved API reference or a missing included example fails here, and so fails `make test`),
every picture a page shows exists, the getting-started program runs as printed, and the pygame,
pyglet and Qt programs of the embedding page compile (and run under Xvfb where those are installed)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from texstream.bake import bake_procedural
from texstream.config import BakeConfig

from .require import skip_unless_required

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TESTED_BLOCK = re.compile(r"<!-- tests/test_docs.py runs this block -->\n```python\n(.*?)```", re.S)
EMBED_BLOCK = re.compile(r"<!-- tests/test_docs.py runs this block: (\w+) -->\n```python\n(.*?)```", re.S)
EMBED_TOOLKITS = {"pygame": "pygame", "pyglet": "pyglet", "qt": "PySide6"}  # block name -> module it needs
# the pictures a page shows: Markdown images (plain or <bracketed> targets, with a title or not) and <img>
IMAGE_REF = re.compile(
    r"!\[[^\]]*\]\(\s*(?:<([^>]+)>|([^)\s]+))(?:\s+\"[^\"]*\")?\s*\)"  # ![alt](target "title"), ![alt](<tar get>)
    r"|<img\b[^>]*\bsrc=[\"']([^\"']+)[\"']",  # <img src="target">
    re.I,
)
IMAGES_BUDGET = 3 * 2**20  # docs/images in all: the repository carries them


def test_site_builds_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        skip_unless_required("docs", "mkdocs and mkdocstrings are not installed (pip install -e '.[docs]')")
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # the theme's banner about its successor, on every build
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    for page in ("index.html", "api/index.html", "embedding/index.html", "TELEMETRY/index.html"):
        assert (site / page).is_file(), page


def test_getting_started_program_runs(gl_context: object, tmp_path: Path) -> None:
    """The page's complete program, as printed, in a folder holding terrain.tpk."""
    (block,) = TESTED_BLOCK.findall((ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8"))
    (tmp_path / "program.py").write_text(block, encoding="utf-8")
    bake_procedural(tmp_path / "terrain.tpk", 1024, "terrain", seed=1, config=BakeConfig(tile_size=64, progress=False))
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    proc = subprocess.run(
        [sys.executable, "program.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    image = np.asarray(Image.open(tmp_path / "terrain.png").convert("RGB"))
    assert image.std() > 10, "the program wrote a flat image"


def image_references() -> list[tuple[Path, str]]:
    refs = []
    for page in sorted(DOCS.glob("**/*.md")):
        text = page.read_text(encoding="utf-8")
        refs += [(page, next(g for g in groups if g)) for groups in IMAGE_REF.findall(text)]
    return refs


def test_image_reference_pattern_finds_both_spellings() -> None:
    text = '![a](images/x.png) and ![b](<images/y z.svg> "title"){ width=600 } and <img alt="c" src="images/w.png">'
    found = [next(g for g in groups if g) for groups in IMAGE_REF.findall(text)]
    assert found == ["images/x.png", "images/y z.svg", "images/w.png"]


def test_every_image_a_page_shows_exists() -> None:
    refs = image_references()
    assert refs, "no page shows a picture"
    missing = []
    for page, target in refs:
        if urllib.parse.urlsplit(target).scheme:  # a picture on the web: not ours to check here
            continue
        path = (page.parent / urllib.parse.unquote(target.split("#")[0])).resolve()
        if not path.is_file() or not path.is_relative_to(DOCS):
            missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, "pictures the docs show that docs/ lacks:\n" + "\n".join(missing)
    shown = {(p.parent / t).resolve() for p, t in refs}
    images = [f for f in (DOCS / "images").iterdir() if f.suffix in (".png", ".svg")]
    unused = sorted(f.name for f in images if f.resolve() not in shown)
    assert not unused, f"docs/images holds pictures no page shows: {unused}"
    total = sum(f.stat().st_size for f in images)
    assert total <= IMAGES_BUDGET, f"docs/images holds {total / 2**20:.1f} MiB of pictures (keep it under 3 MiB)"


def embedding_blocks() -> dict[str, str]:
    """The page's programs by toolkit, and "shaders": the module they share (fullscreen_shaders.py)."""
    blocks = dict(EMBED_BLOCK.findall((DOCS / "embedding.md").read_text(encoding="utf-8")))
    assert sorted(blocks) == sorted([*EMBED_TOOLKITS, "shaders"]), sorted(blocks)
    return blocks


@pytest.mark.parametrize("block", sorted([*EMBED_TOOLKITS, "shaders"]))
def test_embedding_program_compiles(block: str) -> None:
    compile(embedding_blocks()[block], f"docs/embedding.md ({block})", "exec")


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("embed") / "terrain.tpk"
    bake_procedural(path, 1024, "terrain", seed=1, config=BakeConfig(tile_size=64, progress=False))
    return path


@pytest.mark.gl
@pytest.mark.parametrize("toolkit", sorted(EMBED_TOOLKITS))
def test_embedding_program_runs_under_xvfb(toolkit: str, xvfb: str, small_pack: Path, tmp_path: Path) -> None:
    """The page's program, as printed, for 20 frames in a window on a private X server (Qt: offscreen)."""
    module = EMBED_TOOLKITS[toolkit]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: the {toolkit} program is only compiled")
    blocks = embedding_blocks()
    program = tmp_path / f"{toolkit}_app.py"
    program.write_text(blocks[toolkit], encoding="utf-8")
    (tmp_path / "fullscreen_shaders.py").write_text(blocks["shaders"], encoding="utf-8")
    env = dict(os.environ, DISPLAY=xvfb, QT_QPA_PLATFORM="offscreen", SDL_AUDIODRIVER="dummy")
    proc = subprocess.run(
        [sys.executable, str(program), str(small_pack), "20"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    match = re.search(r"(\d+) tiles resident", proc.stdout)
    assert match and int(match.group(1)) > 0, proc.stdout[-2000:]
