"""The HUD's layout without GL: a synthetic frame record and streamer views in, quads out."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from texstream.telemetry import FrameRecord
from texstream.telemetry.hud_layout import LEVEL_COLOURS, NO_LEVEL_COLOUR, HudLayout
from texstream.telemetry.quads import VERTEX, QuadBatch
from texstream.telemetry.schema import FRAME_FIELDS


class FakeTable:
    """A page table whose level-0 pages sample level (x + y) % 3, and nothing where x == 3."""

    level_count = 4
    tiles_x = np.array([8, 4, 2, 1])
    tiles_y = np.array([4, 2, 1, 1])

    def resident_levels(self, level: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        out = (x + y) % 3
        return np.where(x == 3, self.level_count, out)


def frame(**overrides: object) -> FrameRecord:
    values: dict[str, object] = {}
    for f in FRAME_FIELDS:
        base = f.type.split("|")[0]
        values[f.name] = {"integer": 0, "number": 0.0, "string": "config", "boolean": False, "object": {}}[base]
    values.update(budget_bytes=64 << 20, vram_bytes=48 << 20, vram_peak_bytes=50 << 20, frame=7)
    values.update(vram_breakdown={"pool/bc1/136": 40 << 20, "page-table/0": 1 << 20, "staging-ring": 7 << 20})
    values.update(overrides)
    return FrameRecord(**values)


def telemetry(record: FrameRecord | None, textures: int = 2) -> SimpleNamespace:
    vts = [SimpleNamespace(id=i, path=f"/packs/t{i}.tpk", table=FakeTable()) for i in range(textures)]
    streamer = SimpleNamespace(textures=vts, pools={"bc1": SimpleNamespace(name="pool/bc1/136")})
    return SimpleNamespace(
        last=record, streamer=streamer, history=lambda name: np.linspace(0, 2, 30), history_capacity=240
    )


def test_panel_is_laid_out_inside_its_width_and_height() -> None:
    layout = HudLayout(font_size=13)
    tel = telemetry(frame(missing_pages=3, wanted_pages=10))
    atlas = layout.minimap_atlas(tel.streamer.textures)
    batch = QuadBatch(layout.font)
    height = layout.build(batch, tel, atlas)  # type: ignore[arg-type]
    verts = batch.vertices()
    assert verts.dtype == VERTEX and verts.size % 6 == 0 and verts.size > 100
    assert height > 10 * layout.font.line_height
    pos = verts["pos"]
    assert pos[:, 0].min() >= 0 and pos[:, 0].max() <= layout.width
    assert pos[:, 1].min() >= 0 and pos[:, 1].max() <= height
    assert set(np.unique(verts["mode"]).tolist()) == {0.0, 1.0, 2.0}  # solid, glyphs, minimaps


def test_no_frame_yet_is_one_line() -> None:
    layout = HudLayout()
    batch = QuadBatch(layout.font)
    assert layout.build(batch, telemetry(None)) < 3 * layout.font.line_height  # type: ignore[arg-type]


def test_minimap_atlas_colours_levels_and_missing_pages() -> None:
    layout = HudLayout(minimap_pages=128)
    tel = telemetry(frame(), textures=2)
    atlas = layout.minimap_atlas(tel.streamer.textures)
    assert atlas.size == (2 * 8 + 2, 4) and atlas.texture_ids == [0, 1]
    cell = atlas.cells[1]
    img = atlas.image[cell.y : cell.y + cell.height, cell.x : cell.x + cell.width]
    assert (img[0, 0, :3] == LEVEL_COLOURS[0]).all() and (img[1, 0, :3] == LEVEL_COLOURS[1]).all()
    assert (img[:, 3, :3] == NO_LEVEL_COLOUR).all()


@pytest.mark.parametrize("corner", ["top-left", "top-right", "bottom-left", "bottom-right"])
def test_place_keeps_the_margin_from_its_corner(corner: str) -> None:
    layout = HudLayout(corner=corner, margin=8)
    x, y = layout.place((1280, 720), 300, 200)
    assert x == (8 if "left" in corner else 1280 - 8 - 300)
    assert y == (8 if "top" in corner else 720 - 8 - 200)


def test_bad_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="corner"):
        HudLayout(corner="middle")
    with pytest.raises(ValueError, match="margin"):
        HudLayout(margin=-1)


def test_frame_record_is_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        frame().frame = 3  # type: ignore[misc]
