"""Procedural sources: deterministic by seed, independent of the region generated, any size."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.bake.procedural import PATTERNS, ProceduralSource, fbm, lattice_noise


@pytest.mark.parametrize("pattern", PATTERNS)
def test_deterministic_by_seed(pattern: str) -> None:
    a = ProceduralSource(pattern, 300, 200, 7).read_rows(50, 90)
    b = ProceduralSource(pattern, 300, 200, 7).read_rows(50, 90)
    c = ProceduralSource(pattern, 300, 200, 8).read_rows(50, 90)
    assert a.shape == (40, 300, 4) and a.dtype == np.uint8
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert (a[..., 3] == 255).all()


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_band_alone_equals_the_same_rows_of_a_larger_generation(pattern: str) -> None:
    src = ProceduralSource(pattern, 517, 1031, 3)
    whole = src.read_rows(0, 1031)
    for y0, y1 in [(0, 1), (1, 2), (333, 334), (129, 400), (1000, 1031), (511, 777)]:
        assert np.array_equal(src.read_rows(y0, y1), whole[y0:y1]), (y0, y1)


def test_fbm_is_region_independent_in_both_axes() -> None:
    whole = fbm(-5, 70, -9, 130, 4096, 11)
    for y0, y1, x0, x1 in [(-5, 3, -9, 2), (10, 11, 40, 41), (33, 70, 57, 130)]:
        assert np.array_equal(fbm(y0, y1, x0, x1, 4096, 11), whole[y0 + 5 : y1 + 5, x0 + 9 : x1 + 9])


def test_lattice_noise_is_a_pure_function_of_coordinates() -> None:
    rows, cols = np.arange(-4, 60), np.arange(-4, 90)
    n = lattice_noise(rows, cols, np.uint32(5))
    assert n.dtype == np.float32 and -1 <= n.min() and n.max() < 1
    assert np.array_equal(lattice_noise(rows[10:20], cols[30:31], np.uint32(5)), n[10:20, 30:31])
    assert abs(float(n.mean())) < 0.05 and 0.5 < float(n.std()) < 0.65  # uniform: std 1/sqrt(3)


def test_terrain_has_detail_at_every_scale() -> None:
    """Relief (texel-to-texel differences) at full resolution, and large structures at 1/64."""
    src = ProceduralSource("terrain", 4096, 4096, 1)
    rows = src.read_rows(1000, 1256).astype(np.float64)
    fine = np.abs(np.diff(rows[..., :3], axis=1)).mean()
    assert fine > 1.0  # neighbouring texels differ: detail down to a couple of texels
    coarse = np.stack([src.read_rows(y, y + 1)[0, ::64, :3] for y in range(0, 4096, 64)]).astype(np.float64)
    assert coarse.std(axis=(0, 1)).mean() > 20  # water, land, mountains across the texture
    blue = (coarse[..., 2] > coarse[..., 0] + 20).mean()
    assert 0.15 < blue < 0.85  # both water and land


def test_normals_are_unit_vectors_of_the_same_field() -> None:
    n = ProceduralSource("normals", 256, 256, 1).read_rows(0, 256).astype(np.float64)
    v = n[..., :3] / 127.5 - 1.0
    length = np.linalg.norm(v, axis=-1)
    assert np.abs(length - 1).max() < 0.02
    assert (v[..., 2] > 0).all()


def test_checker_is_labelled_and_gridded() -> None:
    rows = ProceduralSource("checker", 512, 300, 1).read_rows(0, 140)
    assert (rows[0, :, :3] == (230, 40, 40)).all()  # thick line along row 0
    assert (rows[128, 4:, 0] == 20).all()  # thin line at the next cell row
    label = rows[8:28, 8:80, 0]
    assert len(np.unique(label)) >= 2  # text pixels in the label area


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pattern": "plaid"}, "pattern"),
        ({"width": 0}, "width"),
        ({"height": 1 << 25}, "height"),
        ({"seed": -1}, "seed"),
    ],
)
def test_validation(kwargs: dict, match: str) -> None:
    args = {"pattern": "terrain", "width": 8, "height": 8, "seed": 1} | kwargs
    with pytest.raises(ValueError, match=match):
        ProceduralSource(**args)
    with pytest.raises(ValueError, match="row range"):
        ProceduralSource("terrain", 8, 8).read_rows(4, 9)


def test_huge_sizes_are_generated_by_band() -> None:
    src = ProceduralSource("terrain", 65536, 65536, 1)
    rows = src.read_rows(40000, 40002)
    assert rows.shape == (2, 65536, 4)
