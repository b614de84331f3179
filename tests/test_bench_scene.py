"""`texstream bench scene --quick`: one run in a subprocess (its own EGL context, honest timings), then
checks of its JSON and telemetry. Speeds are reported by the bench, never asserted here."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from texstream.apps.bench_scene import (
    COMPARISON_FIELDS,
    CUT_FIELDS,
    CUTS_FIELDS,
    NAIVE_FIELDS,
    OVERSUBSCRIBED_FIELDS,
    PATH_FIELDS,
    PATHS,
    RESULT_FIELDS,
    TEXSTREAM_FIELDS,
)
from texstream.runtime.frame_stats import PHASES
from texstream.telemetry import validate_frame
from texstream.testing import psnr


# The tests reading the run share one quick run: ~75 s on llvmpipe with 2 cores.
def run_test(fn):  # noqa: ANN001, ANN201
    return pytest.mark.gl(pytest.mark.slow(fn))


# What the bench promises per path, named independently of the field tuples it exports.
REQUIRED_PATH_FIELDS = {
    "frames",
    "uploads",
    "tiles_per_s",
    "mb_per_s",
    "ceiling_fraction",
    "update_ms_p50",
    "update_ms_p95",
    "latency_p50_frames",
    "latency_p95_frames",
    "latency_p99_frames",
    "vram_peak_bytes",
    "budget_bytes",
    "refetches",
    "refetch_rate",
    "max_mip_bias",
    "update_ms_p99",
    "update_ms_max",
    "streaming_frames",
    "streaming_update_ms",
    "phases_ms",
}
PHASE_NAMES = set(PHASES)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory, gl_context: object) -> tuple[dict, Path, str]:
    """(result JSON, telemetry JSONL path, stdout) of one quick run."""
    folder = tmp_path_factory.mktemp("bench-scene")
    out, tel = folder / "scene.json", folder / "scene.jsonl"
    code = (
        "from texstream.apps.bench_scene import run_scene_bench; "
        f"run_scene_bench(quick=True, json_path={str(out)!r}, telemetry_path={str(tel)!r})"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text()), tel, proc.stdout


def finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def test_psnr() -> None:
    a = np.full((4, 4, 4), 100, np.uint8)
    b = a.copy()
    assert psnr(a, b) == 99.0
    b[..., 0] = 101  # error 1 in one channel of three: mse 1/3
    assert psnr(a, b) == pytest.approx(10 * math.log10(255**2 * 3))
    b[..., 3] = 0  # alpha is ignored
    assert psnr(a, b) == pytest.approx(10 * math.log10(255**2 * 3))


@run_test
def test_every_field(bench: tuple[dict, Path, str]) -> None:
    r, _, stdout = bench
    assert REQUIRED_PATH_FIELDS <= set(PATH_FIELDS)
    assert set(RESULT_FIELDS) | {"telemetry"} == set(r)
    assert r["bench"] == "scene" and r["quick"] is True and r["gl_error"] == "GL_NO_ERROR"
    assert r["frame_size"] == [480, 270] and r["dt_s"] == pytest.approx(1 / 60)
    assert set(r["paths"]) == set(PATHS)  # the JSON's keys are sorted
    for name, p in r["paths"].items():
        assert set(PATH_FIELDS) <= set(p), (name, set(PATH_FIELDS) - set(p))
        for key in PATH_FIELDS:
            if key == "gpu_ms_p50":  # null where the driver has no timer queries
                continue
            if key == "cache_slots":
                assert p[key] and all(isinstance(v, int) and v > 0 for v in p[key].values()), (name, p[key])
                continue
            if key == "streaming_update_ms":  # frames that upload or request tiles: every path has some
                u = p[key]
                assert set(u) == {"p50", "p95", "p99", "max"} and all(finite(v) for v in u.values()), (name, u)
                assert u["p50"] <= u["p95"] <= u["p99"] <= u["max"] <= p["update_ms_max"], (name, u)
                continue
            if key == "phases_ms":
                assert set(p[key]) == {"streaming", "idle"}, (name, p[key])
                for phases in p[key].values():
                    assert set(phases) == PHASE_NAMES and all(finite(v) and v >= 0 for v in phases.values())
                # the phases are parts of update(): on average they cannot add up to more than it
                assert sum(p[key]["streaming"].values()) <= p["streaming_update_ms"]["max"], name
                continue
            assert finite(p[key]), (name, key, p[key])
        assert p["frames"] > 0 and p["uploads"] > 0 and p["duration_s"] == pytest.approx(p["frames"] / 60)
        assert p["latency_p50_frames"] <= p["latency_p95_frames"] <= p["latency_p99_frames"]
        assert 0 <= p["refetches"] <= p["uploads"] and 0 <= p["refetch_rate"] <= 1
        assert p["update_ms_p50"] <= p["update_ms_p95"] <= p["update_ms_p99"] <= p["update_ms_max"]
        assert 0 < p["streaming_frames"] <= p["frames"]
        assert p["failed"] == 0
        assert name in stdout
    up = r["upload_ceiling"]
    assert finite(up["tiles_per_s"]) and up["tiles_per_s"] > 0 and finite(up["mb_per_s"]) and up["mb_per_s"] > 0


@run_test
def test_vram_peak_within_budget(bench: tuple[dict, Path, str]) -> None:
    r, _, _ = bench
    for name, p in r["paths"].items():
        assert 0 < p["vram_peak_bytes"] <= p["budget_bytes"], name
        assert p["vram_peak_fraction"] <= 1.0
    ts = r["naive_comparison"]["texstream"]
    assert 0 < ts["vram_peak_bytes"] <= ts["budget_bytes"]


@run_test
def test_region_cuts_converge(bench: tuple[dict, Path, str]) -> None:
    rc = bench[0]["paths"]["region_cuts"]
    assert set(CUTS_FIELDS) <= set(rc)
    assert len(rc["cuts"]) == 4  # five spots
    for cut in rc["cuts"]:
        assert set(CUT_FIELDS) == set(cut)
        n = cut["frames_to_converge"]
        assert isinstance(n, int) and 0 <= n < cut["hold_frames"], cut
        assert cut["psnr_converged_db"] >= 45.0
        assert finite(cut["psnr_first_db"])
    assert rc["converged_all"] is True
    assert finite(rc["converge_frames_max"]) and finite(rc["converge_frames_mean"])
    assert rc["converge_frames_mean"] <= rc["converge_frames_p95"] <= rc["converge_frames_max"]
    settled = [c["settle_frames"] for c in rc["cuts"]]
    assert all(isinstance(n, int) and 0 <= n for n in settled), settled  # every cut settles within its hold
    assert rc["settle_frames_max"] == max(settled) and rc["settle_frames_mean"] == pytest.approx(np.mean(settled))
    assert rc["settle_frames_mean"] <= rc["settle_frames_p95"] <= rc["settle_frames_max"]


@run_test
def test_oversubscribed_runs_at_half_its_working_set(bench: tuple[dict, Path, str]) -> None:
    r = bench[0]
    o = r["paths"]["oversubscribed"]
    assert set(OVERSUBSCRIBED_FIELDS) <= set(o)
    assert set(o["working_set_tiles"]) == set(o["cache_slots"])
    assert all(v > 0 for v in o["working_set_tiles"].values())
    assert 1.5 <= o["oversubscription"] <= 2.0 + 1e-9
    assert o["budget_bytes"] < r["paths"]["flythrough"]["budget_bytes"]


@run_test
def test_naive_side_has_numbers(bench: tuple[dict, Path, str]) -> None:
    c = bench[0]["naive_comparison"]
    assert set(COMPARISON_FIELDS) == set(c)
    nv, ts = c["naive"], c["texstream"]
    assert set(NAIVE_FIELDS) == set(nv) and set(TEXSTREAM_FIELDS) == set(ts)
    w, h = nv["size"]
    assert (w, h) == (c["size"], c["size"]) and ts["size"] == nv["size"]
    assert nv["vram_bytes"] == w * h * 4 * 4 // 3
    for key in (
        "load_s",
        "upload_s",
        "mipmaps_s",
        "first_draw_s",
        "first_frame_s",
        "frame_ms_mean",
        "png_bytes",
        "frame_ms_mean_trilinear",
    ):
        assert finite(nv[key]) and nv[key] > 0, key
    for key in ("open_s", "first_frame_s", "frame_ms_mean", "settle_s", "settle_frames"):
        assert finite(ts[key]) and ts[key] > 0, key
    assert nv["frames"] == ts["frames"] > 0
    for key in ("first_frame_speedup", "vram_ratio", "frame_time_ratio"):
        assert finite(c[key]) and c[key] > 0
    assert c["attempts"][-1] == {"size": c["size"], "error": None}


@run_test
def test_telemetry_jsonl(bench: tuple[dict, Path, str]) -> None:
    r, tel, _ = bench
    lines = tel.read_text().splitlines()
    index = r["telemetry"]["lines"]
    assert set(index) == set(PATHS)
    assert len(lines) == sum(p["frames"] for p in r["paths"].values())
    first_lines = [index[name]["first_line"] for name in PATHS]  # in the order the paths ran
    assert first_lines == [1 + sum(index[n]["lines"] for n in PATHS[:i]) for i in range(len(PATHS))]
    for name, span in index.items():
        assert span["lines"] == r["paths"][name]["frames"]
        first = json.loads(lines[span["first_line"] - 1])
        last = json.loads(lines[span["first_line"] + span["lines"] - 2])
        validate_frame(first)
        validate_frame(last)
        assert first["frame"] == 1 and last["frame"] == span["lines"]  # a fresh streamer per path
        assert last["time_s"] == pytest.approx(span["lines"] / 60)
    for line in lines[:: max(1, len(lines) // 50)]:
        validate_frame(json.loads(line))
