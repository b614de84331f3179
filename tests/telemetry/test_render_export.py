"""`texstream render --telemetry` writes the documented frame records: JSON lines, or CSV for .csv."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from texstream.telemetry import validate_frame
from texstream.telemetry.stats import CSV_COLUMNS

from .conftest import Packs

FRAMES = 12  # the throttled loop reads the first feedback by frame 4: requests are certain, uploads not


def render_cli(pack: Path, tmp_path: Path, telemetry: Path) -> subprocess.CompletedProcess:
    out = str(tmp_path / "o.png")
    args = ["render", str(pack), "--out", out, "--size", "128x128", "--frames", str(FRAMES), "--budget-mb", "24"]
    args += ["--telemetry", str(telemetry)]
    return subprocess.run([sys.executable, "-m", "texstream", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.usefixtures("gl_context")  # skips (or fails, where GL is required) without headless GL
def test_render_writes_frame_records(packs: Packs, tmp_path: Path) -> None:
    path = tmp_path / "frames.jsonl"
    proc = render_cli(packs.small, tmp_path, path)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == FRAMES
    for r in records:
        validate_frame(r)
    assert records[-1]["total_requested"] > 0 and records[-1]["budget_bytes"] == 24 << 20
    assert f"{records[-1]['resident_tiles']} tiles resident" in proc.stdout


@pytest.mark.usefixtures("gl_context")
def test_render_writes_csv_for_a_csv_name(packs: Packs, tmp_path: Path) -> None:
    path = tmp_path / "frames.csv"
    proc = render_cli(packs.small, tmp_path, path)
    assert proc.returncode == 0, proc.stderr
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) == FRAMES + 1
    frame = dict(zip(CSV_COLUMNS, rows[-1], strict=True))
    assert int(frame["frame"]) == FRAMES and int(frame["budget_bytes"]) == 24 << 20
    assert json.loads(frame["vram_breakdown"])  # the nested object is JSON in its cell
