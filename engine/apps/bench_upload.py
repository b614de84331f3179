"""`bench stream` (a): the engine's upload ceiling (tiles/s and GB/s through each upload path: runs
from the host ring, runs through the device-local staging buffer, runs through the compute-filled
staging texture, and the per-tile path for comparison, fenced and finished) and the host-to-device
copy bandwidth (`copy_bandwidth`: one glCopyBufferSubData of the whole ring), the physical limit."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import moderngl
import numpy as np

from ..config import BudgetConfig, UploadPath
from ..pack.format import TexelFormat
from ..units import MIB

if TYPE_CHECKING:
    from ..gl.gl_ext import GLExt

__all__ = ["CEILING_ARGS", "TILE", "ceiling_paths", "copy_bandwidth", "upload_ceiling"]

TILE = 128  # the default tile: 136-texel slots


def upload_ceiling(
    ctx: moderngl.Context,
    tiles: int,
    batch: int = 256,
    compiled: bool = True,
    runs: bool = False,
    max_run: int = 0,
    device: bool = False,
    staging_texture: bool = False,
    candidate: bool = False,
) -> dict:
    """Tiles/s of the engine's upload loop from the staging ring, fenced per batch, until glFinish.

    ``runs=False``: one sub-image call per tile at scattered cells (each batch's tiles at
    neighbouring cells of one layer, the old slot order); ``runs=True``: what the uploader does now,
    each batch's tiles at consecutive layers of one cell from consecutive ring slots, one call per
    run (`Uploader`'s `upload_runs`); with ``device=True`` too, each batch is first copied into a
    device-local buffer of two batches (`DeviceStaging.copy_in`), the ring fenced behind the copy,
    and the runs uploaded from there (`UploadPath.DEVICE_BUFFER`); with ``staging_texture=True``
    instead, the engine's staging-texture path (`UploadPath.STAGING_TEXTURE`, `TextureStaging.issue`
    with a share of two batches like the device buffer's: one compute dispatch per ring span fills
    an RG32UI array, the ring is fenced behind it, one glCopyImageSubData a run); with
    ``candidate=True``, the bench-only candidate of `bench_staging_texture` (the same array filled by
    one glTexSubImage3D per ring span)."""
    from ..gl.enums import gl_format
    from ..gl.gl_ext import GLExt
    from ..native import load
    from ..runtime.budget import BudgetManager
    from ..runtime.device_staging import DeviceStaging
    from ..runtime.pools import CachePool
    from ..runtime.slots import SlotGeometry
    from ..runtime.staging import StagingRing
    from ..runtime.texture_staging import TextureStaging
    from ..runtime.upload_plan import PoolUploads, upload_runs
    from .bench_staging_texture import StagingTexture

    native = load() if compiled else None
    gl = GLExt(ctx)
    fmt = gl_format(TexelFormat.BC1, True)
    slot = TILE + 8
    tile_bytes = fmt.layer_bytes(slot)
    capacity = 4096
    geo = SlotGeometry.choose(
        slot, tile_bytes, capacity, max_layers=gl.max_array_layers, max_texture_size=min(gl.max_texture_size, 16384)
    )
    layers = -(-capacity // geo.cells)
    ring = StagingRing(ctx, gl, 4 * batch * tile_bytes, tile_bytes)
    # the cache: a pool (the engine path's issue takes pools), its budget only counts
    pool = CachePool(
        gl, BudgetManager(BudgetConfig(budget_mb=1 << 20)), (TexelFormat.BC1, True, slot), 0, geo, capacity, 2, 0
    )
    tex = pool.texture
    assert tex is not None and pool.layers == layers
    staging = (
        DeviceStaging(gl, 2 * batch, ring.stride) if device and runs and not (staging_texture or candidate) else None
    )
    engine_textures = TextureStaging(gl, 2 * batch * ring.stride, ring) if staging_texture and runs else None
    texture_staging = StagingTexture(gl, slot, 2 * batch) if candidate and runs and not staging_texture else None
    cache_slot = np.full(ring.slot_count, -1, np.int64)  # per ring slot, for the engine path's issue
    nbytes = np.full(ring.slot_count, tile_bytes, np.int64)
    calls = 0
    try:
        rng = np.random.default_rng(1)
        ring.memory[:] = rng.integers(0, 256, ring.memory.size, np.uint8)  # any bytes are BC1 blocks
        ctx.finish()
        done, cell, polls, issue = 0, 0, 0, 0.0
        t0 = time.perf_counter()
        c0 = time.thread_time()
        while done < tiles:
            ring.reclaim()
            got = ring.acquire(min(batch, tiles - done))
            if not got.size:
                polls += 1
                continue  # every slot waits on the GPU: poll again
            i0 = time.thread_time()
            n_slots = layers * geo.cells
            if runs:  # cell-major slots: consecutive numbers are consecutive layers of one cell
                slots = (np.arange(cell, cell + got.size) % n_slots).astype(np.int64)
                r = upload_runs(slots, got, layers, max_run)
                lay, cx, cy = geo.locate(slots[r["start"]], layers)
                first, pbo = got[r["start"]], ring.glo
                if staging is not None:  # copy in, fence the ring behind the copy, upload from the copy
                    first, copies = staging.copy_in(ring.glo, first, r["count"], native)
                    ring.submit(got, got.size * tile_bytes)
                    pbo, calls = staging.glo, calls + copies
                if engine_textures is not None:  # fills, the ring's fence, the copies: as the uploader issues them
                    cache_slot[got] = slots
                    plan = [PoolUploads(0, got, r)]
                    assert engine_textures.within_layers(np.zeros(got.size, np.int64), [pool]).all()
                    calls += engine_textures.issue(got, nbytes, cache_slot, plan, [pool], native)[1]
                elif texture_staging is not None:
                    texture_staging.upload(ring.glo, first, r["count"], ring.stride, tex, lay, cx * slot, cy * slot)
                else:
                    gl.upload_runs(
                        tex, lay, cx * slot, cy * slot, r["count"], first * ring.stride, slot, pbo, ring.stride, native
                    )
                    calls += int(r.size)
            else:  # the old order: neighbouring cells of one layer, one call each
                k = np.arange(cell, cell + got.size) % n_slots
                lay, c = k // geo.cells, k % geo.cells
                cx, cy = c % geo.cells_x, c // geo.cells_x
                gl.upload_cell_batch(tex, lay, cx * slot, cy * slot, ring.offsets(got), slot, ring.glo, native)
                calls += int(got.size)
            if staging is None and engine_textures is None:
                ring.submit(got, got.size * tile_bytes)
            issue += time.thread_time() - i0
            cell += got.size
            done += got.size
        cpu = time.thread_time() - c0
        ctx.finish()
        seconds = time.perf_counter() - t0
        ring.reclaim()
    finally:
        if staging is not None:
            staging.release()
        if texture_staging is not None:
            calls += texture_staging.calls
            texture_staging.release()
        if engine_textures is not None:
            engine_textures.release()
        pool.release()
        ring.release()
    return {
        "tiles": done,
        "seconds": seconds,
        "tiles_per_s": done / seconds,
        "mib_per_s": done * tile_bytes / seconds / MIB,
        "gb_per_s": done * tile_bytes / seconds / 1e9,
        "calls": calls,
        "cpu_us_per_tile": cpu / max(1, done) * 1e6,  # the whole loop's, polling for free ring slots included
        "issue_cpu_us_per_tile": issue / max(1, done) * 1e6,  # planning, copy and upload calls, fence
        "gpu_waits": polls,  # polls that found every ring slot still in flight (the GPU is the limit)
        "tile_bytes": tile_bytes,
        "format": "bc1-srgb",
        "slot": slot,
        "batch": batch,
        "path": upload_path_name(runs, device, staging_texture, candidate),
        "loop": "compiled" if native is not None else "python",
    }


#: `upload_ceiling`'s arguments for each engine path.
CEILING_ARGS: dict[UploadPath, dict[str, bool]] = {
    UploadPath.HOST_RING: {},
    UploadPath.DEVICE_BUFFER: {"device": True},
    UploadPath.STAGING_TEXTURE: {"staging_texture": True},
}


def ceiling_paths(gl: GLExt) -> list[UploadPath]:
    """The engine paths this context runs: the device paths read a persistent-mapped ring on the GPU;
    the staging texture also needs GL 4.3 compute (`GLExt.has_staging_texture`)."""
    storage = gl.has_buffer_storage
    paths = [UploadPath.HOST_RING] + ([UploadPath.DEVICE_BUFFER] if storage else [])
    return paths + ([UploadPath.STAGING_TEXTURE] if storage and gl.has_staging_texture else [])


def upload_path_name(runs: bool, device: bool, staging_texture: bool, candidate: bool) -> str:
    """The name `upload_ceiling` reports for its path: an `UploadPath` value, or the candidate's or
    the per-tile path's."""
    if not runs:
        return "per-tile"
    if staging_texture:
        return "staging-texture"
    return "device-buffer" if device else "staging-texture-upload-fill" if candidate else "host-ring"


def copy_bandwidth(ctx: moderngl.Context, ring_mb: int = 64, repeats: int = 8) -> dict:
    """Host -> device bytes/s: glCopyBufferSubData of a whole persistent-mapped staging ring (host
    memory) into a buffer in video memory, `repeats` times, until glFinish: the bus alone, the
    physical limit of any upload path."""
    from ..gl.gl_ext import GLExt
    from ..runtime.staging import StagingRing

    gl = GLExt(ctx)
    size = ring_mb * MIB
    ring = StagingRing(ctx, gl, size, 1 << 16)
    device = ctx.buffer(reserve=ring.nbytes)  # plain storage: the driver keeps it in video memory
    try:
        ring.memory[:] = 1
        gl.copy_buffer(ring.glo, device.glo, ring.nbytes)  # first touch outside the timing
        ctx.finish()
        t0 = time.perf_counter()
        for _ in range(repeats):
            gl.copy_buffer(ring.glo, device.glo, ring.nbytes)
        ctx.finish()
        seconds = time.perf_counter() - t0
    finally:
        device.release()
        ring.release()
    nbytes = repeats * ring.nbytes
    tile_bytes = (TILE + 8) ** 2 // 2  # a 136-texel BC1 tile
    return {
        "bytes": nbytes,
        "seconds": seconds,
        "gb_per_s": nbytes / seconds / 1e9,
        "bc1_tiles_per_s": nbytes / tile_bytes / seconds,
        "persistent": ring.persistent,
    }
