"""The blocking load path: read and upload tiles now, on the render thread (a texture's pinned levels at
open, all-resident references; never per frame). The same read and upload functions as the streaming
path, from client memory in chunks: no ring slot is taken, so streaming loads are not disturbed.
"""

from __future__ import annotations

from collections.abc import Mapping

import moderngl
import numpy as np

from ..gl.gl_ext import GLExt
from ..native import Native
from .byte_sources import ReadBatch, ReadStatus, SourceIndex, _Scratch, read_batch
from .pools import CachePool
from .tiles import TileSpace

CHUNK_TILES = 256  # tiles read and uploaded per step


def load_now(
    frame: int,
    tiles: np.ndarray,
    pool: CachePool,
    cache_slots: np.ndarray,
    *,
    ctx: moderngl.Context,
    gl: GLExt,
    native: Native | None,
    space: TileSpace,
    sources: Mapping[int, SourceIndex],
    stride: int,
    scratch: _Scratch,
    cancelled_state: int,
) -> tuple[np.ndarray, list[str]]:
    """`Uploader.load_now`: (ok mask, a reason per failed tile) for `tiles` read into `cache_slots`
    (`sources`: the uploader's per-texture index arrays; `stride`: bytes per tile in client memory)."""
    tiles = np.asarray(tiles, np.int64)
    cache_slots = np.asarray(cache_slots, np.int64)
    ok = np.zeros(tiles.size, bool)
    reasons: list[str] = []
    if tiles.size == 0:
        return ok, reasons
    if np.any(cache_slots < 0):
        raise ValueError("every tile needs a cache slot")
    if np.any(pool.ledger.writable_at[cache_slots] > frame):
        ctx.finish()  # slots a draw in flight may sample: let those draws end first
    chunk = CHUNK_TILES
    memory = np.zeros(min(chunk, tiles.size) * stride, np.uint8)
    nothing_cancelled = np.zeros(chunk, np.uint8)
    g = pool.geometry
    assert pool.texture is not None
    for start in range(0, tiles.size, chunk):
        part = slice(start, start + chunk)
        t = tiles[part]
        tex = space.tex[t].astype(np.int64)
        status = np.zeros(t.size, np.int32)
        for tx in np.unique(tex).tolist():
            m = np.flatnonzero(tex == tx)
            src = sources[tx]
            entry = t[m] - src.first_tile
            order = np.argsort(src.offsets[entry], kind="stable")
            e, rows = entry[order], m[order]
            batch = ReadBatch(
                -1, src.tile, t[rows], rows.astype(np.int64), src.offsets[e], src.stored[e], src.checksums[e]
            )
            st, err = read_batch(batch, memory, stride, nothing_cancelled, cancelled_state, scratch)
            status[rows] = st
            for k in np.flatnonzero(st != ReadStatus.OK).tolist():
                _, lv, x, y = (int(v[0]) for v in space.coords(t[rows[k : k + 1]]))
                reasons.append(f"{src.tile.name}: tile ({lv}, {x}, {y}) {ReadStatus(int(st[k])).describe(int(err[k]))}")
        good = np.flatnonzero(status == ReadStatus.OK)
        ok[start + good] = True
        if good.size:
            layer, cx, cy = g.locate(cache_slots[part][good], pool.layers)
            gl.upload_cell_batch(
                pool.texture,
                layer,
                cx * g.slot_size,
                cy * g.slot_size,
                memory.ctypes.data + good * stride,
                g.slot_size,
                0,
                native,
            )
    return ok, reasons
