"""BudgetError says what to do: the setting to raise (`BudgetConfig.budget_mb`, in whole MiB) and the
smallest budget that fits, in the library's words (no internal allocation names); the command line
names its own flag instead. Each advertised minimum is checked to be enough, and one MiB less not."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import moderngl
import pytest

import texstream as ts
from texstream.bake import bake_procedural

pytestmark = pytest.mark.gl

ADVICE = re.compile(
    r": set BudgetConfig\.budget_mb to at least (?P<mib>\d+)(?P<pinned>, or lower StreamerConfig\.pinned_levels)?$"
)


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("budget") / "terrain-1024.tpk"
    bake_procedural(out, 1024, "terrain", seed=3, config=ts.BakeConfig(tile_size=64, jobs=1, progress=False))
    return out


def streamer(ctx: moderngl.Context, mib: float, pinned_levels: int = 2) -> ts.Streamer:
    return ts.Streamer(ctx, ts.StreamerConfig(budget=ts.BudgetConfig(budget_mb=mib), pinned_levels=pinned_levels))


def advised(err: ts.BudgetError) -> int:
    message = str(err)
    assert "pool/" not in message and "'feedback'" not in message and "--budget-mb" not in message, message
    m = ADVICE.search(message)
    assert m is not None, message
    return int(m.group("mib"))


def test_constructor_names_the_feedback_buffers_and_the_minimum(gl_context: moderngl.Context) -> None:
    with pytest.raises(ts.BudgetError) as info:
        streamer(gl_context, 0.25)
    assert "feedback buffers" in str(info.value)
    minimum = advised(info.value)
    streamer(gl_context, minimum).release()  # the advised budget is enough


def test_open_names_the_minimum_that_fits(gl_context: moderngl.Context, pack: Path) -> None:
    with ts.Streamer(gl_context, ts.StreamerConfig(budget=ts.BudgetConfig(budget_mb=64))) as probe:
        feedback_mib = probe.stats().vram_breakdown["feedback"] / 2**20
    small = feedback_mib + 0.25  # the streamer is made, the texture cannot open
    with streamer(gl_context, small) as s, pytest.raises(ts.BudgetError) as info:
        s.open(pack)
    message = str(info.value)
    assert message.startswith(f"{pack}: the VRAM budget")
    assert "pinned_levels" not in message  # two pinned levels of 64² tiles cost next to nothing
    minimum = advised(info.value)
    with streamer(gl_context, minimum) as s:
        s.open(pack)
    with streamer(gl_context, minimum - 1) as s, pytest.raises(ts.BudgetError):
        s.open(pack)


def test_pinned_levels_named_where_they_are_the_cost(gl_context: moderngl.Context, pack: Path) -> None:
    """All five levels of a 1024² pack of 64² tiles pinned are 341 tiles: fewer levels would fit."""
    with streamer(gl_context, 3, pinned_levels=5) as s, pytest.raises(ts.BudgetError) as info:
        s.open(pack)
    assert ADVICE.search(str(info.value)).group("pinned"), str(info.value)
    with streamer(gl_context, advised(info.value), pinned_levels=5) as s:
        s.open(pack)


def test_make_all_resident_names_the_minimum_that_fits(gl_context: moderngl.Context, pack: Path) -> None:
    with streamer(gl_context, 3) as s:
        vt = s.open(pack)
        with pytest.raises(ts.BudgetError, match="all 341 tiles need") as info:
            s.make_all_resident(vt)
    minimum = advised(info.value)
    with streamer(gl_context, minimum) as s:
        s.make_all_resident(s.open(pack))


def test_cli_names_its_flag(pack: Path, tmp_path: Path) -> None:
    out = tmp_path / "frame.png"
    args = ["render", str(pack), "--out", str(out), "--size", "64x64", "--frames", "1", "--budget-mb", "0.25"]
    p = subprocess.run([sys.executable, "-m", "texstream", *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert re.search(r": pass --budget-mb \d+ or more$", line), line
    assert "BudgetConfig" not in line and "pool/" not in line
    assert not out.exists()
