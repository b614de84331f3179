"""`Streamer.open` takes what a prototype already has: an image is baked once into the pack cache and
streamed, a DDS file's blocks are re-tiled once and stream bit-identically to the file's own."""

from __future__ import annotations

from pathlib import Path

import moderngl
import numpy as np
import pytest
from PIL import Image

from texstream import BudgetConfig, Streamer, StreamerConfig
from texstream.assets import ImagePackProgress
from texstream.pack import PackReader
from texstream.pack.format import TexelFormat

from .files import block_levels, picture, write_dds

pytestmark = pytest.mark.gl


@pytest.fixture
def pack_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private $TEXSTREAM_CACHE, so the pack cache starts empty."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("TEXSTREAM_CACHE", str(folder))
    return folder


def _config() -> StreamerConfig:
    return StreamerConfig(budget=BudgetConfig(budget_mb=48))


def test_an_image_opens_as_a_pack_baked_once(gl_context: moderngl.Context, tmp_path: Path, pack_cache: Path) -> None:
    src = tmp_path / "photo.png"
    Image.fromarray(picture(300, 200)[..., :3]).save(src)
    events: list[ImagePackProgress] = []
    with Streamer(gl_context, _config()) as s:
        vt = s.open(src, progress=events.append)
        assert (vt.header.width, vt.header.height) == (300, 200)
        assert vt.header.texel_format is TexelFormat.BC1 and vt.header.srgb  # opaque colour
        assert events, "the first open reports its bake"
        packs = sorted(pack_cache.rglob("*.tpk"))
        assert len(packs) == 1 and Path(vt.path) == packs[0]
        s.make_all_resident(vt)
    again: list[ImagePackProgress] = []
    with Streamer(gl_context, _config()) as s:
        vt = s.open(src, progress=again.append)
        assert Path(vt.path) == packs[0] and sorted(pack_cache.rglob("*.tpk")) == packs  # no second bake


def test_a_dds_file_streams_its_own_blocks(gl_context: moderngl.Context, tmp_path: Path, pack_cache: Path) -> None:
    img = picture(256, 256, seed=4)
    levels = block_levels(TexelFormat.BC1, img, 9)
    src = write_dds(tmp_path / "albedo.dds", TexelFormat.BC1, 256, 256, levels)
    with Streamer(gl_context, _config()) as s:
        vt = s.open(src)
        assert vt.header.texel_format is TexelFormat.BC1 and (vt.header.width, vt.header.height) == (256, 256)
        with PackReader(vt.path) as reader:
            h = reader.header
            t, b = h.tile_size, h.border
            tile = np.frombuffer(reader.read_tile(0, 0, 0), np.uint8)
        # the content of tile (0, 0) of level 0 is the file's first block rows, block for block
        blocks_per_row = h.slot_size // 4
        rows = tile.reshape(blocks_per_row, blocks_per_row, 8)[b // 4 : (b + t) // 4, b // 4 : (b + t) // 4]
        file_blocks = np.asarray(levels[0], np.uint8).reshape(256 // 4, 256 // 4, 8)[: t // 4, : t // 4]
        assert np.array_equal(rows, file_blocks)


def _evict_all(pack_cache: Path) -> list[str]:
    """Evict every unleased pack of the cache folder, as another program's cleanup would."""
    from texstream.assets import PackCache, PackCacheConfig

    with PackCache(PackCacheConfig(folder=pack_cache / "packs", max_mb=0)) as other:
        return other.cleanup()


@pytest.mark.parametrize("how", ["streamer.close", "vt.close", "streamer.release"])
def test_closing_an_image_texture_lets_the_cache_evict_its_pack(
    gl_context: moderngl.Context, tmp_path: Path, pack_cache: Path, how: str
) -> None:
    src = tmp_path / "photo.png"
    Image.fromarray(picture(160, 96)[..., :3]).save(src)
    s = Streamer(gl_context, _config())
    try:
        vt = s.open(src)
        pack = Path(vt.path)
        assert _evict_all(pack_cache) == [] and pack.is_file(), "an open texture's pack was evicted"
        {"streamer.close": lambda: s.close(vt), "vt.close": vt.close, "streamer.release": s.release}[how]()
        assert _evict_all(pack_cache) == [pack.stem] and not pack.exists()
    finally:
        s.release()


def test_a_second_handle_keeps_the_pack_leased(gl_context: moderngl.Context, tmp_path: Path, pack_cache: Path) -> None:
    src = tmp_path / "photo.png"
    Image.fromarray(picture(160, 96)[..., :3]).save(src)
    with Streamer(gl_context, _config()) as s:
        first, second = s.open(src), s.open(src)
        pack = Path(first.path)
        assert second.id == first.id  # one residency, two handles
        first.close()
        assert _evict_all(pack_cache) == [] and pack.is_file(), "the open handle's pack was evicted"
        s.make_all_resident(second)  # and it still reads
        second.close()
        assert _evict_all(pack_cache) == [pack.stem]
