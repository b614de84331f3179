"""Block compression of one tile slot with the chosen encoder per format (BC1/BC3/BC4/BC5/BC6H/BC7), or raw RGBA8.

The candidates live in `encoders.ENCODERS`, one record per (format, library); `CHOSEN` names the one
the baker uses for each format, picked on measured quality first and speed second (the figures and
the reasons are in docs/BENCHMARKS.md, "Block-compression encoders"; `texstream bench bake` measures
them again). Swapping an encoder is one entry in `CHOSEN`.

The native encoders check nothing: they read ``S * S * 4`` bytes from whatever buffer they are given,
so `encode_slot` validates shape, dtype, contiguity and the multiple of 4 first, and checks the length
of what comes back. Channel use: BC1 (RGB, opaque), BC3 (RGBA), BC4 (R), BC5 (R, G), BC7 (RGBA),
BC6H (RGB, unsigned half float).

Texels are uint8 RGBA, or float32 RGBA linear values for BC6H (the HDR bake); BC6H also takes uint8
texels as v / 255. Float texels are clipped to the format's range, [0, 65504], NaN to 0, then
rounded to half floats, the encoder's input.

ispc-texcomp releases the GIL while it encodes; the baker still runs its stages in worker processes
(mips, borders and supercompression are Python and numpy around the encoder).
"""

from __future__ import annotations

import numpy as np

from ..pack.format import TexelFormat
from .encoders import BC7_QUALITIES, ENCODERS, HALF_MAX, Encoder, to_half

CHOSEN: dict[TexelFormat, str] = {
    TexelFormat.BC1: "ispc",
    TexelFormat.BC3: "ispc",
    TexelFormat.BC4: "ispc",
    TexelFormat.BC5: "ispc",
    TexelFormat.BC7: "ispc",
    TexelFormat.BC6H: "ispc",
}


def raw_size(fmt: TexelFormat, slot_size: int) -> int:
    """Bytes of one encoded slot (what PackHeader.tile_raw_size gives for the same geometry)."""
    blocks = slot_size // 4
    return blocks * blocks * TexelFormat(fmt).block_bytes


def chosen_encoder(fmt: TexelFormat) -> Encoder:
    return ENCODERS[(TexelFormat(fmt), CHOSEN[TexelFormat(fmt)])]


def _texels_ok(a: object, fmt: TexelFormat) -> bool:
    """Whether `a` has a dtype `fmt` encodes from: uint8, or float32 / float16 for BC6H."""
    dtype = getattr(a, "dtype", None)
    return dtype == np.uint8 or (fmt.float_texels and dtype in (np.float32, np.float16))


def encode_slot(
    slot: np.ndarray, fmt: TexelFormat, *, bc7_quality: str = "normal", srgb: bool = True, alpha: bool = True
) -> bytes:
    """Encode an (S, S, 4) uint8 RGBA slot (float32 too for BC6H); returns exactly `raw_size(fmt, S)` bytes.

    `alpha`: the source has real alpha. False lets BC7 treat every slot as opaque (alpha decodes as
    255 whatever the slot holds); True still encodes a slot that is opaque throughout as opaque.
    `srgb` only matters to encoders that weight colour error perceptually (none of the chosen ones).
    """
    fmt = TexelFormat(fmt)
    if not isinstance(slot, np.ndarray) or not _texels_ok(slot, fmt) or slot.ndim != 3 or slot.shape[2] != 4:
        raise ValueError(f"slot must be an (S, S, 4) uint8 array, got {getattr(slot, 'shape', type(slot))}")
    s = slot.shape[0]
    if slot.shape[1] != s or s < 4 or s % 4:
        raise ValueError(f"slot must be square with a side that is a multiple of 4, got {slot.shape[:2]}")
    if not slot.flags.c_contiguous:
        raise ValueError("slot must be C-contiguous (the encoders read the buffer as packed rows)")
    if bc7_quality not in BC7_QUALITIES:
        raise ValueError(f"bc7 quality must be one of {', '.join(BC7_QUALITIES)}, got {bc7_quality!r}")
    if fmt is TexelFormat.RGBA8:
        return slot.tobytes()
    enc = chosen_encoder(fmt)
    out = enc.encode(slot, bc7_quality, alpha, srgb)
    expected = raw_size(fmt, s)
    if len(out) != expected:
        raise RuntimeError(
            f"{fmt.name.lower()} encoder {enc.name} returned {len(out)} bytes for a {s}^2 slot, expected {expected}"
        )
    return bytes(out)


def encode_slots(
    slots: np.ndarray, fmt: TexelFormat, *, bc7_quality: str = "normal", srgb: bool = True, alpha: bool = True
) -> bytes:
    """Encode an (n, S, S, 4) uint8 (or BC6H's float) stack of slots at once: the bytes of `encode_slot` on each
    slot, one after the other (n * `raw_size(fmt, S)` bytes), in one encoder call where the encoder
    takes a stack (`Encoder.encode_stack`)."""
    fmt = TexelFormat(fmt)
    if not isinstance(slots, np.ndarray) or not _texels_ok(slots, fmt) or slots.ndim != 4 or slots.shape[3] != 4:
        raise ValueError(f"slots must be an (n, S, S, 4) uint8 array, got {getattr(slots, 'shape', type(slots))}")
    n, s = slots.shape[0], slots.shape[1]
    if slots.shape[2] != s or s < 4 or s % 4:
        raise ValueError(f"slots must be square with a side that is a multiple of 4, got {slots.shape[1:3]}")
    if not slots.flags.c_contiguous:
        raise ValueError("slots must be C-contiguous (the encoders read the buffer as packed rows)")
    if bc7_quality not in BC7_QUALITIES:
        raise ValueError(f"bc7 quality must be one of {', '.join(BC7_QUALITIES)}, got {bc7_quality!r}")
    if n == 0:
        return b""
    if fmt is TexelFormat.RGBA8:
        return slots.tobytes()
    enc = chosen_encoder(fmt)
    if enc.encode_stack is None:
        return b"".join(encode_slot(slot, fmt, bc7_quality=bc7_quality, srgb=srgb, alpha=alpha) for slot in slots)
    out = enc.encode_stack(slots, bc7_quality, alpha, srgb)
    expected = n * raw_size(fmt, s)
    if len(out) != expected:
        raise RuntimeError(
            f"{fmt.name.lower()} encoder {enc.name} returned {len(out)} bytes for {n} {s}^2 slots, expected {expected}"
        )
    return bytes(out)


def encodes_blocks_alone(fmt: TexelFormat) -> bool:
    """Whether the chosen encoder of `fmt` encodes a whole surface block by block
    (`encode_surface`): each 4x4 block from its own texels, whatever slot it belongs to."""
    fmt = TexelFormat(fmt)
    return fmt is not TexelFormat.RGBA8 and chosen_encoder(fmt).encode_surface is not None


def encode_surface(surface: np.ndarray, fmt: TexelFormat, columns: int | None = None) -> np.ndarray:
    """The blocks of an (H, W, 4) uint8 surface (H, W multiples of 4), as an (H/4, W/4, block
    bytes) uint8 array; only where `encodes_blocks_alone(fmt)`. Slots cut from this grid (block
    rows and columns at multiples of T/4) are the bytes `encode_slot` gives each slot.

    `columns`: only the first that many columns of each row (a multiple of 4), read in place from
    the wider surface: the grid is then (H/4, columns/4, block bytes)."""
    fmt = TexelFormat(fmt)
    if (
        not isinstance(surface, np.ndarray)
        or not _texels_ok(surface, fmt)
        or surface.ndim != 3
        or surface.shape[2] != 4
    ):
        raise ValueError(f"surface must be an (H, W, 4) uint8 array, got {getattr(surface, 'shape', type(surface))}")
    h = surface.shape[0]
    w = surface.shape[1] if columns is None else columns
    if not 0 < w <= surface.shape[1]:
        raise ValueError(f"columns must be in 1..{surface.shape[1]}, got {columns}")
    if h % 4 or w % 4 or not h or not w:
        raise ValueError(f"surface sides must be positive multiples of 4, got {h} x {w}")
    if not surface.flags.c_contiguous:
        raise ValueError("surface must be C-contiguous (the encoders read the buffer as packed rows)")
    enc = chosen_encoder(fmt)
    if enc.encode_surface is None:
        raise ValueError(f"the {fmt.name.lower()} encoder {enc.name} does not encode a surface block by block")
    out = enc.encode_surface(surface, w)
    bb = fmt.block_bytes
    if len(out) < (h // 4) * (w // 4) * bb:
        raise RuntimeError(f"{fmt.name.lower()} encoder {enc.name} returned {len(out)} bytes for {h} x {w} texels")
    return np.frombuffer(out, np.uint8, (h // 4) * (w // 4) * bb).reshape(h // 4, w // 4, bb)


__all__ = [
    "BC7_QUALITIES",
    "CHOSEN",
    "HALF_MAX",
    "chosen_encoder",
    "encode_slot",
    "encode_slots",
    "encode_surface",
    "encodes_blocks_alone",
    "raw_size",
    "to_half",
]
