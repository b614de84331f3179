"""Texture transfers of the GL layer: tile uploads (one call per tile, or per run of consecutive
layers), layer reads and writes, and GPU-side copies of cells and layers.

`TextureTransfers` is a part of `GLExt` (its base class), kept in a module of its own; like the
rest of `GLExt`, render thread only. Every call that binds ``GL_PIXEL_UNPACK_BUFFER`` or
``GL_PIXEL_PACK_BUFFER`` unbinds it again, and texture work happens on moderngl's scratch unit.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..errors import GLError
from .enums import (
    GL_COPY_READ_BUFFER,
    GL_COPY_WRITE_BUFFER,
    GL_PIXEL_PACK_BUFFER,
    GL_PIXEL_UNPACK_BUFFER,
    GL_RGBA,
    GL_TEXTURE0,
    GL_TEXTURE_2D_ARRAY,
    GL_UNPACK_COMPRESSED_BLOCK_DEPTH,
    GL_UNPACK_COMPRESSED_BLOCK_HEIGHT,
    GL_UNPACK_COMPRESSED_BLOCK_SIZE,
    GL_UNPACK_COMPRESSED_BLOCK_WIDTH,
    GL_UNPACK_IMAGE_HEIGHT,
    GL_UNSIGNED_BYTE,
)
from .loader import (
    Feature,
    GLFunctions,
)
from .objects import TextureArray

__all__ = ["TextureTransfers"]


class TextureTransfers:
    """Uploads, layer reads and writes and GPU copies (the `GLExt` methods that move texels)."""

    functions: GLFunctions
    scratch_unit: int
    addresses: dict[str, int]
    debug: bool
    _upload_fns: np.ndarray | None = None  # the entry points `ts_upload_runs_bound` calls (`addresses`)
    _unpack_cache: dict[tuple[int, int, int], tuple[int, int]]

    def _bind_scratch(self, name: int) -> None: ...

    def _unbind_scratch(self) -> None: ...

    def _clear_stale(self, before: str) -> None: ...

    def check(self, where: str) -> None: ...

    def has(self, feature: Feature) -> bool: ...

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
        f = self.functions
        self._bind_scratch(texture.glo)
        f.glBindBuffer(GL_PIXEL_UNPACK_BUFFER, pbo)
        try:
            if native is not None and not self.debug:
                arrays = [np.ascontiguousarray(a, np.int64) for a in (layer, x, y, offset)]
                ptrs = [a.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)) for a in arrays]
                native.upload_cells(
                    self.addresses["glCompressedTexSubImage3D"],
                    self.addresses["glTexSubImage3D"],
                    int(fmt.compressed),
                    n,
                    ptrs[0],
                    ptrs[1],
                    ptrs[2],
                    cell_size,
                    fmt.internal_format,
                    nbytes,
                    ptrs[3],
                )
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

    def run_image_stride_ok(self, texture: TextureArray, cell_size: int, image_stride: int) -> bool:
        """Whether `upload_runs` can read layers `image_stride` bytes apart for `texture`'s format:
        tightly packed always; with slack only in whole rows of the cell (blocks of 4 texel rows
        when compressed, through the compressed pixel-storage modes, which the context must have)."""
        fmt = texture.format
        nbytes = fmt.layer_bytes(cell_size)
        if image_stride == nbytes:
            return True
        if image_stride < nbytes:
            return False
        if not fmt.compressed:
            return image_stride % (cell_size * 4) == 0
        row = cell_size // 4 * fmt.block_bytes
        return self.has(Feature.COMPRESSED_PIXEL_STORAGE) and image_stride % row == 0

    def upload_runs(
        self,
        texture: TextureArray,
        layer: np.ndarray,
        x: np.ndarray,
        y: np.ndarray,
        depth: np.ndarray,
        offset: np.ndarray,
        cell_size: int,
        pbo: int,
        image_stride: int,
        native: Any = None,
    ) -> int:
        """Upload runs of consecutive layers at one cell: ONE sub-image call per run.

        Arrays (int64): each run's first layer, texel origin x/y (multiples of 4 for block formats),
        its layer count and the byte offset of its first layer in pixel-unpack buffer `pbo` (nonzero);
        layer k of a run is read `image_stride` bytes after layer k-1 (`run_image_stride_ok` must
        hold unless every run is one layer; slack between layers is stepped over with
        GL_UNPACK_IMAGE_HEIGHT and, for compressed formats, the GL_UNPACK_COMPRESSED_BLOCK_* modes,
        reset afterwards). `native` runs the loop in C; else a Python loop does. Returns the bytes
        uploaded."""
        if texture.released:
            raise GLError(f"{texture!r} used after release")
        n = int(layer.size)
        if n == 0:
            return 0
        if pbo == 0:
            raise ValueError("layer runs upload from a pixel-unpack buffer")
        bound = getattr(native, "upload_runs_bound", None) if native is not None and not self.debug else None
        if bound is not None:  # the checks, bindings, unpack modes and calls in one compiled call
            return self._upload_runs_compiled(
                bound, texture, (layer, x, y, depth, offset), cell_size, pbo, image_stride
            )
        # one contiguous (5, n) array: the checks are a few reductions over it, and the compiled loop
        # takes each row's address as a plain int
        runs = np.empty((5, n), np.int64)
        runs[0], runs[1], runs[2], runs[3], runs[4] = layer, x, y, depth, offset
        lo = runs[:4].min(axis=1).tolist()  # layer, x, y, depth
        hi = runs[1:4].max(axis=1).tolist()  # x, y, depth
        single = hi[2] == 1  # one layer a call: the stride between layers does not matter
        if not single and not self.run_image_stride_ok(texture, cell_size, image_stride):
            raise ValueError(f"layers {image_stride} bytes apart cannot be uploaded in runs for {texture!r}")
        fmt, size = texture.format, texture.size
        nbytes = fmt.layer_bytes(cell_size)
        if lo[3] < 1 or lo[0] < 0 or int((runs[0] + runs[3]).max()) > texture.layers:
            raise ValueError(f"a run of layers is outside 0..{texture.layers - 1} of {texture!r}")
        if min(lo[1], lo[2]) < 0 or max(hi[0], hi[1]) > size - cell_size:
            raise ValueError(f"a cell does not fit a {size}x{size} layer")
        f = self.functions
        padded = image_stride != nbytes and not single
        self._bind_scratch(texture.glo)
        f.glBindBuffer(GL_PIXEL_UNPACK_BUFFER, pbo)
        try:
            if padded and fmt.compressed:  # rows of blocks: the image height counts texel rows
                f.glPixelStorei(GL_UNPACK_COMPRESSED_BLOCK_WIDTH, 4)
                f.glPixelStorei(GL_UNPACK_COMPRESSED_BLOCK_HEIGHT, 4)
                f.glPixelStorei(GL_UNPACK_COMPRESSED_BLOCK_DEPTH, 1)
                f.glPixelStorei(GL_UNPACK_COMPRESSED_BLOCK_SIZE, fmt.block_bytes)
                f.glPixelStorei(GL_UNPACK_IMAGE_HEIGHT, image_stride // (cell_size // 4 * fmt.block_bytes) * 4)
            elif padded:
                f.glPixelStorei(GL_UNPACK_IMAGE_HEIGHT, image_stride // (cell_size * 4))
            if native is not None and getattr(native, "upload_runs", None) is not None and not self.debug:
                base, row = runs.ctypes.data, 8 * n
                native.upload_runs(
                    self.addresses["glCompressedTexSubImage3D"],
                    self.addresses["glTexSubImage3D"],
                    int(fmt.compressed),
                    n,
                    base,
                    base + row,
                    base + 2 * row,
                    base + 3 * row,
                    cell_size,
                    fmt.internal_format,
                    nbytes,
                    base + 4 * row,
                )
            elif fmt.compressed:
                call = f.glCompressedTexSubImage3D
                for lv, cx, cy, d, off in zip(*runs.tolist(), strict=True):
                    call(
                        GL_TEXTURE_2D_ARRAY,
                        0,
                        cx,
                        cy,
                        lv,
                        cell_size,
                        cell_size,
                        d,
                        fmt.internal_format,
                        nbytes * d,
                        off,
                    )
            else:
                call = f.glTexSubImage3D
                for lv, cx, cy, d, off in zip(*runs.tolist(), strict=True):
                    call(GL_TEXTURE_2D_ARRAY, 0, cx, cy, lv, cell_size, cell_size, d, GL_RGBA, GL_UNSIGNED_BYTE, off)
        finally:
            if padded:
                f.glPixelStorei(GL_UNPACK_IMAGE_HEIGHT, 0)
                if fmt.compressed:
                    for mode in (
                        GL_UNPACK_COMPRESSED_BLOCK_WIDTH,
                        GL_UNPACK_COMPRESSED_BLOCK_HEIGHT,
                        GL_UNPACK_COMPRESSED_BLOCK_DEPTH,
                        GL_UNPACK_COMPRESSED_BLOCK_SIZE,
                    ):
                        f.glPixelStorei(mode, 0)
            f.glBindBuffer(GL_PIXEL_UNPACK_BUFFER, 0)
            self._unbind_scratch()
        return int(runs[3].sum()) * nbytes

    def _upload_runs_compiled(
        self,
        bound: Any,
        texture: TextureArray,
        arrays: tuple[np.ndarray, ...],
        cell_size: int,
        pbo: int,
        image_stride: int,
    ) -> int:
        """`upload_runs` through ``ts_upload_runs_bound``: the same checks, errors and calls."""
        layer, x, y, depth, offset = (np.ascontiguousarray(a, np.int64) for a in arrays)
        fmt = texture.format
        nbytes = fmt.layer_bytes(cell_size)
        mode, image_height = self._unpack_modes(texture, cell_size, image_stride)
        if self._upload_fns is None:
            names = ("glActiveTexture", "glBindTexture", "glBindBuffer", "glPixelStorei")
            names += ("glCompressedTexSubImage3D", "glTexSubImage3D")
            self._upload_fns = np.array([self.addresses[n] for n in names], np.int64)
        got = bound(
            self._upload_fns.ctypes.data,
            GL_TEXTURE0 + self.scratch_unit,
            texture.glo,
            pbo,
            mode,
            fmt.block_bytes,
            image_height,
            int(fmt.compressed),
            fmt.internal_format,
            cell_size,
            nbytes,
            texture.layers,
            texture.size,
            layer.size,
            layer.ctypes.data,
            x.ctypes.data,
            y.ctypes.data,
            depth.ctypes.data,
            offset.ctypes.data,
        )
        if got == -1:
            raise ValueError(f"a run of layers is outside 0..{texture.layers - 1} of {texture!r}")
        if got == -2:
            raise ValueError(f"a cell does not fit a {texture.size}x{texture.size} layer")
        if got == -3:
            raise ValueError(f"layers {image_stride} bytes apart cannot be uploaded in runs for {texture!r}")
        return int(got) * nbytes

    def _unpack_modes(self, texture: TextureArray, cell_size: int, image_stride: int) -> tuple[int, int]:
        """How runs of layers `image_stride` bytes apart step over the slack (``ts_upload_runs_bound``'s
        pixel mode and image height): 0 packed, 1 image height in texel rows, 2 compressed block rows,
        -1 not at all (`run_image_stride_ok`); asked once per format, cell size and stride."""
        key = (texture.format.internal_format, cell_size, image_stride)
        hit = self._unpack_cache.get(key)
        if hit is None:
            fmt = texture.format
            if image_stride == fmt.layer_bytes(cell_size):
                hit = (0, 0)
            elif not self.run_image_stride_ok(texture, cell_size, image_stride):
                hit = (-1, 0)
            elif fmt.compressed:
                hit = (2, image_stride // (cell_size // 4 * fmt.block_bytes) * 4)
            else:
                hit = (1, image_stride // (cell_size * 4))
            self._unpack_cache[key] = hit
        return hit

    def copy_buffer_spans(
        self,
        src: int,
        dst: int,
        src_offset: np.ndarray,
        dst_offset: np.ndarray,
        size: np.ndarray,
        native: Any = None,
    ) -> int:
        """GPU-side copies of byte spans from buffer `src` into buffer `dst` (glCopyBufferSubData,
        both buffers bound once): span i is `size[i]` bytes from `src_offset[i]` to `dst_offset[i]`
        (int64 arrays). GL orders the copies before every later command that reads `dst`. `native`
        runs the loop in C; else a Python loop does. Returns the bytes copied."""
        n = int(np.size(size))
        if n == 0:
            return 0
        if not (src and dst):
            raise ValueError("buffer copies need two buffer names")
        f = self.functions
        f.glBindBuffer(GL_COPY_READ_BUFFER, src)
        f.glBindBuffer(GL_COPY_WRITE_BUFFER, dst)
        try:
            if native is not None and getattr(native, "copy_spans", None) is not None and not self.debug:
                spans = np.empty((3, n), np.int64)
                spans[0], spans[1], spans[2] = src_offset, dst_offset, size
                base = spans.ctypes.data
                native.copy_spans(self.addresses["glCopyBufferSubData"], n, base, base + 8 * n, base + 16 * n)
            else:
                call = f.glCopyBufferSubData
                spans = zip(
                    np.asarray(src_offset).tolist(),
                    np.asarray(dst_offset).tolist(),
                    np.asarray(size).tolist(),
                    strict=True,
                )
                for so, do, nb in spans:
                    call(GL_COPY_READ_BUFFER, GL_COPY_WRITE_BUFFER, so, do, nb)
        finally:
            f.glBindBuffer(GL_COPY_READ_BUFFER, 0)
            f.glBindBuffer(GL_COPY_WRITE_BUFFER, 0)
        return int(np.sum(size))

    def copy_cells(
        self,
        src: TextureArray,
        dst: TextureArray,
        moves: Iterable[tuple[int, int, int, int, int, int]],
        cell_size: int,
        depth: int = 1,
    ) -> int:
        """GPU-to-GPU copies of cells: ``(src_layer, sx, sy, dst_layer, dx, dy)`` each, `depth`
        consecutive layers from there; returns the count."""
        for t in (src, dst):
            if t.released:
                raise GLError(f"{t!r} used after release")
        if src.format.texel_format is not dst.format.texel_format:
            raise ValueError(f"cannot copy cells between {src!r} and {dst!r}: formats differ")
        n = 0
        for sl, sx, sy, dl, dx, dy in moves:
            self.functions.glCopyImageSubData(
                src.glo,
                GL_TEXTURE_2D_ARRAY,
                0,
                sx,
                sy,
                sl,
                dst.glo,
                GL_TEXTURE_2D_ARRAY,
                0,
                dx,
                dy,
                dl,
                cell_size,
                cell_size,
                depth,
            )
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
        fmt, size, f = texture.format, texture.size, self.functions
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
        n, size, f = texture.layer_bytes, texture.size, self.functions
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
        self.functions.glCopyImageSubData(
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
