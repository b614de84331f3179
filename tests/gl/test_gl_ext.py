"""GLExt on a real (llvmpipe or GPU) EGL context: formats, arrays, uploads, copies, fences, errors."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import moderngl
import numpy as np
import pytest

from texstream.errors import GLError
from texstream.gl.enums import (
    GL_COMPRESSED_RED_RGTC1,
    GL_COMPRESSED_RG_RGTC2,
    GL_COMPRESSED_RGB_S3TC_DXT1_EXT,
    GL_COMPRESSED_RGBA_BPTC_UNORM,
    GL_COMPRESSED_RGBA_S3TC_DXT5_EXT,
    GL_COMPRESSED_SRGB_ALPHA_BPTC_UNORM,
    GL_COMPRESSED_SRGB_ALPHA_S3TC_DXT5_EXT,
    GL_COMPRESSED_SRGB_S3TC_DXT1_EXT,
    GL_RGBA8,
    GL_SRGB8_ALPHA8,
    gl_format,
)
from texstream.gl.gl_ext import GLExt
from texstream.gl.loader import Feature
from texstream.gl.objects import GpuMemoryInfo
from texstream.native import load as load_native
from texstream.pack.format import TexelFormat

from ..require import skip_unless_native
from .helpers import encode, make_image

GL_PIXEL_UNPACK_BUFFER_BINDING = 0x88EF

EXPECTED_FORMATS = {
    (TexelFormat.RGBA8, False): GL_RGBA8,
    (TexelFormat.RGBA8, True): GL_SRGB8_ALPHA8,
    (TexelFormat.BC1, False): GL_COMPRESSED_RGB_S3TC_DXT1_EXT,
    (TexelFormat.BC1, True): GL_COMPRESSED_SRGB_S3TC_DXT1_EXT,
    (TexelFormat.BC3, False): GL_COMPRESSED_RGBA_S3TC_DXT5_EXT,
    (TexelFormat.BC3, True): GL_COMPRESSED_SRGB_ALPHA_S3TC_DXT5_EXT,
    (TexelFormat.BC4, False): GL_COMPRESSED_RED_RGTC1,
    (TexelFormat.BC5, False): GL_COMPRESSED_RG_RGTC2,
    (TexelFormat.BC7, False): GL_COMPRESSED_RGBA_BPTC_UNORM,
    (TexelFormat.BC7, True): GL_COMPRESSED_SRGB_ALPHA_BPTC_UNORM,
}


class CtxProxy:
    """A real context that claims a different GL version / extension list (features GLExt sees)."""

    def __init__(self, ctx: moderngl.Context, version_code: int, drop: tuple[str, ...] = ()) -> None:
        self._ctx = ctx
        self.version_code = version_code
        self.extensions = {e for e in ctx.extensions if e not in drop}

    def __getattr__(self, name: str) -> object:
        return getattr(self._ctx, name)


@pytest.fixture(scope="module")
def gl(gl_context: moderngl.Context) -> GLExt:
    return GLExt(gl_context)


@pytest.fixture(scope="module")
def gl_debug(gl_context: moderngl.Context) -> GLExt:
    return GLExt(gl_context, debug=True)


@pytest.fixture
def bc1_array(gl: GLExt) -> Iterator:
    tex = gl.create_texture_array(gl_format(TexelFormat.BC1), 16, 4)
    yield tex
    tex.release()


# ---- CPU-only: the format table ---------------------------------------------------------------
def test_format_table_maps_every_format_and_srgb_variant() -> None:
    for (fmt, srgb), internal in EXPECTED_FORMATS.items():
        f = gl_format(fmt, srgb)
        assert f.internal_format == internal and f.srgb is srgb and f.texel_format is fmt
        assert f.layer_bytes(136) == 34 * 34 * fmt.block_bytes
    assert gl_format("bc7", True).internal_format == GL_COMPRESSED_SRGB_ALPHA_BPTC_UNORM
    assert gl_format(int(TexelFormat.BC1)).compressed and not gl_format(TexelFormat.RGBA8).compressed
    assert gl_format(TexelFormat.RGBA8).layer_bytes(136) == 136 * 136 * 4


@pytest.mark.parametrize("fmt", [TexelFormat.BC4, TexelFormat.BC5])
def test_linear_formats_have_no_srgb_variant(fmt: TexelFormat) -> None:
    with pytest.raises(ValueError, match="linear"):
        gl_format(fmt, True)


def test_format_errors_name_the_value() -> None:
    with pytest.raises(ValueError, match="bc9"):
        gl_format("bc9")
    with pytest.raises(ValueError, match="42"):
        gl_format(42)
    with pytest.raises(ValueError, match="6"):
        gl_format(TexelFormat.BC1).layer_bytes(6)


# ---- GL ---------------------------------------------------------------------------------------
pytestmark_gl = pytest.mark.gl


@pytestmark_gl
def test_context_features(gl: GLExt) -> None:
    assert gl.has(Feature.SYNC) and gl.has(Feature.TEXTURE_STORAGE) and gl.has(Feature.COPY_IMAGE)
    assert gl.max_array_layers >= 256 and gl.max_texture_size >= 2048
    assert gl.scratch_unit >= 0


@pytestmark_gl
@pytest.mark.parametrize(("fmt", "srgb"), list(EXPECTED_FORMATS))
def test_texture_array_has_the_mapped_internal_format(gl: GLExt, fmt: TexelFormat, srgb: bool) -> None:
    f = gl_format(fmt, srgb)
    tex = gl.create_texture_array(f, 16, 3)
    try:
        assert gl.is_texture(tex.glo)
        assert gl.internal_format_of(tex) == f.internal_format
        assert tex.nbytes == 3 * f.layer_bytes(16) and tex.layer_bytes == f.layer_bytes(16)
    finally:
        tex.release()
    name = tex.glo
    tex.release()  # idempotent
    assert name == 0 and tex.released


@pytestmark_gl
def test_texture_array_release_deletes_the_name(gl: GLExt) -> None:
    tex = gl.create_texture_array(gl_format(TexelFormat.BC7), 8, 2)
    name = tex.glo
    with tex:
        assert gl.is_texture(name)
    assert not gl.is_texture(name)
    with pytest.raises(GLError, match="after release"):
        tex.bind(0)


@pytestmark_gl
def test_texture_array_argument_checks(gl: GLExt) -> None:
    f = gl_format(TexelFormat.BC1)
    with pytest.raises(ValueError, match="multiple of 4"):
        gl.create_texture_array(f, 6, 1)
    with pytest.raises(ValueError, match="layers"):
        gl.create_texture_array(f, 8, 0)
    with pytest.raises(ValueError, match="layers"):
        gl.create_texture_array(f, 8, gl.max_array_layers + 1)
    with pytest.raises(ValueError, match="cubic"):
        gl.create_texture_array(f, 8, 1, filter="cubic")
    with pytest.raises(TypeError, match="GLFormat"):
        gl.create_texture_array(TexelFormat.BC1, 8, 1)  # type: ignore[arg-type]


def cells(*layers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(layer, x, y) arrays of whole-layer cells."""
    lv = np.array(layers, np.int64)
    return lv, np.zeros_like(lv), np.zeros_like(lv)


@pytestmark_gl
@pytest.mark.parametrize("use_native", [False, True], ids=["python-loop", "compiled-loop"])
def test_upload_unbinds_the_unpack_buffer_so_moderngl_writes_still_work(
    gl_context: moderngl.Context, gl: GLExt, bc1_array, use_native: bool
) -> None:
    native = load_native() if use_native else None
    if use_native and native is None:
        skip_unless_native("texstream's compiled helper is not built here")
    blocks = encode(TexelFormat.BC1, make_image(16, 1))
    buf = gl.create_mapped_buffer(4096)
    try:
        buf.array()[512 : 512 + len(blocks)] = np.frombuffer(blocks, np.uint8)
        layer, x, y = cells(1, 3)
        sent = gl.upload_cell_batch(bc1_array, layer, x, y, np.array([512, 512]), 16, buf.glo, native)
        assert sent == 2 * len(blocks)
        assert gl.get_integer(GL_PIXEL_UNPACK_BUFFER_BINDING) == 0
        assert gl.read_layer(bc1_array, 1) == blocks and gl.read_layer(bc1_array, 3) == blocks
        # a bad cell is refused before any call and leaves nothing bound
        with pytest.raises(ValueError, match="layers"):
            gl.upload_cell_batch(bc1_array, *cells(0, 9), np.array([512, 512]), 16, buf.glo, native)
        assert gl.get_integer(GL_PIXEL_UNPACK_BUFFER_BINDING) == 0
        # moderngl's own client-memory upload reads from the pointer, not from a stale PBO
        pixels = np.arange(8 * 8 * 4, dtype=np.uint8).tobytes()
        t = gl_context.texture((8, 8), 4)
        t.write(pixels)
        assert t.read() == pixels
        t.release()
    finally:
        buf.release()


@pytestmark_gl
def test_upload_from_client_memory(gl: GLExt, bc1_array) -> None:
    """pbo=0: the offsets are addresses of memory the caller keeps alive during the call."""
    tiles = [encode(TexelFormat.BC1, make_image(16, seed)) for seed in (4, 5)]
    memory = np.frombuffer(b"".join(tiles), np.uint8).copy()
    n = len(tiles[0])
    layer, x, y = cells(2, 0)
    gl.upload_cell_batch(bc1_array, layer, x, y, memory.ctypes.data + np.array([0, n]), 16, 0, load_native())
    assert gl.read_layer(bc1_array, 2) == tiles[0] and gl.read_layer(bc1_array, 0) == tiles[1]


@pytestmark_gl
def test_upload_checks_its_cells(gl: GLExt, bc1_array) -> None:
    buf = gl.create_mapped_buffer(4096)
    try:
        with pytest.raises(ValueError, match="does not fit"):
            gl.upload_cell_batch(bc1_array, np.array([0]), np.array([4]), np.array([0]), np.array([0]), 16, buf.glo)
        with pytest.raises(ValueError, match="layers"):
            gl.upload_cell_batch(bc1_array, *cells(-1), np.array([0]), 16, buf.glo)
        assert gl.upload_cell_batch(bc1_array, *cells(), np.zeros(0, np.int64), 16, buf.glo) == 0
    finally:
        buf.release()


@pytestmark_gl
def test_write_and_read_layer_round_trip_rgba8(gl: GLExt) -> None:
    img = make_image(16, 2)
    with gl.create_texture_array(gl_format(TexelFormat.RGBA8, True), 16, 2) as tex:
        gl.write_layer(tex, 1, img.tobytes())
        assert gl.read_layer(tex, 1) == img.tobytes()
        with pytest.raises(ValueError, match="bytes"):
            gl.write_layer(tex, 0, b"\0" * 12)


@pytestmark_gl
def test_copy_layers_between_arrays(gl: GLExt) -> None:
    f = gl_format(TexelFormat.BC1)
    data = [encode(TexelFormat.BC1, make_image(16, s)) for s in range(3)]
    with gl.create_texture_array(f, 16, 3) as small, gl.create_texture_array(f, 16, 8) as big:
        for i, d in enumerate(data):
            gl.write_layer(small, i, d)
        gl.copy_layers(small, 0, big, 4, count=3)  # grow: old layers into the new array
        assert [gl.read_layer(big, 4 + i) for i in range(3)] == data
        gl.copy_layers(big, 5, big, 0)  # inside one array, ranges apart
        assert gl.read_layer(big, 0) == data[1]
        with gl.create_texture_array(gl_format(TexelFormat.BC1, True), 16, 1) as srgb:
            gl.copy_layers(small, 2, srgb, 0)  # sRGB and linear views of the same blocks
            assert gl.read_layer(srgb, 0) == data[2]
        with pytest.raises(ValueError, match="overlap"):
            gl.copy_layers(big, 0, big, 1, count=2)
        with pytest.raises(ValueError, match="outside"):
            gl.copy_layers(small, 2, big, 0, count=2)
        with gl.create_texture_array(gl_format(TexelFormat.BC7), 16, 1) as other:
            with pytest.raises(ValueError, match="differ"):
                gl.copy_layers(small, 0, other, 0)


@pytestmark_gl
def test_fence_polls_without_blocking(gl_context: moderngl.Context, gl: GLExt) -> None:
    fence = gl.fence()
    assert isinstance(fence.signalled(), bool)  # a poll, whatever the answer
    gl_context.finish()
    assert fence.signalled() and fence.released  # deleted as soon as it signalled
    assert fence.signalled()  # the answer is cached
    fence.release()
    other = gl.fence()
    other.release()
    other.release()
    with pytest.raises(GLError, match="after release"):
        other.signalled()


@pytestmark_gl
def test_timer_measures_gpu_time(gl_context: moderngl.Context, gl: GLExt) -> None:
    target = gl_context.texture((64, 64), 4)
    fbo = gl_context.framebuffer(color_attachments=[target])
    timer = gl.timer(depth=3)
    previous = gl_context.fbo or gl_context.detect_framebuffer(0)
    try:
        for _ in range(2):
            assert timer.begin()
            fbo.use()
            fbo.clear(0.2, 0.3, 0.4, 1.0)
            timer.end()
        with pytest.raises(GLError, match="twice"):
            timer.begin()
            timer.begin()
        timer.end()
        gl_context.finish()
        ms = timer.poll()
        assert ms is not None and ms >= 0.0
    finally:
        previous.use()
        timer.release()
        timer.release()
        fbo.release()
        target.release()


@pytestmark_gl
def test_memory_info_is_none_or_kib_figures(gl: GLExt) -> None:
    info = gl.memory_info()
    if info is None:  # llvmpipe and most non-NVIDIA, non-AMD drivers
        assert not gl.has(Feature.NVX_MEMORY) and not gl.has(Feature.ATI_MEMORY)
        return
    assert isinstance(info, GpuMemoryInfo)
    assert isinstance(info.available_kib, int) and info.available_kib > 0
    assert info.available_bytes == info.available_kib * 1024
    if info.total_kib is not None:
        assert info.total_kib >= info.available_kib


@pytestmark_gl
def test_get_error_and_check(gl: GLExt) -> None:
    gl.functions.glBindTexture(0xDEAD, 0)  # deliberately bad target
    assert gl.get_error() == "GL_INVALID_ENUM"
    assert gl.get_error() is None
    gl.functions.glBindTexture(0xDEAD, 0)
    with pytest.raises(GLError, match="here: GL_INVALID_ENUM"):
        gl.check("here")
    gl.check("clean")  # nothing pending


@pytestmark_gl
def test_debug_mode_names_the_failing_call(gl: GLExt, gl_debug: GLExt, bc1_array) -> None:
    buf = gl_debug.create_mapped_buffer(1024)
    try:
        # reading past the end of the unpack buffer is GL_INVALID_OPERATION
        with pytest.raises(GLError, match=r"glCompressedTexSubImage3D failed: GL_INVALID_OPERATION"):
            gl_debug.upload_cell_batch(bc1_array, *cells(0), np.array([1024]), 16, buf.glo, load_native())
        assert gl_debug.get_integer(GL_PIXEL_UNPACK_BUFFER_BINDING) == 0
        # without debug mode the same call returns, and the error waits for check()
        gl.upload_cell_batch(bc1_array, *cells(0), np.array([1024]), 16, buf.glo)
        with pytest.raises(GLError, match="GL_INVALID_OPERATION"):
            gl.check("after upload")
    finally:
        buf.release()


@pytestmark_gl
def test_debug_mode_rejects_calls_from_other_threads(gl_debug: GLExt) -> None:
    caught: list[BaseException] = []

    def worker() -> None:
        try:
            gl_debug.fence()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
            caught.append(exc)

    t = threading.Thread(target=worker, name="not-render")
    t.start()
    t.join()
    assert len(caught) == 1 and isinstance(caught[0], GLError)
    assert "render thread" in str(caught[0]) and "not-render" in str(caught[0])


@pytestmark_gl
def test_missing_core_features_are_named(gl_context: moderngl.Context) -> None:
    with pytest.raises(GLError, match="GL_ARB_texture_storage") as info:
        GLExt(CtxProxy(gl_context, 330, drop=("GL_ARB_texture_storage", "GL_ARB_copy_image")))  # type: ignore[arg-type]
    assert "GL_ARB_copy_image" in str(info.value)
    with pytest.raises(GLError, match="3.3"):
        GLExt(CtxProxy(gl_context, 320))  # type: ignore[arg-type]


@pytestmark_gl
def test_missing_optional_features_fail_only_when_used(gl_context: moderngl.Context) -> None:
    drop = ("GL_ARB_buffer_storage", "GL_EXT_texture_compression_s3tc")
    gl = GLExt(CtxProxy(gl_context, 430, drop=drop))  # type: ignore[arg-type]
    assert not gl.has_buffer_storage and not gl.has(Feature.S3TC) and not gl.has(Feature.S3TC_SRGB)
    assert gl.has(Feature.BPTC) and gl.supports_format(gl_format(TexelFormat.BC7))
    with pytest.raises(GLError, match="GL_ARB_buffer_storage"):
        gl.create_mapped_buffer(256)
    with pytest.raises(GLError, match="device-local buffers need OpenGL 4.4 or GL_ARB_buffer_storage"):
        gl.create_device_buffer(256)
    with pytest.raises(GLError, match="glBufferStorage needs OpenGL 4.4 or GL_ARB_buffer_storage"):
        gl.functions.glBufferStorage(0, 0, None, 0)
    assert not gl.supports_format(gl_format(TexelFormat.BC1))
    with pytest.raises(GLError, match="GL_EXT_texture_compression_s3tc"):
        gl.create_texture_array(gl_format(TexelFormat.BC1), 8, 1)


@pytestmark_gl
def test_mapped_buffer_views_and_release(gl: GLExt, caplog: pytest.LogCaptureFixture) -> None:
    buf = gl.create_mapped_buffer(1024)
    name = buf.glo
    v = buf.view(256, 16)
    v[:] = bytes(range(16))
    assert bytes(v) == bytes(range(16))
    with pytest.raises(ValueError, match="outside"):
        buf.view(1020, 16)
    buf.release()
    buf.release()
    assert buf.released and not gl.is_buffer(name)
    with pytest.raises(ValueError):
        v[0] = 1  # the view died with the mapping: no write into unmapped memory
    with pytest.raises(GLError, match="after release"):
        buf.view(0, 1)
    # a view still exported (numpy holds it) keeps the mapping alive instead of unmapping it
    held = gl.create_mapped_buffer(256)
    arr = np.frombuffer(held.view(0, 64), np.uint8)
    with caplog.at_level(logging.ERROR, logger="texstream.gl.objects"):
        held.release()
    assert "still in use" in caplog.text and held.released
    arr[:] = 7  # still valid memory
    assert int(arr.sum()) == 7 * 64
    # the whole-mapping array: one array, shared memory; a live slice keeps the mapping too
    whole = gl.create_mapped_buffer(512)
    a = whole.array()
    assert a is whole.array() and a.size == 512
    a[10:20] = 3
    piece = a[10:20]
    del a
    with caplog.at_level(logging.ERROR, logger="texstream.gl.objects"):
        whole.release()
    assert whole.released and int(piece.sum()) == 30
    free = gl.create_mapped_buffer(512)
    name = free.glo
    free.array()[:] = 1
    free.release()  # no reference left: unmapped and deleted
    assert not gl.is_buffer(name)


@pytestmark_gl
def test_views_taken_every_frame_cost_no_memory_for_good(gl: GLExt, caplog: pytest.LogCaptureFixture) -> None:
    """A view taken and dropped each frame (a readback) is forgotten; views still held, and memory
    made from them, stay valid through the forgetting and keep release() from unmapping."""
    import tracemalloc

    buf = gl.create_mapped_buffer(4096)
    kept = buf.view(0, 16)
    exported = np.frombuffer(buf.view(16, 16), np.uint8)
    part = buf.view(32, 16)[4:8]  # a slice of a dropped view still references its memory
    for i in range(200):  # warm-up: the list reaches its steady size
        buf.view(64 + i % 32, 8)[0] = i % 256
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for i in range(5000):
            buf.view(64 + i % 32, 8)[0] = i % 256
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert grown < 16 * 1024, f"{grown} bytes retained by 5000 dropped views"
    kept[:] = b"k" * 16
    exported[:] = 5
    part[:] = b"pppp"
    assert bytes(kept) == b"k" * 16 and int(exported.sum()) == 80 and bytes(part) == b"pppp"
    with caplog.at_level(logging.ERROR, logger="texstream.gl.objects"):
        buf.release()
    assert "2 views are still in use" in caplog.text  # the export and the slice; `kept` is invalidated
    with pytest.raises(ValueError):
        kept[0] = 1


@pytestmark_gl
def test_loader_falls_back_to_egl_get_proc_address(gl_context: moderngl.Context) -> None:
    """A context whose own loader is unreachable still gets its functions through libEGL."""
    proxy = CtxProxy(gl_context, gl_context.version_code)
    proxy.mglo = None  # type: ignore[attr-defined]  # hides moderngl's glcontext loader
    gl = GLExt(proxy)  # type: ignore[arg-type]
    blocks = encode(TexelFormat.BC4, make_image(8, 3))
    with gl.create_texture_array(gl_format(TexelFormat.BC4), 8, 1) as tex:
        gl.write_layer(tex, 0, blocks)
        assert gl.read_layer(tex, 0) == blocks
