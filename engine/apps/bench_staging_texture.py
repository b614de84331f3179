"""`bench stream` (a), a candidate path measured beside the engine's: a staging texture array of
RG32UI texels (one texel per BC1 block: block-compatible with the cache) filled from the staging
ring by ONE glTexSubImage3D per contiguous ring span (a pixel transfer from the ring bound as the
unpack buffer), then scattered GPU-side into the cache layers with one glCopyImageSubData per run.
Not an engine path: the engine's staging-texture path (`UploadPath.STAGING_TEXTURE`,
`runtime.texture_staging`) fills the array with a compute pass instead, and the bench measures this
pixel-transfer fill beside it so the choice rests on numbers (BC1 only, packed ring slots)."""

from __future__ import annotations

import numpy as np

from ..gl.enums import GL_PIXEL_UNPACK_BUFFER, GL_TEXTURE0, GL_TEXTURE_2D_ARRAY
from ..gl.gl_ext import GLExt
from ..gl.objects import TextureArray

__all__ = ["StagingTexture"]

GL_RG32UI = 0x823C
GL_RG_INTEGER = 0x8228
GL_UNSIGNED_INT = 0x1405
BC1_BLOCK_BYTES = 8  # one RG32UI texel


class StagingTexture:
    """`layers` RG32UI layers of (slot / 4)^2 texels: one BC1 tile of `slot`^2 texels each, its
    blocks in the ring's byte order. Batches take consecutive layers from a cursor (wrapping)."""

    def __init__(self, gl: GLExt, slot: int, layers: int) -> None:
        if slot % 4 or layers < 1:
            raise ValueError(f"a staging texture needs whole blocks and layers, got {slot!r}, {layers!r}")
        self._gl, self.slot, self.layers = gl, slot, layers
        self.side = slot // 4
        f = gl.functions
        (self.glo,) = f.gen_names(f.glGenTextures, 1)
        f.glActiveTexture(GL_TEXTURE0 + gl.scratch_unit)
        f.glBindTexture(GL_TEXTURE_2D_ARRAY, self.glo)
        f.glTexStorage3D(GL_TEXTURE_2D_ARRAY, 1, GL_RG32UI, self.side, self.side, layers)
        f.glBindTexture(GL_TEXTURE_2D_ARRAY, 0)
        gl.check("creating the RG32UI staging texture")
        self._cursor = 0
        self.calls = 0

    @property
    def tile_bytes(self) -> int:
        return self.side * self.side * BC1_BLOCK_BYTES

    def upload(
        self,
        ring_glo: int,
        ring_first: np.ndarray,
        counts: np.ndarray,
        stride: int,
        dst: TextureArray,
        dst_layer: np.ndarray,
        dst_x: np.ndarray,
        dst_y: np.ndarray,
    ) -> None:
        """Run i (`counts[i]` tiles from ring slot `ring_first[i]`) into `dst_layer[i]`.. at texel
        (`dst_x[i]`, `dst_y[i]`) of `dst`: fill consecutive staging layers (one call per contiguous
        ring span), then one copy per run. Needs a packed ring (`stride` equal to a tile's bytes)."""
        if stride != self.tile_bytes:
            raise ValueError(f"the staging texture reads packed tiles of {self.tile_bytes} bytes, not {stride}")
        c = np.asarray(counts, np.int64)
        total = int(c.sum())
        if total > self.layers:
            raise ValueError(f"{total} tiles do not fit {self.layers} staging layers")
        if self._cursor + total > self.layers:
            self._cursor = 0
        first_layer = self._cursor + np.cumsum(c) - c
        self._cursor = (self._cursor + total) % self.layers
        r = np.asarray(ring_first, np.int64)
        joins = np.flatnonzero(r[:-1] + c[:-1] != r[1:]) + 1  # ring spans (staging layers are consecutive)
        starts = np.concatenate([[0], joins])
        span_counts = np.add.reduceat(c, starts)
        f, side = self._gl.functions, self.side
        self._fill(ring_glo, r[starts], first_layer[starts], span_counts, stride)
        runs = zip(first_layer.tolist(), dst_layer.tolist(), dst_x.tolist(), dst_y.tolist(), c.tolist(), strict=True)
        for sl, dl, dx, dy, n in runs:
            f.glCopyImageSubData(
                self.glo, GL_TEXTURE_2D_ARRAY, 0, 0, 0, sl, dst.glo, GL_TEXTURE_2D_ARRAY, 0, dx, dy, dl, side, side, n
            )
        self.calls += int(starts.size + c.size)

    def _fill(
        self, ring_glo: int, ring_first: np.ndarray, first_layer: np.ndarray, counts: np.ndarray, stride: int
    ) -> None:
        f, side = self._gl.functions, self.side
        f.glActiveTexture(GL_TEXTURE0 + self._gl.scratch_unit)
        f.glBindTexture(GL_TEXTURE_2D_ARRAY, self.glo)
        f.glBindBuffer(GL_PIXEL_UNPACK_BUFFER, ring_glo)
        try:
            for first, layer, n in zip(ring_first.tolist(), first_layer.tolist(), counts.tolist(), strict=True):
                f.glTexSubImage3D(
                    GL_TEXTURE_2D_ARRAY, 0, 0, 0, layer, side, side, n, GL_RG_INTEGER, GL_UNSIGNED_INT, first * stride
                )
        finally:
            f.glBindBuffer(GL_PIXEL_UNPACK_BUFFER, 0)
            f.glBindTexture(GL_TEXTURE_2D_ARRAY, 0)

    def release(self) -> None:
        if self.glo:
            self._gl.delete_textures(self.glo)
        self.glo = 0
