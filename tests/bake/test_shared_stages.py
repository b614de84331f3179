"""Levels passed between stages through rings of rows in shared memory, tiles' payloads laid out by
the workers: the packs hold the same tiles however small the rings, and the report says where the
CPU time went."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from texstream.bake import ArraySource, bake, pipeline
from texstream.bake.jobs import LevelRing, plan_stages
from texstream.bake.procedural import ProceduralSource
from texstream.config import BakeConfig
from texstream.pack import AddressMode, PackReader, TexelFormat

from .conftest import load_photo


def _tiles(path: Path) -> dict[tuple[int, int, int], bytes]:
    with PackReader(path) as r:
        h = r.header
        return {
            (lv, x, y): bytes(r.read_tile(lv, x, y))
            for lv in range(h.level_count)
            for y in range(h.tiles_in_level(lv)[1])
            for x in range(h.tiles_in_level(lv)[0])
        }


def test_ring_pieces_split_at_the_end_of_the_ring() -> None:
    ring = LevelRing(offset=4096, rows=10, width=3)
    assert ring.pieces(2, 7) == [(2, 5, 0)]
    assert ring.pieces(8, 14) == [(8, 2, 0), (0, 4, 2)]
    assert ring.pieces(20, 30) == [(0, 10, 0)]
    with pytest.raises(ValueError, match="do not fit"):
        ring.pieces(0, 11)
    shared = bytearray(4096 + ring.nbytes)
    ring.view(shared)[9, 2, 3] = 1.5
    assert np.frombuffer(shared, np.float32, offset=4096)[(9 * 3 + 2) * 4 + 3] == 1.5


@pytest.mark.parametrize(
    ("source", "mode", "fmt"),
    [
        (lambda: ArraySource(load_photo("astronaut.png")[:300, :260], "astronaut"), AddressMode.CLAMP, TexelFormat.BC1),
        (lambda: ProceduralSource("normals", 320, 200, 3), AddressMode.WRAP, TexelFormat.BC5),
    ],
    ids=["array-clamp-bc1", "procedural-wrap-bc5"],
)
@pytest.mark.parametrize("jobs", [1, 2])
def test_the_smallest_rings_hold_bands_back_and_bake_the_same_tiles(
    tmp_path: Path, small_bands: None, monkeypatch: pytest.MonkeyPatch, source, mode, fmt, jobs: int
) -> None:
    """Rings of one window plus one band's output: windows and outputs run past the ring's end,
    and bands wait for the rows they would overwrite to be read; every tile is as before."""
    cfg = BakeConfig(texel_format=fmt, address_mode=mode, tile_size=64, jobs=jobs, progress=False)
    roomy = bake(source(), tmp_path / "roomy.tpk", cfg)
    with PackReader(tmp_path / "roomy.tpk") as r:
        header = r.header
    stages = plan_stages(header, min_bands=2 * jobs)
    assert len(stages) > 2 and any(st.band + 2 * st.margin < st.height for st in stages[1:])
    monkeypatch.setattr(pipeline, "ring_rows", lambda window, output, in_flight: window + output)
    tight = bake(source(), tmp_path / "tight.tpk", cfg)
    assert tight.tiles == roomy.tiles
    assert _tiles(tmp_path / "tight.tpk") == _tiles(tmp_path / "roomy.tpk")


def test_the_report_says_where_the_cpu_time_went(tmp_path: Path, small_bands: None) -> None:
    source = ArraySource(load_photo("coffee.png")[:256, :256], "coffee")
    report = bake(source, tmp_path / "out.tpk", BakeConfig(tile_size=64, jobs=2, progress=False))
    assert report.jobs == 2
    assert report.worker_cpu_seconds > 0 and report.main_cpu_seconds > 0
    assert 0 < report.serial_fraction < 1
    assert len(report.timeline) >= 4 and {t.stage for t in report.timeline} >= {0, 1}
    for t in report.timeline:  # seconds since the bake began, in order
        assert 0 <= t.submitted <= t.started <= t.finished <= t.taken <= report.seconds and t.cpu_seconds >= 0
    assert {"main_cpu_seconds", "worker_cpu_seconds", "serial_fraction"} <= set(report.as_dict())
    here = bake(source, tmp_path / "here.tpk", BakeConfig(tile_size=64, jobs=1, progress=False))
    assert here.jobs == 1 and here.main_cpu_seconds >= here.worker_cpu_seconds > 0  # the jobs ran here
    assert 0 <= here.serial_fraction < 1
