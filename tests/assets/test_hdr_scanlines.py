"""The Radiance reader's two scanline decoders, compiled (`ts_hdr_scanlines` and `ts_rgbe_to_float` in
_native.c) and Python/numpy, give the same texels, bit for bit, and the same one-line errors on valid,
random and hostile inputs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.require import skip_unless_native
from texstream.assets import hdr
from texstream.assets.hdr import parse_hdr, rgbe_to_float, use_scanline_decoder
from texstream.errors import SourceError
from texstream.native import hdr_functions

from .hdr_files import float_to_rgbe, hdr_bytes, sky

CORPUS = Path(__file__).parent.parent / "fuzz" / "corpus" / "hdr"


@pytest.fixture(autouse=True)
def restore_decoder() -> Iterator[None]:
    previous = use_scanline_decoder("auto")
    yield
    use_scanline_decoder(*previous)


@pytest.fixture
def compiled() -> None:
    if hdr_functions() is None:
        skip_unless_native("texstream's compiled helper with ts_hdr_scanlines is not built")


def outcome(data: bytes, kind: str) -> tuple[str, bytes | str]:
    """What one decoder makes of `data`: ("image", the float bits and shape) or ("refused", the line)."""
    use_scanline_decoder(kind)
    try:
        image = parse_hdr(data, "x.hdr", max_texels=1 << 20)
    except SourceError as exc:
        return "refused", str(exc)
    return "image", repr(image.rgb.shape).encode() + image.rgb.tobytes() + repr(image.exposure).encode()


def same_outcome(data: bytes) -> tuple[str, bytes | str]:
    native, python = outcome(data, "native"), outcome(data, "python")
    assert native == python, (native[0], python[0], native[1] if native[0] == "refused" else python[1])
    return native


SPLICES = [bytes([2, 2, 0, 8]), bytes([0xFF, 7]), bytes([0x80]), bytes([128, 1]), bytes([1, 1, 1, 9])]


def mutations(data: bytes, rng: np.random.Generator, count: int) -> Iterator[bytes]:
    """Byte flips, random bytes, cuts and spliced-in run headers, in the picture's body."""
    body = data.index(b"\n\n") + 2
    for _ in range(count):
        out = bytearray(data)
        kind = rng.integers(4)
        at = int(rng.integers(body, len(out)))
        if kind == 0:
            out[at] ^= 1 << int(rng.integers(8))
        elif kind == 1:
            n = int(rng.integers(1, 16))
            out[at : at + n] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        elif kind == 2:
            del out[at:]
        else:
            out[at:at] = SPLICES[int(rng.integers(len(SPLICES)))]
        yield bytes(out)


@pytest.mark.parametrize(("width", "height"), [(8, 3), (127, 4), (128, 2), (129, 3), (300, 5), (7, 6), (1, 9)])
@pytest.mark.parametrize("rle", [True, False])
def test_both_decoders_read_valid_pictures_alike(compiled: None, width: int, height: int, rle: bool) -> None:
    img = sky(width, height)
    kind, _ = same_outcome(hdr_bytes(img, rle=rle))
    assert kind == "image"
    use_scanline_decoder("native")
    np.testing.assert_array_equal(parse_hdr(hdr_bytes(img, rle=rle)).rgb, rgbe_to_float(float_to_rgbe(img)))


def test_both_decoders_agree_on_mutated_and_random_inputs(compiled: None) -> None:
    rng = np.random.default_rng(21)
    seeds = [hdr_bytes(sky(40, 6)), hdr_bytes(sky(9, 3)), hdr_bytes(sky(12, 4), rle=False)]
    seeds += [f.read_bytes() for f in sorted(CORPUS.glob("*"))]
    refused = read = 0
    for seed in seeds:
        for data in mutations(seed, rng, 150):
            kind, _ = same_outcome(data)
            refused += kind == "refused"
            read += kind == "image"
    for _ in range(200):  # random bodies after a valid header: mostly refused, each the same way
        width, height = int(rng.integers(1, 200)), int(rng.integers(1, 6))
        head = b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y %d +X %d\n" % (height, width)
        least = height * min(4 + 8 * -(-width // 127), 4 * width)  # what passes the reader's size check
        body = rng.integers(0, 256, int(rng.integers(least, 5 * width * height + 16)), dtype=np.uint8)
        if rng.integers(2) and body.size >= 4:  # give the body a run-length scanline header
            body[:4] = [2, 2, width >> 8, width & 255]
        same_outcome(head + body.tobytes())
    assert refused > 100 and read > 20  # both kinds of outcome were exercised


def test_both_decoders_refuse_the_same_way_at_every_cut(compiled: None) -> None:
    data = hdr_bytes(sky(24, 5))
    for cut in range(data.index(b"\n-Y") + 1, len(data)):
        assert same_outcome(data[:cut])[0] == "refused"


def test_rgbe_values_are_the_same_from_both_paths(compiled: None) -> None:
    """Every (exponent, mantissa) pair: the compiled conversion and numpy's give the same bits as
    Radiance's formula (m + 0.5) * 2^(e - 136) computed in float64."""
    e = np.repeat(np.arange(256), 256).astype(np.uint8)
    m = np.tile(np.arange(256), 256).astype(np.uint8)
    rgbe = np.stack([m, m[::-1], m, e], -1).reshape(256, 256, 4)
    use_scanline_decoder("native")
    native = rgbe_to_float(rgbe)
    use_scanline_decoder("python")
    python = rgbe_to_float(rgbe)
    assert native.view(np.uint32).tobytes() == python.view(np.uint32).tobytes()
    exact = (rgbe[..., :3].astype(np.float64) + 0.5) * np.ldexp(1.0, rgbe[..., 3:].astype(np.int64) - 136)
    exact[rgbe[..., 3] == 0] = 0.0
    np.testing.assert_array_equal(python, exact.astype(np.float32))


def test_the_python_decoder_is_what_runs_without_the_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    """No compiled helper (as on a machine without a C compiler): pictures still read, in Python."""
    monkeypatch.setattr("texstream.native.hdr_functions", lambda path=None: None)
    img = sky(30, 4)
    np.testing.assert_array_equal(parse_hdr(hdr_bytes(img)).rgb, rgbe_to_float(float_to_rgbe(img)))
    use_scanline_decoder("native")
    with pytest.raises(RuntimeError, match="no compiled Radiance decoder"):
        parse_hdr(hdr_bytes(img))


def test_an_unknown_decoder_is_refused() -> None:
    with pytest.raises(ValueError, match="auto, native or python"):
        hdr.use_scanline_decoder("fast")
