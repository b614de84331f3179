"""Gamma-correct mip levels, computed in row bands so no level is ever held whole.

Colour data in sRGB is decoded to linear light with the exact sRGB transfer function (a 256-entry
table built in float64), filtered in float32, and re-encoded; alpha and linear data (normal maps,
masks, anything baked with ``srgb=False``) are filtered as they are.

Filter: a 2x2 box on the pack's ceil-halved geometry. Texel ``i`` of level ``l`` is the mean of
texels ``2i`` and ``2i + 1`` of level ``l - 1`` in each axis; at an odd edge the missing texel is
taken by the address mode (clamp repeats the edge texel, wrap takes texel 0 of the same level).
Why a box and not a wider kernel such as the [1, 3, 3, 1] / 8 tent: the box footprint is exactly
the one the format describes, a band of ``2^k`` rows of level ``l`` makes the matching rows of level
``l + k`` on its own (no rows from neighbouring bands, so bands are computed in parallel without
exchanging data), and under wrap the only cross-image dependency is the odd-edge texel (a wider
kernel needs both ends of every level before either end can be finished). It is also what GPUs
use for ``glGenerateMipmap``, so streamed levels look like driver-made ones. Aliasing of very fine
periodic detail is the known cost.

Alpha. Colour with real alpha (``Transfer.premultiplied``) is filtered premultiplied, in linear
light: a texel of the next level has colour ``sum(c * a) / sum(a)`` over its 2x2 footprint and
alpha ``mean(a)``, so the colour of transparent texels never leaks into their neighbours (the
dark or tinted fringe around cut-outs); a footprint with ``sum(a) == 0`` gets colour 0, which
`bleed` then replaces. Opaque bands take the straight path, which gives the same bits for alpha 1.

Bleeding (`bleed`). The colour of a texel whose stored alpha is 0 is never seen when it is
blended, but bilinear filtering mixes it into its visible neighbours, and a block encoder spends
endpoints on it. So before a level is cut into tiles, such texels take the colour around them, by
push-pull on the BC block grid: the alpha-weighted mean colour of their aligned 2x2 group if any
texel of it is visible, else of their aligned 4x4 block (every mixed block is filled from inside
itself, so its endpoints fit only the visible colour); fully transparent blocks are then filled by
`BLEED_BLOCKS` rounds of dilation over the block grid (each round fills an empty block with the
mean of its filled neighbours, reaching ``BLEED_ROWS`` texels from any visible texel), and blocks
farther away than that take the mean colour of their block row (0 when the row has none): they sit
inside fully transparent regions, where no filter or encoder can see them. Why not a full
push-pull up the whole pyramid: a band holds only a few levels and a few rows of context, and every
band that holds a texel (content or border) must give it the same colour so that borders agree
with the neighbouring tile. The 4x4 blocks are aligned in level texels (slot origins are multiples
of 4) and the dilation reads ``BLEED_ROWS`` rows either side, which the baker adds to each band's
margin; rows past the level's edges count as transparent (no wrap across the seam). Bled colour
is for storage only: the next level is made from the unbled rows (premultiplied, the colour of
alpha-0 texels has no weight).

The chain stays in float32 linear light: level ``l + 1`` is made from the unquantized level ``l``,
and only the copies cut into tiles are rounded to 8 bits. Float texels (``Transfer.float_texels``,
the HDR bake to BC6H) are never rounded here: the tiles are cut from the float32 levels themselves,
from level 0 (a float source's linear rows) down, and the encoder takes them as they are.

Speed matters (a 16K^2 level 0 is 268 MTexel), so the two per-texel steps use table lookups that
numpy runs as one gather each:

* decode + first reduction: the bytes of each texel are read as two little-endian u16 pairs
  (R,G) and (B,A), and one 65536-entry table maps a pair to two float32 at once. For sRGB the
  table also applies the sRGB curve to alpha, which is exact for 0 and 255; sources with other
  alpha values get alpha recomputed from the bytes (``Transfer.alpha``).
* encode (sRGB): the top 20 bits of a non-negative float32 (exponent and 11 mantissa bits) index
  a 1 MiB table holding the rounded 8-bit code of the bin's midpoint. That is exact except for
  values within 2^-12 (relative) of a rounding boundary, which may land one code off (measured:
  0.7 % of random values, never more than one code). Negative values and NaN encode as 0.
  Alpha and linear data are encoded arithmetically, round(v * 255) with ties up.

Where the compiled helper is built (`engine/native/_native.c`, the default) both steps run there, to
the same bits, and a band's first two reductions run as one pass (`band_levels`' ``fuse``): the
level after the band's 8-bit rows comes out as its 8-bit codes, the one after that as float32,
and the middle level's float rows (16 bytes a texel, a quarter of the band's texels) are never
written to memory and read back. Measured on the 2-core box (8192² photo, one process): mip
reduction and re-encoding went from 19 % to 15 % of a band's CPU time for BC1 + zstd (155 to 119 ms
a bake), from 25 % to 16 % for BC5 + zstd (195 to 105 ms).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..pack.format import AddressMode

log = logging.getLogger(__name__)

_CHUNK_ROWS = 16  # rows per inner step of the encoder
_CHUNK_TEXELS = 1 << 16  # texels per inner step of the reduction: its temporaries stay in L2
_ENC_SHIFT = 12  # float32 bits >> 12: 1 sign, 8 exponent, 11 mantissa bits -> 2^20-entry table
BLEED_BLOCKS = 4  # dilation rounds over the 4x4 block grid of a level (see `bleed`)
BLEED_ROWS = 4 * BLEED_BLOCKS  # rows of context `bleed` reads beyond the rows it fills


# ---- transfer functions (float64, exact) ----------------------------------------------------------
def srgb_to_linear(v: np.ndarray) -> np.ndarray:
    """The sRGB electro-optical transfer function on values in [0, 1] (float64)."""
    v = np.asarray(v, np.float64)
    return np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)


def linear_to_srgb(v: np.ndarray) -> np.ndarray:
    """Inverse of `srgb_to_linear`, on values clipped to [0, 1] (float64)."""
    v = np.clip(np.asarray(v, np.float64), 0.0, 1.0)
    return np.where(v <= 0.0031308, v * 12.92, 1.055 * v ** (1 / 2.4) - 0.055)


@lru_cache(maxsize=2)
def decode_table(srgb: bool) -> np.ndarray:
    """float32[256]: 8-bit code -> linear value (sRGB curve or v / 255)."""
    v = np.arange(256) / 255.0
    return (srgb_to_linear(v) if srgb else v).astype(np.float32)


@lru_cache(maxsize=2)
def _pair_table(srgb: bool) -> np.ndarray:
    """uint64[65536]: a u16 holding two 8-bit codes -> their two float32 values / 4, as one 8-byte
    word (the 2x2 box's 1/4 applied in the table: scaling by a power of two is exact)."""
    t = decode_table(srgb) * np.float32(0.25)  # exact: a power of two
    i = np.arange(65536)
    pair = np.empty((65536, 2), np.float32)
    pair[:, 0] = t[i & 255]
    pair[:, 1] = t[i >> 8]
    return pair.view(np.uint64).ravel()


@lru_cache(maxsize=2)
def _encode_table(srgb: bool) -> np.ndarray:
    """uint8[2^20]: float32 bits >> 12 -> rounded 8-bit code of the bin's midpoint.

    Only the bins between 2^-14 and 1 need the transfer function: every non-negative bin below
    encodes as 0 (its value times 255, or 255 * 12.92 for sRGB, is under 0.2), those from 1.0 to
    +inf as 255, and NaN (every bin past +inf: a midpoint has a mantissa bit set) and the negative
    bins as 0. Computing just those 2^15 bins builds the table in a millisecond instead of a third
    of a second of every bake's start."""
    n = 1 << (32 - _ENC_SHIFT)
    lo = int(np.array(2.0**-14, np.float32).view(np.uint32)) >> _ENC_SHIFT
    one = int(np.array(1.0, np.float32).view(np.uint32)) >> _ENC_SHIFT
    inf = int(np.array(np.inf, np.float32).view(np.uint32)) >> _ENC_SHIFT
    code = np.zeros(n, np.uint8)
    bins = np.arange(lo, one, dtype=np.uint64)
    x = ((bins << _ENC_SHIFT) + (1 << (_ENC_SHIFT - 1))).astype(np.uint32).view(np.float32).astype(np.float64)
    code[lo:one] = np.rint((linear_to_srgb(x) if srgb else x) * 255.0)
    code[one:inf] = 255
    return code


_use_native = True


def use_native_reduce(enabled: bool) -> bool:
    """Reduce rows and encode texels with the compiled helper when it is built (the default) or
    with numpy (False); both give the same bits. Returns the previous setting (for tests and benchmarks)."""
    global _use_native
    previous, _use_native = _use_native, bool(enabled)
    return previous


def _native_reduce(dtype: type):  # noqa: ANN202 (a ctypes function or None)
    if not _use_native:
        return None
    from ..native import reduce_f32, reduce_rgba8

    return reduce_rgba8() if dtype is np.uint8 else reduce_f32()


def _native_encode():  # noqa: ANN202 (a ctypes function or None)
    if not _use_native:
        return None
    from ..native import encode_f32

    return encode_f32()


def _check_native(status: int) -> None:
    """Raise for a compiled loop's refusal (a geometry it does not take, or no memory for its scratch
    row): the callers pass checked arrays, so this is a bug or an exhausted heap, never bad input."""
    if status == -2:
        raise MemoryError("the compiled mip loop could not allocate its scratch row")
    if status != 0:
        raise RuntimeError(f"the compiled mip loop refused its arguments (status {status})")


def _encode_plain(f32: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Linear values -> round(v * 255), clipped, NaN -> 0. Ties (common: means of four 8-bit values)
    round up; the 1/512 bias makes that hold despite float32 error in the means."""
    n = f32.shape[0]
    tmp = np.empty((min(n, _CHUNK_ROWS),) + f32.shape[1:], np.float32)
    for r in range(0, n, _CHUNK_ROWS):
        m = min(_CHUNK_ROWS, n - r)
        t = tmp[:m]
        np.multiply(f32[r : r + m], np.float32(255.0), out=t)
        t += np.float32(0.5 + 1 / 512)
        np.fmax(t, np.float32(0.0), out=t)  # fmax, not maximum: NaN -> 0
        np.minimum(t, np.float32(255.0), out=t)
        out[r : r + m] = t  # float -> uint8 truncates: floor of a non-negative value
    return out


# ---- one texel format's transfer -------------------------------------------------------------------
@dataclass(frozen=True)
class Transfer:
    """How 8-bit texels map to the linear float32 values that are filtered.

    srgb:  colour channels (RGB) use the sRGB curve; alpha never does.
    alpha: channel 3 may hold values other than 0 and 255 (else it is opaque or a 0/255 mask,
           for which the fast path is exact).
    premultiplied: colour is filtered weighted by alpha (colour with real alpha; see the module
           docstring); implies `alpha`.
    float_texels: tiles hold float texels (BC6H): `encode` keeps the float32 values.
    """

    srgb: bool
    alpha: bool = True
    premultiplied: bool = False
    float_texels: bool = False

    def decode(self, u8: np.ndarray) -> np.ndarray:
        """(..., 4) uint8 -> (..., 4) float32 linear."""
        out = decode_table(self.srgb)[u8]
        if self.srgb:
            out[..., 3] = u8[..., 3] * np.float32(1 / 255)
        return out

    def encode(self, f32: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """(n, w, 4) float32 linear -> uint8 (see the module docstring for the rounding); with
        `float_texels`, the float32 rows themselves (the block encoder rounds them to half floats)."""
        if f32.dtype != np.float32 or f32.ndim != 3 or f32.shape[2] != 4:
            raise ValueError(f"expected (rows, width, 4) float32, got {f32.shape} {f32.dtype}")
        if self.float_texels:
            return f32
        n, w, _ = f32.shape
        if out is None:
            out = np.empty((n, w, 4), np.uint8)
        native = _native_encode() if n and w and out.flags.c_contiguous else None
        if native is not None:  # the same bits in one pass (_native.c)
            src = np.ascontiguousarray(f32)
            table = _encode_table(True)
            mask = (0b0111 if self.alpha else 0b1111) if self.srgb else 0
            _check_native(native(src.ctypes.data, n, w, w * 4, table.ctypes.data, mask, out.ctypes.data, w * 4))
            return out
        if not self.srgb:
            return _encode_plain(f32, out)
        table = _encode_table(True)
        bits = np.ascontiguousarray(f32).view(np.uint32)
        idx = np.empty((min(n, _CHUNK_ROWS), w, 4), np.uint32)
        for r in range(0, n, _CHUNK_ROWS):
            m = min(_CHUNK_ROWS, n - r)
            np.right_shift(bits[r : r + m], _ENC_SHIFT, out=idx[:m])
            np.take(table, idx[:m], mode="clip", out=out[r : r + m])
        if self.alpha:
            _encode_plain(f32[..., 3:], out[..., 3:])
        return out

    # ---- 2x2 box reduction ----------------------------------------------------------------------
    def reduce(self, rows: np.ndarray, extra: np.ndarray | None, mode: AddressMode) -> np.ndarray:
        """Halve a block of rows: (m, w, 4) -> (ceil(m / 2), ceil(w / 2), 4) float32 linear.

        `rows` is uint8 (encoded texels) or float32 (linear). When `m` is odd, `extra` is the row
        the address mode puts after the last one (the level's odd edge). Columns: an odd width's
        missing last texel follows `mode` (clamp: the edge texel again; wrap: column 0).
        """
        m, w = rows.shape[0], rows.shape[1]
        if self.premultiplied:
            return self._reduce_premultiplied(rows, extra, mode)
        if m % 2:
            if extra is None:
                raise ValueError(f"{m} rows need the address mode's extra row")
            tail = np.concatenate([rows[m - 1 : m], extra.reshape(1, w, 4).astype(rows.dtype)])
            head = self.reduce(rows[: m - 1], None, mode) if m > 1 else None
            last = self.reduce(tail, None, mode)
            return last if head is None else np.concatenate([head, last])
        wo = (w + 1) // 2
        we = w - (w % 2)
        half = we // 2
        out = np.empty((m // 2, wo, 4), np.float32)
        if rows.dtype == np.float32 and m and w:
            native_f32 = _native_reduce(np.float32)
            if native_f32 is not None:  # the same sums in the same order, in one pass (_native.c)
                src = np.ascontiguousarray(rows)
                wrap = int(mode is AddressMode.WRAP)
                _check_native(native_f32(src.ctypes.data, m, w, src.strides[0] // 4, wrap, out.ctypes.data, wo * 4))
                return out
        native = _native_reduce(np.uint8) if rows.dtype == np.uint8 and m and w else None
        if native is not None:
            src = np.ascontiguousarray(rows)
            table = _pair_table(self.srgb)
            status = native(
                src.ctypes.data,
                m,
                w,
                src.strides[0],
                table.ctypes.data,
                int(self.srgb and self.alpha),
                int(mode is AddressMode.WRAP),
                out.ctypes.data,
                wo * 4,
            )
            _check_native(status)
            return out
        step = max(2, min(m, _CHUNK_TEXELS // max(1, w)) & ~1)
        if rows.dtype == np.uint8:
            pairs = _pair_table(self.srgb)  # linear values already scaled by 1/4
            src = np.ascontiguousarray(rows).view(np.uint16)  # (m, w, 2): (R,G) and (B,A) byte pairs
            buf = np.empty((step, w, 2), np.uint64)
        elif rows.dtype != np.float32:
            raise ValueError(f"rows must be uint8 or float32, got {rows.dtype}")
        vert = np.empty((step // 2, w, 4), np.float32)
        for r in range(0, m, step):
            c = min(step, m - r)
            if rows.dtype == np.uint8:
                np.take(pairs, src[r : r + c], mode="clip", out=buf[:c])  # mode="raise" is 8x slower
                lin = buf[:c].view(np.float32)  # (c, w, 4)
            else:
                lin = rows[r : r + c]
            v = vert[: c // 2]
            np.add(lin[0::2], lin[1::2], out=v)  # vertical pairs: whole rows, contiguous
            o = out[r // 2 : (r + c) // 2]
            if half:
                # Horizontal pairs, iterated along the row (order="C" on transposed views): left to
                # itself numpy would loop over each texel's 4 channels, several times slower.
                np.add(
                    v[:, 0:we:2].transpose(0, 2, 1),
                    v[:, 1:we:2].transpose(0, 2, 1),
                    out=o[:, :half].transpose(0, 2, 1),
                    order="C",
                )
            if w % 2:
                other = v[:, w - 1] if mode is AddressMode.CLAMP else v[:, 0]
                np.add(v[:, w - 1], other, out=o[:, wo - 1])
            if rows.dtype == np.float32:
                o *= np.float32(0.25)
        if rows.dtype == np.uint8 and self.srgb and self.alpha:
            self._reduce_alpha(rows, out, mode)
        return out

    def premultiply(self, rows: np.ndarray) -> np.ndarray:
        """(n, w, 4) uint8 texels or float32 linear -> a new float32 array (colour * alpha, alpha)."""
        if rows.dtype == np.uint8:
            lin = np.take(decode_table(self.srgb), rows)  # np.take: several times faster than table[rows]
            np.take(decode_table(False), rows[..., 3], out=lin[..., 3])  # exact: 255 -> 1.0
        elif rows.dtype == np.float32:
            lin = rows.copy()
        else:
            raise ValueError(f"rows must be uint8 or float32, got {rows.dtype}")
        lin[..., :3] *= lin[..., 3:]
        return lin

    def _reduce_premultiplied(self, rows: np.ndarray, extra: np.ndarray | None, mode: AddressMode) -> np.ndarray:
        """`reduce` weighted by alpha, by chunks of rows (the float copies stay small)."""
        m, w = rows.shape[0], rows.shape[1]
        if m % 2 and extra is None:
            raise ValueError(f"{m} rows need the address mode's extra row")
        box = Transfer(srgb=self.srgb)  # a float32 input is only summed: srgb plays no part
        out = np.empty(((m + 1) // 2, (w + 1) // 2, 4), np.float32)
        step = max(2, min(m, 4 * _CHUNK_TEXELS // max(1, w)) & ~1)
        for r in range(0, m, step):
            c = min(step, m - r)
            ex = None
            if c % 2:  # the last chunk of an odd block of rows
                assert extra is not None
                ex = self.premultiply(extra.reshape(1, w, 4).astype(rows.dtype))[0]
            out[r // 2 : (r + c + 1) // 2] = box.reduce(self.premultiply(rows[r : r + c]), ex, mode)
        a = out[..., 3:]
        with np.errstate(invalid="ignore", divide="ignore"):
            np.divide(out[..., :3], a, out=out[..., :3], where=a > 0)
        out[..., :3][np.broadcast_to(a <= 0, out[..., :3].shape)] = 0.0  # nothing visible: bled later
        return out

    @staticmethod
    def _reduce_alpha(rows: np.ndarray, out: np.ndarray, mode: AddressMode) -> None:
        """Redo alpha from the bytes (the pair table put it through the sRGB curve)."""
        a = rows[..., 3].astype(np.uint16)
        s = a[0::2] + a[1::2]
        w = a.shape[1]
        we = w - (w % 2)
        total = np.empty(out.shape[:2], np.uint16)
        total[:, : we // 2] = s[:, 0:we:2] + s[:, 1:we:2]
        if w % 2:
            total[:, -1] = s[:, w - 1] + (s[:, w - 1] if mode is AddressMode.CLAMP else s[:, 0])
        out[..., 3] = total * np.float32(1 / 1020)


# ---- bleeding colour into transparent texels -------------------------------------------------------
def _sum2(a: np.ndarray) -> np.ndarray:
    """Sums of aligned 2x2 groups: (2h, 2w, ...) -> (h, w, ...) (strided adds: a reshaped sum over
    axes 1 and 3 is several times slower)."""
    v = a[0::2] + a[1::2]
    return v[:, 0::2] + v[:, 1::2]


def bleed(enc: np.ndarray, rows: np.ndarray, row0: int, transfer: Transfer) -> int:
    """Give texels of `enc` whose alpha is 0 the colour around them (module docstring); in place.

    `enc` is (n, w, 4) uint8, the encoded copy of `rows` (uint8 texels or float32 linear, the same
    rows as filtered); `row0` is the level row of its first row (the 4x4 grid is aligned on level
    rows). When `enc` starts and ends on that grid (or at the level's edges, as the baker's bands
    do), rows at least `BLEED_ROWS` inside it get colours that do not depend on where the rows were
    cut. Returns the number of texels filled.
    """
    n, w = enc.shape[:2]
    hole = enc[..., 3] == 0
    count = int(np.count_nonzero(hole))
    if count == 0 or count == hole.size:
        return count if count == 0 else _fill_all(enc, hole, 0)
    top = row0 % 4
    hp, wp = -(-(top + n) // 4) * 4, -(-w // 4) * 4  # padded to whole blocks: padding has no weight
    weight = np.zeros((hp, wp), np.float32)
    weight[top : top + n, :w] = np.take(decode_table(False), enc[..., 3])
    colour = np.zeros((hp, wp, 3), np.float32)
    for c in range(3):  # one channel at a time: numpy's inner loop then runs along the row
        lin = np.take(decode_table(transfer.srgb), rows[..., c]) if rows.dtype == np.uint8 else rows[..., c]
        np.multiply(lin, weight[top : top + n, :w], out=colour[top : top + n, :w, c])
    s1, a1 = _sum2(colour), _sum2(weight)  # aligned 2x2 groups
    s2, a2 = _sum2(s1), _sum2(a1)  # aligned 4x4 blocks
    with np.errstate(invalid="ignore", divide="ignore"):
        block = np.where(a2[..., None] > 0, s2 / a2[..., None], 0.0).astype(np.float32)
    block = _dilate(block, a2 > 0)
    ys, xs = np.nonzero(hole)  # only the holes are filled: push-pull from the group, else the block
    ys = ys + top
    gy, gx = ys // 2, xs // 2
    ga = a1[gy, gx]
    fill = np.empty((1, count, 4), np.float32)
    inner = ga > 0
    fill[0, inner, :3] = s1[gy[inner], gx[inner]] / ga[inner, None]
    fill[0, ~inner, :3] = block[ys[~inner] // 4, xs[~inner] // 4]
    fill[0, :, 3] = 0.0
    enc[ys - top, xs, :3] = transfer.encode(fill)[0, :, :3]
    return count


def _fill_all(enc: np.ndarray, hole: np.ndarray, value: int) -> int:
    enc[hole, :3] = value  # nothing visible in reach: any colour will do, a constant packs best
    return int(np.count_nonzero(hole))


def _dilate(block: np.ndarray, filled: np.ndarray) -> np.ndarray:
    """`BLEED_BLOCKS` rounds of mean-of-filled-neighbours over the block grid, then each block row's
    mean for what is still empty (0 for rows with nothing filled)."""
    hb, wb = filled.shape
    block = block.copy()
    filled = filled.copy()
    for _ in range(BLEED_BLOCKS):
        if filled.all():
            return block
        pad_c = np.pad(block * filled[..., None], ((1, 1), (1, 1), (0, 0)))
        pad_f = np.pad(filled.astype(np.float32), 1)
        acc = np.zeros_like(block)
        num = np.zeros(filled.shape, np.float32)
        for dy in range(3):
            for dx in range(3):
                acc += pad_c[dy : dy + hb, dx : dx + wb]
                num += pad_f[dy : dy + hb, dx : dx + wb]
        new = ~filled & (num > 0)
        block[new] = acc[new] / num[new, None]
        filled |= new
    if not filled.all():
        cnt = filled.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(cnt[:, None] > 0, (block * filled[..., None]).sum(axis=1) / cnt[:, None], 0.0)
        block = np.where(filled[..., None], block, mean[:, None, :]).astype(np.float32)
    return block


# ---- level geometry in bands ---------------------------------------------------------------------
@dataclass(frozen=True)
class LevelRows:
    """Rows [lo, hi) of one level, as uint8 texels (the stage's input level 0, or a level made with
    the next one in one pass: its codes, see `band_levels`) or float32 linear."""

    level: int
    lo: int
    hi: int
    data: np.ndarray


def next_window(lo: int, hi: int, height: int) -> tuple[int, int]:
    """Rows of the next level computable from rows [lo, hi) of a level `height` rows tall."""
    nlo = (lo + 1) // 2
    nhi = (height + 1) // 2 if hi >= height else hi // 2
    return nlo, max(nlo, nhi)


def band_levels(
    first: LevelRows,
    count: int,
    dims: Callable[[int], tuple[int, int]],
    transfer: Transfer,
    mode: AddressMode,
    row_zero: Callable[[int], np.ndarray],
    *,
    fuse: bool = True,
) -> Iterator[LevelRows]:
    """Yield `first`, then the rows of the next `count` levels that `first`'s rows determine.

    `dims(level)` gives a level's (width, height). Under wrap, an odd-height level's last row pairs
    with the level's row 0; `row_zero(level)` supplies it when the band does not hold it.
    Each level is made from the previous one only, so memory is two levels of one band.

    `fuse`: when `first` is 8-bit and the compiled helper is built, the next level may come as its
    8-bit codes (``Transfer.encode`` of its float rows, the same bits) with the level after made in
    the same pass (`_reduce_twice`); a caller that needs that level's float rows passes False.
    """
    cur = first
    yield cur
    done = 0
    if fuse and count >= 2:
        both = _reduce_twice(first, dims, transfer, mode)
        if both is not None:
            yield both[0]
            cur = both[1]
            yield cur
            done = 2
    for _ in range(count - done):
        w, h = dims(cur.level)
        lo, hi = next_window(cur.lo, cur.hi, h)
        used = cur.data[2 * lo - cur.lo : min(2 * hi, h) - cur.lo]
        extra = None
        if 2 * hi > h:  # odd edge: the row after the last one
            if mode is AddressMode.CLAMP:
                extra = cur.data[h - 1 - cur.lo]
            elif cur.lo == 0:
                extra = cur.data[0]
            else:
                extra = row_zero(cur.level)
        data = transfer.reduce(used, extra, mode) if hi > lo else np.empty((0, (w + 1) // 2, 4), np.float32)
        cur = LevelRows(cur.level + 1, lo, hi, data)
        yield cur


def _reduce_twice(
    first: LevelRows, dims: Callable[[int], tuple[int, int]], transfer: Transfer, mode: AddressMode
) -> tuple[LevelRows, LevelRows] | None:
    """The two levels after 8-bit `first` in one compiled pass (``ts_mip_reduce_twice_rgba8``): the
    middle one as 8-bit codes, the next as float32 linear; None where that pass does not apply (no
    helper, numpy chosen, premultiplied or float texels, an odd edge's extra row, no rows)."""
    if first.data.dtype != np.uint8 or transfer.premultiplied or transfer.float_texels or not _use_native:
        return None
    from ..native import reduce_twice_rgba8

    native = reduce_twice_rgba8()
    if native is None:
        return None
    w0, h0 = dims(first.level)
    w1, h1 = dims(first.level + 1)
    w2 = dims(first.level + 2)[0]
    lo1, hi1 = next_window(first.lo, first.hi, h0)
    lo2, hi2 = next_window(lo1, hi1, h1)
    if 2 * hi1 > h0 or 2 * hi2 > h1 or hi2 <= lo2 or w1 != (w0 + 1) // 2 or w2 != (w1 + 1) // 2:
        return None
    src = np.ascontiguousarray(first.data[2 * lo1 - first.lo : 2 * hi1 - first.lo])
    if src.shape[1:] != (w0, 4):
        return None
    mid = np.empty((hi1 - lo1, w1, 4), np.uint8)
    last = np.empty((hi2 - lo2, w2, 4), np.float32)
    mask = (0b0111 if transfer.alpha else 0b1111) if transfer.srgb else 0
    status = native(
        src.ctypes.data, src.shape[0], w0, src.strides[0], _pair_table(transfer.srgb).ctypes.data,
        int(transfer.srgb and transfer.alpha), int(mode is AddressMode.WRAP), _encode_table(True).ctypes.data, mask,
        mid.ctypes.data, w1 * 4, 2 * lo2 - lo1, hi2 - lo2, last.ctypes.data, w2 * 4,
    )  # fmt: skip
    _check_native(status)
    return LevelRows(first.level + 1, lo1, hi1, mid), LevelRows(first.level + 2, lo2, hi2, last)


def reduce_level(level: np.ndarray, transfer: Transfer, mode: AddressMode = AddressMode.CLAMP) -> np.ndarray:
    """One whole small level (h, w, 4) -> the next, float32 linear. For small images and tools."""
    h = level.shape[0]
    extra = None
    if h % 2:
        extra = level[h - 1] if mode is AddressMode.CLAMP else level[0]
    return transfer.reduce(level, extra, mode)


__all__ = [
    "BLEED_BLOCKS",
    "BLEED_ROWS",
    "LevelRows",
    "Transfer",
    "band_levels",
    "bleed",
    "decode_table",
    "linear_to_srgb",
    "next_window",
    "reduce_level",
    "srgb_to_linear",
    "use_native_reduce",
]
