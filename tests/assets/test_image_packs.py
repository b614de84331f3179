"""Image files baked once into the content-addressed pack cache: hits, keys, concurrency, the size
bound, the content rules, corrupt cached packs, hostile images and the command line."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from texstream.apps.cli import main
from texstream.assets import (
    ContentKind,
    ImageBakeSettings,
    ImageContent,
    ImagePackStage,
    PackCache,
    PackCacheConfig,
    classify,
    pack_for_image,
)
from texstream.errors import SourceError
from texstream.pack import PackReader
from texstream.pack.format import TexelFormat


class Bakes:
    """The `on_bake` hook: the keys baked, in order."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def __call__(self, key: str) -> None:
        self.keys.append(key)


def noise(path: Path, size: tuple[int, int] = (96, 80), seed: int = 1, mode: str = "RGB") -> Path:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    a = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    if mode == "RGBA":
        a[..., 3] = np.where(a[..., 3] > 128, 255, 0)
    Image.fromarray(a[..., 0] if mode == "L" else a, mode).save(path)
    return path


def normal_map(path: Path, size: int = 96) -> Path:
    """Tangent-space normals of a bumpy height field, encoded 0.5 + 0.5 n."""
    y, x = np.mgrid[0:size, 0:size] / size * 2 * np.pi
    dx, dy = 0.4 * np.cos(3 * x) * np.cos(2 * y), -0.4 * np.sin(3 * x) * np.sin(2 * y)
    n = np.stack([-dx, -dy, np.ones_like(dx)], -1)
    n /= np.linalg.norm(n, axis=-1, keepdims=True)
    Image.fromarray(np.rint((n * 0.5 + 0.5) * 255).astype(np.uint8), "RGB").save(path)
    return path


@pytest.fixture
def cache(tmp_path: Path) -> PackCache:
    with PackCache(PackCacheConfig(folder=tmp_path / "packs"), on_bake=Bakes()) as c:
        yield c


def header_of(pack: Path) -> tuple[TexelFormat, bool]:
    with PackReader(pack) as r:
        return r.header.texel_format, r.header.srgb


# ---- hits and keys -----------------------------------------------------------------------------------
def test_first_call_bakes_second_is_a_hit_without_hashing(tmp_path: Path, cache: PackCache) -> None:
    photo = noise(tmp_path / "photo.png")
    first: list = []
    pack = pack_for_image(photo, cache=cache, jobs=1, progress=first.append)
    assert cache.on_bake.keys == [pack.stem]
    stages = [e.stage for e in first]
    assert stages[0] is ImagePackStage.HASHING and ImagePackStage.BAKING in stages and stages[-1] is ImagePackStage.DONE
    assert [e.done for e in first if e.stage is ImagePackStage.BAKING][-1] == 80  # every row read by the bake
    again: list = []
    assert pack_for_image(photo, cache=cache, jobs=1, progress=again.append) == pack
    assert cache.on_bake.keys == [pack.stem]  # no second bake
    assert [e.stage for e in again] == [ImagePackStage.DONE]  # nor a hash or a decode
    with PackReader(pack) as r:
        assert (r.header.width, r.header.height) == (96, 80)
        assert r.verify() == []


def test_a_changed_file_gets_a_new_pack(tmp_path: Path, cache: PackCache) -> None:
    photo = noise(tmp_path / "photo.png", seed=1)
    old = pack_for_image(photo, cache=cache, jobs=1)
    st = photo.stat()
    noise(photo, seed=2)  # same path, same size, new bytes; its mtime put back as it was
    assert photo.stat().st_size == st.st_size
    os.utime(photo, ns=(st.st_atime_ns, st.st_mtime_ns))
    new = pack_for_image(photo, cache=cache, jobs=1)
    assert new != old and len(cache.on_bake.keys) == 2
    assert pack_for_image(photo, cache=cache, jobs=1) == new and len(cache.on_bake.keys) == 2


def test_settings_change_the_key_and_an_override_wins(tmp_path: Path, cache: PackCache) -> None:
    photo = noise(tmp_path / "photo.png")
    auto = pack_for_image(photo, cache=cache, jobs=1)
    small_tiles = pack_for_image(photo, cache=cache, jobs=1, settings=ImageBakeSettings(tile_size=64))
    bc7 = pack_for_image(photo, cache=cache, jobs=1, settings=ImageBakeSettings(texel_format=TexelFormat.BC7))
    assert len({auto, small_tiles, bc7}) == 3 and len(cache.on_bake.keys) == 3
    assert header_of(auto) == (TexelFormat.BC1, True)
    with PackReader(small_tiles) as r:
        assert r.header.tile_size == 64 and r.header.texel_format is TexelFormat.BC1  # format still by content
    assert header_of(bc7) == (TexelFormat.BC7, True)
    # the same resolved settings given explicitly are the same key
    given = ImageBakeSettings(texel_format=TexelFormat.BC1, srgb=True)
    assert pack_for_image(photo, cache=cache, jobs=1, settings=given) == auto and len(cache.on_bake.keys) == 3


# ---- two processes -----------------------------------------------------------------------------------
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from texstream.assets import PackCache, PackCacheConfig, pack_for_image
    image, folder, marker, go = map(Path, sys.argv[1:5])
    def on_bake(key):
        with open(marker, "a") as f:
            f.write(key + "\\n")
        time.sleep(1.0)  # hold the bake lock while the other process asks
    stages = []
    with PackCache(PackCacheConfig(folder=folder), on_bake=on_bake) as cache:
        Path(str(go) + ".ready." + sys.argv[5]).touch()
        while not go.exists():
            time.sleep(0.005)
        pack = pack_for_image(image, cache=cache, jobs=1, progress=lambda e: stages.append(e.stage.value))
    print(pack)
    print(",".join(stages))
    """
)


def test_two_processes_asking_at_once_bake_once(tmp_path: Path) -> None:
    image = noise(tmp_path / "shared.png", size=(128, 128))
    folder, marker, go = tmp_path / "packs", tmp_path / "bakes.txt", tmp_path / "go"
    env = dict(os.environ, TEXSTREAM_CACHE=str(tmp_path / "unused"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(image), str(folder), str(marker), str(go), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + 120
        while not all(Path(f"{go}.ready.{i}").exists() for i in range(2)):
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline, "the children did not start"
            time.sleep(0.01)
        go.touch()
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], results
    paths = {out.splitlines()[0] for out, _ in results}
    stages = [out.splitlines()[1].split(",") for out, _ in results]
    assert len(paths) == 1 and Path(paths.pop()).is_file()
    assert len(marker.read_text().splitlines()) == 1  # exactly one bake
    assert sum("baking" in s for s in stages) == 1
    assert any("waiting" in s for s in stages)  # the other one waited for it, then used its pack


# ---- size bound ---------------------------------------------------------------------------------------
def test_lru_evicts_the_least_recently_used_and_never_a_leased_pack(tmp_path: Path) -> None:
    folder = tmp_path / "packs"
    images = [noise(tmp_path / f"img{i}.png", size=(128, 128), seed=i) for i in range(4)]

    def use(cache: PackCache, image: Path) -> Path:
        time.sleep(0.02)  # distinct last-use times on coarse file clocks
        return pack_for_image(image, cache=cache, jobs=1)

    with PackCache(PackCacheConfig(folder=folder)) as unbounded:
        a = use(unbounded, images[0])
        b = use(unbounded, images[1])
        assert use(unbounded, images[0]) == a  # a used again: b is now the least recently used
        size = max(e.size for e in unbounded.entries())
    bound = PackCacheConfig(folder=folder, max_mb=2.5 * size / 2**20)  # room for two packs
    with PackCache(bound) as cache:
        c = use(cache, images[2])
        assert [e.path for e in cache.entries()] == [a, c] and not b.exists()
    with PackCache(PackCacheConfig(folder=folder)) as holder:
        assert holder.get(a.stem) == a  # another user holds a
        with PackCache(bound) as cache:
            assert use(cache, images[2]) == c  # c used after a: a is the least recently used
            cache.release(c)
            d = use(cache, images[3])
            assert a.exists(), "a leased pack was evicted"
            assert not c.exists() and d.exists()
    with PackCache(bound) as cache:  # nobody holds a any more: it goes first
        e = use(cache, images[1])
        assert [x.path for x in cache.entries()] == [d, e] and not a.exists()


def test_each_hold_on_a_lease_is_given_back_before_the_pack_can_go(tmp_path: Path, cache: PackCache) -> None:
    from texstream.assets import open_pack_reader

    photo = noise(tmp_path / "photo.png", size=(128, 128))
    pack = pack_for_image(photo, cache=cache, jobs=1)
    assert pack_for_image(photo, cache=cache, jobs=1) == pack and cache.holds(pack) == 2
    reader = open_pack_reader(photo, cache=cache)  # a third hold, given back when the reader closes
    assert Path(reader.path) == pack and cache.holds(pack) == 3

    def evicted() -> list[str]:
        with PackCache(PackCacheConfig(folder=tmp_path / "packs", max_mb=0)) as other:
            return other.cleanup()

    cache.release(pack)
    reader.close()
    reader.close()  # closing twice gives back one hold only
    assert cache.holds(pack) == 1 and evicted() == [] and pack.is_file()
    cache.release(pack)
    cache.release(pack)  # one more than was held: nothing
    assert cache.holds(pack) == 0 and evicted() == [pack.stem] and not pack.exists()


def test_a_pack_opened_by_path_holds_no_lease(tmp_path: Path, cache: PackCache) -> None:
    from texstream.assets import open_pack_reader

    pack = pack_for_image(noise(tmp_path / "photo.png"), cache=cache, jobs=1)
    cache.release(pack)
    with open_pack_reader(pack, cache=cache) as reader:
        assert type(reader) is PackReader and cache.holds(pack) == 0


# ---- content rules ------------------------------------------------------------------------------------
def content(**kw: object) -> ImageContent:
    base = dict(width=64, height=64, channels=3, alpha=False, grey=False, deep=False, normal_like=False)
    base.update(kw)
    return ImageContent(**base)


@pytest.mark.parametrize(
    ("name", "facts", "kind"),
    [
        ("photo.png", {}, ContentKind.COLOUR),
        ("portrait.png", {"channels": 1, "grey": True}, ContentKind.COLOUR),
        ("leaf.png", {"channels": 4, "alpha": True}, ContentKind.COLOUR_ALPHA),
        ("brick_normal.png", {}, ContentKind.NORMAL_MAP),
        ("Brick_NRM.jpg", {}, ContentKind.NORMAL_MAP),
        ("brick_n.png", {}, ContentKind.NORMAL_MAP),
        ("normals.tif", {}, ContentKind.NORMAL_MAP),
        ("surface.png", {"normal_like": True}, ContentKind.NORMAL_MAP),
        ("decal.png", {"channels": 4, "alpha": True, "normal_like": True}, ContentKind.COLOUR_ALPHA),
        ("brick_rough.png", {"channels": 1, "grey": True}, ContentKind.GREY_DATA),
        ("brick_metallic.png", {"grey": True}, ContentKind.GREY_DATA),
        ("brick_ao.png", {"channels": 1, "grey": True}, ContentKind.GREY_DATA),
        ("terrain_height.png", {"channels": 1, "grey": True}, ContentKind.GREY_DATA),
        ("dem.tif", {"channels": 1, "grey": True, "deep": True}, ContentKind.GREY_DATA),
        ("brick_rough.png", {}, ContentKind.DATA),
        ("northern.png", {}, ContentKind.COLOUR),
    ],
)
def test_classify_rules(name: str, facts: dict, kind: ContentKind) -> None:
    assert classify(name, content(**facts)) is kind


@pytest.mark.parametrize(
    ("make", "expect"),
    [
        (lambda d: noise(d / "photo.png"), (TexelFormat.BC1, True)),
        (lambda d: noise(d / "leaf.png", mode="RGBA"), (TexelFormat.BC7, True)),
        (lambda d: noise(d / "wall_normal.png"), (TexelFormat.BC5, False)),
        (lambda d: normal_map(d / "surface.png"), (TexelFormat.BC5, False)),
        (lambda d: noise(d / "wall_rough.png", mode="L"), (TexelFormat.BC4, False)),
    ],
    ids=["colour", "alpha", "named-normal", "detected-normal", "grey-data"],
)
def test_content_rules_choose_the_pack_format(tmp_path: Path, cache: PackCache, make, expect) -> None:
    assert header_of(pack_for_image(make(tmp_path), cache=cache, jobs=1)) == expect


def test_an_override_wins_over_the_content_rules(tmp_path: Path, cache: PackCache) -> None:
    normals = normal_map(tmp_path / "surface.png")
    forced = ImageBakeSettings(texel_format=TexelFormat.BC7, srgb=False)
    assert header_of(pack_for_image(normals, cache=cache, jobs=1, settings=forced)) == (TexelFormat.BC7, False)


def test_noise_is_not_detected_as_a_normal_map(tmp_path: Path, cache: PackCache) -> None:
    from texstream.assets.image_packs import content_kind

    assert content_kind(noise(tmp_path / "surface.png"), cache) is ContentKind.COLOUR
    assert content_kind(normal_map(tmp_path / "bumps.png"), cache) is ContentKind.NORMAL_MAP


# ---- corrupt cached packs ---------------------------------------------------------------------------------
def test_a_corrupt_cached_pack_is_detected_and_baked_again(tmp_path: Path, cache: PackCache) -> None:
    photo = noise(tmp_path / "photo.png", size=(300, 200))
    pack = pack_for_image(photo, cache=cache, jobs=1)
    cache.release(pack)
    with PackReader(pack) as r:
        e = r.entry(0, 1, 0)
    st = pack.stat()
    with open(pack, "r+b") as f:  # flip payload bytes in place, then put the mtime back
        f.seek(e.offset + 3)
        byte = f.read(1)
        f.seek(e.offset + 3)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(pack, ns=(st.st_atime_ns, st.st_mtime_ns))
    with PackReader(pack) as r:
        assert r.verify() != []
    assert pack_for_image(photo, cache=cache, jobs=1) == pack
    assert len(cache.on_bake.keys) == 2
    with PackReader(pack) as r:
        assert r.verify() == []
    assert pack_for_image(photo, cache=cache, jobs=1) == pack and len(cache.on_bake.keys) == 2


# ---- hostile images ---------------------------------------------------------------------------------------
def png_claiming(path: Path, width: int, height: int) -> Path:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 4096)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return path


def truncated(path: Path) -> Path:
    whole = noise(path.with_name("whole.png"), (200, 200)).read_bytes()
    return written(path, whole[: len(whole) // 2])


def written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda d: truncated(d / "cut.png"), "cannot decode"),
        (lambda d: png_claiming(d / "huge.png", 1_000_000, 1_000_000), "limit"),
        (lambda d: png_claiming(d / "bomb.png", 30_000, 30_000), "truncated"),
        (lambda d: written(d / "notes.png", b"not an image at all\n" * 10), "not an image"),
    ],
    ids=["truncated", "huge-claim", "implausible-claim", "not-an-image"],
)
def test_hostile_images_give_one_line(tmp_path: Path, cache: PackCache, make, words: str) -> None:
    target = make(tmp_path)
    with pytest.raises(SourceError) as err:
        pack_for_image(target, cache=cache, jobs=1)
    message = str(err.value)
    assert "\n" not in message and target.name in message and words in message
    assert cache.entries() == [] and cache.on_bake.keys == []


# ---- command line ---------------------------------------------------------------------------------------
def test_cli_commands_take_an_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("TEXSTREAM_CACHE", str(tmp_path / "cache"))
    photo = noise(tmp_path / "photo.png", size=(200, 150))
    assert main(["info", str(photo), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["width"], info["height"], info["format"]) == (200, 150, "bc1")
    assert info["metadata"]["content_kind"] == "colour"
    packs = list((tmp_path / "cache" / "packs").glob("*.tpk"))
    assert len(packs) == 1
    assert main(["verify", str(photo)]) == 0
    assert "all" in capsys.readouterr().out
    out = tmp_path / "level0.png"
    assert main(["extract", str(photo), str(out)]) == 0
    assert Image.open(out).size == (200, 150)
    assert list((tmp_path / "cache" / "packs").glob("*.tpk")) == packs  # baked once


def test_cli_keeps_its_error_for_a_file_that_is_neither(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TEXSTREAM_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "readme.txt"
    text.write_text("hello\n")
    assert main(["info", str(text)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "texstream bake" in err
    cut = truncated(tmp_path / "cut.png")
    assert main(["verify", str(cut)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "cut.png" in err


def test_resolve_pack_leaves_packs_fifos_and_other_files_to_the_reader(tmp_path: Path, cache: PackCache) -> None:
    from texstream.assets import resolve_pack

    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    assert resolve_pack(fifo, cache=cache) == fifo  # not opened: reading a FIFO could wait forever
    text = written(tmp_path / "readme.txt", b"hello\n")
    assert resolve_pack(text, cache=cache) == text
    pack = pack_for_image(noise(tmp_path / "photo.png"), cache=cache, jobs=1)
    assert resolve_pack(pack, cache=cache) == pack
    assert resolve_pack("https://example.com/x.png", cache=cache) == "https://example.com/x.png"
    assert resolve_pack(tmp_path / "photo.png", cache=cache) == pack and len(cache.on_bake.keys) == 1


def test_srgb_asked_for_picks_a_colour_format() -> None:
    from texstream.assets import settings_for

    assert settings_for(ContentKind.GREY_DATA, ImageBakeSettings(srgb=True)).texel_format is TexelFormat.BC1
    assert settings_for(ContentKind.GREY_DATA).texel_format is TexelFormat.BC4
    linear_bc7 = settings_for(ContentKind.COLOUR_ALPHA, ImageBakeSettings(srgb=False))
    assert (linear_bc7.texel_format, linear_bc7.srgb) == (TexelFormat.BC7, False)
    with pytest.raises(ValueError, match="linear"):
        ImageBakeSettings(texel_format=TexelFormat.BC5, srgb=True)


def test_streamed_sources_are_analysed_through_a_thumbnail(tmp_path: Path) -> None:
    """Images above the libvips threshold (a big tiled TIFF) are sampled by libvips, not decoded whole."""
    import pyvips

    from texstream.assets.image_settings import analyse_source
    from texstream.bake.source import VipsSource

    normals = normal_map(tmp_path / "bumps.png", size=128)
    tiled = tmp_path / "bumps.tif"
    pyvips.Image.new_from_file(str(normals)).tiffsave(
        str(tiled), tile=True, pyramid=True, tile_width=64, tile_height=64
    )
    facts = analyse_source(VipsSource(tiled), tiled)
    assert (facts.width, facts.height, facts.channels, facts.alpha, facts.normal_like) == (128, 128, 3, False, True)
    photo = noise(tmp_path / "leaf.png", mode="RGBA")
    facts = analyse_source(VipsSource(photo), photo)
    assert facts.alpha and not facts.normal_like and not facts.grey


@pytest.mark.gl
def test_cli_renders_an_image(gl_context: object, tmp_path: Path) -> None:
    photo = noise(tmp_path / "photo.png", size=(256, 256))
    out = tmp_path / "frame.png"
    env = dict(os.environ, TEXSTREAM_CACHE=str(tmp_path / "cache"))
    args = ["render", str(photo), "--out", str(out), "--size", "64x64", "--frames", "4", "--all-resident"]
    p = subprocess.run([sys.executable, "-m", "texstream", *args], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert np.asarray(Image.open(out).convert("RGB")).std() > 10  # the noise, not a flat frame
    assert len(list((tmp_path / "cache" / "packs").glob("*.tpk"))) == 1


def test_a_pack_left_without_its_record_is_checked_and_used(tmp_path: Path, cache: PackCache) -> None:
    """A baker killed between the pack's rename and its record: the pack is verified, sealed, used."""
    photo = noise(tmp_path / "photo.png")
    pack = pack_for_image(photo, cache=cache, jobs=1)
    cache.release(pack)
    pack.with_suffix(".json").unlink()
    assert pack_for_image(photo, cache=cache, jobs=1) == pack and len(cache.on_bake.keys) == 1
    assert [e.record.get("recovered") for e in cache.entries()] == [True]
