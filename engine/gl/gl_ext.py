"""`GLExt`: raw OpenGL that moderngl lacks, called through ctypes on the context's own function loader.

moderngl has no compressed sub-uploads, no immutable texture arrays of compressed formats, no
buffer storage or persistent mapping, no fences, no image copies and no memory queries. `GLExt` is
the one way texstream calls GL directly; everything else goes through it. The GL layer is split by
job: `enums` (enum values, texel-format tables), `loader` (features, the function table, the
entry-point lookup), `objects` (the objects `GLExt` hands out) and this facade.

Rules the GL layer keeps:

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
import logging
import threading
from collections.abc import Callable
from typing import Any

import moderngl

from ..errors import GLError
from .enums import (
    GL_CLAMP_TO_EDGE,
    GL_CLIENT_STORAGE_BIT,
    GL_COPY_READ_BUFFER,
    GL_COPY_WRITE_BUFFER,
    GL_DELETE_STATUS,
    GL_ERROR_NAMES,
    GL_GPU_MEMORY_INFO_CURRENT_AVAILABLE_VIDMEM_NVX,
    GL_GPU_MEMORY_INFO_DEDICATED_VIDMEM_NVX,
    GL_GPU_MEMORY_INFO_EVICTED_MEMORY_NVX,
    GL_GPU_MEMORY_INFO_EVICTION_COUNT_NVX,
    GL_GPU_MEMORY_INFO_TOTAL_AVAILABLE_MEMORY_NVX,
    GL_LINEAR,
    GL_MAP_COHERENT_BIT,
    GL_MAP_PERSISTENT_BIT,
    GL_MAP_READ_BIT,
    GL_MAP_WRITE_BIT,
    GL_MAX_ARRAY_TEXTURE_LAYERS,
    GL_MAX_TEXTURE_MAX_ANISOTROPY,
    GL_MAX_TEXTURE_SIZE,
    GL_NEAREST,
    GL_NO_ERROR,
    GL_SYNC_GPU_COMMANDS_COMPLETE,
    GL_TEXTURE0,
    GL_TEXTURE_2D_ARRAY,
    GL_TEXTURE_BASE_LEVEL,
    GL_TEXTURE_FREE_MEMORY_ATI,
    GL_TEXTURE_INTERNAL_FORMAT,
    GL_TEXTURE_MAG_FILTER,
    GL_TEXTURE_MAX_ANISOTROPY,
    GL_TEXTURE_MAX_LEVEL,
    GL_TEXTURE_MIN_FILTER,
    GL_TEXTURE_WRAP_S,
    GL_TEXTURE_WRAP_T,
    GLFormat,
)
from .loader import (
    _FUNCTIONS,
    _FUNCTYPE,
    _WAITING_FUNCTYPE,
    MIN_VERSION,
    REQUIRED_FEATURES,
    Feature,
    GLFunctions,
    _missing,
    feature_available,
    proc_address_lookup,
)
from .objects import (
    DeviceBuffer,
    Fence,
    FrameThrottle,
    GpuMemoryInfo,
    GpuTimer,
    LiveObjects,
    MappedBuffer,
    TextureArray,
)
from .transfers import TextureTransfers

__all__ = [
    "GLExt",
]

log = logging.getLogger(__name__)


class GLExt(TextureTransfers):
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
        self.functions = GLFunctions()  # the function table (public: GL objects and tests call through it)
        self.addresses: dict[str, int] = {}  # entry points, for compiled loops (texstream.native)
        self._load_functions()
        self.scratch_unit = int(getattr(ctx, "default_texture_unit", 0))
        self._unpack_cache: dict[tuple[int, int, int], tuple[int, int]] = {}  # `upload_runs`' unpack modes
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
        return feature_available(feature, self.version_code, self._extensions)

    @property
    def has_buffer_storage(self) -> bool:
        return self.has(Feature.BUFFER_STORAGE)

    @property
    def has_staging_texture(self) -> bool:
        """True when the staging-texture upload path can run (`UploadPath.STAGING_TEXTURE`): a compute
        pass reading a storage buffer and storing images (GLSL 4.30, so a GL 4.3 context), then
        glCopyImageSubData."""
        needs = (Feature.COMPUTE_SHADER, Feature.SHADER_IMAGE_LOAD_STORE, Feature.SHADER_STORAGE_BUFFER)
        return self.version_code >= 430 and all(self.has(f) for f in (*needs, Feature.COPY_IMAGE))

    @property
    def reports_video_memory(self) -> bool:
        """True when the driver reports dedicated video memory (GL_NVX_gpu_memory_info or
        GL_ATI_meminfo): a discrete GPU, where GPU-only buffers live apart from host memory."""
        return self.has(Feature.NVX_MEMORY) or self.has(Feature.ATI_MEMORY)

    def supports_format(self, fmt: GLFormat) -> bool:
        return fmt.feature is None or self.has(fmt.feature)

    def _describe(self) -> str:
        info = getattr(self.ctx, "info", {}) or {}
        v = self.version_code
        return f"OpenGL {v // 100}.{v % 100 // 10} ({info.get('GL_RENDERER', 'unknown renderer')})"

    # -- loading --------------------------------------------------------------------------------
    def _load_functions(self) -> None:
        resolve = proc_address_lookup(self.ctx)
        get_error: Callable[[], int] | None = None
        for name, (restype, argtypes, feature) in _FUNCTIONS.items():
            if feature is not None and not self.has(feature):
                setattr(self.functions, name, _missing(name, feature))
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
                self.functions.wait_sync = _WAITING_FUNCTYPE(restype, *argtypes)(address)
            if name == "glGetError":
                get_error = fn
            setattr(self.functions, name, fn)
        assert get_error is not None
        self._raw_get_error = get_error
        if self.debug:
            for name in _FUNCTIONS:
                fn = getattr(self.functions, name)
                if name != "glGetError" and isinstance(fn, ctypes._CFuncPtr):  # type: ignore[attr-defined]
                    setattr(self.functions, name, self._checked(name, fn))

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
        self.functions.glGetIntegerv(pname, out)
        return int(out[0])

    def get_integers(self, pname: int, count: int) -> list[int]:
        """glGetIntegerv for a `pname` with `count` values."""
        out = (ctypes.c_int * max(count, 4))()
        self.functions.glGetIntegerv(pname, out)
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
        f = self.functions
        self._clear_stale("creating a texture array")
        (name,) = f.gen_names(f.glGenTextures, 1)
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
            self.delete_textures(name)
            raise
        self._unbind_scratch()
        try:  # allocation failures (GL_OUT_OF_MEMORY) must surface even without debug mode
            self.check(f"creating {fmt.name} texture array {size}x{size}x{layers}")
        except GLError:
            self.delete_textures(name)
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
        self.functions.glActiveTexture(GL_TEXTURE0 + unit)
        self.functions.glBindTexture(GL_TEXTURE_2D_ARRAY, texture.glo)

    def internal_format_of(self, texture: TextureArray) -> int:
        """The internal format GL reports for `texture` (GL_TEXTURE_INTERNAL_FORMAT of level 0)."""
        out = ctypes.c_int(0)
        self._bind_scratch(texture.glo)
        try:
            self.functions.glGetTexLevelParameteriv(
                GL_TEXTURE_2D_ARRAY, 0, GL_TEXTURE_INTERNAL_FORMAT, ctypes.byref(out)
            )
        finally:
            self._unbind_scratch()
        return int(out.value)

    def create_mapped_buffer(self, size: int, *, read: bool = False) -> MappedBuffer:
        """A persistent, coherent, mapped buffer of `size` bytes (needs buffer storage): write-mapped
        for uploads, or read-mapped (client storage) for GPU-to-CPU readback with ``read=True``."""
        if size < 1:
            raise ValueError(f"buffer size must be positive, got {size!r}")
        if not self.has(Feature.BUFFER_STORAGE):
            raise GLError(f"persistent mapping needs {Feature.BUFFER_STORAGE.requirement}, which this context lacks")
        f = self.functions
        self._clear_stale("creating a mapped buffer")
        (name,) = f.gen_names(f.glGenBuffers, 1)
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

    def create_device_buffer(self, size: int) -> DeviceBuffer:
        """An immutable buffer of `size` bytes with no mapping flags (needs buffer storage): GPU-only
        memory, in video memory on discrete GPUs, filled by buffer copies."""
        if size < 1:
            raise ValueError(f"buffer size must be positive, got {size!r}")
        if not self.has(Feature.BUFFER_STORAGE):
            raise GLError(f"device-local buffers need {Feature.BUFFER_STORAGE.requirement}, which this context lacks")
        f = self.functions
        self._clear_stale("creating a device-local buffer")
        (name,) = f.gen_names(f.glGenBuffers, 1)
        f.glBindBuffer(GL_COPY_WRITE_BUFFER, name)
        try:
            f.glBufferStorage(GL_COPY_WRITE_BUFFER, size, None, 0)
        finally:
            f.glBindBuffer(GL_COPY_WRITE_BUFFER, 0)
        errors = _drain(self._raw_get_error)
        if errors:
            self._delete_buffers(name)
            raise GLError(f"creating a {size}-byte device-local buffer failed: {', '.join(errors)}")
        return DeviceBuffer(self, name, size)

    def copy_buffer(self, src: int, dst: int, size: int, src_offset: int = 0, dst_offset: int = 0) -> None:
        """GPU-side glCopyBufferSubData between two buffer names (e.g. an SSBO into a readback buffer)."""
        f = self.functions
        f.glBindBuffer(GL_COPY_READ_BUFFER, src)
        f.glBindBuffer(GL_COPY_WRITE_BUFFER, dst)
        try:
            f.glCopyBufferSubData(GL_COPY_READ_BUFFER, GL_COPY_WRITE_BUFFER, src_offset, dst_offset, size)
        finally:
            f.glBindBuffer(GL_COPY_READ_BUFFER, 0)
            f.glBindBuffer(GL_COPY_WRITE_BUFFER, 0)

    def unmap_and_delete_buffer(self, name: int) -> None:
        """Unmap and delete a mapped buffer name (a `MappedBuffer`'s ``release()`` calls this)."""
        f = self.functions
        f.glBindBuffer(GL_COPY_WRITE_BUFFER, name)
        f.glUnmapBuffer(GL_COPY_WRITE_BUFFER)
        f.glBindBuffer(GL_COPY_WRITE_BUFFER, 0)
        self._delete_buffers(name)

    # -- sync and timing ------------------------------------------------------------------------
    def fence(self) -> Fence:
        """A fence after every command issued so far (glFenceSync); poll it with ``signalled()``."""
        sync = self.functions.glFenceSync(GL_SYNC_GPU_COMMANDS_COMPLETE, 0)
        if not sync:
            raise GLError("glFenceSync returned no sync object")
        self.live_syncs += 1
        return Fence(self, sync)

    def live_objects(self, probe: int = 4096) -> LiveObjects:
        """Count the context's live GL objects of each kind by asking the driver about every name up
        to `probe` (glIsBuffer, glIsTexture, ...), whoever made them; sync objects are this layer's
        fences not yet deleted. For leak checks in tests and soak runs (a few ms: not per frame)."""
        counts = {kind: len(names) for kind, names in self.live_names(probe).items()}
        return LiveObjects(**counts, syncs=self.live_syncs)

    def live_names(self, probe: int = 4096) -> dict[str, frozenset[int]]:
        """The names of the context's live GL objects of each kind up to `probe`, as `live_objects`
        counts them (for leak checks that say which objects were left, and who made them)."""
        f = self.functions
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
        return {kind: frozenset(n for n in range(1, probe + 1) if is_kind(n)) for kind, is_kind in checks.items()}

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
        self.functions.glActiveTexture(GL_TEXTURE0 + self.scratch_unit)
        self.functions.glBindTexture(GL_TEXTURE_2D_ARRAY, name)

    def _unbind_scratch(self) -> None:
        self.functions.glActiveTexture(GL_TEXTURE0 + self.scratch_unit)
        self.functions.glBindTexture(GL_TEXTURE_2D_ARRAY, 0)

    def delete_textures(self, *names: int) -> None:
        """Delete texture names (the owner of a `TextureArray` calls this from its ``release()``)."""
        self.functions.delete_names(self.functions.glDeleteTextures, *names)

    def delete_buffers(self, *names: int) -> None:
        """Delete buffer names (the owner of a `DeviceBuffer` calls this from its ``release()``)."""
        self._delete_buffers(*names)

    def _delete_buffers(self, *names: int) -> None:
        self.functions.delete_names(self.functions.glDeleteBuffers, *names)

    def sync_released(self) -> None:
        """A `Fence` deleted its sync object: one fewer live sync (for `live_objects`)."""
        self.live_syncs -= 1

    def is_texture(self, name: int) -> bool:
        return bool(self.functions.glIsTexture(name))

    def is_buffer(self, name: int) -> bool:
        return bool(self.functions.glIsBuffer(name))


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
