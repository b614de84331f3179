"""The staging textures of the staging-texture upload path (`UploadPath.STAGING_TEXTURE`).

I/O threads still write tiles into the host staging ring (`staging.StagingRing`). At upload time a
compute pass (shaders/staging_fill.glsl) reads the frame's tiles from the ring, bound as a shader
storage buffer, and stores them into a staging texture array of 32-bit-integer texels, one texel per
BC block: RG32UI for 8-byte blocks (BC1, BC4), RGBA32UI for 16-byte blocks (BC3, BC5, BC6H, BC7); one
dispatch per span of consecutive ring slots. Then one glCopyImageSubData per run of consecutive cache
layers moves the blocks into the cache array: block-compatible formats, copied bit for bit, GPU to
GPU. No pixel-transfer call reads host memory: on the NVIDIA H200 this moves about 1.7x the tiles of
the device buffer (`UploadPath.DEVICE_BUFFER`), whose uploads pay the driver's cost per call.

The arrays take the budget's "staging-device" share (`staging_share`), never more: half of it for
each block size, made at first use for the slot size of the first pool seen, as many layers as fit.
A pool this cannot serve (an uncompressed format, another slot size, an array of too few layers, or
one the driver refused) uploads straight from the ring, as `UploadPath.HOST_RING` does, and so does a
pool's batch of fewer than `min_tiles` tiles: on the H200 a glCopyImageSubData call costs the render
thread tens of microseconds against about 8 for an upload call, which only a large batch repays (its
GPU time per tile is under half the ring's).

Ordering (no fence of its own):

- ring writes -> compute reads: the ring is persistent and coherently mapped, and the I/O threads
  finished writing a slot before its load became READY; a dispatch issued afterwards reads them.
- compute reads -> ring reuse: the ring's fence is inserted right after the dispatches (and the
  ring uploads of pools served from the ring), so a ring slot goes back to the I/O threads once the
  shader has read it, before the copies ran.
- image stores -> copy reads: stores are incoherent shader writes, so ONE glMemoryBarrier with every
  bit (glCopyImageSubData's reads are named by no single bit) sits between the dispatches and the
  copies of a frame.
- copy reads -> the next stores into the same layers: a frame's batch takes consecutive layers from
  a wrapping cursor (back to layer 0 when the batch does not fit before the end), so layers are
  written again only after the cursor wraps; a wrap puts a glMemoryBarrier before the dispatches,
  which orders them after every earlier command's memory accesses, the copies' reads included.
- copy writes -> draws that sample the cache: ordinary GL command order, as for any upload.

The uploader caps a frame's tiles per array at its layers (`within_layers`). Render thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import moderngl
import numpy as np

from ..errors import GLError, ShaderError
from ..gl.enums import GL_MAX_IMAGE_UNITS, GL_MAX_SHADER_STORAGE_BLOCK_SIZE, GL_TEXTURE_2D_ARRAY
from ..gl.gl_ext import GLExt
from ..gl.shaders import compute_shader, shader_file
from .int_sets import distinct
from .pools import CachePool
from .staging import StagingRing
from .upload_plan import PoolUploads

__all__ = ["MIN_LAYERS", "TextureStaging", "TextureStagingStats", "upload_from_buffer"]

log = logging.getLogger(__name__)

#: A pool is served only by an array of at least this many layers: fewer would cap a frame's uploads
#: below what the ring path uploads at once.
MIN_LAYERS = 8
FILL_GROUP = 64  # the fill shader's local_size_x
#: The ring's storage binding during the fill: the page tables' (`texture.VT_PAGES_BINDING`), an engine
#: binding the streamer binds the tables to again after the uploads (bindings 0-5 are the program's).
RING_BINDING = 6
GL_SHADER_STORAGE_BUFFER = 0x90D2
GL_ALL_BARRIER_BITS = 0xFFFFFFFF
GL_WRITE_ONLY = 0x88B9
GL_R32UI = 0x8236
BLOCK_UINTS = {8: 2, 16: 4}  # block bytes -> 32-bit components of its staging texel


@dataclass(frozen=True)
class TextureStagingStats:
    """A snapshot of the staging textures; counters are cumulative since creation."""

    share_bytes: int  # the "staging-device" share the arrays live in
    nbytes: int  # GPU bytes of the arrays made so far (<= share_bytes)
    arrays: tuple[tuple[int, int, int], ...]  # (block bytes, slot size, layers) of each array made
    batches: int  # frames whose uploads went through an array
    dispatches: int  # compute dispatches (one per span of consecutive ring slots)
    copies: int  # glCopyImageSubData calls (one per run)
    ring_tiles: int  # tiles of pools no array serves, uploaded straight from the ring


class _Array:
    """One staging array: `layers` layers of (slot / 4)^2 texels of one block size, its fill program."""

    def __init__(self, ctx: moderngl.Context, block_bytes: int, slot: int, layers: int, image_unit: int) -> None:
        self.block_bytes, self.slot, self.layers, self.side = block_bytes, slot, layers, slot // 4
        self.texture = ctx.texture_array((self.side, self.side, layers), BLOCK_UINTS[block_bytes], dtype="u4")
        try:
            defines = {"BLOCK_UINTS": BLOCK_UINTS[block_bytes], "IMAGE_UNIT": image_unit, "RING_BINDING": RING_BINDING}
            self.program = compute_shader(ctx, shader_file("texstream/staging_fill.glsl"), defines=defines)
        except BaseException:
            self.texture.release()
            raise
        self.program["side"] = self.side
        self.cursor = 0

    @property
    def nbytes(self) -> int:
        return self.side * self.side * self.block_bytes * self.layers

    def take(self, count: int) -> tuple[int, bool]:
        """The first of `count` consecutive layers for one frame's batch, and whether the cursor went
        back to layer 0 (the batch writes layers earlier frames' copies read)."""
        wrapped = self.cursor + count > self.layers
        if wrapped:
            self.cursor = 0
        first = self.cursor
        self.cursor = (self.cursor + count) % self.layers
        return first, wrapped

    def release(self) -> None:
        self.texture.release()
        self.program.release()


class TextureStaging:
    """The staging arrays of one uploader, in a `share_bytes` share of the budget (module docstring).

    Parameters
    ----------
    gl
        The context's `GLExt` (`has_staging_texture`).
    share_bytes
        The budget's "staging-device" bytes: the arrays never take more.
    ring
        The persistent-mapped host ring the fill reads (bound whole as a storage buffer).
    min_tiles
        A pool's frame batch of fewer tiles uploads straight from the ring
        (`StreamerConfig.upload_staging_min_tiles`).
    """

    def __init__(self, gl: GLExt, share_bytes: int, ring: StagingRing, min_tiles: int = 1) -> None:
        if share_bytes < 1:
            raise ValueError(f"staging textures need a share of the budget, got {share_bytes!r} bytes")
        if not gl.has_staging_texture or not ring.persistent:
            raise GLError("the staging-texture path needs GL 4.3 compute shaders and a persistent-mapped ring")
        limit = gl.get_integer(GL_MAX_SHADER_STORAGE_BLOCK_SIZE) & 0xFFFFFFFF
        if ring.nbytes > limit:
            raise GLError(f"the {ring.nbytes}-byte staging ring exceeds this driver's {limit}-byte storage buffers")
        self._gl, self.share_bytes, self._ring, self.min_tiles = gl, int(share_bytes), ring, max(1, int(min_tiles))
        self.image_unit = gl.get_integer(GL_MAX_IMAGE_UNITS) - 1  # the last one: the program's are below it
        self._arrays: dict[int, _Array | None] = {}  # block bytes -> its array (None: refused by the driver)
        self._batches = self._dispatches = self._copies = self._ring_tiles = 0

    # ---- which pools it serves --------------------------------------------------------------------
    def layers_for(self, block_bytes: int, slot: int) -> int:
        """Layers of the array for `block_bytes`-byte blocks and `slot`-texel tiles: half the share."""
        tile = (slot // 4) ** 2 * block_bytes
        return min(self.share_bytes // 2 // tile, self._gl.max_array_layers)

    def array_for(self, pool: CachePool) -> _Array | None:
        """The array that stages `pool`'s tiles (made at first use), or None: the ring serves it."""
        texture = pool.texture
        if texture is None or not texture.format.compressed:
            return None
        slot = pool.geometry.slot_size
        block = texture.format.layer_bytes(slot) // (slot // 4) ** 2
        if block not in BLOCK_UINTS:
            return None
        if block not in self._arrays:
            layers = self.layers_for(block, slot)
            self._arrays[block] = None
            if layers >= MIN_LAYERS:
                try:
                    self._arrays[block] = _Array(self._gl.ctx, block, slot, layers, self.image_unit)
                    log.debug("staging texture: %d layers of %d-byte blocks, %d-texel slots", layers, block, slot)
                except (moderngl.Error, GLError, ShaderError) as exc:
                    self._gl.get_error()  # the refusal's error code, so the next check starts clean
                    log.warning("no staging texture for %d-byte blocks (%s): those uploads read the ring", block, exc)
        arr = self._arrays[block]
        return arr if arr is not None and arr.slot == slot else None

    def within_layers(self, pool_of: np.ndarray, pools: Sequence[CachePool | None]) -> np.ndarray:
        """Which of a frame's loads (in upload order; `pool_of`: each one's pool) fit their array's
        layers: the first `layers` loads of each array's pools; loads the ring serves all fit."""
        keep = np.ones(pool_of.size, bool)
        by_array: dict[int, list[int]] = {}
        for p in distinct(pool_of):
            pool = pools[p] if 0 <= p < len(pools) else None
            arr = self.array_for(pool) if pool is not None else None
            if arr is not None:
                by_array.setdefault(id(arr), []).append(p)
        for members in by_array.values():
            arr = self.array_for(pools[members[0]])  # type: ignore[arg-type]
            assert arr is not None
            mine = np.isin(pool_of, members)
            keep[mine] = np.arange(int(np.count_nonzero(mine))) < arr.layers
        return keep

    # ---- the upload ---------------------------------------------------------------------------
    def issue(
        self,
        slots: np.ndarray,
        nbytes: np.ndarray,
        cache_slot: np.ndarray,
        plan: list[PoolUploads],
        pools: Sequence[CachePool | None],
        native: Any = None,
    ) -> tuple[int, int]:
        """Upload ring slots `slots` (`plan`: per pool, sorted by cache slot, its runs; `nbytes` and
        `cache_slot` per ring slot) and fence the ring; returns (bytes, calls). Each array's share
        of the frame must fit its layers (`within_layers`)."""
        ring, gl = self._ring, self._gl
        staged: list[tuple[_Array, PoolUploads, int]] = []  # (array, pool's uploads, its first layer)
        direct: list[PoolUploads] = []
        for u in plan:
            pool = pools[u.pool]
            arr = self.array_for(pool) if pool is not None and u.ring_slots.size >= self.min_tiles else None
            if arr is None:
                direct.append(u)
            else:
                staged.append((arr, u, 0))
        total = calls = 0
        try:
            staged, calls = self._fill(staged)
            if direct:
                firsts = [u.ring_slots[u.runs["start"]] for u in direct]
                nb, nc = upload_from_buffer(gl, direct, firsts, pools, cache_slot, ring.glo, ring.stride, native)
                total, calls = total + nb, calls + nc
                self._ring_tiles += sum(u.ring_slots.size for u in direct)
        finally:  # whatever was issued read the ring: fence it, so its slots come back once read
            gl.functions.glBindBufferBase(GL_SHADER_STORAGE_BUFFER, RING_BINDING, 0)
            gl.functions.glBindImageTexture(self.image_unit, 0, 0, 0, 0, GL_WRITE_ONLY, GL_R32UI)
            ring.submit(slots, int(nbytes[slots].sum()))
        if staged:
            gl.ctx.memory_barrier(GL_ALL_BARRIER_BITS)  # the stores reach the copies
            nb, nc = self._copy_out(staged, pools, cache_slot, nbytes)
            total, calls = total + nb, calls + nc
            self._batches += 1
        return total, calls

    def _fill(self, staged: list[tuple[_Array, PoolUploads, int]]) -> tuple[list[tuple[_Array, PoolUploads, int]], int]:
        """Dispatch the fills: per array, its pools' loads into consecutive layers of one batch, one
        dispatch per span of consecutive ring slots. Returns `staged` with each pool's first staging
        layer, and the dispatches."""
        if not staged:
            return staged, 0
        dispatches = 0
        out: list[tuple[_Array, PoolUploads, int]] = []
        f = self._gl.functions
        f.glBindBufferBase(GL_SHADER_STORAGE_BUFFER, RING_BINDING, self._ring.glo)
        for arr in {id(a): a for a, _, _ in staged}.values():
            mine = [u for a, u, _ in staged if a is arr]
            counts = [u.ring_slots.size for u in mine]
            first_layer, wrapped = arr.take(sum(counts))
            if wrapped:  # stores into layers earlier copies read: those reads complete first
                self._gl.ctx.memory_barrier(GL_ALL_BARRIER_BITS)
            out += [
                (arr, u, first_layer + at) for u, at in zip(mine, np.cumsum([0, *counts[:-1]]).tolist(), strict=True)
            ]
            ring_slots = np.concatenate([u.ring_slots for u in mine])
            starts = np.concatenate([[0], np.flatnonzero(np.diff(ring_slots) != 1) + 1])
            ends = np.concatenate([starts[1:], [ring_slots.size]])
            arr.texture.bind_to_image(self.image_unit, read=False, write=True)
            program = arr.program
            program["slot_blocks"] = self._ring.stride // arr.block_bytes
            groups_x = -(-arr.side * arr.side // FILL_GROUP)
            for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
                program["first_slot"] = int(ring_slots[a])
                program["first_layer"] = first_layer + a
                program.run(groups_x, b - a)
            dispatches += int(starts.size)
        self._dispatches += dispatches
        return out, dispatches

    def _copy_out(
        self,
        staged: list[tuple[_Array, PoolUploads, int]],
        pools: Sequence[CachePool | None],
        cache_slot: np.ndarray,
        nbytes: np.ndarray,
    ) -> tuple[int, int]:
        """One glCopyImageSubData per run, staging layers -> cache layers; (bytes, calls)."""
        copy = self._gl.functions.glCopyImageSubData
        total = calls = 0
        for arr, u, first_layer in staged:
            pool = pools[u.pool]
            assert pool is not None and pool.texture is not None
            g, runs = pool.geometry, u.runs
            layer, cx, cy = g.locate(cache_slot[u.ring_slots[runs["start"]]], pool.layers)
            src, dst, side, slot = arr.texture.glo, pool.texture.glo, arr.side, arr.slot
            rows = zip(
                (first_layer + runs["start"]).tolist(),
                layer.tolist(),
                (cx * slot).tolist(),
                (cy * slot).tolist(),
                runs["count"].tolist(),
                strict=True,
            )
            for sl, dl, dx, dy, n in rows:
                copy(src, GL_TEXTURE_2D_ARRAY, 0, 0, 0, sl, dst, GL_TEXTURE_2D_ARRAY, 0, dx, dy, dl, side, side, n)
            calls += int(runs.size)
            total += int(nbytes[u.ring_slots].sum())
        self._copies += calls
        return total, calls

    # ---- figures and lifetime -------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """GPU bytes of the arrays made so far (within `share_bytes`)."""
        return sum(a.nbytes for a in self._arrays.values() if a is not None)

    @property
    def glos(self) -> tuple[int, ...]:
        """GL names of the arrays made so far."""
        return tuple(a.texture.glo for a in self._arrays.values() if a is not None)

    def stats(self) -> TextureStagingStats:
        arrays = tuple((a.block_bytes, a.slot, a.layers) for a in self._arrays.values() if a is not None)
        return TextureStagingStats(
            self.share_bytes, self.nbytes, arrays, self._batches, self._dispatches, self._copies, self._ring_tiles
        )

    def release(self) -> None:
        """Delete the arrays and programs (idempotent; GL keeps them until the copies reading them ended)."""
        for arr in self._arrays.values():
            if arr is not None:
                arr.release()
        self._arrays.clear()


def upload_from_buffer(
    gl: GLExt,
    plan: list[PoolUploads],
    firsts: list[np.ndarray],
    pools: Sequence[CachePool | None],
    cache_slot: np.ndarray,
    pbo: int,
    stride: int,
    native: Any = None,
) -> tuple[int, int]:
    """Upload `plan`'s runs from pixel-unpack buffer `pbo` (run i of pool uploads k at slot
    ``firsts[k][i]`` of `stride` bytes), one call per run (`GLExt.upload_runs`); (bytes, calls)."""
    total = calls = 0
    for uploads, first in zip(plan, firsts, strict=True):
        s, runs = uploads.ring_slots, uploads.runs
        pool = pools[uploads.pool]
        assert pool is not None and pool.texture is not None
        g = pool.geometry
        layer, cx, cy = g.locate(cache_slot[s[runs["start"]]], pool.layers)
        total += gl.upload_runs(
            pool.texture,
            layer,
            cx * g.slot_size,
            cy * g.slot_size,
            runs["count"],
            first * stride,
            g.slot_size,
            pbo,
            stride,
            native,
        )
        calls += int(runs.size)
    return total, calls
