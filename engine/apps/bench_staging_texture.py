"""`bench stream` (a), candidate paths measured beside the engine's: a staging texture array of
RG32UI texels (one texel per BC1 block: block-compatible with the cache) filled contiguously from
the staging ring, then scattered GPU-side into the cache layers with one glCopyImageSubData per run.
The fill is ONE glTexSubImage3D per contiguous ring span (``fill="upload"``), or one compute dispatch
per span that reads the ring as a storage buffer and stores the blocks (``fill="compute"``: no pixel
transfer at all). Not engine paths: the bench measures them so that the choice between them and
`UploadPath.DEVICE_BUFFER` rests on numbers (BC1 only; BC3/BC5/BC7 would take RGBA32UI)."""

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
GL_SHADER_STORAGE_BUFFER = 0x90D2
GL_ALL_BARRIER_BITS = 0xFFFFFFFF
FILL_GROUP = 64

FILL_SHADER = f"""#version 430
layout(local_size_x = {FILL_GROUP}) in;
layout(std430, binding = 0) readonly buffer Ring {{ uvec2 blocks[]; }};
layout(rg32ui, binding = 0) writeonly uniform uimage2DArray staging;
uniform uint first_block;  // the span's first block in the ring
uniform int first_layer;  // its first staging layer
uniform int side;  // blocks along a tile's side
uniform uint count;  // blocks in the span
void main() {{
    uint i = gl_GlobalInvocationID.x;
    if (i >= count) return;
    uint per_tile = uint(side * side), b = i % per_tile;
    ivec3 at = ivec3(int(b) % side, int(b) / side, first_layer + int(i / per_tile));
    imageStore(staging, at, uvec4(blocks[first_block + i], 0u, 0u));
}}
"""


class StagingTexture:
    """`layers` RG32UI layers of (slot / 4)^2 texels: one BC1 tile of `slot`^2 texels each, its
    blocks in the ring's byte order. Batches take consecutive layers from a cursor (wrapping)."""

    def __init__(self, gl: GLExt, slot: int, layers: int, fill: str = "upload") -> None:
        if slot % 4 or layers < 1 or fill not in ("upload", "compute"):
            raise ValueError(
                f"a staging texture needs whole blocks, layers and a fill, got {slot!r}, {layers!r}, {fill!r}"
            )
        self._gl, self.slot, self.layers, self.fill = gl, slot, layers, fill
        self.side = slot // 4
        self._array = self._program = None
        if fill == "compute":  # moderngl objects: image binding and dispatch come with them
            self._array = gl.ctx.texture_array((self.side, self.side, layers), 2, dtype="u4")
            self._program = gl.ctx.compute_shader(FILL_SHADER)
            self._program["side"] = self.side
            self.glo = self._array.glo
        else:
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
        if self._program is not None:
            self._fill_by_compute(ring_glo, r[starts], first_layer[starts], span_counts, stride)
        else:
            self._fill_by_upload(ring_glo, r[starts], first_layer[starts], span_counts, stride)
        runs = zip(first_layer.tolist(), dst_layer.tolist(), dst_x.tolist(), dst_y.tolist(), c.tolist(), strict=True)
        for sl, dl, dx, dy, n in runs:
            f.glCopyImageSubData(
                self.glo, GL_TEXTURE_2D_ARRAY, 0, 0, 0, sl, dst.glo, GL_TEXTURE_2D_ARRAY, 0, dx, dy, dl, side, side, n
            )
        self.calls += int(starts.size + c.size)

    def _fill_by_compute(
        self, ring_glo: int, ring_first: np.ndarray, first_layer: np.ndarray, counts: np.ndarray, stride: int
    ) -> None:
        assert self._program is not None and self._array is not None
        ctx, per_tile = self._gl.ctx, self.side * self.side
        self._gl.functions.glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 0, ring_glo)
        self._array.bind_to_image(0, read=False, write=True)
        for first, layer, n in zip(ring_first.tolist(), first_layer.tolist(), counts.tolist(), strict=True):
            self._program["first_block"] = first * stride // BC1_BLOCK_BYTES
            self._program["first_layer"] = layer
            self._program["count"] = n * per_tile
            self._program.run(-(-n * per_tile // FILL_GROUP))
        ctx.memory_barrier(GL_ALL_BARRIER_BITS)  # the stores reach the copies

    def _fill_by_upload(
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
        if self._array is not None:
            self._array.release()
            self._program.release()  # type: ignore[union-attr]
            self._array = self._program = None
        elif self.glo:
            self._gl.delete_textures(self.glo)
        self.glo = 0
