"""The uploader: owns every tile load from start to end, in batches.

A load takes one staging-ring slot for its whole life, so loads are records in arrays indexed by ring
slot (structure of arrays), with an explicit `LoadState`::

    FREE --submit--> READING --drain: read ok--> READY --upload--> UPLOADING --reclaim: fence--> FREE
                       |   \\                        |
                       |    cancel --> CANCELLED    cancel / drain: read failed --> FREE
                       |                  |
                       +------ drain -----+--> FREE (cancelled or failed: reported to the caller)
                       |                  |
                       +-- drain: the read hangs past read_timeout_s --> ABANDONED --its read
                           returns (drain)--> FREE (failed: reported when abandoned)

- `submit` (render thread) reserves ring slots for tiles whose cache slots the caller already took,
  groups them by pack into file-ordered `ReadBatch`es and queues them: one queue item per batch (the
  streamer keeps them for `start_reads`, its last step, so the woken threads' Python runs after it).
- The I/O threads read, decode and verify a batch into its ring slots (`io_workers`).
- `drain` (render thread) takes the finished batches: READING -> READY, or FREE on failure; a
  CANCELLED load is freed here too (the thread skipped it or its bytes are dropped). A batch read for
  longer than ``read_timeout_s`` is given up: its loads fail now (their cache slots go back, their
  tiles back off) and its ring slots stay ABANDONED, owned by the stuck thread, until the read
  returns (if it never does, they stay out of use: at most one batch per hung read).
- `cancel_stale` (render thread) cancels loads still queued for reading whose tiles the latest
  feedback readbacks no longer want (a fast pan leaves many): the thread skips them.
- `upload` (render thread) takes READY loads in submission order under the per-frame caps, into cache
  slots whose overwrite gate has passed (no draw in flight samples them), one call per run of
  consecutive cache layers at one cell from consecutive ring slots (`upload_plan`: `submit` hands
  ring slots out in cache-slot order), ONE fence a frame; a time budget keeps the calls that fit.
  On the device path (`UploadPath.DEVICE_BUFFER`, `device_staging`) the runs are first copied into a
  device-local buffer and uploaded from there; the ring's fence then sits right behind the copies. On
  `UploadPath.STAGING_TEXTURE` (`texture_staging`) a compute pass stages them, then GPU copies land them.
- `reclaim` (render thread) frees the ring slots of fenced batches that signalled.
- `load_now` is the blocking path (pinned levels at open, all-resident references): the same read
  and upload functions, on the render thread, waiting for fences instead of polling.

Which thread owns what: the records (every array here) belong to the render thread. While a load is
READING or CANCELLED, the I/O thread holding its batch owns its ring slot's bytes and reads (only) its
state byte, to skip it when CANCELLED. A pack's file stays open until every batch reading it is back.

It never touches page tables, pools or the scheduler: it returns what happened (`Drained`, `Uploaded`).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence

import moderngl
import numpy as np

from ..config import StreamerConfig, UploadPath
from ..errors import EngineError, GLError
from ..gl.gl_ext import GLExt
from ..gl.objects import FenceLike
from ..native import Native
from ..pack.reader import PackReader
from ..remote import RemoteStats
from . import blocking_load, staging_share
from .budget import BudgetManager
from .byte_sources import ReadBatch, ReadResult, ReadStatus, SourceIndex, TileSource, _Scratch, failure_reasons
from .device_staging import DeviceStaging
from .io_workers import IOWorkers, ReadHook
from .pools import CachePool
from .records import Drained, LoadRecords, Uploaded
from .staging import StagingRing
from .texture_staging import TextureStaging, upload_from_buffer
from .tiles import TileSpace
from .upload_budget import UploadCost
from .upload_choice import RingLoads, UploadChoice
from .upload_plan import PoolUploads, keep_within_budget

__all__ = ["Drained", "LoadRecords", "LoadState", "Uploaded", "Uploader"]

log = logging.getLogger(__name__)

BATCH_TILES = 32  # tiles per I/O queue item: small enough to spread over threads, large enough to amortize


class LoadState(enum.IntEnum):
    """A load's state, one uint8 per staging-ring slot (see the module docstring for the owners)."""

    FREE = 0  # no load uses this ring slot
    READING = 1  # queued to or being read by an I/O thread, which owns the slot's bytes
    CANCELLED = 2  # still with an I/O thread, no longer wanted: skipped if not started, dropped on drain
    READY = 3  # verified bytes in the ring slot, waiting for the upload caps and the cache slot's gate
    UPLOADING = 4  # upload issued; the GPU reads the ring slot until its fence signals
    ABANDONED = 5  # its read hung and was given up: the stuck I/O thread owns the slot until it returns


# plain ints of the states for per-frame array code (enum attribute lookups are slow)
_FREE = int(LoadState.FREE)
_READING = int(LoadState.READING)
_CANCELLED = int(LoadState.CANCELLED)
_READY = int(LoadState.READY)
_UPLOADING = int(LoadState.UPLOADING)
_ABANDONED = int(LoadState.ABANDONED)
_READ_OK = int(ReadStatus.OK)
_READ_SKIPPED = int(ReadStatus.SKIPPED)


class Uploader:
    """Tile loads from pack to cache slot (see the module docstring). Render thread only.

    Parameters
    ----------
        ctx, gl: the context and its raw GL layer.
    space
        The tile id space (its listeners grow the tile -> load map).
    config
        Streaming configuration (I/O threads, caps, native helper).
    ring_bytes
        Staging-ring size; slot_bytes: largest tile.
    device_bytes, upload_path
        Bytes of the device-local buffer, or on `UploadPath.STAGING_TEXTURE` of the staging arrays' share
        (`TextureStaging`); needs a persistent-mapped ring (0: upload straight from it, `UploadPath.HOST_RING`).
    fence_factory
        The ring's fences (tests inject fakes).
    read_hook
        Called on the I/O thread before each batch (fault injection; see `IOWorkers`).
    """

    def __init__(
        self,
        ctx: moderngl.Context,
        gl: GLExt,
        space: TileSpace,
        config: StreamerConfig,
        ring_bytes: int,
        slot_bytes: int,
        fence_factory: Callable[[], FenceLike] | None = None,
        read_hook: ReadHook | None = None,
        device_bytes: int = 0,
        upload_path: UploadPath = UploadPath.DEVICE_BUFFER,
    ) -> None:
        self.ctx, self.gl, self.space, self.config = ctx, gl, space, config
        self.native: Native | None = None
        if config.native:
            from ..native import load

            self.native = load()
        self.ring = StagingRing(ctx, gl, ring_bytes, slot_bytes, fence_factory=fence_factory)
        self.device: DeviceStaging | None = None
        self.textures: TextureStaging | None = None  # the staging-texture path's arrays
        if device_bytes > 0:
            if not self.ring.persistent:
                self.ring.release()
                raise EngineError("the device upload path needs a persistent-mapped staging ring (buffer storage)")
            try:
                if upload_path is UploadPath.STAGING_TEXTURE:
                    self.textures = TextureStaging(gl, device_bytes, self.ring, config.upload_staging_min_tiles)
                else:
                    self.device = DeviceStaging(gl, device_bytes // self.ring.stride, self.ring.stride)
            except BaseException:
                self.ring.release()
                raise
        n = self.ring.slot_count
        self.state = np.zeros(n, np.uint8)
        self.tile = np.full(n, -1, np.int64)
        self.tex = np.full(n, -1, np.int64)
        self.pool = np.full(n, -1, np.int64)
        self.cache_slot = np.full(n, -1, np.int64)
        self.nbytes = np.zeros(n, np.int64)
        self.issued = np.zeros(n, np.int64)  # frame of submit
        self.seq = np.zeros(n, np.int64)  # submission order
        self._next_seq = 0
        self.load_of = np.full(space.capacity, -1, np.int32)  # tile id -> ring slot of its load
        space.add_listener(self._grow)
        self.sources: dict[int, SourceIndex] = {}
        self._retired: list[SourceIndex] = []  # closed textures whose files wait for their batches
        self._next_batch = 0
        self._held: list[ReadBatch] = []  # read batches submit(start=False) keeps for start_reads()
        self.io = IOWorkers(
            config.io_threads, self.ring.memory, self.ring.stride, self.state, _CANCELLED, self.native, read_hook
        )
        self.blocking_scratch = _Scratch(self.native)  # the render thread's, for the blocking path
        self.last_calls = 0  # upload calls the latest upload() issued (buffer copies included)
        self.cost = UploadCost()  # seconds per call and per byte on this driver, measured
        self._runs_ok: dict[tuple[int, int], bool] = {}  # (texel format, slot size): runs read the ring's stride
        self.choice = UploadChoice(n, self.native is not None)  # which READY loads go, in which calls
        self._loads = RingLoads(self.state, self.seq, self.pool, self.cache_slot, self.nbytes)
        self._layers = self._runs_max = np.zeros(0, np.int64)  # per pool, for `choice.plan`
        self._closed = False

    @property
    def upload_path(self) -> UploadPath:
        """The path the upload calls take (never AUTO)."""
        if self.textures is not None:
            return UploadPath.STAGING_TEXTURE
        return UploadPath.DEVICE_BUFFER if self.device is not None else UploadPath.HOST_RING

    @classmethod
    def fitting(
        cls,
        current: Uploader | None,
        tile_bytes: int,
        sources: list[tuple[int, PackReader]],
        *,
        ctx: moderngl.Context,
        gl: GLExt,
        space: TileSpace,
        config: StreamerConfig,
        budget: BudgetManager,
        read_hook: ReadHook | None,
    ) -> Uploader:
        """`current` if its ring slots hold `tile_bytes`, else a new uploader (ring reserved in the
        budget as "staging-ring") reading `sources`; the old one is released. EngineError while the
        old one still streams."""
        if current is not None and current.ring.slot_bytes >= tile_bytes:
            return current
        if current is not None:
            if current.busy or current.ring.batches_in_flight:
                raise EngineError("cannot open a pack with larger tiles while tiles are streaming; open it first")
            for tex, _ in sources:
                current.remove_source(tex)
            current.release()
            staging_share.release_staging(budget)
        host, device, path = staging_share.reserve_staging(config, gl, budget, tile_bytes)
        try:
            try:
                up = cls(ctx, gl, space, config, host, tile_bytes, None, read_hook, device, path)
            except GLError as exc:  # no device-local buffer (out of memory): the host ring still works
                if not device:
                    raise
                log.warning("no device-local staging buffer (%s): uploads read the host ring", exc)
                up = cls(ctx, gl, space, config, staging_share.all_to_ring(budget), tile_bytes, read_hook=read_hook)
        except BaseException:
            staging_share.release_staging(budget)
            raise
        for tex, reader in sources:
            up.add_source(tex, reader)
        return up

    def _grow(self, capacity: int) -> None:
        self.load_of = np.concatenate([self.load_of, np.full(capacity - self.load_of.size, -1, np.int32)])

    # ---- sources --------------------------------------------------------------------------------
    def add_source(self, tex: int, reader: PackReader) -> None:
        """Read texture `tex`'s tiles from `reader`'s pack (the uploader keeps its own descriptor, so
        the reader may close whenever its owner likes)."""
        self.sources[tex] = SourceIndex.of(reader, self.space.ranges[tex].first_tile)

    def remote_stats(self, tex: int | None = None) -> list[RemoteStats]:
        """Network figures of the open textures read by URL (or of texture `tex` alone)."""
        sources = self.sources.values() if tex is None else [s for t, s in self.sources.items() if t == tex]
        return [s.tile.remote.stats() for s in sources if s.tile.remote is not None]

    def remove_source(self, tex: int) -> LoadRecords:
        """Forget a texture's loads (cancelled; returned so the caller frees their cache slots) and
        close the uploader's descriptor of its pack once no I/O thread reads it any more."""
        self.start_reads()  # its kept batches count in src.batches: the threads see them skipped
        cancelled = self.cancel_where(self.tex == tex)
        src = self.sources.pop(tex, None)
        if src is not None:
            src.closing = True
            if src.batches:
                self._retired.append(src)
            else:
                src.tile.close()
        return cancelled

    # ---- counts ---------------------------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return self.ring.free_count

    def count(self, state: LoadState) -> int:
        return int(np.count_nonzero(self.state == state))

    @property
    def in_flight(self) -> int:
        """Loads submitted and not yet uploaded (reading or ready)."""
        return int(np.count_nonzero((self.state == _READING) | (self.state == _READY)))

    @property
    def busy(self) -> bool:
        return bool(np.any((self.state != _FREE) & (self.state != _UPLOADING)))

    def states(self, tex: int | None = None) -> dict[LoadState, int]:
        """How many loads (of texture `tex`, or all) are in each state."""
        s = self.state if tex is None else self.state[self.tex == tex]
        counts = np.bincount(s, minlength=len(LoadState))
        return {st: int(counts[st]) for st in LoadState}

    def loading_mask(self, ids: np.ndarray) -> np.ndarray:
        """Which of these tiles have a load (any state but UPLOADING's tail end)."""
        return self.load_of[ids] >= 0

    # ---- submit ---------------------------------------------------------------------------------
    def submit(
        self, frame: int, tiles: np.ndarray, pool: np.ndarray, cache_slots: np.ndarray, *, start: bool = True
    ) -> int:
        """Start loads of `tiles` into `cache_slots` of pools `pool` (in priority order). The caller
        checked `free_slots`; returns how many were submitted (all, unless the ring ran dry).
        `start=False` keeps the read batches for `start_reads()`, the streamer's last step: a thread
        woken now takes the interpreter lock at the render thread's next numpy call that drops it."""
        tiles = np.asarray(tiles, np.int64)
        n = tiles.size
        if n == 0:
            return 0
        if np.any(self.load_of[tiles] >= 0):
            raise ValueError("a tile already has a load")
        got = self.ring.acquire(n)
        if got.size < n:
            self.ring.abandon(got)
            raise EngineError(f"staging ring has {got.size} free slots for {n} loads")
        # ring slots in the order of the cache slots (by pool): a run of cache layers then reads one
        # contiguous span of ring memory, so it uploads with one call
        slots = np.empty(n, np.int64)
        slots[np.lexsort((cache_slots, pool))] = got
        tex = self.space.tex[tiles].astype(np.int64)
        self.state[slots] = _READING
        self.tile[slots] = tiles
        self.tex[slots] = tex
        self.pool[slots] = pool
        self.cache_slot[slots] = cache_slots
        self.nbytes[slots] = self.space.tile_bytes[tex]
        self.issued[slots] = frame
        self.seq[slots] = self._next_seq + np.arange(n)  # priority order: the upload caps take a prefix
        self._next_seq += n
        self.load_of[tiles] = slots
        order = np.lexsort((np.zeros(n), tex))
        bounds = np.diff(tex[order]).nonzero()[0] + 1
        for part in np.split(order, bounds):
            self._queue(tex[part[0]], tiles[part], slots[part])
        if start:
            self.start_reads()
        return n

    def start_reads(self) -> int:
        """Hand the read batches `submit(start=False)` kept to the I/O threads; returns how many."""
        held, self._held = self._held, []
        if held:
            self.io.submit_many(held)
        return len(held)

    def move_cache_slots(self, pool: int, moved_from: np.ndarray, moved_to: np.ndarray) -> None:
        """Pool `pool` was resized and renamed its slots (``moved_from[i]`` is now ``moved_to[i]``):
        loads still to be uploaded there follow them."""
        old = np.asarray(moved_from, np.int64)
        if old.size == 0:
            return
        live = (
            (self.pool == pool) & (self.cache_slot >= 0) & ((self.state == _READING) | (self.state == _READY))
        ).nonzero()[0]
        if live.size == 0:
            return
        cs = self.cache_slot[live]
        order = np.argsort(old)
        at = np.searchsorted(old[order], cs)
        hit = (at < old.size) & (old[order][np.minimum(at, old.size - 1)] == cs)
        self.cache_slot[live[hit]] = np.asarray(moved_to, np.int64)[order][at[hit]]

    def _queue(self, tex: int, tiles: np.ndarray, slots: np.ndarray) -> None:
        src = self.sources[int(tex)]
        entry = tiles - src.first_tile
        order = np.argsort(src.offsets[entry], kind="stable")
        e = entry[order]  # every array in file order once; the batches are slices (views) of them
        t, s, off, stored, checksums = tiles[order], slots[order], src.offsets[e], src.stored[e], src.checksums[e]
        for start in range(0, order.size, BATCH_TILES):
            b = slice(start, start + BATCH_TILES)
            batch = ReadBatch(self._next_batch, src.tile, t[b], s[b], off[b], stored[b], checksums[b])
            self._next_batch += 1
            src.batches += 1
            self._held.append(batch)

    # ---- drain ----------------------------------------------------------------------------------
    def drain(self) -> Drained:
        """Take every finished read batch, and give up reads that hang (never blocks)."""
        self.start_reads()  # batches a frame that raised before its last step kept
        results = self.io.drain()
        drained = self._apply_results(results)
        late = self.io.overdue(self.config.read_timeout_s)
        if not late:
            return drained
        gave_up = self._abandon(late)
        return Drained(
            LoadRecords.concat([drained.failed, gave_up.failed]),
            drained.reasons + gave_up.reasons,
            drained.ready,
            drained.read_seconds,
        )

    def _abandon(self, batches: list[ReadBatch]) -> Drained:
        """Loads of batches whose read hangs: failed now; their ring slots wait for the read to return."""
        timeout = self.config.read_timeout_s
        reasons: list[str] = []  # one per failed load, in the order of `reading` below
        for b in batches:
            n = int(np.count_nonzero(self.state[b.ring_slots] == _READING))
            reasons += [f"{b.source.name}: its read hangs (over {timeout:g} s); given up"] * n
        slots = np.concatenate([b.ring_slots for b in batches])
        state = self.state[slots]
        reading = slots[state == _READING]
        failed = self._records(reading)
        t = self.tile[reading]
        mine = self.load_of[t] == reading
        self.load_of[t[mine]] = -1
        self.state[slots[(state == _READING) | (state == _CANCELLED)]] = _ABANDONED
        return Drained(failed, reasons, 0)

    def _apply_results(self, results: list[ReadResult]) -> Drained:
        if not results:
            return Drained(LoadRecords.empty(), [], 0)
        for r in results:
            self._batch_done(r.batch.source)
        late = [r for r in results if r.abandoned]
        if late:  # given up earlier (their loads already failed): the ring slots are free again
            self._free(np.concatenate([r.batch.ring_slots for r in late]))
            results = [r for r in results if not r.abandoned]
            if not results:
                return Drained(LoadRecords.empty(), [], 0)
        slots = np.concatenate([r.batch.ring_slots for r in results])
        status = np.concatenate([r.status for r in results])
        state = self.state[slots]
        cancelled = state == _CANCELLED
        ok = (status == _READ_OK) & ~cancelled
        failed = ~ok & ~cancelled & (status != _READ_SKIPPED)
        self.state[slots[ok]] = _READY
        failed_rec = self._records(slots[failed])
        reasons = failure_reasons(results, failed, self.space.coords) if failed.any() else []
        self._free(np.concatenate([slots[failed], slots[cancelled]]))
        return Drained(failed_rec, reasons, int(np.count_nonzero(ok)), [r.seconds for r in results])

    def _batch_done(self, tile_source: TileSource) -> None:
        for src in list(self.sources.values()) + self._retired:
            if src.tile is tile_source:
                src.batches -= 1
                if src.closing and src.batches == 0:
                    self._retired.remove(src)
                    src.tile.close()
                return

    def _records(self, slots: np.ndarray) -> LoadRecords:
        return LoadRecords(
            self.tile[slots].copy(), self.tex[slots].copy(), self.pool[slots].copy(), self.cache_slot[slots].copy()
        )

    def _free(self, slots: np.ndarray) -> None:
        """Loads that end without an upload: their ring slots go straight back."""
        if slots.size == 0:
            return
        t = self.tile[slots]
        mine = (t >= 0) & (self.load_of[np.maximum(t, 0)] == slots)  # a cancelled tile may have a new load
        self.load_of[t[mine]] = -1
        self.state[slots] = _FREE
        self.tile[slots] = -1
        self.ring.abandon(slots)

    # ---- cancel ---------------------------------------------------------------------------------
    def cancel(self, tiles: np.ndarray) -> LoadRecords:
        """Cancel the loads of `tiles` that have one and are not uploading yet; returns them: their
        cache slots are the caller's to free now (no thread writes cache slots)."""
        tiles = np.asarray(tiles, np.int64)
        slots = self.load_of[tiles]
        mask = np.zeros(self.state.size, bool)
        mask[slots[slots >= 0]] = True
        return self.cancel_where(mask)

    def cancel_where(self, mask: np.ndarray) -> LoadRecords:
        """Cancel the loads of the ring slots in `mask` (see `cancel`). A READY load ends now; a
        READING one becomes CANCELLED and keeps its ring slot until its batch comes back."""
        live = mask & ((self.state == _READING) | (self.state == _READY))
        slots = live.nonzero()[0]
        out = self._records(slots)
        reading = slots[self.state[slots] == _READING]
        self.state[reading] = _CANCELLED
        self.load_of[self.tile[reading]] = -1  # the tile may be asked for again at once
        self.cache_slot[reading] = -1
        self._free(slots[self.state[slots] == _READY])
        return out

    def cancel_stale(self, last_wanted: np.ndarray, wanted_since: int) -> LoadRecords:
        """Cancel loads still with the I/O threads whose tiles were last wanted before frame
        `wanted_since` (`last_wanted`: frame each tile id was last wanted). Returned like `cancel`."""
        reading = (self.state == _READING).nonzero()[0]
        if reading.size == 0:
            return LoadRecords.empty()
        stale = last_wanted[self.tile[reading]] < wanted_since
        if not stale.any():
            return LoadRecords.empty()
        mask = np.zeros(self.state.size, bool)
        mask[reading[stale]] = True
        return self.cancel_where(mask)

    # ---- upload ---------------------------------------------------------------------------------
    def upload(
        self,
        frame: int,
        pools: Sequence[CachePool | None],
        max_tiles: int | None = None,
        max_bytes: int | None = None,
        time_budget_s: float | None = None,
    ) -> Uploaded:
        """Issue READY loads in submission order under the caps, into writable cache slots only.

        With `time_budget_s`, only the calls (runs) whose predicted time (`cost`, measured on this
        driver) fits go out, most urgent first, at least one. Defaults: the `StreamerConfig`'s."""
        cfg = self.config
        max_tiles = cfg.upload_tiles_per_frame if max_tiles is None else max_tiles
        max_bytes = cfg.upload_bytes_per_frame if max_bytes is None else max_bytes
        if self.device is not None:  # a frame's batch fits the device buffer in one piece
            max_tiles = min(max_tiles, self.device.slot_count)
        if time_budget_s is None and cfg.upload_time_budget_ms is not None:
            time_budget_s = cfg.upload_time_budget_ms * 1e-3
        writable = [None if pool is None else pool.ledger.writable_at for pool in pools]  # the overwrite gates
        chosen = self.choice.choose(self._loads, _READY, writable, frame, max_tiles, max_bytes)
        if chosen.size and self.textures is not None:  # a frame's batch fits each staging array in one piece
            chosen = chosen[self.textures.within_layers(self.pool[chosen], pools)]
        if chosen.size == 0:
            return Uploaded(LoadRecords.empty(), np.zeros(0, np.int64), 0)
        plan = self.choice.plan(chosen, self.pool, self.cache_slot, *self._plan_limits(pools))
        if time_budget_s is not None:
            plan = keep_within_budget(plan, self.seq, self.nbytes, self.cost, time_budget_s)
            chosen = np.concatenate([u.ring_slots for u in plan])
        t0 = time.perf_counter()
        nbytes = self._issue(chosen, plan, pools)
        if time_budget_s is not None:  # the cost model serves the time budget only
            self.cost.observe(self.last_calls, nbytes, time.perf_counter() - t0)
        loads = self._records(chosen)
        self.state[chosen] = _UPLOADING
        self.load_of[self.tile[chosen]] = -1
        return Uploaded(loads, frame - self.issued[chosen], nbytes)

    def _plan_limits(self, pools: Sequence[CachePool | None]) -> tuple[np.ndarray, np.ndarray]:
        """Per pool: its layers and the longest run a call may upload into it (0 for a missing pool)."""
        n = len(pools)
        if self._layers.size != n:
            self._layers, self._runs_max = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for p, pool in enumerate(pools):
            ok = pool is not None and pool.texture is not None
            self._layers[p] = pool.layers if ok else 0  # type: ignore[union-attr]
            self._runs_max[p] = self._max_run(pool) if ok else 0  # type: ignore[arg-type]
        return self._layers, self._runs_max

    def _max_run(self, pool: CachePool) -> int:
        """The longest run a call may upload into `pool`: 1 where the unpack modes cannot step over
        the slack between ring slots (asked of GL once per texel format and slot size)."""
        key = (pool.texture.format.internal_format, pool.geometry.slot_size)  # type: ignore[union-attr]
        if key not in self._runs_ok:
            self._runs_ok[key] = self.gl.run_image_stride_ok(pool.texture, key[1], self.ring.stride)  # type: ignore[arg-type]
        return self.config.upload_max_run if self._runs_ok[key] else 1

    def _issue(self, slots: np.ndarray, plan: list[PoolUploads], pools: Sequence[CachePool | None]) -> int:
        """Upload ring slots into their cache slots (per pool, one call per run of consecutive cache
        layers at one cell read from consecutive ring slots), then fence them all at once. On the
        device path the runs are copied into the device buffer first and the fence goes right
        behind the copies (the ring slots are free once copied); the uploads read the device buffer."""
        ring = self.ring
        ring.stage(slots, self.nbytes[slots])
        if self.textures is not None:  # fills, the ring's fence, then the copies (`texture_staging`)
            total, self.last_calls = self.textures.issue(slots, self.nbytes, self.cache_slot, plan, pools, self.native)
            return total
        total = 0
        self.last_calls = 0
        firsts = [u.ring_slots[u.runs["start"]] for u in plan]  # each run's first ring slot
        pbo, source = ring.glo, firsts
        if self.device is not None:
            try:
                counts = np.concatenate([u.runs["count"] for u in plan])
                device_first, copies = self.device.copy_in(ring.glo, np.concatenate(firsts), counts, self.native)
            finally:  # issued copies read the ring: fence whatever went out
                ring.submit(slots, int(self.nbytes[slots].sum()))
            pbo, at = self.device.glo, np.cumsum([0] + [f.size for f in firsts])
            source = [device_first[at[i] : at[i + 1]] for i in range(len(plan))]
            self.last_calls += copies
        try:
            total, n = upload_from_buffer(self.gl, plan, source, pools, self.cache_slot, pbo, ring.stride, self.native)
            self.last_calls += n
        finally:
            if self.device is None:
                ring.submit(slots, total)  # issued uploads read the ring: fence whatever went out
        return total

    def reclaim(self) -> int:
        """Free the ring slots of upload batches whose fence signalled (polls)."""
        freed = self.ring.reclaim()
        if freed.size:
            self.state[freed] = _FREE
            self.tile[freed] = -1
        return int(freed.size)

    # ---- the blocking path ----------------------------------------------------------------------
    def load_now(
        self, frame: int, tiles: np.ndarray, pool: CachePool, cache_slots: np.ndarray
    ) -> tuple[np.ndarray, list[str]]:
        """Read and upload `tiles` into `cache_slots` of `pool` now (open's pinned levels, all-resident
        references; never per frame). The same read and upload functions as the streaming path, from
        client memory in chunks (no ring slot is taken, so streaming loads are not disturbed).
        Returns (ok mask, a reason per failed tile); failed tiles' cache slots are the caller's."""
        return blocking_load.load_now(
            frame,
            tiles,
            pool,
            cache_slots,
            ctx=self.ctx,
            gl=self.gl,
            native=self.native,
            space=self.space,
            sources=self.sources,
            stride=self.ring.stride,
            scratch=self.blocking_scratch,
            cancelled_state=_CANCELLED,
        )

    # ---- lifetime -------------------------------------------------------------------------------
    def release(self) -> None:
        """Stop the I/O threads, drop every load, close the packs, free the ring (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._held.clear()  # never started: every load is dropped with the ring
        stopped = self.io.shutdown(self.config.shutdown_wait_s)
        self.blocking_scratch.close()
        for src in list(self.sources.values()) + self._retired:
            if stopped:  # else a stuck thread may still read it
                src.tile.close()
        self.sources.clear()
        self._retired.clear()
        for staging in (self.device, self.textures):
            if staging is not None:
                staging.release()
        if stopped:
            self.ring.release()
        else:
            log.error("leaving the staging ring mapped: an I/O thread may still write into it")
