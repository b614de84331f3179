"""The documentation: the site builds with ``mkdocs build --strict`` (a broken link, a missing page,
an unresolved API reference or a missing included example fails here, and so fails `make test`), and
the getting-started program runs as printed."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from texstream.bake import bake_procedural
from texstream.config import BakeConfig

from .require import skip_unless_required

ROOT = Path(__file__).resolve().parents[1]
TESTED_BLOCK = re.compile(r"<!-- tests/test_docs.py runs this block -->\n```python\n(.*?)```", re.S)


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
