"""End to end on GL: BC/RGBA8 tiles through the staging ring into array layers (the engine's own
upload loop, compiled and pure Python), checked two ways.

1. The layer's stored bytes equal the uploaded bytes (glGetCompressedTextureSubImage).
2. Sampling the layer (texelFetch into a float framebuffer) matches texture2ddecoder's decode of
   the same blocks, PSNR >= 45 dB (sRGB formats compared after linearizing the reference).
"""

from __future__ import annotations

from collections.abc import Iterator

import moderngl
import numpy as np
import pytest

from texstream.gl.enums import gl_format
from texstream.gl.gl_ext import GLExt
from texstream.native import load as load_native
from texstream.pack.format import TexelFormat
from texstream.runtime.staging import StagingRing

from ..require import skip_unless_native
from .helpers import (
    SLOT,
    LayerSampler,
    compared_channels,
    encode,
    make_image,
    psnr,
    reference_rgba,
    srgb_to_linear,
)

pytestmark = pytest.mark.gl

CASES = [
    (TexelFormat.BC1, False),
    (TexelFormat.BC1, True),
    (TexelFormat.BC3, False),
    (TexelFormat.BC3, True),
    (TexelFormat.BC4, False),
    (TexelFormat.BC5, False),
    (TexelFormat.BC7, False),
    (TexelFormat.BC7, True),
    (TexelFormat.RGBA8, False),
    (TexelFormat.RGBA8, True),
]
MIN_PSNR = 45.0


@pytest.fixture(scope="module")
def gl(gl_context: moderngl.Context) -> GLExt:
    return GLExt(gl_context)


@pytest.fixture(scope="module")
def sampler(gl_context: moderngl.Context, gl: GLExt) -> Iterator[LayerSampler]:
    s = LayerSampler(gl_context, gl, SLOT)
    yield s
    s.release()


def check_layer(gl: GLExt, sampler: LayerSampler, tex, layer: int, fmt: TexelFormat, srgb: bool, data: bytes):
    assert gl.read_layer(tex, layer) == data  # the exact bytes are stored
    got = sampler.sample(tex, layer)
    ref = reference_rgba(fmt, data, SLOT).astype(np.float64) / 255.0
    if srgb:
        ref[..., :3] = srgb_to_linear(ref[..., :3])
    ch = compared_channels(fmt)
    quality = psnr(got[..., ch], ref[..., ch])
    assert quality >= MIN_PSNR, f"{fmt.name} srgb={srgb} layer {layer}: PSNR {quality:.1f} dB"
    if fmt in (TexelFormat.BC1, TexelFormat.BC4, TexelFormat.BC5):
        assert np.allclose(got[..., 3], 1.0)  # opaque: RGB DXT1, RGTC have no alpha


@pytest.mark.parametrize("use_native", [False, True], ids=["python-loop", "compiled-loop"])
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "orphaning"])
@pytest.mark.parametrize(("fmt", "srgb"), CASES, ids=[f"{f.name.lower()}{'-srgb' if s else ''}" for f, s in CASES])
def test_tiles_through_the_ring_sample_like_the_reference_decoder(
    gl_context: moderngl.Context,
    gl: GLExt,
    sampler: LayerSampler,
    fmt: TexelFormat,
    srgb: bool,
    persistent: bool,
    use_native: bool,
) -> None:
    native = load_native() if use_native else None
    if use_native and native is None:
        skip_unless_native("texstream's compiled helper is not built here")
    f = gl_format(fmt, srgb)
    n = f.layer_bytes(SLOT)
    tiles = [encode(fmt, make_image(SLOT, seed)) for seed in (3, 4, 5)]
    assert all(len(t) == n for t in tiles)
    ring = StagingRing(gl_context, gl, size_bytes=4 * n + 4096, slot_bytes=n, persistent=persistent)
    tex = gl.create_texture_array(f, SLOT, 5)
    try:
        assert ring.persistent is persistent
        slots = ring.acquire(3)
        for slot, data in zip(slots.tolist(), tiles, strict=True):
            ring.view(slot)[:] = data  # what an I/O thread does, straight into the upload memory
        layers = np.array([4, 0, 2])
        ring.stage(slots, n)
        zero = np.zeros(3, np.int64)
        gl.upload_cell_batch(tex, layers, zero, zero, ring.offsets(slots), SLOT, ring.glo, native)
        ring.submit(slots, 3 * n)
        for layer, data in zip(layers.tolist(), tiles, strict=True):
            check_layer(gl, sampler, tex, layer, fmt, srgb, data)
        gl_context.finish()
        assert ring.reclaim().size == 3 and ring.stats().free == ring.slot_count
    finally:
        tex.release()
        ring.release()


def test_orphaning_batches_do_not_disturb_earlier_uploads(
    gl_context: moderngl.Context, gl: GLExt, sampler: LayerSampler
) -> None:
    """Each fallback batch orphans the buffer; layers uploaded by earlier batches keep their data."""
    f = gl_format(TexelFormat.BC7, True)
    n = f.layer_bytes(SLOT)
    ring = StagingRing(gl_context, gl, size_bytes=2 * n, slot_bytes=n, persistent=False)
    tex = gl.create_texture_array(f, SLOT, 6)
    tiles = [encode(TexelFormat.BC7, make_image(SLOT, seed)) for seed in range(6)]
    zero = np.zeros(1, np.int64)
    try:
        for layer, data in enumerate(tiles):
            slots = np.zeros(0, np.int64)
            for _ in range(1000):  # both slots may be in flight: wait for a fence like the uploader would
                ring.reclaim()
                slots = ring.acquire(1)
                if slots.size:
                    break
                gl_context.finish()
            assert slots.size == 1
            ring.view(int(slots[0]))[:] = data
            ring.stage(slots, n)
            gl.upload_cell_batch(tex, np.array([layer]), zero, zero, ring.offsets(slots), SLOT, ring.glo)
            ring.submit(slots, n)
        for layer, data in enumerate(tiles):
            check_layer(gl, sampler, tex, layer, TexelFormat.BC7, True, data)
    finally:
        tex.release()
        ring.release()
