"""Raw OpenGL that moderngl lacks, called through ctypes on the context's own function loader.

moderngl has no compressed sub-uploads, no immutable texture arrays of compressed formats, no
buffer storage or persistent mapping, no fences, no image copies and no memory queries. This module
is the one place in texstream that calls GL directly; everything else goes through `GLExt`.

Rules this module keeps:

- Only the render thread (the thread the context is current on) may call into `GLExt` or the
  objects it creates. In debug mode every call checks that and raises `GLError` otherwise.
- Every GL object has one owner with an idempotent ``release()``; names are deleted explicitly
  (``ctx.external_texture`` / ``ctx.external_buffer`` wrap names without owning them, and
  ``external_texture`` binds as ``GL_TEXTURE_2D``, so texture arrays are kept as raw names here).
- Function loaders return non-NULL even for functions the driver lacks, so availability is decided
  from the GL version and the extension list at construction, never from the pointer.
- Binding state that moderngl relies on is restored: ``GL_PIXEL_UNPACK_BUFFER`` and
  ``GL_PIXEL_PACK_BUFFER`` are unbound after every call that used them (moderngl's own
  ``Texture.write(bytes)`` silently reads from a still-bound unpack buffer otherwise), and texture
  work happens on moderngl's scratch unit (``ctx.default_texture_unit``), which moderngl rebinds
  before each of its own texture operations.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import moderngl
import numpy as np

from ..errors import GLError
from ..pack.format import TexelFormat

__all__ = [
    "Feature",
    "Fence",
    "FenceLike",
    "FrameThrottle",
    "GLExt",
    "GLFormat",
    "GpuMemoryInfo",
    "GpuTimer",
    "LiveObjects",
    "MappedBuffer",
    "TextureArray",
    "gl_format",
]

log = logging.getLogger(__name__)

# ---- GL enums ---------------------------------------------------------------------------------
GL_NO_ERROR = 0
GL_DELETE_STATUS = 0x8B80
GL_ERROR_NAMES = {
    0x0500: "GL_INVALID_ENUM",
    0x0501: "GL_INVALID_VALUE",
    0x0502: "GL_INVALID_OPERATION",
    0x0503: "GL_STACK_OVERFLOW",
    0x0504: "GL_STACK_UNDERFLOW",
    0x0505: "GL_OUT_OF_MEMORY",
    0x0506: "GL_INVALID_FRAMEBUFFER_OPERATION",
    0x0507: "GL_CONTEXT_LOST",
}

GL_TEXTURE0 = 0x84C0
GL_TEXTURE_2D_ARRAY = 0x8C1A
GL_TEXTURE_2D = 0x0DE1
GL_RGBA16UI = 0x8D76
GL_RGBA_INTEGER = 0x8D99
GL_UNSIGNED_SHORT = 0x1403
GL_UNPACK_ALIGNMENT = 0x0CF5
GL_TEXTURE_MIN_FILTER = 0x2801
GL_TEXTURE_MAG_FILTER = 0x2800
GL_TEXTURE_WRAP_S = 0x2802
GL_TEXTURE_WRAP_T = 0x2803
GL_TEXTURE_BASE_LEVEL = 0x813C
GL_TEXTURE_MAX_LEVEL = 0x813D
GL_TEXTURE_MAX_ANISOTROPY = 0x84FE
GL_MAX_TEXTURE_MAX_ANISOTROPY = 0x84FF
GL_TEXTURE_INTERNAL_FORMAT = 0x1003
GL_LINEAR = 0x2601
GL_NEAREST = 0x2600
GL_CLAMP_TO_EDGE = 0x812F
GL_RGBA = 0x1908
GL_UNSIGNED_BYTE = 0x1401
GL_MAX_ARRAY_TEXTURE_LAYERS = 0x88FF
GL_MAX_TEXTURE_SIZE = 0x0D33
GL_MAX_COMBINED_TEXTURE_IMAGE_UNITS = 0x8B4D
GL_MAX_SHADER_STORAGE_BUFFER_BINDINGS = 0x90DD
GL_MAX_FRAGMENT_SHADER_STORAGE_BLOCKS = 0x90DA
GL_MAX_SHADER_STORAGE_BLOCK_SIZE = 0x90DE

GL_PIXEL_PACK_BUFFER = 0x88EB
GL_PIXEL_UNPACK_BUFFER = 0x88EC
GL_COPY_WRITE_BUFFER = 0x8F37
GL_MAP_WRITE_BIT = 0x0002
GL_MAP_READ_BIT = 0x0001
GL_CLIENT_STORAGE_BIT = 0x0200
GL_COPY_READ_BUFFER = 0x8F36
GL_MAP_PERSISTENT_BIT = 0x0040
GL_MAP_COHERENT_BIT = 0x0080

GL_SYNC_GPU_COMMANDS_COMPLETE = 0x9117
GL_SYNC_FLUSH_COMMANDS_BIT = 0x0001
GL_ALREADY_SIGNALED = 0x911A
GL_TIMEOUT_EXPIRED = 0x911B
GL_CONDITION_SATISFIED = 0x911C
GL_WAIT_FAILED = 0x911D

GL_TIME_ELAPSED = 0x88BF
GL_QUERY_RESULT = 0x8866
GL_QUERY_RESULT_AVAILABLE = 0x8867

# GL_NVX_gpu_memory_info (values in KiB)
GL_GPU_MEMORY_INFO_DEDICATED_VIDMEM_NVX = 0x9047
GL_GPU_MEMORY_INFO_TOTAL_AVAILABLE_MEMORY_NVX = 0x9048
GL_GPU_MEMORY_INFO_CURRENT_AVAILABLE_VIDMEM_NVX = 0x9049
GL_GPU_MEMORY_INFO_EVICTION_COUNT_NVX = 0x904A
GL_GPU_MEMORY_INFO_EVICTED_MEMORY_NVX = 0x904B
# GL_ATI_meminfo (four values in KiB: total free, largest free block, total aux free, largest aux)
GL_TEXTURE_FREE_MEMORY_ATI = 0x87FC

# Internal formats.
GL_RGBA8 = 0x8058
GL_SRGB8_ALPHA8 = 0x8C43
GL_COMPRESSED_RGB_S3TC_DXT1_EXT = 0x83F0
GL_COMPRESSED_SRGB_S3TC_DXT1_EXT = 0x8C4C
GL_COMPRESSED_RGBA_S3TC_DXT5_EXT = 0x83F3
GL_COMPRESSED_SRGB_ALPHA_S3TC_DXT5_EXT = 0x8C4F
GL_COMPRESSED_RED_RGTC1 = 0x8DBB
GL_COMPRESSED_RG_RGTC2 = 0x8DBD
GL_COMPRESSED_RGBA_BPTC_UNORM = 0x8E8C
GL_COMPRESSED_SRGB_ALPHA_BPTC_UNORM = 0x8E8D


# ---- features: decided by version and extension list, never by the loader's pointer ----------
class Feature(enum.Enum):
    """A GL capability: (core version that has it or None, extensions that provide it, what for)."""

    SYNC = (320, ("GL_ARB_sync",), "fences")
    TEXTURE_STORAGE = (420, ("GL_ARB_texture_storage",), "immutable texture arrays")
    COPY_IMAGE = (430, ("GL_ARB_copy_image",), "GPU copies between texture layers")
    TIMER_QUERY = (330, ("GL_ARB_timer_query",), "GPU timer queries")
    BUFFER_STORAGE = (440, ("GL_ARB_buffer_storage",), "persistent-mapped buffers")
    GET_TEXTURE_SUB_IMAGE = (450, ("GL_ARB_get_texture_sub_image",), "reading back one texture layer")
    TEXTURE_ANISOTROPY = (
        460,
        ("GL_ARB_texture_filter_anisotropic", "GL_EXT_texture_filter_anisotropic"),
        "anisotropic filtering",
    )
    S3TC = (None, ("GL_EXT_texture_compression_s3tc",), "BC1/BC3 textures")
    S3TC_SRGB = (
        None,
        ("GL_EXT_texture_sRGB", "GL_EXT_texture_compression_s3tc_srgb"),
        "sRGB BC1/BC3 textures",
    )
    RGTC = (300, ("GL_ARB_texture_compression_rgtc", "GL_EXT_texture_compression_rgtc"), "BC4/BC5 textures")
    BPTC = (420, ("GL_ARB_texture_compression_bptc",), "BC7 textures")
    NVX_MEMORY = (None, ("GL_NVX_gpu_memory_info",), "NVIDIA memory report")
    ATI_MEMORY = (None, ("GL_ATI_meminfo",), "AMD memory report")

    @property
    def requirement(self) -> str:
        core, exts, _ = self.value
        parts = ([f"OpenGL {core // 100}.{core % 100 // 10}"] if core else []) + list(exts)
        return " or ".join(parts)


#: Features texstream cannot run without (its minimum GL besides moderngl's own 3.3 core).
REQUIRED_FEATURES = (Feature.SYNC, Feature.TEXTURE_STORAGE, Feature.COPY_IMAGE, Feature.TIMER_QUERY)
MIN_VERSION = 330


# ---- texel formats ----------------------------------------------------------------------------
@dataclass(frozen=True)
class GLFormat:
    """How one texstream texel format (and sRGB flag) is stored in GL.

    BC1 maps to the *RGB* DXT1 formats: tiles are opaque colour, and the RGB variant decodes the
    3-colour block mode's fourth index as opaque black instead of transparent, like D3D's BC1 with
    alpha ignored. Use BC3 or BC7 for alpha.
    """

    texel_format: TexelFormat
    srgb: bool
    internal_format: int
    name: str
    feature: Feature | None  # None: core in every GL texstream accepts

    @property
    def compressed(self) -> bool:
        return self.texel_format.compressed

    @property
    def block_bytes(self) -> int:
        """Bytes per 4x4 texel block (64 for RGBA8)."""
        return self.texel_format.block_bytes

    def layer_bytes(self, size: int) -> int:
        """Bytes of one `size` x `size` layer; `size` must be a multiple of 4 (the BC block)."""
        if size < 4 or size % 4:
            raise ValueError(f"layer size must be a positive multiple of 4, got {size!r}")
        return (size // 4) ** 2 * self.block_bytes


_FORMATS: dict[tuple[TexelFormat, bool], tuple[int, str, Feature | None]] = {
    (TexelFormat.RGBA8, False): (GL_RGBA8, "GL_RGBA8", None),
    (TexelFormat.RGBA8, True): (GL_SRGB8_ALPHA8, "GL_SRGB8_ALPHA8", None),
    (TexelFormat.BC1, False): (
        GL_COMPRESSED_RGB_S3TC_DXT1_EXT,
        "GL_COMPRESSED_RGB_S3TC_DXT1_EXT",
        Feature.S3TC,
    ),
    (TexelFormat.BC1, True): (
        GL_COMPRESSED_SRGB_S3TC_DXT1_EXT,
        "GL_COMPRESSED_SRGB_S3TC_DXT1_EXT",
        Feature.S3TC_SRGB,
    ),
    (TexelFormat.BC3, False): (
        GL_COMPRESSED_RGBA_S3TC_DXT5_EXT,
        "GL_COMPRESSED_RGBA_S3TC_DXT5_EXT",
        Feature.S3TC,
    ),
    (TexelFormat.BC3, True): (
        GL_COMPRESSED_SRGB_ALPHA_S3TC_DXT5_EXT,
        "GL_COMPRESSED_SRGB_ALPHA_S3TC_DXT5_EXT",
        Feature.S3TC_SRGB,
    ),
    (TexelFormat.BC4, False): (GL_COMPRESSED_RED_RGTC1, "GL_COMPRESSED_RED_RGTC1", Feature.RGTC),
    (TexelFormat.BC5, False): (GL_COMPRESSED_RG_RGTC2, "GL_COMPRESSED_RG_RGTC2", Feature.RGTC),
    (TexelFormat.BC7, False): (GL_COMPRESSED_RGBA_BPTC_UNORM, "GL_COMPRESSED_RGBA_BPTC_UNORM", Feature.BPTC),
    (TexelFormat.BC7, True): (
        GL_COMPRESSED_SRGB_ALPHA_BPTC_UNORM,
        "GL_COMPRESSED_SRGB_ALPHA_BPTC_UNORM",
        Feature.BPTC,
    ),
}


def gl_format(texel_format: TexelFormat | int | str, srgb: bool = False) -> GLFormat:
    """The GL storage of `texel_format` (a TexelFormat, its value or its name), sRGB or linear."""
    if isinstance(texel_format, str):
        fmt = TexelFormat.parse(texel_format)
    else:
        try:
            fmt = TexelFormat(texel_format)
        except ValueError:
            raise ValueError(f"unknown texel format {texel_format!r}") from None
    entry = _FORMATS.get((fmt, bool(srgb)))
    if entry is None:
        raise ValueError(f"{fmt.name.lower()} holds linear data; it has no sRGB GL format")
    internal, name, feature = entry
    return GLFormat(fmt, bool(srgb), internal, name, feature)


# ---- function table ---------------------------------------------------------------------------
_u, _i, _p = ctypes.c_uint, ctypes.c_int, ctypes.c_void_p
_sz = ctypes.c_ssize_t  # GLsizeiptr / GLintptr
_u64 = ctypes.c_uint64
_pu, _pi = ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_int)

# name: (restype, argtypes, feature or None for base GL 3.3)
_FUNCTIONS: dict[str, tuple[Any, tuple[Any, ...], Feature | None]] = {
    "glGetError": (_u, (), None),
    "glGetIntegerv": (None, (_u, _pi), None),
    "glGenTextures": (None, (_i, _pu), None),
    "glDeleteTextures": (None, (_i, _pu), None),
    "glIsTexture": (ctypes.c_ubyte, (_u,), None),
    "glBindTexture": (None, (_u, _u), None),
    "glActiveTexture": (None, (_u,), None),
    "glTexParameteri": (None, (_u, _u, _i), None),
    "glTexParameterf": (None, (_u, _u, ctypes.c_float), None),
    "glGetTexLevelParameteriv": (None, (_u, _i, _u, _pi), None),
    "glTexStorage3D": (None, (_u, _i, _u, _i, _i, _i), Feature.TEXTURE_STORAGE),
    "glTexStorage2D": (None, (_u, _i, _u, _i, _i), Feature.TEXTURE_STORAGE),
    "glTexSubImage2D": (None, (_u, _i, _i, _i, _i, _i, _u, _u, _p), None),
    "glPixelStorei": (None, (_u, _i), None),
    "glTexSubImage3D": (None, (_u, _i, _i, _i, _i, _i, _i, _i, _u, _u, _p), None),
    "glCompressedTexSubImage3D": (None, (_u, _i, _i, _i, _i, _i, _i, _i, _u, _i, _p), None),
    "glGetCompressedTextureSubImage": (
        None,
        (_u, _i, _i, _i, _i, _i, _i, _i, _i, _p),
        Feature.GET_TEXTURE_SUB_IMAGE,
    ),
    "glGetTextureSubImage": (
        None,
        (_u, _i, _i, _i, _i, _i, _i, _i, _u, _u, _i, _p),
        Feature.GET_TEXTURE_SUB_IMAGE,
    ),
    "glCopyImageSubData": (
        None,
        (_u, _u, _i, _i, _i, _i, _u, _u, _i, _i, _i, _i, _i, _i, _i),
        Feature.COPY_IMAGE,
    ),
    "glGenBuffers": (None, (_i, _pu), None),
    "glDeleteBuffers": (None, (_i, _pu), None),
    "glIsBuffer": (ctypes.c_ubyte, (_u,), None),
    "glIsQuery": (ctypes.c_ubyte, (_u,), None),
    "glIsFramebuffer": (ctypes.c_ubyte, (_u,), None),
    "glIsRenderbuffer": (ctypes.c_ubyte, (_u,), None),
    "glIsVertexArray": (ctypes.c_ubyte, (_u,), None),
    "glIsProgram": (ctypes.c_ubyte, (_u,), None),
    "glIsShader": (ctypes.c_ubyte, (_u,), None),
    "glGetProgramiv": (None, (_u, _u, _pi), None),
    "glGetShaderiv": (None, (_u, _u, _pi), None),
    "glBindBuffer": (None, (_u, _u), None),
    "glBufferStorage": (None, (_u, _sz, _p, _u), Feature.BUFFER_STORAGE),
    "glCopyBufferSubData": (None, (_u, _u, _sz, _sz, _sz), None),
    "glMapBufferRange": (_p, (_u, _sz, _sz, _u), None),
    "glUnmapBuffer": (ctypes.c_ubyte, (_u,), None),
    "glFenceSync": (_p, (_u, _u), Feature.SYNC),
    "glClientWaitSync": (_u, (_p, _u, _u64), Feature.SYNC),
    "glDeleteSync": (None, (_p,), Feature.SYNC),
    "glGenQueries": (None, (_i, _pu), None),
    "glDeleteQueries": (None, (_i, _pu), None),
    "glBeginQuery": (None, (_u, _u), None),
    "glEndQuery": (None, (_u,), None),
    "glGetQueryObjectiv": (None, (_u, _u, _pi), None),
    "glGetQueryObjectui64v": (None, (_u, _u, ctypes.POINTER(_u64)), Feature.TIMER_QUERY),
}

# GL calls keep the interpreter lock (PYFUNCTYPE): they are short and never wait (the streamer polls
# fences with a zero timeout), and a call that dropped the lock would have to take it back from an
# I/O thread, waiting up to the 5 ms switch interval. Windows' stdcall (WINFUNCTYPE) drops it.
_FUNCTYPE = ctypes.WINFUNCTYPE if sys.platform == "win32" else ctypes.PYFUNCTYPE  # type: ignore[attr-defined]
# ...except a fence wait with a timeout (`Fence.wait`, frame throttling): it lets the I/O threads run.
_WAITING_FUNCTYPE = ctypes.WINFUNCTYPE if sys.platform == "win32" else ctypes.CFUNCTYPE  # type: ignore[attr-defined]


def _proc_address_fallbacks() -> list[Callable[[bytes], int | None]]:
    """eglGetProcAddress, then glXGetProcAddressARB: for contexts whose loader is not reachable."""
    found: list[Callable[[bytes], int | None]] = []
    for lib_name, func_name in (("EGL", "eglGetProcAddress"), ("GL", "glXGetProcAddressARB")):
        path = ctypes.util.find_library(lib_name)
        if not path:
            continue
        try:
            fn = getattr(ctypes.CDLL(path), func_name)
        except (OSError, AttributeError):
            continue
        fn.restype, fn.argtypes = ctypes.c_void_p, (ctypes.c_char_p,)
        found.append(fn)
    return found


def _context_loader(ctx: moderngl.Context) -> Callable[[str], int] | None:
    """The loader moderngl's context itself uses (glcontext's ``load_opengl_function``)."""
    inner = getattr(getattr(ctx, "mglo", None), "_context", None)
    load = getattr(inner, "load_opengl_function", None)
    return load if callable(load) else None


def _missing(name: str, feature: Feature) -> Callable[..., Any]:
    def call(*_args: Any) -> Any:
        raise GLError(f"{name} needs {feature.requirement} ({feature.value[2]}), which this context lacks")

    call.__name__ = name
    return call


# ---- public objects ---------------------------------------------------------------------------
class FenceLike(Protocol):
    """What the staging ring needs of a fence (a GL `Fence`, or a fake one in tests)."""

    def signalled(self) -> bool: ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class LiveObjects:
    """Live GL objects of a context by kind (`GLExt.live_objects`)."""

    buffers: int
    textures: int
    queries: int
    framebuffers: int
    renderbuffers: int
    vertex_arrays: int
    programs: int
    shaders: int
    syncs: int

    @property
    def total(self) -> int:
        return sum(getattr(self, f) for f in self.__dataclass_fields__)

    def minus(self, other: LiveObjects) -> dict[str, int]:
        """Kinds whose count differs from `other`'s, with the difference."""
        diff = {f: getattr(self, f) - getattr(other, f) for f in self.__dataclass_fields__}
        return {k: v for k, v in diff.items() if v}


@dataclass(frozen=True)
class GpuMemoryInfo:
    """GPU memory as the driver reports it, in KiB (GL's unit). Fields the source lacks are None."""

    source: str  # "GL_NVX_gpu_memory_info" or "GL_ATI_meminfo"
    available_kib: int  # free video memory now (NVX current available; ATI texture pool free)
    total_kib: int | None = None  # dedicated video memory (NVX only)
    total_available_kib: int | None = None  # NVX: dedicated plus what the driver may spill to
    evicted_kib: int | None = None  # NVX: memory evicted since start
    eviction_count: int | None = None  # NVX: evictions since start

    @property
    def available_bytes(self) -> int:
        return self.available_kib * 1024

    @property
    def total_bytes(self) -> int | None:
        return None if self.total_kib is None else self.total_kib * 1024


class Fence:
    """A GL sync object: ``signalled()`` polls it (never blocks); ``release()`` deletes it.

    The first poll flushes the command stream (GL_SYNC_FLUSH_COMMANDS_BIT), so a fence that is only
    ever polled still signals. Once signalled, the sync object is deleted at once and the answer
    cached; ``release()`` is idempotent.
    """

    __slots__ = ("_gl", "_sync", "_done", "_flushed")

    def __init__(self, gl: GLExt, sync: int) -> None:
        self._gl = gl
        self._sync: int | None = sync
        self._done = False
        self._flushed = False

    def signalled(self) -> bool:
        if self._done:
            return True
        if self._sync is None:
            raise GLError("fence polled after release (it never signalled)")
        flags = 0 if self._flushed else GL_SYNC_FLUSH_COMMANDS_BIT
        self._flushed = True
        status = self._gl._f.glClientWaitSync(self._sync, flags, 0)
        if status == GL_WAIT_FAILED:
            raise GLError("glClientWaitSync failed (GL_WAIT_FAILED): invalid sync object or context lost")
        if status in (GL_ALREADY_SIGNALED, GL_CONDITION_SATISFIED):
            self._done = True
            self.release()
            return True
        return False

    def wait(self, timeout_s: float) -> bool:
        """Block up to `timeout_s` (releasing the interpreter lock) until the fence signals; True once
        it has. For frame throttling; the streamer itself never waits."""
        if self._done:
            return True
        if self._sync is None:
            raise GLError("fence waited on after release (it never signalled)")
        self._flushed = True
        status = self._gl._wait_sync(self._sync, GL_SYNC_FLUSH_COMMANDS_BIT, int(timeout_s * 1e9))
        if status == GL_WAIT_FAILED:
            raise GLError("glClientWaitSync failed (GL_WAIT_FAILED): invalid sync object or context lost")
        if status in (GL_ALREADY_SIGNALED, GL_CONDITION_SATISFIED):
            self._done = True
            self.release()
            return True
        return False

    def release(self) -> None:
        if self._sync is not None:
            sync, self._sync = self._sync, None
            self._gl._f.glDeleteSync(sync)
            self._gl.live_syncs -= 1

    @property
    def released(self) -> bool:
        return self._sync is None


class FrameThrottle:
    """Keeps at most `depth` frames queued on the GPU, as a window's swap chain does.

    A headless loop (EGL, offscreen framebuffers, no swap) has nothing else that stops the CPU from
    queueing hundreds of frames ahead of the GPU; every fenced readback (the streamer's feedback, its
    upload fences) then lags by as many frames. Call `frame_done()` once per frame, after its draws:
    it fences the frame and waits for the frame `depth` frames older.
    """

    def __init__(self, gl: GLExt, depth: int = 2, timeout_s: float = 5.0) -> None:
        if depth < 1:
            raise ValueError(f"throttle depth must be >= 1, got {depth!r}")
        self._gl, self.depth, self.timeout_s = gl, depth, timeout_s
        self._fences: list[Fence] = []
        self.wait_ms = 0.0  # time the latest frame_done() waited

    def frame_done(self) -> None:
        self._fences.append(self._gl.fence())
        t0 = time.perf_counter()
        while len(self._fences) > self.depth:
            oldest = self._fences.pop(0)
            if not oldest.wait(self.timeout_s):
                oldest.release()
                raise GLError(f"the GPU did not finish a frame within {self.timeout_s:.0f} s")
        self.wait_ms = (time.perf_counter() - t0) * 1e3

    def release(self) -> None:
        for f in self._fences:
            f.release()
        self._fences.clear()


class TextureArray:
    """An immutable 2D texture array: `layers` layers of `size` x `size` texels, one mip level.

    Filtering is linear (or nearest) without mips, addressing clamp-to-edge: tiles carry their own
    border, and the virtual-texture shader picks levels itself. Not a moderngl object: bind it with
    ``bind(unit)`` and point a ``sampler2DArray`` uniform at that unit.
    """

    def __init__(self, gl: GLExt, glo: int, fmt: GLFormat, size: int, layers: int) -> None:
        self._gl = gl
        self._glo = glo
        self.format = fmt
        self.size = size
        self.layers = layers
        self.layer_bytes = fmt.layer_bytes(size)

    @property
    def glo(self) -> int:
        """The GL texture name (0 after release)."""
        return self._glo

    @property
    def nbytes(self) -> int:
        """GPU bytes this texture occupies (for the budget)."""
        return self.layer_bytes * self.layers

    @property
    def released(self) -> bool:
        return self._glo == 0

    def bind(self, unit: int) -> None:
        """Bind to texture unit `unit` (``GL_TEXTURE0 + unit``) as ``GL_TEXTURE_2D_ARRAY``."""
        self._gl.bind_texture_array(self, unit)

    def release(self) -> None:
        if self._glo:
            name, self._glo = self._glo, 0
            self._gl._delete_textures(name)

    def __enter__(self) -> TextureArray:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"TextureArray(glo={self._glo}, {self.format.name}, {self.size}x{self.size}x{self.layers})"


class MappedBuffer:
    """An immutable GL buffer (glBufferStorage) mapped once, persistently and coherently, for writing.

    ``view(offset, nbytes)`` hands out writable byte memoryviews into the mapping, usable from any
    thread; CPU writes are visible to GL commands issued after them (coherent mapping, no flush).
    ``release()`` invalidates the views it handed out, then unmaps and deletes the buffer. If any
    memory derived from a view is still alive (a slice, ``numpy.frombuffer(view)``, an export), the
    mapping is left in place and the GL buffer leaks, with an error logged, rather than unmapping
    memory under a writer's feet.
    """

    def __init__(self, gl: GLExt, glo: int, size: int, address: int) -> None:
        self._gl = gl
        self._glo = glo
        self.size = size
        self.address = address
        self._array = (ctypes.c_ubyte * size).from_address(address)
        self._chunks: list[tuple[ctypes.Array[ctypes.c_ubyte], memoryview]] = []
        self._prune_at = 64  # list length that triggers forgetting views nobody holds
        self._numpy: np.ndarray | None = None

    @property
    def glo(self) -> int:
        """The GL buffer name (0 after release)."""
        return self._glo

    @property
    def released(self) -> bool:
        return self._glo == 0

    def view(self, offset: int, nbytes: int) -> memoryview:
        """A writable memoryview of `nbytes` bytes at `offset` in the mapping."""
        if self.released:
            raise GLError(f"{self!r} used after release")
        if offset < 0 or nbytes < 1 or offset + nbytes > self.size:
            raise ValueError(f"range {offset}+{nbytes} is outside the {self.size}-byte buffer")
        if len(self._chunks) >= self._prune_at:
            self._prune()
        chunk = (ctypes.c_ubyte * nbytes).from_buffer(self._array, offset)
        mv = memoryview(chunk).cast("B")
        self._chunks.append((chunk, mv))
        return mv

    def _prune(self) -> None:
        """Forget views nobody holds any more, so a view taken every frame costs no memory for good."""
        view_baseline, chunk_baseline = _view_refcount_baseline(), _refcount_baseline()
        kept = []
        for pair in self._chunks:
            if _refs(pair[1]) <= view_baseline:  # only this list holds the view
                try:
                    pair[1].release()
                except BufferError:  # something made from it (numpy.frombuffer) is alive
                    kept.append(pair)
                    continue
                if _refs(pair[0]) <= chunk_baseline:
                    continue
            kept.append(pair)
        self._chunks = kept
        self._prune_at = max(64, 2 * len(kept))

    def array(self) -> np.ndarray:
        """The whole mapping as one uint8 numpy array (made once; slices of it share the memory)."""
        if self.released:
            raise GLError(f"{self!r} used after release")
        if self._numpy is None:
            self._numpy = np.frombuffer(self._array, np.uint8)
        return self._numpy

    def release(self) -> None:
        if not self._glo:
            return
        busy = 0
        if self._numpy is not None:
            # our reference, getrefcount's argument: anything more is a live slice or a caller's copy
            if sys.getrefcount(self._numpy) > 2:
                busy += 1
            else:
                self._numpy = None
        for pair in self._chunks:
            try:
                pair[1].release()
            except BufferError:  # exported (e.g. numpy.frombuffer(view) is alive)
                busy += 1
        # Views sharing a chunk's buffer (slices, memoryview(view)) keep the chunk referenced. Both
        # counts go through the same expression, so interpreter-specific temporaries cancel out.
        baseline = _refcount_baseline()
        busy += sum(1 for pair in self._chunks if _refs(pair[0]) > baseline)
        name, self._glo = self._glo, 0
        if busy:
            log.error("%s: %d views are still in use; leaving it mapped (GL buffer %d leaked)", self, busy, name)
            return
        self._chunks.clear()
        self._gl._unmap_and_delete_buffer(name)

    def __repr__(self) -> str:
        return f"MappedBuffer(glo={self._glo}, size={self.size})"


def _refs(obj: object) -> int:
    return sys.getrefcount(obj)


def _refcount_baseline() -> int:
    """What `_refs` reports for a chunk referenced only from a MappedBuffer's chunk list."""
    probe = [((ctypes.c_ubyte * 1)(), None)]
    return max(_refs(pair[0]) for pair in probe)


def _view_refcount_baseline() -> int:
    """What `_refs` reports for a view referenced only from a MappedBuffer's chunk list."""
    probe = [(None, memoryview(bytearray(1)))]
    return max(_refs(pair[1]) for pair in probe)


class GpuTimer:
    """GPU time per frame from GL_TIME_ELAPSED queries, read back without ever waiting.

    ``begin()`` / ``end()`` bracket the GPU work of a frame; ``poll()`` returns the newest finished
    measurement in milliseconds (None when none finished yet). `depth` queries rotate, so results are
    read `depth - 1` frames late at most; when the GPU falls further behind, frames go unmeasured
    (counted in ``skipped``) rather than stalling. TIME_ELAPSED queries cannot nest: do not bracket
    the same work with a moderngl ``Query(time=True)``.
    """

    def __init__(self, gl: GLExt, depth: int = 4) -> None:
        if depth < 2:
            raise ValueError(f"timer depth must be >= 2, got {depth!r}")
        self._gl = gl
        self._ids = gl._gen_names(gl._f.glGenQueries, depth)
        self._pending: list[int] = []  # query ids begun and ended, oldest first
        self._active: int | None = None
        self._next = 0
        self.last_ms: float | None = None
        self.skipped = 0

    def begin(self) -> bool:
        """Start timing; returns False (frame unmeasured) when every query is still in flight."""
        if self._active is not None:
            raise GLError("GpuTimer.begin() called twice without end()")
        if not self._ids:
            raise GLError("GpuTimer used after release")
        self.poll()
        qid = self._ids[self._next]
        if qid in self._pending:
            self.skipped += 1
            return False
        self._next = (self._next + 1) % len(self._ids)
        self._gl._f.glBeginQuery(GL_TIME_ELAPSED, qid)
        self._active = qid
        return True

    def end(self) -> None:
        if self._active is None:
            return  # begin() declined this frame
        self._gl._f.glEndQuery(GL_TIME_ELAPSED)
        self._pending.append(self._active)
        self._active = None

    def poll(self) -> float | None:
        """Collect finished queries (oldest first); returns the newest GPU time in ms, or None."""
        f = self._gl._f
        avail = ctypes.c_int(0)
        result = ctypes.c_uint64(0)
        while self._pending:
            qid = self._pending[0]
            f.glGetQueryObjectiv(qid, GL_QUERY_RESULT_AVAILABLE, ctypes.byref(avail))
            if not avail.value:
                break
            f.glGetQueryObjectui64v(qid, GL_QUERY_RESULT, ctypes.byref(result))
            self._pending.pop(0)
            self.last_ms = result.value / 1e6
        return self.last_ms

    def release(self) -> None:
        if self._ids:
            if self._active is not None:
                self._gl._f.glEndQuery(GL_TIME_ELAPSED)
                self._active = None
            ids, self._ids = self._ids, []
            self._pending.clear()
            arr = (ctypes.c_uint * len(ids))(*ids)
            self._gl._f.glDeleteQueries(len(ids), arr)


class _Functions:
    """Attribute bag of loaded GL entry points (plain ctypes functions, or debug-checking wrappers)."""

    def __getattr__(self, name: str) -> Any:  # only reached for names that were never loaded
        raise AttributeError(f"GL entry point {name} is not in texstream's function table")


# ---- the extension object ---------------------------------------------------------------------
class GLExt:
    """Raw GL entry points and helpers for one moderngl context (standalone EGL or a window's).

    Construction checks the GL version and extensions and raises `GLError` naming what is missing.
    With ``debug=True`` every raw call is followed by glGetError (raising `GLError` naming the call
    and the error) and checked to run on the thread that created this object.
    """

    def __init__(self, ctx: moderngl.Context, debug: bool = False) -> None:
        self.ctx = ctx
        self.debug = bool(debug)
        self.version_code: int = int(ctx.version_code)
        self._extensions = frozenset(ctx.extensions)
        self._thread = threading.get_ident()
        self.live_syncs = 0  # fences made by this layer and not yet deleted
        if self.version_code < MIN_VERSION:
            raise GLError(f"texstream needs OpenGL 3.3 or newer; this context is {self._describe()}")
        missing = [f for f in REQUIRED_FEATURES if not self.has(f)]
        if missing:
            needs = "; ".join(f"{f.value[2]} need {f.requirement}" for f in missing)
            raise GLError(f"this GL context ({self._describe()}) lacks what texstream needs: {needs}")
        self._f = _Functions()
        self.addresses: dict[str, int] = {}  # entry points, for compiled loops (texstream.native)
        self._load_functions()
        self.scratch_unit = int(getattr(ctx, "default_texture_unit", 0))
        self.max_array_layers = self.get_integer(GL_MAX_ARRAY_TEXTURE_LAYERS)
        self.max_texture_size = self.get_integer(GL_MAX_TEXTURE_SIZE)
        self.max_anisotropy = (
            self._get_float(GL_MAX_TEXTURE_MAX_ANISOTROPY) if self.has(Feature.TEXTURE_ANISOTROPY) else 1.0
        )
        log.debug(
            "GLExt on %s: buffer_storage=%s, max layers %d, debug=%s",
            self._describe(),
            self.has(Feature.BUFFER_STORAGE),
            self.max_array_layers,
            self.debug,
        )

    # -- capabilities ---------------------------------------------------------------------------
    def has(self, feature: Feature) -> bool:
        """True when the context's version or extensions provide `feature`."""
        core, exts, _ = feature.value
        if feature is Feature.S3TC_SRGB and not self.has(Feature.S3TC):
            return False
        return (core is not None and self.version_code >= core) or any(e in self._extensions for e in exts)

    @property
    def has_buffer_storage(self) -> bool:
        return self.has(Feature.BUFFER_STORAGE)

    def supports_format(self, fmt: GLFormat) -> bool:
        return fmt.feature is None or self.has(fmt.feature)

    def _describe(self) -> str:
        info = getattr(self.ctx, "info", {}) or {}
        v = self.version_code
        return f"OpenGL {v // 100}.{v % 100 // 10} ({info.get('GL_RENDERER', 'unknown renderer')})"

    # -- loading --------------------------------------------------------------------------------
    def _load_functions(self) -> None:
        ctx_loader = _context_loader(self.ctx)
        fallbacks: list[Callable[[bytes], int | None]] | None = None  # loaded on the first miss

        def resolve(name: str) -> int:
            nonlocal fallbacks
            if ctx_loader is not None:
                try:
                    address = int(ctx_loader(name) or 0)
                except Exception:  # glcontext raises its own error types for unknown names
                    address = 0
                if address:
                    return address
            if fallbacks is None:
                fallbacks = _proc_address_fallbacks()
            for load in fallbacks:
                address = int(load(name.encode()) or 0)
                if address:
                    return address
            return 0

        get_error: Callable[[], int] | None = None
        for name, (restype, argtypes, feature) in _FUNCTIONS.items():
            if feature is not None and not self.has(feature):
                setattr(self._f, name, _missing(name, feature))
                continue
            address = resolve(name)
            if not address:
                raise GLError(
                    f"cannot load {name}: neither moderngl's context loader nor eglGetProcAddress / "
                    "glXGetProcAddressARB resolves it"
                )
            fn = _FUNCTYPE(restype, *argtypes)(address)
            self.addresses[name] = address
            if name == "glClientWaitSync":
                self._wait_sync = _WAITING_FUNCTYPE(restype, *argtypes)(address)
            if name == "glGetError":
                get_error = fn
            setattr(self._f, name, fn)
        assert get_error is not None
        self._raw_get_error = get_error
        if self.debug:
            for name in _FUNCTIONS:
                fn = getattr(self._f, name)
                if name != "glGetError" and isinstance(fn, ctypes._CFuncPtr):  # type: ignore[attr-defined]
                    setattr(self._f, name, self._checked(name, fn))

    def _checked(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        get_error = self._raw_get_error
        owner = self._thread

        def call(*args: Any) -> Any:
            if threading.get_ident() != owner:
                raise GLError(
                    f"{name} called from thread {threading.current_thread().name!r}; only the "
                    "render thread (the one that created GLExt) may call GL"
                )
            stale = _drain(get_error)
            if stale:
                log.warning(
                    "GL errors pending before %s (raised by earlier, non-texstream calls): %s",
                    name,
                    ", ".join(stale),
                )
            result = fn(*args)
            errors = _drain(get_error)
            if errors:
                raise GLError(f"{name} failed: {', '.join(errors)}")
            return result

        call.__name__ = name
        return call

    # -- errors and queries ---------------------------------------------------------------------
    def get_error(self) -> str | None:
        """The oldest pending GL error's name (e.g. "GL_INVALID_ENUM"), or None; clears that one."""
        code = self._raw_get_error()
        return None if code == GL_NO_ERROR else _error_name(code)

    def check(self, where: str) -> None:
        """Raise GLError naming `where` and every pending error; no-op when there are none."""
        errors = _drain(self._raw_get_error)
        if errors:
            raise GLError(f"{where}: {', '.join(errors)}")

    def get_integer(self, pname: int) -> int:
        """glGetIntegerv for a single-valued `pname`."""
        out = (ctypes.c_int * 4)()  # room for drivers that write more than asked
        self._f.glGetIntegerv(pname, out)
        return int(out[0])

    def get_integers(self, pname: int, count: int) -> list[int]:
        """glGetIntegerv for a `pname` with `count` values."""
        out = (ctypes.c_int * max(count, 4))()
        self._f.glGetIntegerv(pname, out)
        return [int(v) for v in out[:count]]

    def _get_float(self, pname: int) -> float:
        # glGetFloatv is not in the table (one use); integers are exact enough for an aniso cap.
        return float(max(1, self.get_integer(pname)))

    def memory_info(self) -> GpuMemoryInfo | None:
        """Free/total GPU memory from GL_NVX_gpu_memory_info or GL_ATI_meminfo; None without both."""
        if self.has(Feature.NVX_MEMORY):
            return GpuMemoryInfo(
                source="GL_NVX_gpu_memory_info",
                available_kib=self.get_integer(GL_GPU_MEMORY_INFO_CURRENT_AVAILABLE_VIDMEM_NVX),
                total_kib=self.get_integer(GL_GPU_MEMORY_INFO_DEDICATED_VIDMEM_NVX),
                total_available_kib=self.get_integer(GL_GPU_MEMORY_INFO_TOTAL_AVAILABLE_MEMORY_NVX),
                evicted_kib=self.get_integer(GL_GPU_MEMORY_INFO_EVICTED_MEMORY_NVX),
                eviction_count=self.get_integer(GL_GPU_MEMORY_INFO_EVICTION_COUNT_NVX),
            )
        if self.has(Feature.ATI_MEMORY):
            free, _largest, _aux_free, _aux_largest = self.get_integers(GL_TEXTURE_FREE_MEMORY_ATI, 4)
            return GpuMemoryInfo(source="GL_ATI_meminfo", available_kib=free)
        return None

    # -- texture arrays -------------------------------------------------------------------------
    def create_texture_array(
        self,
        fmt: GLFormat,
        size: int,
        layers: int,
        *,
        filter: str = "linear",
        anisotropy: float = 1.0,
    ) -> TextureArray:
        """Immutable storage (glTexStorage3D, one level) for `layers` layers of `size` x `size`."""
        if not isinstance(fmt, GLFormat):
            raise TypeError(f"fmt must be a GLFormat (see gl_format()), got {type(fmt).__name__}")
        if not self.supports_format(fmt):
            assert fmt.feature is not None
            raise GLError(f"{fmt.name} needs {fmt.feature.requirement}, which this context lacks")
        fmt.layer_bytes(size)  # validates size
        if size > self.max_texture_size:
            raise ValueError(f"layer size {size} exceeds GL_MAX_TEXTURE_SIZE {self.max_texture_size}")
        if not 1 <= layers <= self.max_array_layers:
            raise ValueError(
                f"layers must be in 1..{self.max_array_layers} (GL_MAX_ARRAY_TEXTURE_LAYERS), got {layers!r}"
            )
        if filter not in ("linear", "nearest"):
            raise ValueError(f"filter must be 'linear' or 'nearest', got {filter!r}")
        if anisotropy < 1.0:
            raise ValueError(f"anisotropy must be >= 1, got {anisotropy!r}")
        f = self._f
        self._clear_stale("creating a texture array")
        (name,) = self._gen_names(f.glGenTextures, 1)
        self._bind_scratch(name)
        try:
            f.glTexStorage3D(GL_TEXTURE_2D_ARRAY, 1, fmt.internal_format, size, size, layers)
            filt = GL_LINEAR if filter == "linear" else GL_NEAREST
            f.glTexParameteri(GL_TEXTURE_2D_ARRAY, GL_TEXTURE_MIN_FILTER, filt)
            f.glTexParameteri(GL_TEXTURE_2D_ARRAY, GL_TEXTURE_MAG_FILTER, filt)
            f.glTexParameteri(GL_TEXTURE_2D_ARRAY, GL_TEXTURE_WRAP_S, GL_CLAMP_TO_EDGE)
            f.glTexParameteri(GL_TEXTURE_2D_ARRAY, GL_TEXTURE_WRAP_T, GL_CLAMP_TO_EDGE)
            f.glTexParameteri(GL_TEXTURE_2D_ARRAY, GL_TEXTURE_BASE_LEVEL, 0)
            f.glTexParameteri(GL_TEXTURE_2D_ARRAY, GL_TEXTURE_MAX_LEVEL, 0)
            if anisotropy > 1.0 and self.has(Feature.TEXTURE_ANISOTROPY):
                f.glTexParameterf(GL_TEXTURE_2D_ARRAY, GL_TEXTURE_MAX_ANISOTROPY, min(anisotropy, self.max_anisotropy))
        except BaseException:
            self._unbind_scratch()
            self._delete_textures(name)
            raise
        self._unbind_scratch()
        try:  # allocation failures (GL_OUT_OF_MEMORY) must surface even without debug mode
            self.check(f"creating {fmt.name} texture array {size}x{size}x{layers}")
        except GLError:
            self._delete_textures(name)
            raise
        log.debug(
            "texture array %d: %s %dx%dx%d (%d bytes)",
            name,
            fmt.name,
            size,
            size,
            layers,
            fmt.layer_bytes(size) * layers,
        )
        return TextureArray(self, name, fmt, size, layers)

    def bind_texture_array(self, texture: TextureArray, unit: int) -> None:
        """Bind `texture` to ``GL_TEXTURE0 + unit`` for drawing."""
        if texture.released:
            raise GLError(f"{texture!r} used after release")
        self._f.glActiveTexture(GL_TEXTURE0 + unit)
        self._f.glBindTexture(GL_TEXTURE_2D_ARRAY, texture.glo)

    def internal_format_of(self, texture: TextureArray) -> int:
        """The internal format GL reports for `texture` (GL_TEXTURE_INTERNAL_FORMAT of level 0)."""
        out = ctypes.c_int(0)
        self._bind_scratch(texture.glo)
        try:
            self._f.glGetTexLevelParameteriv(GL_TEXTURE_2D_ARRAY, 0, GL_TEXTURE_INTERNAL_FORMAT, ctypes.byref(out))
        finally:
            self._unbind_scratch()
        return int(out.value)

    def upload_cell_batch(
        self,
        texture: TextureArray,
        layer: np.ndarray,
        x: np.ndarray,
        y: np.ndarray,
        offset: np.ndarray,
        cell_size: int,
        pbo: int,
        native: Any = None,
    ) -> int:
        """Upload many square cells: one sub-image call per cell, the texture and buffer bound once.

        Arrays (int64): layer, texel origin x/y (multiples of 4 for block formats) and where each
        cell's bytes are: the byte offset in pixel-unpack buffer `pbo`, or with ``pbo=0`` the address
        of client memory the caller keeps alive during the call. `native` (texstream.native.Native)
        runs the loop in C; else a Python loop does (always in debug mode: every call checked).
        Returns the bytes uploaded."""
        if texture.released:
            raise GLError(f"{texture!r} used after release")
        n = int(layer.size)
        if n == 0:
            return 0
        fmt, size = texture.format, texture.size
        nbytes = fmt.layer_bytes(cell_size)
        if layer.min() < 0 or layer.max() >= texture.layers:
            raise ValueError(f"layers {layer.min()}..{layer.max()} are outside 0..{texture.layers - 1} of {texture!r}")
        if min(x.min(), y.min()) < 0 or max(x.max(), y.max()) > size - cell_size:
            raise ValueError(f"a cell does not fit a {size}x{size} layer")
        f = self._f
        self._bind_scratch(texture.glo)
        f.glBindBuffer(GL_PIXEL_UNPACK_BUFFER, pbo)
        try:
            if native is not None and not self.debug:
                arrays = [np.ascontiguousarray(a, np.int64) for a in (layer, x, y, offset)]
                ptrs = [a.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)) for a in arrays]
                native.upload_cells(self.addresses["glCompressedTexSubImage3D"], self.addresses["glTexSubImage3D"],
                                    int(fmt.compressed), n, ptrs[0], ptrs[1], ptrs[2], cell_size,
                                    fmt.internal_format, nbytes, ptrs[3])  # fmt: skip
            elif fmt.compressed:
                call = f.glCompressedTexSubImage3D
                for lv, cx, cy, off in zip(layer.tolist(), x.tolist(), y.tolist(), offset.tolist(), strict=True):
                    call(GL_TEXTURE_2D_ARRAY, 0, cx, cy, lv, cell_size, cell_size, 1, fmt.internal_format, nbytes, off)
            else:
                call = f.glTexSubImage3D
                for lv, cx, cy, off in zip(layer.tolist(), x.tolist(), y.tolist(), offset.tolist(), strict=True):
                    call(GL_TEXTURE_2D_ARRAY, 0, cx, cy, lv, cell_size, cell_size, 1, GL_RGBA, GL_UNSIGNED_BYTE, off)
        finally:
            f.glBindBuffer(GL_PIXEL_UNPACK_BUFFER, 0)
            self._unbind_scratch()
        return n * nbytes

    def copy_cells(
        self, src: TextureArray, dst: TextureArray, moves: Iterable[tuple[int, int, int, int, int, int]], cell_size: int
    ) -> int:
        """GPU-to-GPU copies of cells: ``(src_layer, sx, sy, dst_layer, dx, dy)`` each; returns the count."""
        for t in (src, dst):
            if t.released:
                raise GLError(f"{t!r} used after release")
        if src.format.texel_format is not dst.format.texel_format:
            raise ValueError(f"cannot copy cells between {src!r} and {dst!r}: formats differ")
        n = 0
        for sl, sx, sy, dl, dx, dy in moves:
            self._f.glCopyImageSubData(src.glo, GL_TEXTURE_2D_ARRAY, 0, sx, sy, sl,
                                       dst.glo, GL_TEXTURE_2D_ARRAY, 0, dx, dy, dl,
                                       cell_size, cell_size, 1)  # fmt: skip
            n += 1
        return n

    def write_layer(self, texture: TextureArray, layer: int, data: bytes | bytearray | memoryview) -> None:
        """Upload one whole layer from client memory (no PBO; for pinned data and tests)."""
        if texture.released:
            raise GLError(f"{texture!r} used after release")
        if not 0 <= layer < texture.layers:
            raise ValueError(f"layer {layer!r} is outside 0..{texture.layers - 1} of {texture!r}")
        raw = memoryview(data).cast("B")
        if raw.nbytes != texture.layer_bytes:
            raise ValueError(f"a {texture.format.name} layer is {texture.layer_bytes} bytes, got {raw.nbytes}")
        buf = (ctypes.c_ubyte * raw.nbytes).from_buffer_copy(raw)
        fmt, size, f = texture.format, texture.size, self._f
        self._bind_scratch(texture.glo)
        f.glBindBuffer(GL_PIXEL_UNPACK_BUFFER, 0)
        try:
            if fmt.compressed:
                f.glCompressedTexSubImage3D(
                    GL_TEXTURE_2D_ARRAY, 0, 0, 0, layer, size, size, 1, fmt.internal_format, raw.nbytes, buf
                )
            else:
                f.glTexSubImage3D(GL_TEXTURE_2D_ARRAY, 0, 0, 0, layer, size, size, 1, GL_RGBA, GL_UNSIGNED_BYTE, buf)
        finally:
            self._unbind_scratch()

    def read_layer(self, texture: TextureArray, layer: int) -> bytes:
        """One layer's stored bytes: compressed blocks as stored, or RGBA8 texels (tests, debugging).

        Needs GL 4.5 or GL_ARB_get_texture_sub_image. Waits for the GPU: never call it per frame.
        """
        if texture.released:
            raise GLError(f"{texture!r} used after release")
        if not 0 <= layer < texture.layers:
            raise ValueError(f"layer {layer!r} is outside 0..{texture.layers - 1} of {texture!r}")
        n, size, f = texture.layer_bytes, texture.size, self._f
        out = (ctypes.c_ubyte * n)()
        f.glBindBuffer(GL_PIXEL_PACK_BUFFER, 0)
        if texture.format.compressed:
            f.glGetCompressedTextureSubImage(texture.glo, 0, 0, 0, layer, size, size, 1, n, out)
        else:
            f.glGetTextureSubImage(texture.glo, 0, 0, 0, layer, size, size, 1, GL_RGBA, GL_UNSIGNED_BYTE, n, out)
        return bytes(out)

    def copy_layers(self, src: TextureArray, src_layer: int, dst: TextureArray, dst_layer: int, count: int = 1) -> None:
        """GPU-to-GPU copy of `count` consecutive layers (glCopyImageSubData), e.g. to grow a cache."""
        for t in (src, dst):
            if t.released:
                raise GLError(f"{t!r} used after release")
        if src.format.texel_format is not dst.format.texel_format or src.size != dst.size:
            raise ValueError(f"cannot copy layers between {src!r} and {dst!r}: formats or sizes differ")
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count!r}")
        for t, first in ((src, src_layer), (dst, dst_layer)):
            if not (0 <= first and first + count <= t.layers):
                raise ValueError(f"layers {first}..{first + count - 1} are outside 0..{t.layers - 1} of {t!r}")
        if src is dst and abs(src_layer - dst_layer) < count:
            raise ValueError("source and destination layer ranges overlap")
        s = src.size
        self._f.glCopyImageSubData(
            src.glo,
            GL_TEXTURE_2D_ARRAY,
            0,
            0,
            0,
            src_layer,
            dst.glo,
            GL_TEXTURE_2D_ARRAY,
            0,
            0,
            0,
            dst_layer,
            s,
            s,
            count,
        )

    # -- buffers --------------------------------------------------------------------------------
    def create_mapped_buffer(self, size: int, *, read: bool = False) -> MappedBuffer:
        """A persistent, coherent, mapped buffer of `size` bytes (needs buffer storage): write-mapped
        for uploads, or read-mapped (client storage) for GPU-to-CPU readback with ``read=True``."""
        if size < 1:
            raise ValueError(f"buffer size must be positive, got {size!r}")
        if not self.has(Feature.BUFFER_STORAGE):
            raise GLError(f"persistent mapping needs {Feature.BUFFER_STORAGE.requirement}, which this context lacks")
        f = self._f
        self._clear_stale("creating a mapped buffer")
        (name,) = self._gen_names(f.glGenBuffers, 1)
        flags = (GL_MAP_READ_BIT if read else GL_MAP_WRITE_BIT) | GL_MAP_PERSISTENT_BIT | GL_MAP_COHERENT_BIT
        f.glBindBuffer(GL_COPY_WRITE_BUFFER, name)
        try:
            f.glBufferStorage(GL_COPY_WRITE_BUFFER, size, None, flags | (GL_CLIENT_STORAGE_BIT if read else 0))
            address = f.glMapBufferRange(GL_COPY_WRITE_BUFFER, 0, size, flags)
        except BaseException:
            f.glBindBuffer(GL_COPY_WRITE_BUFFER, 0)
            self._delete_buffers(name)
            raise
        f.glBindBuffer(GL_COPY_WRITE_BUFFER, 0)
        errors = _drain(self._raw_get_error)
        if errors or not address:
            self._delete_buffers(name)
            raise GLError(
                f"creating a {size}-byte persistent-mapped buffer failed: "
                f"{', '.join(errors) or 'glMapBufferRange returned NULL'}"
            )
        return MappedBuffer(self, name, size, int(address))

    def copy_buffer(self, src: int, dst: int, size: int, src_offset: int = 0, dst_offset: int = 0) -> None:
        """GPU-side glCopyBufferSubData between two buffer names (e.g. an SSBO into a readback buffer)."""
        f = self._f
        f.glBindBuffer(GL_COPY_READ_BUFFER, src)
        f.glBindBuffer(GL_COPY_WRITE_BUFFER, dst)
        try:
            f.glCopyBufferSubData(GL_COPY_READ_BUFFER, GL_COPY_WRITE_BUFFER, src_offset, dst_offset, size)
        finally:
            f.glBindBuffer(GL_COPY_READ_BUFFER, 0)
            f.glBindBuffer(GL_COPY_WRITE_BUFFER, 0)

    def _unmap_and_delete_buffer(self, name: int) -> None:
        f = self._f
        f.glBindBuffer(GL_COPY_WRITE_BUFFER, name)
        f.glUnmapBuffer(GL_COPY_WRITE_BUFFER)
        f.glBindBuffer(GL_COPY_WRITE_BUFFER, 0)
        self._delete_buffers(name)

    # -- sync and timing ------------------------------------------------------------------------
    def fence(self) -> Fence:
        """A fence after every command issued so far (glFenceSync); poll it with ``signalled()``."""
        sync = self._f.glFenceSync(GL_SYNC_GPU_COMMANDS_COMPLETE, 0)
        if not sync:
            raise GLError("glFenceSync returned no sync object")
        self.live_syncs += 1
        return Fence(self, sync)

    def live_objects(self, probe: int = 4096) -> LiveObjects:
        """Count the context's live GL objects of each kind by asking the driver about every name up
        to `probe` (glIsBuffer, glIsTexture, ...), whoever made them; sync objects are this layer's
        fences not yet deleted. For leak checks in tests and soak runs (a few ms: not per frame)."""
        f = self._f
        flag = ctypes.c_int(0)

        def alive(is_kind: Callable[[int], int], get_iv: Callable[..., None]) -> Callable[[int], bool]:
            # a deleted program still in use (and its shaders) lives on flagged for deletion: not counted
            def check(name: int) -> bool:
                if not is_kind(name):
                    return False
                get_iv(name, GL_DELETE_STATUS, ctypes.byref(flag))
                return not flag.value

            return check

        checks = {
            "buffers": f.glIsBuffer,
            "textures": f.glIsTexture,
            "queries": f.glIsQuery,
            "framebuffers": f.glIsFramebuffer,
            "renderbuffers": f.glIsRenderbuffer,
            "vertex_arrays": f.glIsVertexArray,
            "programs": alive(f.glIsProgram, f.glGetProgramiv),
            "shaders": alive(f.glIsShader, f.glGetShaderiv),
        }
        counts = {kind: sum(1 for name in range(1, probe + 1) if is_kind(name)) for kind, is_kind in checks.items()}
        return LiveObjects(**counts, syncs=self.live_syncs)

    def throttle(self, depth: int = 2) -> FrameThrottle:
        """A `FrameThrottle` for a headless loop: at most `depth` frames queued on the GPU."""
        return FrameThrottle(self, depth)

    def timer(self, depth: int = 4) -> GpuTimer:
        return GpuTimer(self, depth)

    # -- internals ------------------------------------------------------------------------------
    def _clear_stale(self, before: str) -> None:
        """Drain errors left by other code, so the check after an allocation blames only it."""
        stale = _drain(self._raw_get_error)
        if stale:
            log.warning(
                "GL errors pending before %s (raised by earlier, non-texstream calls): %s",
                before,
                ", ".join(stale),
            )

    def _bind_scratch(self, name: int) -> None:
        self._f.glActiveTexture(GL_TEXTURE0 + self.scratch_unit)
        self._f.glBindTexture(GL_TEXTURE_2D_ARRAY, name)

    def _unbind_scratch(self) -> None:
        self._f.glActiveTexture(GL_TEXTURE0 + self.scratch_unit)
        self._f.glBindTexture(GL_TEXTURE_2D_ARRAY, 0)

    def _gen_names(self, gen: Callable[..., None], count: int) -> list[int]:
        arr = (ctypes.c_uint * count)()
        gen(count, arr)
        names = [int(v) for v in arr]
        if not all(names):
            raise GLError(f"GL returned no object names ({gen.__name__ if hasattr(gen, '__name__') else gen})")
        return names

    def _delete_textures(self, *names: int) -> None:
        arr = (ctypes.c_uint * len(names))(*names)
        self._f.glDeleteTextures(len(names), arr)

    def _delete_buffers(self, *names: int) -> None:
        arr = (ctypes.c_uint * len(names))(*names)
        self._f.glDeleteBuffers(len(names), arr)

    def is_texture(self, name: int) -> bool:
        return bool(self._f.glIsTexture(name))

    def is_buffer(self, name: int) -> bool:
        return bool(self._f.glIsBuffer(name))


def _error_name(code: int) -> str:
    return GL_ERROR_NAMES.get(code, f"GL error 0x{code:04X}")


def _drain(get_error: Callable[[], int], limit: int = 16) -> list[str]:
    """Every pending GL error's name, oldest first (bounded: a lost context repeats forever)."""
    errors: list[str] = []
    for _ in range(limit):
        code = get_error()
        if code == GL_NO_ERROR:
            break
        errors.append(_error_name(code))
    return errors
