"""The whole bake: levels against a float64 reference, borders, BCn quality, sizes, interruptions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from texstream.bake import ArraySource, bake, bake_file, bake_procedural, open_source, plan_stages
from texstream.bake.source import Source
from texstream.config import BakeConfig
from texstream.errors import EngineError, SourceError
from texstream.pack import AddressMode, PackHeader, PackReader, Supercompression, TexelFormat

from . import reference as ref
from .conftest import ASSETS, PHOTOS, assemble, leftovers, load_photo, read_slots


class Plain:
    """A minimal Source read by the main process only (no `forkable`/`parallel`), that can fail."""

    def __init__(self, rgba: np.ndarray, fail_at: int | None = None, exc: BaseException | None = None) -> None:
        self.rgba, self.fail_at, self.exc = rgba, fail_at, exc
        self.name = "plain"
        self.height, self.width = rgba.shape[:2]
        self.channels = 4

    def read_rows(self, y0: int, y1: int) -> np.ndarray:
        if self.fail_at is not None and y1 > self.fail_at:
            assert self.exc is not None
            raise self.exc
        return self.rgba[y0:y1]


class Shared(Plain):
    """The same, read by forked workers directly."""

    forkable = True


def _cfg(**kw: object) -> BakeConfig:
    base: dict = {"texel_format": TexelFormat.RGBA8, "tile_size": 64, "progress": False}
    base.update(kw)
    return BakeConfig(**base)


def _photo_odd() -> np.ndarray:
    img = load_photo("coffee.png")[:203, :301].copy()  # odd on both axes, several odd levels
    img[..., 3] = np.linspace(60, 255, img.shape[1]).astype(np.uint8)[None, :]  # real alpha
    return img


@pytest.mark.parametrize("mode", [AddressMode.CLAMP, AddressMode.WRAP])
@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("kind", [Plain, Shared])
def test_levels_and_borders_match_the_reference(
    tmp_path: Path, small_bands: None, mode: AddressMode, jobs: int, kind: type
) -> None:
    src = _photo_odd()
    out = tmp_path / "p.tpk"
    bake(kind(src), out, _cfg(address_mode=mode, jobs=jobs))
    header, slots = read_slots(out)
    assert len(plan_stages(header)) > 2 and plan_stages(header)[0].bands > 2  # the banded paths ran
    wrap = mode is AddressMode.WRAP
    want = ref.pyramid(src, header.level_count, srgb=True, wrap=wrap, premultiplied=True)  # real alpha
    for lv in range(header.level_count):
        level = assemble(header, slots, lv)
        assert level.shape[:2] == header.level_dims(lv)[::-1]
        if lv == 0:
            assert np.array_equal(level, src)
        else:  # float32 chain vs float64 reference: equal but for rare one-code rounding
            assert ref.psnr(level, want[lv]) >= 50
            assert np.abs(level.astype(int) - want[lv]).max() <= 1
        tx, ty = header.tiles_in_level(lv)
        for y in range(ty):
            for x in range(tx):  # borders and padding: exactly the level's texels by the address mode
                expected = ref.expected_slot(level, x, y, header.tile_size, header.border, wrap)
                assert np.array_equal(slots[(lv, x, y)], expected), (lv, x, y)


def test_wrap_borders_come_from_the_other_side(tmp_path: Path) -> None:
    src = load_photo("chelsea.png")[:128, :192]
    out = {}
    for mode in (AddressMode.CLAMP, AddressMode.WRAP):
        out[mode] = tmp_path / f"{mode.name}.tpk"
        bake(ArraySource(src), out[mode], _cfg(address_mode=mode, jobs=1))
    _, clamp = read_slots(out[AddressMode.CLAMP])
    _, wrap = read_slots(out[AddressMode.WRAP])
    b = 4
    assert np.array_equal(clamp[(0, 0, 0)][b:-b, :b], np.repeat(src[:64, :1], b, axis=1))
    assert np.array_equal(wrap[(0, 0, 0)][b:-b, :b], src[:64, -b:])
    assert np.array_equal(wrap[(0, 0, 0)][:b, b:-b], src[-b:, :64])
    assert np.array_equal(wrap[(0, 2, 1)][b:-b, -b:], src[64:, :b])


@pytest.mark.parametrize("name", PHOTOS)
def test_bc1_photographs(tmp_path: Path, name: str) -> None:
    out = tmp_path / "bc1.tpk"
    report = bake_file(ASSETS / name, out, _cfg(texel_format=TexelFormat.BC1, jobs=2, tile_size=128))
    header, slots = read_slots(out)
    src = load_photo(name)
    assert ref.psnr(assemble(header, slots, 0)[..., :3], src[..., :3]) >= 30
    assert report.tiles == header.tile_count and report.file_bytes == out.stat().st_size


def test_bc7_photograph(tmp_path: Path) -> None:
    out = tmp_path / "bc7.tpk"
    bake_file(ASSETS / "coffee.png", out, _cfg(texel_format=TexelFormat.BC7, bc7_quality="fast", jobs=2))
    header, slots = read_slots(out)
    assert ref.psnr(assemble(header, slots, 0), load_photo("coffee.png")) >= 40
    want = ref.pyramid(load_photo("coffee.png"), 2, srgb=True, wrap=False)[1]
    assert ref.psnr(assemble(header, slots, 1), want) >= 40


@pytest.mark.parametrize("fmt", [TexelFormat.BC3, TexelFormat.BC4, TexelFormat.BC5])
def test_other_formats_round_trip(tmp_path: Path, fmt: TexelFormat) -> None:
    src = _photo_odd()
    out = tmp_path / "f.tpk"
    bake(
        ArraySource(src),
        out,
        _cfg(texel_format=fmt, jobs=2, srgb=fmt is TexelFormat.BC3, supercompression=Supercompression.LZ4),
    )
    header, slots = read_slots(out)
    got = assemble(header, slots, 0)
    channels = {TexelFormat.BC3: [0, 1, 2, 3], TexelFormat.BC4: [0], TexelFormat.BC5: [0, 1]}[fmt]
    assert ref.psnr(got[..., channels], src[..., channels]) >= 32
    linear = ref.pyramid(src, 2, srgb=header.srgb, wrap=False)[1]
    assert ref.psnr(assemble(header, slots, 1)[..., channels], linear[..., channels]) >= 32


@pytest.mark.parametrize(("w", "h"), [(1, 1), (1, 5000), (5000, 1), (129, 1)])
def test_degenerate_sizes(tmp_path: Path, w: int, h: int) -> None:
    rng = np.random.default_rng(w + h)
    src = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    out = tmp_path / "d.tpk"
    bake(Plain(src), out, _cfg(jobs=2))
    header, slots = read_slots(out)
    assert (header.width, header.height) == (w, h)
    want = ref.pyramid(src, header.level_count, srgb=True, wrap=False, premultiplied=True)
    for lv in range(header.level_count):  # colour under alpha 0 is bled (test_alpha): visible texels
        got, visible = assemble(header, slots, lv).astype(int), want[lv][..., 3] > 0
        assert np.abs(got[visible] - want[lv][visible]).max() <= (0 if lv == 0 else 1)
        assert np.abs(got[..., 3] - want[lv][..., 3]).max() <= (0 if lv == 0 else 1)


def test_4097_square_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "big.tpk"
    report = bake_procedural(out, 4097, "checker", 3, _cfg(texel_format=TexelFormat.BC1, jobs=2, tile_size=128))
    with PackReader(out) as r:
        assert (r.header.width, r.header.height, r.header.level_count) == (4097, 4097, 7)
        assert r.verify() == []
        assert r.metadata["pattern"] == "checker" and r.metadata["seed"] == 3
    header, slots = read_slots(out)
    from texstream.bake.procedural import ProceduralSource

    src = ProceduralSource("checker", 4097, 4097, 3)
    for y0 in (0, 2048, 4000):  # bands of rows, the last one through the partial tile row
        rows = src.read_rows(y0, min(4097, y0 + 97))
        got = assemble(header, slots, 0)[y0 : y0 + rows.shape[0]]
        assert ref.psnr(got[..., :3], rows[..., :3]) >= 30
    assert report.source_pixels == 4097 * 4097


def test_metadata_and_report(tmp_path: Path) -> None:
    out = tmp_path / "m.tpk"
    cfg = _cfg(texel_format=TexelFormat.BC7, bc7_quality="fast", address_mode=AddressMode.WRAP, jobs=1)
    report = bake(ArraySource(load_photo("chelsea.png")[:100, :100], name="cat"), out, cfg, {"note": "hi"})
    with PackReader(out) as r:
        meta = r.metadata
    assert meta["source"] == "cat" and meta["note"] == "hi" and meta["format"] == "bc7"
    assert meta["address_mode"] == "wrap" and meta["bc7_quality"] == "fast" and meta["srgb"] is True
    assert meta["tile_size"] == 64 and meta["border"] == 4 and meta["supercompression"] == "zstd"
    assert meta["mip_filter"] and meta["tool"].startswith("texstream")
    d = report.as_dict()
    assert d["source_pixels"] == 10000 and d["tiles"] == 5 and d["mpixels_per_s"] > 0
    assert "100 x 100" in report.summary()
    json.dumps(d)


# ---- failures leave nothing behind -----------------------------------------------------------------
@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("kind", [Plain, Shared])
def test_interrupted_bake_leaves_nothing(
    tmp_path: Path, small_bands: None, exc: BaseException, jobs: int, kind: type
) -> None:
    src = _photo_odd()
    out = tmp_path / "x.tpk"
    with pytest.raises(type(exc)):
        bake(kind(src, fail_at=150, exc=exc), out, _cfg(jobs=jobs))
    assert leftovers(tmp_path) == []


def test_failed_bake_keeps_the_previous_pack(tmp_path: Path) -> None:
    out = tmp_path / "keep.tpk"
    out.write_bytes(b"previous pack")
    with pytest.raises(SourceError):
        bake_file(tmp_path / "missing.png", out, _cfg())
    with pytest.raises(RuntimeError):
        bake(Plain(_photo_odd(), fail_at=100, exc=RuntimeError("x")), out, _cfg(jobs=2))
    assert out.read_bytes() == b"previous pack" and leftovers(tmp_path) == ["keep.tpk"]


def test_procedural_worker_error_propagates(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pattern"):
        bake_procedural(tmp_path / "x.tpk", 64, "plaid", 1, _cfg())
    assert leftovers(tmp_path) == []


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="BakeConfig"):
        bake(ArraySource(np.zeros((4, 4), np.uint8)), tmp_path / "a.tpk", {"jobs": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a texstream Source"):
        bake(object(), tmp_path / "a.tpk", _cfg())  # type: ignore[arg-type]
    with pytest.raises(EngineError, match="does not exist"):
        bake(ArraySource(np.zeros((4, 4), np.uint8)), tmp_path / "no" / "a.tpk", _cfg())
    with pytest.raises(EngineError, match="is a folder"):
        bake(ArraySource(np.zeros((4, 4), np.uint8)), tmp_path, _cfg())
    with pytest.raises(ValueError, match="JSON"):
        bake(ArraySource(np.zeros((4, 4), np.uint8)), tmp_path / "a.tpk", _cfg(), {"bad": object()})
    assert isinstance(ArraySource(np.zeros((4, 4), np.uint8)), Source)


def test_progress_bar(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from texstream.bake import progress_bar

    monkeypatch.setattr(progress_bar, "PROGRESS_DELAY_S", 0.0)
    bake(ArraySource(load_photo("coffee.png")), tmp_path / "p.tpk", _cfg(progress=True, jobs=2))
    assert "tile" in capsys.readouterr().err


def test_no_progress_bar_for_a_bake_shorter_than_its_delay(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from texstream.bake import progress_bar

    monkeypatch.setattr(progress_bar, "PROGRESS_DELAY_S", 3600.0)
    bake(ArraySource(load_photo("coffee.png")), tmp_path / "p.tpk", _cfg(progress=True))
    assert capsys.readouterr().err == ""


def test_stage_plan_bounds_band_memory() -> None:
    h = PackHeader(width=65536, height=65536, tile_size=128)
    stages = plan_stages(h)
    assert stages[0].level == 0 and stages[-1].final and stages[-1].bands == 1
    assert sum(s.count for s in stages) == h.level_count
    for s in stages[:-1]:
        texel = 4 if s.level == 0 else 16
        assert s.band * s.width * texel <= (32 << 20) * (4 if s.count == 2 else 1) or s.count == 1
        assert s.band == h.tile_size << (s.count - 1) and s.margin == h.border << (s.count - 1)
    assert plan_stages(PackHeader(width=2048, height=2048), min_bands=4)[0].bands >= 4


@pytest.mark.parametrize("mode", [AddressMode.CLAMP, AddressMode.WRAP])
def test_streamed_file_bakes_like_the_decoded_one(tmp_path: Path, small_bands: None, mode: AddressMode) -> None:
    """libvips streaming (main process reads strips into the shared ring) == Pillow (workers read)."""
    path = ASSETS / "chelsea.png"
    streamed, decoded = tmp_path / "s.tpk", tmp_path / "d.tpk"
    bake(open_source(path, vips_threshold=0), streamed, _cfg(jobs=2, address_mode=mode))
    bake(open_source(path), decoded, _cfg(jobs=2, address_mode=mode))
    h1, a = read_slots(streamed)
    h2, b = read_slots(decoded)
    assert h1 == h2 and a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert np.array_equal(assemble(h1, a, 0), load_photo("chelsea.png"))


def test_output_does_not_depend_on_the_number_of_jobs(tmp_path: Path) -> None:
    src = _photo_odd()
    tiles = []
    for jobs in (1, 3):
        out = tmp_path / f"j{jobs}.tpk"
        bake(ArraySource(src), out, _cfg(jobs=jobs, texel_format=TexelFormat.BC1))
        with PackReader(out) as r:
            tiles.append([r.read_tile(*r.tile_position(i)) for i in range(r.header.tile_count)])
    assert tiles[0] == tiles[1]


class Crashing:
    """A picklable worker-side source whose worker process dies on one band."""

    parallel = True
    name, width, height, channels = "crash", 64, 400, 3

    def __init__(self, parent: int) -> None:
        self.parent = parent

    def read_rows(self, y0: int, y1: int) -> np.ndarray:
        import os

        if y0 > 200 and os.getpid() != self.parent:
            os._exit(3)
        return np.zeros((y1 - y0, 64, 4), np.uint8)


def test_a_dead_worker_aborts_the_bake(tmp_path: Path, small_bands: None) -> None:
    import os

    with pytest.raises(EngineError, match="worker process died"):
        bake(Crashing(os.getpid()), tmp_path / "c.tpk", _cfg(jobs=2))
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("ring", [True, False])
def test_spawned_workers_where_the_fork_server_is_missing(
    tmp_path: Path, small_bands: None, monkeypatch: pytest.MonkeyPatch, ring: bool
) -> None:
    """Without a fork server (Windows): spawned workers; without memfd (macOS), bands pickled, no
    shared ring; the same pack either way."""
    import multiprocessing
    import os

    src = _photo_odd()
    served, spawned = tmp_path / "f.tpk", tmp_path / "s.tpk"
    bake(Plain(src), served, _cfg(jobs=2, address_mode=AddressMode.WRAP))
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    if not ring:
        monkeypatch.delattr(os, "memfd_create", raising=False)
    bake(Plain(src), spawned, _cfg(jobs=2, address_mode=AddressMode.WRAP))
    a, b = read_slots(served)[1], read_slots(spawned)[1]
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
