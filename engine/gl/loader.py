"""Loading raw GL entry points: which features a context has, the function table, the lookup.

Function loaders return non-NULL even for functions the driver lacks, so whether a `Feature` is there
is decided from the GL version and the extension list (`feature_available`), never from the pointer;
an entry point of a missing feature is replaced by one that raises `GLError` naming what it needs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import sys
from collections.abc import Callable, Collection
from typing import Any

import moderngl

from ..errors import GLError

__all__ = [
    "Feature",
    "MIN_VERSION",
    "REQUIRED_FEATURES",
    "feature_available",
    "proc_address_lookup",
]


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
    BPTC = (420, ("GL_ARB_texture_compression_bptc",), "BC6H and BC7 textures")
    COMPRESSED_PIXEL_STORAGE = (
        420,
        ("GL_ARB_compressed_texture_pixel_storage",),
        "uploads of layer runs from padded staging slots",
    )
    COMPUTE_SHADER = (430, ("GL_ARB_compute_shader",), "compute shaders")
    SHADER_IMAGE_LOAD_STORE = (420, ("GL_ARB_shader_image_load_store",), "image stores from shaders")
    SHADER_STORAGE_BUFFER = (430, ("GL_ARB_shader_storage_buffer_object",), "shader storage buffers")
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


def feature_available(feature: Feature, version_code: int, extensions: Collection[str]) -> bool:
    """True when GL `version_code` (e.g. 450) or one of `extensions` provides `feature`."""
    core, exts, _ = feature.value
    if feature is Feature.S3TC_SRGB and not feature_available(Feature.S3TC, version_code, extensions):
        return False
    return (core is not None and version_code >= core) or any(e in extensions for e in exts)


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
    "glBindBufferBase": (None, (_u, _u, _u), None),
    "glBindImageTexture": (None, (_u, _u, _i, ctypes.c_ubyte, _i, _u, _u), Feature.SHADER_IMAGE_LOAD_STORE),
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


def proc_address_lookup(ctx: moderngl.Context) -> Callable[[str], int]:
    """A lookup of GL entry-point addresses for `ctx` (0 when unresolved): moderngl's own loader
    first, then eglGetProcAddress / glXGetProcAddressARB, loaded on the first miss."""
    ctx_loader = _context_loader(ctx)
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

    return resolve


class GLFunctions:
    """The function table: loaded GL entry points as attributes (plain ctypes functions, or
    debug-checking wrappers), e.g. ``functions.glBindTexture(target, name)``.

    `GLExt.functions` is the one table of a context; the GL objects it hands out hold the same table,
    so they call GL without reaching into the facade. ``wait_sync`` is glClientWaitSync bound so that
    it releases the interpreter lock while it blocks (for frame throttling only).
    """

    wait_sync: Callable[[int, int, int], int]

    def __getattr__(self, name: str) -> Any:  # only reached for names that were never loaded
        raise AttributeError(f"GL entry point {name} is not in texstream's function table")

    def gen_names(self, gen: Callable[..., None], count: int) -> list[int]:
        """`count` new object names from a glGen* entry point; `GLError` when the driver gives none."""
        arr = (ctypes.c_uint * count)()
        gen(count, arr)
        names = [int(v) for v in arr]
        if not all(names):
            raise GLError(f"GL returned no object names ({getattr(gen, '__name__', gen)})")
        return names

    def delete_names(self, delete: Callable[..., None], *names: int) -> None:
        """Delete object names through a glDelete* entry point (one call for all of them)."""
        arr = (ctypes.c_uint * len(names))(*names)
        delete(len(names), arr)
