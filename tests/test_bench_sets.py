"""`texstream bench sets`: its deciders part on a small scale (CPU only, a second or two), checking that
the three cases see what the bench says they see. Speeds are reported by the bench, never asserted."""

from __future__ import annotations

import numpy as np

from texstream.apps.bench_sets import CASES, Scale, deciders, headers, pan, view_pages

SMALL = Scale(2048, (320, 180), 24)


def test_the_cases_write_one_and_four_feedback_entries_per_fragment_and_stream_every_frame() -> None:
    r = deciders(SMALL)
    assert set(r) == set(CASES)
    one, tset, independent = (r[c] for c in CASES)
    assert (one["textures"], tset["textures"], independent["textures"]) == (1, 4, 4)
    assert tset["feedback_entries_p50"] == one["feedback_entries_p50"] > 0
    assert independent["feedback_entries_p50"] == 4 * one["feedback_entries_p50"]
    for c in CASES:
        assert r[c]["frames_streaming"] == 1.0, c  # the pan brings new pages every frame
        for part in ("feedback", "requests", "page_tables", "feedback_and_page_tables"):
            p = r[c][part]
            assert 0 <= p["p50"] <= p["p95"] <= p["p99"], (c, part)
    # the set loads its members too: more tiles a frame than the texture alone
    assert tset["uploads_per_frame_p50"] > one["uploads_per_frame_p50"]


def test_the_view_names_the_pages_a_draw_at_the_bench_zoom_would_want() -> None:
    hs = headers(SMALL.lead)
    corner = pan(SMALL)[3]
    level, x, y = view_pages(SMALL, corner, 3, hs[0])
    assert level == 0  # 0.75 screen pixels a texel: level 0 of the lead
    assert x.min() == int(corner[0] // 128) and y.min() == int(corner[1] // 128)
    small_level, sx, _ = view_pages(SMALL, corner, 3, hs[2])  # half the size: its level 0 too, half the pages
    assert small_level == 0 and np.unique(sx).size <= np.unique(x).size
