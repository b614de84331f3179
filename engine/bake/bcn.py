"""Block compression of one tile slot with etcpak (BC1/BC3/BC4/BC5/BC7), or raw RGBA8.

etcpak checks nothing: it reads ``width * height * 4`` bytes from whatever buffer it is given and
writes blocks of 4x4 texels, so `encode_slot` validates shape, dtype, contiguity and the multiple of
4 first, and checks the length of what comes back. Channel use: BC1 (RGB, opaque: etcpak writes
no 1-bit alpha), BC3 (RGBA), BC4 (R), BC5 (R, G), BC7 (RGBA). etcpak's ``decompress_*`` functions
are never called (they crash); tests decode with texture2ddecoder.

etcpak holds the GIL while it encodes, which is why the baker runs encoders in worker processes.
"""

from __future__ import annotations

import logging
from functools import lru_cache

import etcpak
import numpy as np

from ..pack.format import TexelFormat

log = logging.getLogger(__name__)

# BC7 quality presets -> (uber level 0..4, max partitions 0..64): slower searches, better blocks.
BC7_PRESETS: dict[str, tuple[int, int]] = {
    "fast": (0, 16),
    "normal": (1, 64),
    "slow": (4, 64),
}


def raw_size(fmt: TexelFormat, slot_size: int) -> int:
    """Bytes of one encoded slot (what PackHeader.tile_raw_size gives for the same geometry)."""
    blocks = slot_size // 4
    return blocks * blocks * TexelFormat(fmt).block_bytes


@lru_cache(maxsize=8)
def bc7_params(quality: str, perceptual: bool) -> etcpak.BC7CompressBlockParams:
    """etcpak BC7 parameters for a preset; perceptual (YCbCr-weighted) error for sRGB colour."""
    try:
        uber, partitions = BC7_PRESETS[quality]
    except KeyError:
        raise ValueError(f"bc7 quality must be one of {', '.join(BC7_PRESETS)}, got {quality!r}") from None
    p = etcpak.BC7CompressBlockParams()
    if perceptual:
        p.init_perceptual_weights()
    else:
        p.init_linear_weights()
    p.m_uber_level = uber
    p.m_max_partitions = partitions
    return p


def encode_slot(slot: np.ndarray, fmt: TexelFormat, *, bc7_quality: str = "normal", srgb: bool = True) -> bytes:
    """Encode an (S, S, 4) uint8 RGBA slot; returns exactly `raw_size(fmt, S)` bytes.

    `srgb` only steers BC7's error metric (perceptual for colour, plain RGBA for linear data).
    """
    fmt = TexelFormat(fmt)
    if not isinstance(slot, np.ndarray) or slot.dtype != np.uint8 or slot.ndim != 3 or slot.shape[2] != 4:
        raise ValueError(f"slot must be an (S, S, 4) uint8 array, got {getattr(slot, 'shape', type(slot))}")
    s = slot.shape[0]
    if slot.shape[1] != s or s < 4 or s % 4:
        raise ValueError(f"slot must be square with a side that is a multiple of 4, got {slot.shape[:2]}")
    if not slot.flags.c_contiguous:
        raise ValueError("slot must be C-contiguous (etcpak reads the buffer as packed rows)")
    if fmt is TexelFormat.RGBA8:
        out = slot.tobytes()
    elif fmt is TexelFormat.BC1:
        out = etcpak.compress_bc1(slot, s, s)
    elif fmt is TexelFormat.BC3:
        out = etcpak.compress_bc3(slot, s, s)
    elif fmt is TexelFormat.BC4:
        out = etcpak.compress_bc4(slot, s, s)
    elif fmt is TexelFormat.BC5:
        out = etcpak.compress_bc5(slot, s, s)
    else:
        out = etcpak.compress_bc7(slot, s, s, bc7_params(bc7_quality, srgb))
    expected = raw_size(fmt, s)
    if len(out) != expected:
        raise RuntimeError(
            f"{fmt.name.lower()} encoder returned {len(out)} bytes for a {s}^2 slot, expected {expected}"
        )
    return bytes(out)


__all__ = ["BC7_PRESETS", "bc7_params", "encode_slot", "raw_size"]
