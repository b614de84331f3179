"""GL enum values, GL error names, and the texel-format table: how each texstream format is stored in GL.

The values are plain ints, as the raw calls in `gl_ext` and `objects` pass them to GL.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..pack.format import TexelFormat
from .loader import Feature

__all__ = [
    "GLFormat",
    "GL_ALREADY_SIGNALED",
    "GL_CLAMP_TO_EDGE",
    "GL_CLIENT_STORAGE_BIT",
    "GL_COMPRESSED_RED_RGTC1",
    "GL_COMPRESSED_RGBA_BPTC_UNORM",
    "GL_COMPRESSED_RGB_BPTC_UNSIGNED_FLOAT",
    "GL_COMPRESSED_RGBA_S3TC_DXT5_EXT",
    "GL_COMPRESSED_RGB_S3TC_DXT1_EXT",
    "GL_COMPRESSED_RG_RGTC2",
    "GL_COMPRESSED_SRGB_ALPHA_BPTC_UNORM",
    "GL_COMPRESSED_SRGB_ALPHA_S3TC_DXT5_EXT",
    "GL_COMPRESSED_SRGB_S3TC_DXT1_EXT",
    "GL_CONDITION_SATISFIED",
    "GL_COPY_READ_BUFFER",
    "GL_COPY_WRITE_BUFFER",
    "GL_DELETE_STATUS",
    "GL_ERROR_NAMES",
    "GL_GPU_MEMORY_INFO_CURRENT_AVAILABLE_VIDMEM_NVX",
    "GL_GPU_MEMORY_INFO_DEDICATED_VIDMEM_NVX",
    "GL_GPU_MEMORY_INFO_EVICTED_MEMORY_NVX",
    "GL_GPU_MEMORY_INFO_EVICTION_COUNT_NVX",
    "GL_GPU_MEMORY_INFO_TOTAL_AVAILABLE_MEMORY_NVX",
    "GL_LINEAR",
    "GL_MAP_COHERENT_BIT",
    "GL_MAP_PERSISTENT_BIT",
    "GL_MAP_READ_BIT",
    "GL_MAP_WRITE_BIT",
    "GL_MAX_ARRAY_TEXTURE_LAYERS",
    "GL_MAX_COMBINED_TEXTURE_IMAGE_UNITS",
    "GL_MAX_FRAGMENT_SHADER_STORAGE_BLOCKS",
    "GL_MAX_IMAGE_UNITS",
    "GL_MAX_SHADER_STORAGE_BLOCK_SIZE",
    "GL_MAX_SHADER_STORAGE_BUFFER_BINDINGS",
    "GL_MAX_TEXTURE_MAX_ANISOTROPY",
    "GL_MAX_TEXTURE_SIZE",
    "GL_NEAREST",
    "GL_NO_ERROR",
    "GL_PIXEL_PACK_BUFFER",
    "GL_PIXEL_UNPACK_BUFFER",
    "GL_QUERY_RESULT",
    "GL_QUERY_RESULT_AVAILABLE",
    "GL_RGBA",
    "GL_RGBA16UI",
    "GL_RGBA8",
    "GL_RGBA_INTEGER",
    "GL_SRGB8_ALPHA8",
    "GL_SYNC_FLUSH_COMMANDS_BIT",
    "GL_SYNC_GPU_COMMANDS_COMPLETE",
    "GL_TEXTURE0",
    "GL_TEXTURE_2D",
    "GL_TEXTURE_2D_ARRAY",
    "GL_TEXTURE_BASE_LEVEL",
    "GL_TEXTURE_FREE_MEMORY_ATI",
    "GL_TEXTURE_INTERNAL_FORMAT",
    "GL_TEXTURE_MAG_FILTER",
    "GL_TEXTURE_MAX_ANISOTROPY",
    "GL_TEXTURE_MAX_LEVEL",
    "GL_TEXTURE_MIN_FILTER",
    "GL_TEXTURE_WRAP_S",
    "GL_TEXTURE_WRAP_T",
    "GL_TIMEOUT_EXPIRED",
    "GL_TIME_ELAPSED",
    "GL_UNPACK_ALIGNMENT",
    "GL_UNPACK_COMPRESSED_BLOCK_DEPTH",
    "GL_UNPACK_COMPRESSED_BLOCK_HEIGHT",
    "GL_UNPACK_COMPRESSED_BLOCK_SIZE",
    "GL_UNPACK_COMPRESSED_BLOCK_WIDTH",
    "GL_UNPACK_IMAGE_HEIGHT",
    "GL_UNSIGNED_BYTE",
    "GL_UNSIGNED_SHORT",
    "GL_WAIT_FAILED",
    "gl_format",
]

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
GL_UNPACK_IMAGE_HEIGHT = 0x806E
GL_UNPACK_COMPRESSED_BLOCK_WIDTH = 0x9127
GL_UNPACK_COMPRESSED_BLOCK_HEIGHT = 0x9128
GL_UNPACK_COMPRESSED_BLOCK_DEPTH = 0x9129
GL_UNPACK_COMPRESSED_BLOCK_SIZE = 0x912A
GL_UNSIGNED_BYTE = 0x1401
GL_MAX_ARRAY_TEXTURE_LAYERS = 0x88FF
GL_MAX_TEXTURE_SIZE = 0x0D33
GL_MAX_COMBINED_TEXTURE_IMAGE_UNITS = 0x8B4D
GL_MAX_SHADER_STORAGE_BUFFER_BINDINGS = 0x90DD
GL_MAX_FRAGMENT_SHADER_STORAGE_BLOCKS = 0x90DA
GL_MAX_SHADER_STORAGE_BLOCK_SIZE = 0x90DE
GL_MAX_IMAGE_UNITS = 0x8F38

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
GL_COMPRESSED_RGB_BPTC_UNSIGNED_FLOAT = 0x8E8F  # BC6H unsigned (UF16)


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
    (TexelFormat.BC6H, False): (
        GL_COMPRESSED_RGB_BPTC_UNSIGNED_FLOAT,
        "GL_COMPRESSED_RGB_BPTC_UNSIGNED_FLOAT",
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
