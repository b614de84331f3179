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

from texstream.apps.bench_staging_texture import StagingTexture
from texstream.gl.enums import gl_format
from texstream.gl.gl_ext import GLExt
from texstream.native import load as load_native
from texstream.pack.format import TexelFormat
from texstream.runtime.device_staging import DeviceStaging
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


def cell_bytes(fmt: TexelFormat, layer: bytes, layer_size: int, x: int, y: int, size: int) -> bytes:
    """The bytes of the `size`-texel cell at texel (x, y) of one layer's stored bytes."""
    if not fmt.compressed:  # texels in rows
        texels = np.frombuffer(layer, np.uint8).reshape(layer_size, layer_size, 4)
        return texels[y : y + size, x : x + size].tobytes()
    bb = gl_format(fmt, False).block_bytes
    per_row = layer_size // 4
    blocks = np.frombuffer(layer, np.uint8).reshape(layer_size // 4, per_row, bb)
    return blocks[y // 4 : (y + size) // 4, x // 4 : (x + size) // 4].tobytes()


RUN_CASES = [TexelFormat.BC1, TexelFormat.BC5, TexelFormat.BC7, TexelFormat.RGBA8]
# what upload_runs sets and must put back: the unpack buffer, the image height and compressed block
# modes that step over slack, the scratch unit's array binding
UNPACK_STATE = {
    "GL_PIXEL_UNPACK_BUFFER_BINDING": 0x88EF,
    "GL_UNPACK_IMAGE_HEIGHT": 0x806E,
    "GL_UNPACK_COMPRESSED_BLOCK_WIDTH": 0x9127,
    "GL_UNPACK_COMPRESSED_BLOCK_HEIGHT": 0x9128,
    "GL_UNPACK_COMPRESSED_BLOCK_DEPTH": 0x9129,
    "GL_UNPACK_COMPRESSED_BLOCK_SIZE": 0x912A,
    "GL_TEXTURE_BINDING_2D_ARRAY": 0x8C1D,
}


def unpack_state(gl: GLExt) -> dict[str, int]:
    return {name: gl.get_integer(pname) for name, pname in UNPACK_STATE.items()}


@pytest.mark.parametrize("use_native", [False, True], ids=["python-loop", "compiled-loop"])
@pytest.mark.parametrize("slack", [0, 1], ids=["packed", "padded"])
@pytest.mark.parametrize("fmt", RUN_CASES, ids=[f.name.lower() for f in RUN_CASES])
def test_runs_of_layers_upload_with_one_call_each(
    gl_context: moderngl.Context, gl: GLExt, fmt: TexelFormat, slack: int, use_native: bool
) -> None:
    """A run of consecutive layers at one cell, read from consecutive ring slots (tightly packed, or
    a whole tile of slack apart, stepped over by the unpack image height), lands exactly; the
    cells beside it and the layers around it keep their bytes."""
    native = load_native() if use_native else None
    if use_native and native is None:
        skip_unless_native("texstream's compiled helper is not built here")
    f = gl_format(fmt, False)
    n = f.layer_bytes(SLOT)
    ring = StagingRing(gl_context, gl, size_bytes=8 * n * (1 + slack), slot_bytes=n * (1 + slack))
    tex = gl.create_texture_array(f, 2 * SLOT, 6)  # 2x2 cells per layer
    tiles = [encode(fmt, make_image(SLOT, seed)) for seed in range(7)]
    sentinel = bytes([0x5A]) * tex.layer_bytes  # new storage holds whatever the driver left there
    try:
        for layer in range(6):
            gl.write_layer(tex, layer, sentinel)
        assert gl.run_image_stride_ok(tex, SLOT, ring.stride)
        slots = ring.acquire(7)
        assert np.array_equal(slots, np.arange(7))  # a fresh ring hands out one span
        for slot, data in zip(slots.tolist(), tiles, strict=True):
            ring.view(slot)[:n] = data
        ring.stage(slots, n)
        # runs: layers 1..4 at cell (1, 0) from slots 0..3; layers 0..2 at cell (0, 1) from 4..6
        sent = gl.upload_runs(
            tex,
            np.array([1, 0]),
            np.array([SLOT, 0]),
            np.array([0, SLOT]),
            np.array([4, 3]),
            ring.offsets(np.array([0, 4])),
            SLOT,
            ring.glo,
            ring.stride,
            native,
        )
        ring.submit(slots, sent)
        assert sent == 7 * n
        assert unpack_state(gl) == {mode: 0 for mode in UNPACK_STATE}, "upload_runs left GL state behind"
        for k in range(4):
            got = cell_bytes(fmt, gl.read_layer(tex, 1 + k), 2 * SLOT, SLOT, 0, SLOT)
            assert got == tiles[k], f"layer {1 + k} of the first run"
        for k in range(3):
            got = cell_bytes(fmt, gl.read_layer(tex, k), 2 * SLOT, 0, SLOT, SLOT)
            assert got == tiles[4 + k], f"layer {k} of the second run"
        untouched = cell_bytes(fmt, gl.read_layer(tex, 5), 2 * SLOT, SLOT, 0, SLOT)
        assert untouched == sentinel[:n], "the run wrote past its last layer"
        assert cell_bytes(fmt, gl.read_layer(tex, 1), 2 * SLOT, 0, 0, SLOT) == sentinel[:n]
    finally:
        tex.release()
        ring.release()


@pytest.mark.parametrize("use_native", [False, True], ids=["python-loop", "compiled-loop"])
def test_strides_that_split_rows_and_runs_outside_are_refused(
    gl_context: moderngl.Context, gl: GLExt, use_native: bool
) -> None:
    """Slack that is not whole rows of blocks cannot be stepped over: the uploader falls back to one
    call per tile, and upload_runs refuses rather than upload skewed bytes; so are runs past the
    layers or cells past the layer, before any call (the GL state is left as it was)."""
    native = load_native() if use_native else None
    if use_native and native is None:
        skip_unless_native("texstream's compiled helper is not built here")
    f = gl_format(TexelFormat.BC1, False)
    n = f.layer_bytes(SLOT)
    tex = gl.create_texture_array(f, SLOT, 2)
    try:
        assert not gl.run_image_stride_ok(tex, SLOT, n + 16)
        one = np.zeros(1, np.int64)
        with pytest.raises(ValueError, match="cannot be uploaded in runs"):
            gl.upload_runs(tex, one, one, one, one + 2, one + 16, SLOT, 1, n + 16, native)
        with pytest.raises(ValueError, match="a run of layers is outside"):
            gl.upload_runs(tex, one + 1, one, one, one + 2, one + 16, SLOT, 1, n, native)
        with pytest.raises(ValueError, match="a cell does not fit"):
            gl.upload_runs(tex, one, one + 4, one, one + 1, one + 16, SLOT, 1, n, native)
        assert unpack_state(gl) == {mode: 0 for mode in UNPACK_STATE}
    finally:
        tex.release()


@pytest.mark.parametrize("use_native", [False, True], ids=["python-loop", "compiled-loop"])
@pytest.mark.parametrize("fmt", RUN_CASES, ids=[f.name.lower() for f in RUN_CASES])
def test_runs_through_the_device_buffer_upload_the_copied_bytes(
    gl_context: moderngl.Context, gl: GLExt, fmt: TexelFormat, use_native: bool
) -> None:
    """The device path: runs copied from the ring into the device-local buffer (one copy for ring
    slots contiguous in both) and uploaded from there land exactly, also when the ring's bytes
    change after the copy (the uploads read the device buffer, not the ring); the cells around them
    keep their bytes."""
    native = load_native() if use_native else None
    if use_native and native is None:
        skip_unless_native("texstream's compiled helper is not built here")
    f = gl_format(fmt, False)
    n = f.layer_bytes(SLOT)
    ring = StagingRing(gl_context, gl, size_bytes=8 * n, slot_bytes=n)
    device = DeviceStaging(gl, 8, ring.stride)
    tex = gl.create_texture_array(f, 2 * SLOT, 6)
    tiles = [encode(fmt, make_image(SLOT, seed)) for seed in range(6)]
    sentinel = bytes([0x5A]) * tex.layer_bytes
    try:
        for layer in range(6):
            gl.write_layer(tex, layer, sentinel)
        device.copy_in(ring.glo, np.array([0]), np.array([1]), native)  # a first batch moves the cursor
        slots = ring.acquire(6)
        for slot, data in zip(slots.tolist(), tiles, strict=True):
            ring.view(slot)[:n] = data
        # runs: layers 0..3 at cell (1, 1) from slots 0..3; layers 4..5 at cell (0, 0) from 4..5
        first, copies = device.copy_in(ring.glo, np.array([0, 4]), np.array([4, 2]), native)
        assert copies == 1 and first.tolist() == [1, 5]  # after the first batch, in one span
        ring.submit(slots, 6 * n)
        gl_context.finish()
        assert ring.reclaim().size == 6  # the fence behind the copy freed the ring slots
        ring.memory[:] = 0xC3  # an I/O thread refills them before the uploads run
        sent = gl.upload_runs(
            tex, np.array([0, 4]), np.array([SLOT, 0]), np.array([SLOT, 0]), np.array([4, 2]),
            first * ring.stride, SLOT, device.glo, ring.stride, native,
        )  # fmt: skip
        assert sent == 6 * n
        for k in range(4):
            assert cell_bytes(fmt, gl.read_layer(tex, k), 2 * SLOT, SLOT, SLOT, SLOT) == tiles[k], f"layer {k}"
        for k in range(2):
            assert cell_bytes(fmt, gl.read_layer(tex, 4 + k), 2 * SLOT, 0, 0, SLOT) == tiles[4 + k]
        assert cell_bytes(fmt, gl.read_layer(tex, 0), 2 * SLOT, 0, 0, SLOT) == sentinel[:n]
        assert cell_bytes(fmt, gl.read_layer(tex, 4), 2 * SLOT, SLOT, SLOT, SLOT) == sentinel[:n]
        assert device.stats().copies == 2 and device.stats().bytes_copied == 7 * ring.stride
        wrapped, _ = device.copy_in(ring.glo, np.array([0]), np.array([2]), native)
        assert wrapped.tolist() == [0]  # slots 7..8 do not fit before the end: the batch starts over
        with pytest.raises(ValueError, match="does not fit the 8-slot device buffer"):
            device.copy_in(ring.glo, np.array([0]), np.array([9]), native)
    finally:
        tex.release()
        device.release()
        device.release()  # idempotent
        ring.release()


def test_the_staging_texture_candidate_lands_bc1_runs_exactly(gl_context: moderngl.Context, gl: GLExt) -> None:
    """`bench stream`'s candidate path (an RG32UI staging array filled by one upload a ring span, then
    one glCopyImageSubData a run into the BC1 cache) moves the same bytes as a direct upload, so what
    the bench measures for it is a path that would be correct (the engine's compute-filled staging
    texture is tested in tests/runtime/test_texture_staging.py)."""
    f = gl_format(TexelFormat.BC1, True)
    n = f.layer_bytes(SLOT)
    ring = StagingRing(gl_context, gl, size_bytes=8 * n, slot_bytes=n)
    staging = StagingTexture(gl, SLOT, 8)
    tex = gl.create_texture_array(f, 2 * SLOT, 6)
    tiles = [encode(TexelFormat.BC1, make_image(SLOT, seed)) for seed in range(6)]
    sentinel = bytes([0x5A]) * tex.layer_bytes
    try:
        for layer in range(6):
            gl.write_layer(tex, layer, sentinel)
        slots = ring.acquire(6)
        for slot, data in zip(slots.tolist(), tiles, strict=True):
            ring.view(slot)[:n] = data
        # runs: layers 1..4 at cell (1, 0) from slots 0..3; layers 0..1 at cell (0, 1) from 4..5
        staging.upload(
            ring.glo, np.array([0, 4]), np.array([4, 2]), ring.stride, tex, np.array([1, 0]),
            np.array([SLOT, 0]), np.array([0, SLOT]),
        )  # fmt: skip
        ring.submit(slots, 6 * n)
        assert staging.calls == 3  # one fill (the ring span is contiguous) and one copy per run
        for k in range(4):
            assert cell_bytes(TexelFormat.BC1, gl.read_layer(tex, 1 + k), 2 * SLOT, SLOT, 0, SLOT) == tiles[k]
        for k in range(2):
            assert cell_bytes(TexelFormat.BC1, gl.read_layer(tex, k), 2 * SLOT, 0, SLOT, SLOT) == tiles[4 + k]
        assert cell_bytes(TexelFormat.BC1, gl.read_layer(tex, 5), 2 * SLOT, SLOT, 0, SLOT) == sentinel[:n]
        assert cell_bytes(TexelFormat.BC1, gl.read_layer(tex, 1), 2 * SLOT, 0, 0, SLOT) == sentinel[:n]
    finally:
        tex.release()
        staging.release()
        ring.release()
