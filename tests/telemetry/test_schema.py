"""Record formats, docs, ring buffers and the glyph atlas: no GL needed."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from texstream.telemetry import FRAME_SCHEMA, SUMMARY_SCHEMA, GlyphAtlas, History, load_font, validate_frame
from texstream.telemetry.schema import FRAME_FIELDS, SUMMARY_FIELDS, schema_markdown, validate_summary

DOCS = Path(__file__).resolve().parents[2] / "docs" / "TELEMETRY.md"


def sample_frame() -> dict:
    values = {
        "integer": 1,
        "number": 1.5,
        "number|null": None,
        "string": "config",
        "boolean": False,
        "object": {"pool/bc1": 4},
    }
    return {f.name: values[f.type] for f in FRAME_FIELDS}


def test_docs_hold_the_generated_field_tables() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for fields in (FRAME_FIELDS, SUMMARY_FIELDS):
        assert schema_markdown(fields) in text, "docs/TELEMETRY.md is out of date: paste schema_markdown()"


def test_schemas_list_every_field_once() -> None:
    for schema, fields in ((FRAME_SCHEMA, FRAME_FIELDS), (SUMMARY_SCHEMA, SUMMARY_FIELDS)):
        names = [f.name for f in fields]
        assert len(set(names)) == len(names)
        assert schema["required"] == names
        assert list(schema["properties"]) == names
        assert schema["additionalProperties"] is False
        for f in fields:
            prop = schema["properties"][f.name]
            assert prop["description"] and "unit" in prop
            assert f.name.islower() and " " not in f.name


def test_validate_frame_accepts_a_fitting_record() -> None:
    validate_frame(sample_frame())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("uploads"), "missing field 'uploads'"),
        (lambda r: r.update(extra=1), "unknown field 'extra'"),
        (lambda r: r.update(uploads=1.5), "'uploads' = 1.5 is not integer"),
        (lambda r: r.update(uploads=True), "'uploads' = True is not integer"),
        (lambda r: r.update(update_ms=math.nan), "'update_ms' = nan is not number"),
        (lambda r: r.update(gpu_ms="fast"), "'gpu_ms' = 'fast' is not number or null"),
        (lambda r: r.update(net_offline=1), "'net_offline' = 1 is not boolean"),
        (lambda r: r.update(vram_breakdown={"pool": 1.5}), "'vram_breakdown'['pool'] = 1.5 is not integer"),
    ],
)
def test_validate_frame_names_each_problem(change, message: str) -> None:  # noqa: ANN001
    record = sample_frame()
    change(record)
    with pytest.raises(ValueError, match="FRAME_SCHEMA") as info:
        validate_frame(record)
    assert message in str(info.value)


def test_validate_summary_rejects_a_frame() -> None:
    with pytest.raises(ValueError, match="missing field 'frames'"):
        validate_summary(sample_frame())
    with pytest.raises(TypeError, match="mapping"):
        validate_frame([1, 2])  # type: ignore[arg-type]


def test_history_ring_keeps_the_newest_in_order() -> None:
    h = History(4)
    assert len(h) == 0 and h.values().size == 0 and math.isnan(h.latest)
    for v in range(1, 4):
        h.push(v)
    np.testing.assert_array_equal(h.values(), [1, 2, 3])
    for v in range(4, 8):
        h.push(v)
    np.testing.assert_array_equal(h.values(), [4, 5, 6, 7])
    np.testing.assert_array_equal(h.newest(2), [7, 6])
    np.testing.assert_array_equal(h.newest(10), [7, 6, 5, 4])
    assert h.latest == 7 and len(h) == 4 and h.capacity == 4
    h.clear()
    assert len(h) == 0
    with pytest.raises(ValueError, match="capacity"):
        History(0)


def test_font_is_scalable() -> None:
    small, name = load_font(12)
    large, _ = load_font(24)
    assert isinstance(small, ImageFont.FreeTypeFont), name
    assert GlyphAtlas(large).line_height > 1.6 * GlyphAtlas(small).line_height
    with pytest.raises(ValueError, match="font size"):
        load_font(0)


@pytest.mark.parametrize("text", ["VRAM 123.4 / 256.0 MiB (48%)", "latency p50 1  p95 3  p99 12 frames", "gjpqy {[|]}"])
def test_glyph_layout_reproduces_pillow(text: str) -> None:
    """The atlas quads composited on the CPU equal Pillow's own rendering of the line."""
    font, name = load_font(13)
    atlas = GlyphAtlas(font, name)
    q = atlas.layout(text, 3, 2)
    w, h = int(atlas.measure(text)) + 8, atlas.line_height + 4
    out = np.zeros((h, w), np.uint8)
    src = np.asarray(atlas.image)
    for x, y, gw, gh, u, v in zip(q.x, q.y, q.w, q.h, q.u, q.v, strict=True):
        out[y : y + gh, x : x + gw] = np.maximum(out[y : y + gh, x : x + gw], src[v : v + gh, u : u + gw])
    ref = Image.new("L", (w, h), 0)
    ImageDraw.Draw(ref).text((3, 2), text, font=font, fill=255)
    diff = np.abs(out.astype(int) - np.asarray(ref, int))
    assert np.count_nonzero(diff > 16) <= 2, "glyphs only differ where two glyph boxes overlap"


def test_layout_many_equals_one_by_one() -> None:
    atlas = GlyphAtlas(*load_font(13))
    texts = ["abc", "", "x y", "µs ±1"]
    xs, ys = np.array([0.0, 5.0, 10.5, 3.0]), np.array([0.0, 20.0, 40.0, 60.0])
    many, span = atlas.layout_many(texts, xs, ys)
    for i, t in enumerate(texts):
        one = atlas.layout(t, xs[i], ys[i])
        np.testing.assert_array_equal(many.x[span == i], one.x)
        np.testing.assert_array_equal(many.y[span == i], one.y)
    assert atlas.measure("a\u4e00") == atlas.measure("a?"), "characters outside the atlas draw as ?"


def test_frame_record_has_one_typed_attribute_per_field() -> None:
    import dataclasses

    from texstream.telemetry import FrameRecord
    from texstream.telemetry.schema import FRAME_FIELDS

    fields = dataclasses.fields(FrameRecord)
    assert [f.name for f in fields] == [f.name for f in FRAME_FIELDS]
    nullable = {f.name for f in FRAME_FIELDS if f.type.endswith("|null")}
    assert {f.name for f in fields if "None" in str(f.type)} == nullable
    values = {f.name: None if f.name in nullable else 0 for f in FRAME_FIELDS}
    record = FrameRecord(**values)
    assert record.as_dict() == values and list(record.as_dict()) == [f.name for f in FRAME_FIELDS]
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.frame = 1  # type: ignore[misc]
