"""Block encoders the baker can use, one record per (format, library), behind one small interface.

Every adapter takes a validated slot (an (S, S, 4) uint8 C-contiguous RGBA array, S a multiple of
4, or float texels for BC6H; `bcn.encode_slot` checks that) and returns the slot's blocks, at least
`raw_size` bytes long (`bcn` checks the length). Libraries are imported on first use, so only the
chosen encoders' libraries must be installed; the others are candidates for `texstream bench bake`'s
encoder comparison.

Libraries, as measured (docs/BENCHMARKS.md, "Block-compression encoders"):

ispc      ispc-texcomp, Intel's ISPC Texture Compressor (SIMD kernels). Releases the GIL. Its
          RGBASurface wraps the caller's buffer without copying. Two quirks handled here: BC1 comes
          back in a buffer of one byte per texel, twice its size (the blocks are the first half),
          and BC7 mode 6 blocks can decode an opaque texel's alpha as 254 (see `force_opaque_bc7`).
etcpak    etcpak's BC1-BC5 and its bc7enc-based BC7. Holds the GIL. Checks nothing about the buffer.
quicktex  quicktex's rgbcx-based BC1/BC3/BC4/BC5 (no BC7), levels 0..18.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..config import BC7_QUALITIES
from ..pack.format import TexelFormat

# BC7 quality level -> ispc-texcomp profile, for opaque slots and for slots with alpha < 255.
# Measured on one core: "slow" is 4x slower than "basic" for +0.13 dB, so slow means basic;
# "alpha_veryfast" tries only modes 4-7 (-1.1 dB on the icon), so normal takes "alpha_fast".
ISPC_BC7_PROFILES: dict[str, tuple[str, str]] = {
    "fast": ("ultrafast", "alpha_ultrafast"),
    "balanced": ("ultrafast", "alpha_fast"),
    "normal": ("veryfast", "alpha_fast"),
    "slow": ("basic", "alpha_basic"),
}
# BC7 quality level -> (profile, threshold): opaque blocks whose colours stray from one line by more
# than `threshold` (the sum over the block's 16 texels of the squared distance, in 8-bit steps, to the
# principal axis of their RGB) are encoded again with `profile` after the level's own profile.
# Mode 6 alone (ultrafast) is one line with 16 steps; the partitioned modes veryfast adds cost 15x as
# much a block and pay off where a block holds two colours or more. Measured on one core (CPU time),
# 136² slots of the astronaut / coffee / chelsea photos: threshold 200 re-encodes 15 / 30 / 9 % of
# their blocks, 8.2 MPixel/s at 43.1 / 42.4 / 45.3 dB, against ultrafast's 26 at 39.9 / 40.0 / 44.6
# and veryfast's 1.7 at 43.8 / 42.8 / 46.1; 100: 5.0 MPixel/s at 43.4 / 42.6 / 45.7; 300: 9.0 at
# 43.0 / 42.3 / 45.0 (`texstream bench bake` measures the levels again).
ISPC_BC7_REFINE: dict[str, tuple[str, int]] = {"balanced": ("veryfast", 200)}
# BC7 quality level -> etcpak's (uber level 0..4, max partitions 0..64).
# etcpak has no second pass over picked blocks: "balanced" is its fast preset.
ETCPAK_BC7_PRESETS: dict[str, tuple[int, int]] = {
    "fast": (0, 16),
    "balanced": (0, 16),
    "normal": (1, 64),
    "slow": (4, 64),
}
QUICKTEX_LEVEL = 5  # quicktex's own default; level 18 gains ~0.3 dB at a tenth of the speed

# BC6H: ispc-texcomp's "fast" profile. Measured on one core, 256² texels (colour waves in [0, 1] /
# an HDR sky clipped to [0, 1], checked with texture2ddecoder): veryfast 30 MTexel/s, 35.8 / 54.7 dB;
# fast 4.4 MTexel/s, 41.3 / 56.0 dB; basic 1.7 MTexel/s, 41.3 / 56.2 dB; slow 0.3 MTexel/s, +0.03 dB.
ISPC_BC6H_PROFILE = "fast"
HALF_MAX = 65504.0  # the largest finite half float: BC6H (unsigned) holds [0, HALF_MAX]


def to_half(texels: np.ndarray) -> np.ndarray:
    """RGBA texels (uint8 as v / 255, or float) as C-contiguous float16 in BC6H's range (see the module)."""
    if texels.dtype == np.uint8:
        return (texels * np.float32(1 / 255)).astype(np.float16)
    f = np.nan_to_num(texels.astype(np.float32, copy=False), nan=0.0, posinf=HALF_MAX, neginf=0.0)
    return np.ascontiguousarray(np.clip(f, 0.0, HALF_MAX).astype(np.float16))


@dataclass(frozen=True)
class Encoder:
    """One library's encoder for one format.

    `encode(slot, quality, alpha, srgb)`: `quality` is a BC7 level (`BC7_QUALITIES`; other
    formats ignore it), `alpha` says the slot may hold alpha below 255 (False: treat it as opaque),
    `srgb` says the data is colour (only etcpak's BC7 weights its error by it).
    """

    fmt: TexelFormat
    name: str  # the library's short name: ispc, etcpak, quicktex
    releases_gil: bool  # threads can encode in parallel
    encode: Callable[[np.ndarray, str, bool, bool], bytes]
    # Many slots in one call: an (n, S, S, 4) array -> the n slots' blocks, slot after slot, the
    # same bytes as n `encode` calls. None: `bcn.encode_slots` calls `encode` per slot.
    encode_stack: Callable[[np.ndarray, str, bool, bool], bytes] | None = None
    # A whole (H, W, 4) surface -> its blocks in raster order, each block encoded from its own 16
    # texels alone (so a block shared by two slots' borders is the same in both); the second
    # argument: encode only the first that many columns of each row (read in place). None where the
    # encoding of a block depends on its slot (BC7 picks a profile per slot).
    encode_surface: Callable[[np.ndarray, int], bytes] | None = None


# ---- ispc-texcomp ---------------------------------------------------------------------------------------
@lru_cache(maxsize=16)
def _ispc_bc7_settings(profile: str):  # noqa: ANN202 (the module is imported lazily)
    import ispc_texcomp

    settings = ispc_texcomp.BC7EncSettings.from_profile(profile)
    # Opaque profiles ignore alpha (3 channels) and so pick mode 6 p-bits that decode alpha 254;
    # scoring alpha too leaves few of those for `force_opaque_bc7` to fix (-0.06 dB instead of -0.37
    # at veryfast on the photographs).
    settings.channels = 4
    return settings


@lru_cache(maxsize=1)
def _ispc_bc6h_settings():  # noqa: ANN202 (the module is imported lazily)
    import ispc_texcomp

    return ispc_texcomp.BC6HEncSettings.from_profile(ISPC_BC6H_PROFILE)


def _ispc_bc6h(texels: np.ndarray, width: int, height: int) -> bytes:
    """BC6H (unsigned) blocks of (height, width, 4) texels, in raster order: the kernel reads half
    floats, 8 bytes a texel; each block is encoded from its own 16 texels."""
    import ispc_texcomp

    half = to_half(texels.reshape(height, width, 4))
    return ispc_texcomp.compress_blocks_bc6h(
        ispc_texcomp.RGBASurface(half, width, height, width * 8), _ispc_bc6h_settings()
    )


def _ispc(fmt: TexelFormat) -> Callable[[np.ndarray, str, bool, bool], bytes]:
    def encode(slot: np.ndarray, quality: str, alpha: bool, srgb: bool) -> bytes:
        import ispc_texcomp

        s = slot.shape[0]
        if fmt is TexelFormat.BC6H:
            return _ispc_bc6h(slot, s, s)
        surface = ispc_texcomp.RGBASurface(slot, s, s, s * 4)  # wraps the slot's buffer, no copy
        if fmt is TexelFormat.BC1:
            return ispc_texcomp.compress_blocks_bc1(surface)[: (s // 4) ** 2 * 8]  # over-allocated 2x
        if fmt is TexelFormat.BC3:
            return ispc_texcomp.compress_blocks_bc3(surface)
        # BC4 and BC5 read packed R8 and RG8 texels (Intel's kernels), whatever the surface's name says.
        if fmt is TexelFormat.BC4:
            red = np.ascontiguousarray(slot[..., 0])
            return ispc_texcomp.compress_blocks_bc4(ispc_texcomp.RGBASurface(red, s, s, s))
        if fmt is TexelFormat.BC5:
            red_green = _red_green(slot)
            return ispc_texcomp.compress_blocks_bc5(ispc_texcomp.RGBASurface(red_green, s, s, s * 2))
        alpha_profile = ISPC_BC7_PROFILES[quality][1]
        # The alpha profiles spend bits on alpha; a slot that is opaque throughout gains nothing from them.
        if alpha and slot[..., 3].min() < 255:
            return ispc_texcomp.compress_blocks_bc7(surface, _ispc_bc7_settings(alpha_profile))
        return _ispc_bc7_opaque(slot, quality)

    return encode


def _ispc_stack(fmt: TexelFormat) -> Callable[[np.ndarray, str, bool, bool], bytes]:
    """n slots as one surface S wide and n * S tall: its blocks come out in raster order, which is
    slot after slot, each slot's blocks in its own raster order; the kernels encode every block on
    its own, so the bytes are those of one call per slot, without n calls' overhead."""

    def encode(slots: np.ndarray, quality: str, alpha: bool, srgb: bool) -> bytes:
        import ispc_texcomp

        n, s = slots.shape[0], slots.shape[1]
        tall = slots.reshape(n * s, s, 4)
        blocks = n * (s // 4) ** 2
        if fmt is TexelFormat.BC6H:
            return _ispc_bc6h(tall, s, n * s)
        if fmt is TexelFormat.BC1:
            surface = ispc_texcomp.RGBASurface(tall, s, n * s, s * 4)
            return ispc_texcomp.compress_blocks_bc1(surface)[: blocks * 8]  # over-allocated 2x
        if fmt is TexelFormat.BC3:
            return ispc_texcomp.compress_blocks_bc3(ispc_texcomp.RGBASurface(tall, s, n * s, s * 4))
        if fmt is TexelFormat.BC4:
            red = np.ascontiguousarray(tall[..., 0])
            return ispc_texcomp.compress_blocks_bc4(ispc_texcomp.RGBASurface(red, s, n * s, s))
        if fmt is TexelFormat.BC5:
            red_green = _red_green(tall)
            return ispc_texcomp.compress_blocks_bc5(ispc_texcomp.RGBASurface(red_green, s, n * s, s * 2))
        opaque_profile, alpha_profile = ISPC_BC7_PROFILES[quality]
        # As `_ispc`: slots with alpha below 255 take the alpha profile, the others the opaque one.
        translucent = slots[..., 3].min(axis=(1, 2)) < 255 if alpha else np.zeros(n, bool)
        out = np.empty((n, (s // 4) ** 2 * 16), np.uint8)
        for group, profile in ((~translucent, opaque_profile), (translucent, alpha_profile)):
            count = int(np.count_nonzero(group))
            if not count:
                continue
            part = (slots if count == n else np.ascontiguousarray(slots[group])).reshape(count * s, s, 4)
            if profile == opaque_profile:
                data = _ispc_bc7_opaque(part, quality)
            else:
                surface = ispc_texcomp.RGBASurface(part, s, count * s, s * 4)
                data = ispc_texcomp.compress_blocks_bc7(surface, _ispc_bc7_settings(profile))
            out[group] = np.frombuffer(data, np.uint8).reshape(count, -1)
        return out.tobytes()

    return encode


def _red_green(rgba: np.ndarray) -> np.ndarray:
    """The R and G bytes of (..., 4) uint8 texels, packed: each texel's first two bytes copied as
    one 2-byte element (numpy copies a trailing axis of 2 bytes element by element, ~70x slower)."""
    return np.ascontiguousarray(rgba.view(np.uint16)[..., 0])


def _ispc_surface(fmt: TexelFormat) -> Callable[[np.ndarray], bytes] | None:
    if fmt is TexelFormat.BC7:
        return None

    def encode(surface: np.ndarray, w: int) -> bytes:
        import ispc_texcomp

        h, stride = surface.shape[0], surface.shape[1] * 4  # `surface` may be wider than the `w` columns encoded
        if fmt is TexelFormat.BC6H:
            return _ispc_bc6h(np.ascontiguousarray(surface[:, :w]), w, h)
        if fmt is TexelFormat.BC1:
            return ispc_texcomp.compress_blocks_bc1(ispc_texcomp.RGBASurface(surface, w, h, stride))[: h * w // 2]
        if fmt is TexelFormat.BC3:
            return ispc_texcomp.compress_blocks_bc3(ispc_texcomp.RGBASurface(surface, w, h, stride))
        if fmt is TexelFormat.BC4:
            red = np.ascontiguousarray(surface[:, :w, 0])
            return ispc_texcomp.compress_blocks_bc4(ispc_texcomp.RGBASurface(red, w, h, w))
        red_green = _red_green(surface[:, :w])
        return ispc_texcomp.compress_blocks_bc5(ispc_texcomp.RGBASurface(red_green, w, h, w * 2))

    return encode


def _ispc_bc7_opaque(texels: np.ndarray, quality: str) -> bytes:
    """BC7 blocks of (H, W, 4) opaque texels (sides multiples of 4), in raster order, at `quality`:
    its opaque profile, then the blocks `ISPC_BC7_REFINE` picks encoded again; every mode 6 block
    made to decode alpha 255. Each block's bytes depend on its own 16 texels only."""
    import ispc_texcomp

    h, w = texels.shape[:2]
    surface = ispc_texcomp.RGBASurface(texels, w, h, w * 4)
    data = ispc_texcomp.compress_blocks_bc7(surface, _ispc_bc7_settings(ISPC_BC7_PROFILES[quality][0]))
    refine = ISPC_BC7_REFINE.get(quality)
    if refine is not None:
        profile, threshold = refine
        blocks = texels.reshape(h // 4, 4, w // 4, 4, 4).transpose(0, 2, 1, 3, 4).reshape(-1, 4, 4, 4)
        picked = np.flatnonzero(off_axis_energy(blocks) > threshold)
        if picked.size:
            out = np.frombuffer(data, np.uint8).reshape(-1, 16).copy()
            out[picked] = _ispc_bc7_blocks(blocks[picked], _ispc_bc7_settings(profile))
            data = out.tobytes()
    return force_opaque_bc7(data)


_GATHER_ROW = 32  # blocks side by side in the surface of picked blocks: the kernels run across a row


def _ispc_bc7_blocks(blocks: np.ndarray, settings) -> np.ndarray:  # noqa: ANN001 (imported lazily)
    """(k, 4, 4, 4) blocks of texels -> (k, 16) BC7 blocks, laid out as rows of `_GATHER_ROW` blocks
    (the last row padded with copies of the last block) so the SIMD kernels run full."""
    import ispc_texcomp

    k = blocks.shape[0]
    per_row = min(k, _GATHER_ROW)
    rows = -(-k // per_row)
    padded = np.concatenate([blocks, np.repeat(blocks[-1:], rows * per_row - k, axis=0)])
    surface = np.ascontiguousarray(padded.reshape(rows, per_row, 4, 4, 4).transpose(0, 2, 1, 3, 4))
    surface = surface.reshape(rows * 4, per_row * 4, 4)
    data = ispc_texcomp.compress_blocks_bc7(
        ispc_texcomp.RGBASurface(surface, per_row * 4, rows * 4, per_row * 16), settings
    )
    return np.frombuffer(data, np.uint8).reshape(-1, 16)[:k]


def off_axis_energy(blocks: np.ndarray) -> np.ndarray:
    """Per (4, 4, 4) uint8 block of an (n, 4, 4, 4) stack: the sum over its 16 texels of the squared
    distance (8-bit steps) of their RGB to the line through their mean along their principal axis:
    what no single-line BC7 mode can encode. The covariance is exact (integers) and the rest
    element-wise float64, so the figure is the same on every machine. The axis comes from three power
    iterations: a Rayleigh quotient, so the energy is never under-estimated, only over where no axis
    dominates (noise), and such a block is encoded again, never worse."""
    rgb = np.ascontiguousarray(blocks.reshape(-1, 16, 4)[..., :3].transpose(2, 0, 1)).astype(np.int32)  # (3, n, 16)
    sums = rgb.sum(axis=2)
    # 16 * covariance, exact in int32 (at most 16 * 16 * 255²): 16 * sum(x y) - sum(x) sum(y)
    c = {}
    for i in range(3):
        for j in range(i, 3):
            products = np.einsum("nk,nk->n", rgb[i], rgb[j])
            c[i, j] = c[j, i] = (16 * products - sums[i] * sums[j]).astype(np.float64)
    total = c[0, 0] + c[1, 1] + c[2, 2]
    # Start from the covariance row of the largest variance: far from orthogonal to the principal axis.
    largest = np.argmax(np.stack([c[0, 0], c[1, 1], c[2, 2]]), axis=0)
    v = [np.choose(largest, [c[0, j], c[1, j], c[2, j]]) for j in range(3)]
    for _ in range(3):
        v = [c[i, 0] * v[0] + c[i, 1] * v[1] + c[i, 2] * v[2] for i in range(3)]
        norm = np.sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2])
        norm[norm == 0] = 1.0
        v = [x / norm for x in v]
    along = sum(v[i] * (c[i, 0] * v[0] + c[i, 1] * v[1] + c[i, 2] * v[2]) for i in range(3))
    return np.maximum(total - along, 0.0) / 16


_MODE6_ALPHA_AND_PBITS = (0x3FFF << 49) | (0b11 << 63)  # A0, A1 (7 bits each at 49, 56) and P0, P1 (63, 64)


def force_opaque_bc7(blocks: bytes) -> bytes:
    """Make every mode 6 block decode alpha 255: ispc's opaque profiles leave it at 254 where a p-bit is 0.

    Mode 6 stores RGBA endpoints as 7 bits plus one p-bit shared by the endpoint's four channels,
    so alpha 255 needs A = 127 and p = 1. Setting them moves that endpoint's R, G, B from 2c to
    2c + 1: one step in 255, far below BC7's own error. Opaque profiles use modes 1, 3, 4, 5 and 6
    only; modes 1 and 3 have no alpha (255), and 4 and 5 store it apart from colour (ispc writes 255).
    """
    arr = np.frombuffer(blocks, np.uint8).reshape(-1, 16)
    mode6 = (arr[:, 0] & 0x7F) == 0x40
    if not mode6.any():
        return blocks
    words = arr.copy().view("<u8")  # (n, 2): low and high 64 bits of each little-endian block
    lo = words[:, 0]
    hi = words[:, 1]
    lo[mode6] |= np.uint64(_MODE6_ALPHA_AND_PBITS & 0xFFFF_FFFF_FFFF_FFFF)
    hi[mode6] |= np.uint64(_MODE6_ALPHA_AND_PBITS >> 64)
    return words.tobytes()


# ---- etcpak ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=8)
def _etcpak_bc7_params(quality: str, perceptual: bool):  # noqa: ANN202
    import etcpak

    uber, partitions = ETCPAK_BC7_PRESETS[quality]
    p = etcpak.BC7CompressBlockParams()
    if perceptual:
        p.init_perceptual_weights()
    else:
        p.init_linear_weights()
    p.m_uber_level = uber
    p.m_max_partitions = partitions
    return p


def _etcpak(fmt: TexelFormat) -> Callable[[np.ndarray, str, bool, bool], bytes]:
    def encode(slot: np.ndarray, quality: str, alpha: bool, srgb: bool) -> bytes:
        import etcpak

        s = slot.shape[0]
        if fmt is TexelFormat.BC7:
            return etcpak.compress_bc7(slot, s, s, _etcpak_bc7_params(quality, srgb))
        fn = {
            TexelFormat.BC1: etcpak.compress_bc1,
            TexelFormat.BC3: etcpak.compress_bc3,
            TexelFormat.BC4: etcpak.compress_bc4,
            TexelFormat.BC5: etcpak.compress_bc5,
        }[fmt]
        return fn(slot, s, s)

    return encode


# ---- quicktex -------------------------------------------------------------------------------------------
@lru_cache(maxsize=8)
def _quicktex_encoder(fmt: TexelFormat):  # noqa: ANN202
    from quicktex.s3tc.bc1 import BC1Encoder
    from quicktex.s3tc.bc3 import BC3Encoder
    from quicktex.s3tc.bc4 import BC4Encoder
    from quicktex.s3tc.bc5 import BC5Encoder

    if fmt is TexelFormat.BC1:
        return BC1Encoder(QUICKTEX_LEVEL)
    if fmt is TexelFormat.BC3:
        return BC3Encoder(QUICKTEX_LEVEL)
    if fmt is TexelFormat.BC4:
        return BC4Encoder(0)  # red; its default is alpha
    return BC5Encoder(0, 1)


def _quicktex(fmt: TexelFormat) -> Callable[[np.ndarray, str, bool, bool], bytes]:
    def encode(slot: np.ndarray, quality: str, alpha: bool, srgb: bool) -> bytes:
        import quicktex

        s = slot.shape[0]
        raw = quicktex.RawTexture.frombytes(slot.reshape(-1), s, s)  # it wants a flat buffer
        return _quicktex_encoder(fmt).encode(raw).tobytes()

    return encode


_BLOCK_FORMATS = (TexelFormat.BC1, TexelFormat.BC3, TexelFormat.BC4, TexelFormat.BC5, TexelFormat.BC7)

ENCODERS: dict[tuple[TexelFormat, str], Encoder] = {}
for _fmt in _BLOCK_FORMATS:
    ENCODERS[(_fmt, "ispc")] = Encoder(_fmt, "ispc", True, _ispc(_fmt), _ispc_stack(_fmt), _ispc_surface(_fmt))
    ENCODERS[(_fmt, "etcpak")] = Encoder(_fmt, "etcpak", False, _etcpak(_fmt))
    if _fmt is not TexelFormat.BC7:
        ENCODERS[(_fmt, "quicktex")] = Encoder(_fmt, "quicktex", False, _quicktex(_fmt))
_bc6h = TexelFormat.BC6H  # ispc only: neither etcpak nor quicktex encodes BC6H
ENCODERS[(_bc6h, "ispc")] = Encoder(_bc6h, "ispc", True, _ispc(_bc6h), _ispc_stack(_bc6h), _ispc_surface(_bc6h))

__all__ = ["BC7_QUALITIES", "ENCODERS", "HALF_MAX", "Encoder", "force_opaque_bc7", "off_axis_energy", "to_half"]
