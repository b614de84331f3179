"""Packs are byte-identical across changes to how the bake runs (who reads the source, which process
encodes, in process or in workers): each case below bakes a small pack and compares the SHA-256 of
the whole file with the digest of the same pack baked by the pipeline before those changes.

A digest here changes only with the pack format, the encoders' output or the bake's settings; a
change that alters one on purpose says so and records the new digest (and, for the format, bumps
the pack version).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from texstream.bake import ArraySource, bake, bake_file, jobs, open_source
from texstream.bake.procedural import ProceduralSource
from texstream.bake.source import Source
from texstream.config import BakeConfig
from texstream.pack import AddressMode, Supercompression, TexelFormat

from .conftest import ASSETS, load_photo

# case -> SHA-256 of the pack file: the digest recorded with the pipeline of release 0.1.0 (commit
# a56db91), and the one this case writes on an Intel Xeon (2026-12-02; the code of 426e601 writes the
# same bytes there, and the blocks pass the same quality tests). Two, because the ispc encoders
# use the x86 approximate reciprocal (rcpps), whose exact results the instruction set leaves to each
# processor: the same code and packages wrote other (equally valid) blocks there. A change to the
# pipeline alters both.
DIGESTS: dict[str, tuple[str, str]] = {
    "array-bc1-zstd-jobs1": (
        "c20092fac3ff43fe8838b775c3d3c3ed3b570eb40ba10519825f8d28b966ee55",
        "5222a3c9f785c30590ac5ebe68675c87f5ddd091009fff751e741eedfa65b035",
    ),
    "array-bc1-zstd-jobs2": (
        "24475f0e23adf237f8e1d3f41ca60c26c57f5e17fe1d8b2cbce35db63eb24b80",
        "6e54d0a120b40ada5f46673fd046733812f6a21c03a09bb78ebf15ede4aa30b6",
    ),
    "array-bc7-alpha-wrap-jobs2": (
        "f9a6d3b4c23fe92bcd90cad89b1ee25e6a3c4c998c4e5197236c2f16084834d5",
        "34651eecb61460b336fd926481489647de6db8b4fee620a682cd13eed9b98b49",
    ),
    "procedural-bc5-lz4-wrap-jobs2": (
        "fa624884aa910ba682b758fe98d7f28b439d0633d2f38e1b6248c6b22077e1ef",
        "00dc204b11880369173d6e66bb159c00e1956193d26d3db917511f122bff8bfc",
    ),
    "procedural-bc4-none-jobs1": (
        "8a73aec60917930ad01e6e0f6d6271ac7572ba63543be39cfb97c72de0042539",
        "0e51bfd2f8eda7dff15a9b4f10ab416ecebce97aab62e5d821d11c4a77be393c",
    ),
    "png-streamed-bc1-zstd-jobs2": (
        "6d86076b20135c500ffa8e337d1e0a595311ffe92bf98e8cf306235629835dbd",
        "9577cf0b53326e85c80258a5e99e5e10b00057c3a1b6c1036d803e103c056db3",
    ),
    "tiff-bc1-zstd-jobs2": (
        "32dd6cd949c2e1bdab01217ec9bfe60d593c05d6eb6d94711797e799dade6dac",
        "661be4096e4c24da56782552c2ddb31c89fdaa60cdf132bd2b2f2d854778323b",
    ),
    "png-default-level3-jobs2": (
        "905c6cc55a16d2ec51c5fac90dbcf0d469a20709de023d7f714f76dbab943521",
        "aa552012a9adabc3bdce960eebab0af23e328e3b542fde52e964ce7e09403cc3",
    ),
    # Every default setting since zstd level 2 became the default (level 3's bytes are the case above).
    "png-default-jobs2": (
        "fa49c6f85ee94c9ce2f16f80e40e9d4b9100c2baf4905c7befbabf62b19146ca",
        "470e7bbf965a4002d1ecf296149ecfddc3181062e19cd7ec8d5e74026677df51",
    ),
    # Opaque BC7 at each level, as baked before the balanced level came (commit 7a38e8a); balanced's own
    # bytes as it first baked them.
    "array-bc7-fast-jobs1": (
        "4f284fa21c3e5ee5a3b725e2c74c0ef42aecc44979246fd6e76cbd8337c3963d",
        "81e17511464317f9996428bd2f843c32844677fa3f4c2390544a36e58d8510c5",
    ),
    "array-bc7-normal-jobs1": (
        "be9491264824fcdd2c3b06d3c625a70c389a3f5044b53e367dc9e5795f68019c",
        "62869f9719cd1f46a8c54ce991e1e9a875740825c278af2a6d6c5206eb99b29c",
    ),
    "array-bc7-slow-jobs1": (
        "7a3914d5a82480bd67f853bea24e69f93dc3c5fe431f043e1a71393a98b7801a",
        "2cae9752fc6474ad2f7fd5ab81a5b844db1fae57d70f81ad7227dc1d6ff3f0f5",
    ),
    "array-bc7-balanced-jobs1": (
        "0bb8a388c0e6218db8b315f2e09ce1de4b30b695c8a9c4ba5f9fb4707033383e",
        "2b2f20e6c906b2d7dca74704feef5e9964efe7b307ba1c256a89adc2fc5a2279",
    ),
}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _photo_alpha() -> np.ndarray:
    img = load_photo("coffee.png")[:203, :301].copy()  # odd on both axes, several odd levels
    img[..., 3] = np.linspace(0, 255, img.shape[1]).astype(np.uint8)[None, :]  # real alpha, some 0
    return img


def _tiff(folder: Path) -> Path:
    import pyvips

    path = folder / "chelsea.tif"
    img = pyvips.Image.new_from_file(str(ASSETS / "chelsea.png"))
    img.tiffsave(str(path), compression="none")
    return path


def _case(name: str, folder: Path) -> tuple[Source | Path, BakeConfig]:
    small = {"tile_size": 64, "progress": False, "zstd_level": 3}  # the level these digests were baked at
    if name.startswith("array-bc1"):
        cfg = BakeConfig(texel_format=TexelFormat.BC1, jobs=int(name[-1]), **small)
        return ArraySource(load_photo("astronaut.png")[:300, :260], "astronaut"), cfg
    if name.startswith("array-bc7-") and name.endswith("-jobs1"):
        level = name.removeprefix("array-bc7-").removesuffix("-jobs1")
        crop = (150, 130) if level == "slow" else (300, 260)  # slow: a quarter of the texels, ~0.3 s
        cfg = BakeConfig(texel_format=TexelFormat.BC7, bc7_quality=level, jobs=1, **small)
        return ArraySource(load_photo("astronaut.png")[: crop[0], : crop[1]], "astronaut"), cfg
    if name == "array-bc7-alpha-wrap-jobs2":
        cfg = BakeConfig(
            texel_format=TexelFormat.BC7, bc7_quality="fast", address_mode=AddressMode.WRAP, jobs=2, **small
        )
        return ArraySource(_photo_alpha(), "coffee-alpha"), cfg
    if name == "procedural-bc5-lz4-wrap-jobs2":
        cfg = BakeConfig(
            texel_format=TexelFormat.BC5,
            supercompression=Supercompression.LZ4,
            address_mode=AddressMode.WRAP,
            jobs=2,
            **small,
        )
        return ProceduralSource("normals", 320, 200, 3), cfg
    if name == "procedural-bc4-none-jobs1":
        cfg = BakeConfig(texel_format=TexelFormat.BC4, supercompression=Supercompression.NONE, jobs=1, **small)
        return ProceduralSource("terrain", 250, 330, 2), cfg
    if name == "png-streamed-bc1-zstd-jobs2":
        return open_source(ASSETS / "chelsea.png", vips_threshold=0), BakeConfig(jobs=2, **small)
    if name == "tiff-bc1-zstd-jobs2":
        return _tiff(folder), BakeConfig(jobs=2, **small)
    if name == "png-default-level3-jobs2":
        return ASSETS / "astronaut.png", BakeConfig(jobs=2, progress=False, zstd_level=3)
    assert name == "png-default-jobs2"
    return ASSETS / "astronaut.png", BakeConfig(jobs=2, progress=False)


@pytest.mark.parametrize("name", sorted(DIGESTS))
def test_pack_bytes_match_the_recorded_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    if "default" not in name:  # several stages and bands from small images
        monkeypatch.setattr(jobs, "BAND_BYTES", 1 << 14)
        monkeypatch.setattr(jobs, "FINAL_BYTES", 1 << 12)
    source, cfg = _case(name, tmp_path)
    out = tmp_path / "out.tpk"
    if isinstance(source, Path):
        bake_file(source, out, cfg)
    else:
        bake(source, out, cfg)
    assert _digest(out) in DIGESTS[name]


def test_a_small_default_bake_runs_in_process_and_writes_the_workers_pack(tmp_path: Path) -> None:
    """jobs=0 (every core) on a small image: no worker processes, and the very pack the workers
    write (the band plan is that of every core)."""
    import os

    from texstream.bake.pipeline import IN_PROCESS_PIXELS, bakes_in_process

    source = ArraySource(load_photo("astronaut.png")[:300, :260], "astronaut")
    here = bake(source, tmp_path / "here.tpk", BakeConfig(jobs=0, tile_size=64, progress=False))
    cores = os.cpu_count() or 1
    workers = bake(source, tmp_path / "workers.tpk", BakeConfig(jobs=cores, tile_size=64, progress=False))
    assert here.jobs == 1 and workers.jobs == cores
    assert _digest(tmp_path / "here.tpk") == _digest(tmp_path / "workers.tpk")
    assert bakes_in_process(BakeConfig(jobs=0), IN_PROCESS_PIXELS)
    assert not bakes_in_process(BakeConfig(jobs=0), IN_PROCESS_PIXELS + 1) or cores == 1
    assert not bakes_in_process(BakeConfig(jobs=2), 16)  # an explicit job count gets its workers
