"""The facade: `Streamer(ctx, config)`, `open(path) -> VirtualTexture`, `update()` once a frame.

Per frame, `update()` (render thread; never blocks on disk or on the GPU) runs whole-array steps
over every texture at once, no Python loop over tiles:

1. reclaim staging slots whose upload fences signalled; read the feedback that is ready and reduce it
   to wanted pages (mip bias applied); touch the cache slots those pages sample;
2. step the budget's mip-bias controller (wanted working set vs cache capacity);
3. drain finished reads (failures: back-off and fallback), upload what is ready under the caps, and
   update the page tables of the arrivals;
4. ask the scheduler for this frame's loads, reserve cache slots (evicting LRU tiles no frame in
   flight uses) and hand them to the uploader, which queues them to the I/O threads in batches;
5. upload the changed page-table ranges, bind a fresh feedback buffer for the coming draw.

Who owns what: the tile id space (`tiles`), page tables (`page_table`), cache pools (`pools`), loads
(`uploader`, with the staging ring and the I/O threads), requests (`requests`) and the budget
(`budget`) each own their state; this module only moves results between them.

Threading contract: every method of `Streamer` and `VirtualTexture` belongs to the thread that owns
the GL context (the render thread: the one that made the streamer; a call from another thread is an
`EngineError`). The only other threads are the uploader's I/O threads, which touch no GL and no engine
state (`uploader` documents exactly what they touch). A streamer dropped without `release()` is
released when it is collected on its own thread (with a `ResourceWarning`, as for an unclosed file).

GPU memory: every allocation (cache pools, page tables, ring, feedback) is reserved in the
`BudgetManager` before it is made. Pools are sized when textures open or the budget changes
(`pools.plan_capacities`).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass
from types import TracebackType

import moderngl
import numpy as np

from ..config import StreamerConfig
from ..errors import BudgetError, EngineError, TileCorruptError
from ..gl.gl_ext import GLExt
from ..gl.shaders import register_includes
from ..pack.format import PackHeader
from ..pack.reader import PackReader
from ..remote import NetworkCounters, NetworkSummary, summarize
from .budget import BudgetManager
from .feedback import FeedbackRing
from .feedback_reduce import FeedbackReducer, Wanted
from .frame_stats import FrameStats, StreamerStats, streamer_stats
from .io_workers import ReadHook
from .origin import Origin
from .page_table import ENTRY_BYTES, PageTableBuffer, PageTables
from .pool_set import PoolSet
from .pools import CachePool, PoolKey
from .requests import RequestScheduler
from .staging import RingStats
from .texture import VT_PAGES_BINDING, VirtualTexture, check_bindings
from .tiles import HEADER, MAX_LEVELS, MAX_TEXTURES, TileSpace
from .uploader import Drained, Uploaded, Uploader

__all__ = ["FrameStats", "Streamer", "VirtualTexture"]

log = logging.getLogger(__name__)


NO_UPDATE_BINDS = 30  # one texture drawn this often without an update() ...
NO_UPDATE_SECONDS = 2.0  # ... over this long: the program forgot to call update() (a slow frame that
# draws many textures once each is not that)


@dataclass(frozen=True)
class IOStatus:
    """`Streamer.io_status()`: the reader threads and the staging ring."""

    threads: int  # threads taking new batches
    stuck_threads: int  # retired threads still inside a read that was given up
    pending_batches: int  # batches submitted and not yet drained
    compiled: bool  # reads and uploads run in the compiled helper (texstream.native)
    ring: RingStats | None  # None before the first texture opens


class Streamer:
    """Streams tiles of any number of packs into one VRAM budget.

    Every method belongs to the thread that made the streamer (the one its GL context is current on);
    reads, decompression and checksums run on the streamer's own I/O threads.

    Parameters
    ----------
    ctx : moderngl.Context
        The context the textures are drawn with (OpenGL 4.3 or later with buffer storage).
    config : StreamerConfig, optional
        Streaming configuration; default ``StreamerConfig()``.

    Raises
    ------
    TypeError
        `config` is not a `StreamerConfig`.
    GLError
        The context lacks a GL feature the engine needs.

    Examples
    --------
    >>> streamer = texstream.Streamer(ctx)                     # doctest: +SKIP
    >>> terrain = streamer.open("terrain.tpk")                 # doctest: +SKIP
    >>> while running:                                         # doctest: +SKIP
    ...     streamer.update()
    ...     terrain.bind(prog, "u_terrain")
    ...     draw()
    >>> streamer.release()                                     # doctest: +SKIP
    """

    _closed = True  # until __init__ has made everything release() frees

    def __init__(
        self, ctx: moderngl.Context, config: StreamerConfig | None = None, *, read_hook: ReadHook | None = None
    ) -> None:
        if config is not None and not isinstance(config, StreamerConfig):
            raise TypeError(f"config must be a StreamerConfig, got {type(config).__name__}")
        self._owner = threading.get_ident()
        # read_hook: called on an I/O thread before each batch of tile reads, with the batch; fault
        # injection for tests (it may sleep, block or raise), not part of the documented API.
        self._read_hook = read_hook
        self.ctx = ctx
        self.config = config = config or StreamerConfig()
        self.gl = GLExt(ctx, debug=config.debug_gl)
        check_bindings(self.gl)
        register_includes(ctx)  # plain ctx.program() resolves #include "texstream/vt.glsl" too
        mem = self.gl.memory_info()
        self.budget = BudgetManager(config.budget, mem.available_bytes if mem else None)
        self.frame = 0
        self._space = TileSpace()
        self._tables = PageTables(self._space)
        self._pages = PageTableBuffer(ctx, self.budget)
        self._pool_set = PoolSet(self.gl, self.budget, config)
        self.textures: list[VirtualTexture] = []
        self._by_id: dict[int, VirtualTexture] = {}
        self._reducer = FeedbackReducer(self._space)
        self._uploader: Uploader | None = None
        self._scheduler = RequestScheduler(config, self._space, self._tables, self._loading)
        vw, vh = ctx.viewport[2:] if ctx.viewport else (0, 0)
        self._feedback = self._make_feedback((max(1920, vw), max(1080, vh)))
        self.last = FrameStats()
        self._sampled = Wanted.empty()  # newest feedback's pages without the bias (what draws sample)
        self._wanted = Wanted.empty()  # this frame's wanted pages, bias applied (what gets loaded)
        self._needed = Wanted.empty()  # the newest feedback's wanted pages: touched every frame
        self._totals = dict.fromkeys(("uploads", "upload_bytes", "evicted", "failed", "requested", "cancelled"), 0)
        self._latencies: deque[int] = deque(maxlen=4096)
        self._feedback_frames: deque[int] = deque(maxlen=config.cancel_after_frames)  # frames with fresh feedback
        self.freeze_feedback = False  # True: feedback is read (buffers recycle) but ignored
        self._closed_network = NetworkCounters()  # network totals of closed remote textures
        # draws without update(): the textures would stay at their pinned levels, so say why once
        self._binds_since_update = np.zeros(MAX_TEXTURES, np.int64)  # per texture id
        self._last_update = time.monotonic()
        self._warned_no_update = False
        self._closed = False

    # ---- textures -----------------------------------------------------------------------------
    def open(self, path: str | os.PathLike[str], *, origin: Origin | str = Origin.BOTTOM_LEFT) -> VirtualTexture:
        """Open a pack for streaming; its coarsest `StreamerConfig.pinned_levels` levels load now.

        Parameters
        ----------
        path : str or os.PathLike
            A pack file, or a URL: ``http(s)://`` (range requests) or any filesystem fsspec knows
            (``s3://``, ``gs://``, ... with its backend installed), read through the disk cache of
            `StreamerConfig.remote`.
        origin : Origin or str, optional
            Which image row texture coordinate v = 0 names: `Origin.BOTTOM_LEFT` (default, the GL
            and moderngl convention) or `Origin.TOP_LEFT` (glTF, DirectX). See `VirtualTexture.origin`.

        Returns
        -------
        VirtualTexture
            The texture to bind in shaders (``vt.bind(program, name)``).

        Raises
        ------
        PackNotFoundError
            No file at `path` (also a `FileNotFoundError`).
        PackFormatError
            The file is not a valid pack.
        RemoteError
            The URL cannot be reached or read.
        BudgetError
            The budget cannot hold the texture's pinned levels and page table.
        EngineError
            Too many textures open, or the streamer is released.
        """
        self._check_open()
        origin = Origin.parse(origin)
        reader = PackReader(path, self.config.remote)
        vt: VirtualTexture | None = None
        try:
            h = reader.header
            if h.level_count > MAX_LEVELS:
                raise EngineError(f"{path}: {h.level_count} levels; page-table entries hold at most {MAX_LEVELS}")
            if len(self.textures) >= MAX_TEXTURES:
                raise EngineError(f"at most {MAX_TEXTURES} virtual textures can be open at once")
            tex_id = next(i for i in range(MAX_TEXTURES) if i not in self._by_id)
            key: PoolKey = (h.texel_format, h.srgb, h.slot_size)
            self._make_room(h, key)
            self._ensure_uploader(h.tile_raw_size)
            tiles = self._space.register(tex_id, h)
            try:
                self._pages.fit(self._space.used, self._tables)
                pool = self._pool_set.attach(key, tex_id, h)
            except BaseException:
                self._space.unregister(tex_id)
                raise
            self._tables.add_texture(tex_id, self.config.pinned_levels)
            vt = VirtualTexture(self, tex_id, reader, pool, tiles, origin)
            self.textures.append(vt)
            self._by_id[tex_id] = vt
            assert self._uploader is not None
            self._uploader.add_source(tex_id, reader)
            self._plan_pools()
            self._load_pinned(vt)
        except BaseException as exc:
            if vt is not None:
                self.close(vt)
            reader.close()
            if isinstance(exc, BudgetError):
                minimum = max(self._open_minimum_budget(h, key), exc.minimum_bytes or 0)
                # fewer pinned levels are named where one pinned level would lower the advised MiB
                fewer = -(-self._open_minimum_budget(h, key, 1) // 2**20) < -(-minimum // 2**20)
                raise BudgetError(f"{path}: {exc.problem}", minimum_bytes=minimum, pinned_levels=fewer) from None
            raise
        log.info("opened %s as texture %d (%s)", path, tex_id, pool.name)
        return vt

    def close(self, vt: VirtualTexture) -> None:
        """Stop streaming a texture: its loads are cancelled and its cache slots freed once the
        frames in flight no longer sample them. Closing a texture twice does nothing.

        Parameters
        ----------
        vt : VirtualTexture
            A texture this streamer opened.
        """
        self._check_thread()
        if vt not in self.textures:
            return
        assert self._uploader is not None
        for remote in self._uploader.remote_stats(vt.id):  # its counters outlive it in the totals
            self._closed_network.add(remote)
        self._pool_set.free_loads(self._uploader.remove_source(vt.id))
        pinned = self._pool_set.pinned_tiles(vt.header) if self._tables.resident_count[vt.id] else 0
        self._pool_set.detach(vt.pool, vt.id, self.frame, pinned)
        rng = self._space.ranges[vt.id]
        self._scheduler.forget(rng.start, rng.stop)
        self._tables.remove_texture(vt.id)
        self._space.unregister(vt.id)
        self.textures.remove(vt)
        del self._by_id[vt.id]
        vt.reader.close()
        self._sampled = self._sampled.select(self._space.is_tile(self._sampled.ids))
        self._needed = self._needed.select(self._space.is_tile(self._needed.ids))
        vt.closed = True

    @property
    def pools(self) -> dict[PoolKey, CachePool]:
        """The cache pools by (texel format, sRGB, slot size)."""
        return self._pool_set.by_key

    def _plan_pools(self, budget: int | None = None) -> None:
        """Share what the budget leaves after fixed costs among the pools, and apply what moved."""
        for r in self._pool_set.plan({t: vt.header for t, vt in self._by_id.items()}, self.frame, budget):
            if r.result.moved_from.size:
                self._tables.move_slots(r.pool.textures, r.result.moved_from, r.result.moved_to)
            self._tables.set_absent(r.result.evicted_tiles)
            if r.result.cancelled_tiles.size and self._uploader is not None:
                self._uploader.cancel(r.result.cancelled_tiles)  # their cache slots are gone: nothing to free

    def _make_room(self, h: PackHeader, key: PoolKey) -> None:
        """Shrink the pools (they share all the budget) so a new texture's fixed costs fit."""
        extra = self._pages.growth_bytes(self._space.used + HEADER + h.tile_count)
        extra += self._pool_set.first_layers_bytes(key, h)
        if self._uploader is None or self._uploader.ring.slot_bytes < h.tile_raw_size:
            extra += max(0, self._ring_size(h.tile_raw_size) - self.budget.reserved("staging-ring"))
        if self.pools and extra > self.budget.available:
            self._plan_pools(budget=self.budget.budget - extra)

    def _ring_size(self, tile_bytes: int, budget: int | None = None) -> int:
        # The ring takes at most a quarter of the budget (small budgets would otherwise be all ring).
        budget = self.budget.budget if budget is None else budget
        return max(min(self.config.ring_mb << 20, budget // 4), 16 * tile_bytes)

    # ---- budget advice: the smallest budget that fits, for BudgetError messages ------------------
    def _minimum_budget(self, fixed: int, tile_bytes: int) -> int:
        """Smallest budget B with fixed + ring(B) <= B: the ring grows with the budget (a quarter of
        it, up to ring_mb), so B is the fixed point of B = fixed + ring(B), reached from below."""
        if self._uploader is not None:
            tile_bytes = max(tile_bytes, self._uploader.ring.slot_bytes)
        b = fixed + self._ring_size(tile_bytes, fixed)
        for _ in range(64):
            nxt = fixed + self._ring_size(tile_bytes, b)
            if nxt <= b:
                break
            b = nxt
        return b

    def _pinned_layers_bytes(
        self, extra: tuple[PoolKey, PackHeader] | None = None, full: int = -1, levels: int | None = None
    ) -> int:
        """Bytes of the whole layers every pool's pinned tiles take (a pool holds at least one layer),
        with texture `extra` added; texture id `full` counts all its tiles, not just its pinned ones;
        `levels` pinned levels instead of the configured ones."""
        levels = self.config.pinned_levels if levels is None else levels

        def pinned(h: PackHeader) -> int:
            return int(h.level_first[-1] - h.level_first[max(0, h.level_count - levels)])

        tiles: dict[PoolKey, int] = {}
        geometry = {}
        for pool in self._pool_set:
            geometry[pool.key] = pool.geometry
            tiles[pool.key] = sum(
                vt.header.tile_count if t == full else pinned(vt.header)
                for t in pool.textures
                if (vt := self._by_id.get(t)) is not None
            )
        if extra is not None:
            key, h = extra
            geometry.setdefault(key, self._pool_set.geometry(h))
            tiles[key] = tiles.get(key, 0) + pinned(h)
        total = 0
        for key, g in geometry.items():
            total += max(g.round_up(tiles[key]), g.cells) // g.cells * g.layer_bytes
        return total

    def _open_minimum_budget(self, h: PackHeader, key: PoolKey, levels: int | None = None) -> int:
        """The smallest budget in which the open textures and `h` fit: feedback, page tables, the
        pinned levels' layers of every pool and the staging ring."""
        pages = PageTableBuffer.entries_for(self._space.used + HEADER + h.tile_count) * ENTRY_BYTES
        fixed = self.budget.reserved("feedback") + pages + self._pinned_layers_bytes((key, h), levels=levels)
        return self._minimum_budget(fixed, h.tile_raw_size)

    def _ensure_uploader(self, tile_bytes: int) -> None:
        if self._uploader is not None and self._uploader.ring.slot_bytes >= tile_bytes:
            return
        if self._uploader is not None:
            if self._uploader.busy or self._uploader.ring.batches_in_flight:
                raise EngineError("cannot open a pack with larger tiles while tiles are streaming; open it first")
            for vt in self.textures:
                self._uploader.remove_source(vt.id)
            self._uploader.release()
            self.budget.release("staging-ring")
        size = self._ring_size(tile_bytes)
        self.budget.reserve("staging-ring", size)
        try:
            self._uploader = Uploader(
                self.ctx, self.gl, self._space, self.config, size, tile_bytes, read_hook=self._read_hook
            )
        except BaseException:
            self.budget.release("staging-ring")
            raise
        for vt in self.textures:
            self._uploader.add_source(vt.id, vt.reader)

    def _make_feedback(self, fb_size: tuple[int, int]) -> FeedbackRing:
        divisor = self.config.feedback_divisor
        ring = FeedbackRing(self.ctx, self.gl, FeedbackRing.capacity_for(fb_size, divisor), divisor)
        try:
            self.budget.reserve("feedback", ring.nbytes)
        except BaseException:
            ring.release()
            raise
        return ring

    def set_feedback_size(self, size: tuple[int, int]) -> None:
        """Size the feedback buffers for draws of `size` pixels.

        They follow the viewport by themselves; call this when drawing into framebuffers larger
        than the viewport seen at construction.

        Parameters
        ----------
        size : tuple of int
            Width and height in pixels of the largest draw that samples virtual textures.
        """
        old = self._feedback
        self.budget.release("feedback")
        try:
            self._feedback = self._make_feedback(size)
        except BudgetError:
            self.budget.reserve("feedback", old.nbytes)
            raise
        old.release()

    def _fit_feedback(self) -> None:
        vp = self.ctx.viewport
        if vp and FeedbackRing.capacity_for((vp[2], vp[3]), self.config.feedback_divisor) > self._feedback.capacity:
            try:
                self.set_feedback_size((vp[2], vp[3]))
            except BudgetError:
                pass  # keep the smaller buffers; dropped entries are counted

    def _load_pinned(self, vt: VirtualTexture) -> None:
        """Load the coarsest levels now through the uploader's blocking path (the never-black fallback)."""
        first = self._tables.first_pinned[vt.id]
        ids = self._space.tile_ids(vt.id, range(int(first), vt.header.level_count))
        slots = self._allocate_blocking(vt, ids, pin=True)
        self._load_blocking(vt, ids, slots, what="pinned")
        self._pool_set.level_pins[vt.pool.index] += int(ids.size)

    def _allocate_blocking(self, vt: VirtualTexture, ids: np.ndarray, pin: bool) -> np.ndarray:
        alloc = vt.pool.allocate(self.frame, ids, np.full(ids.size, vt.id), self._space.level[ids])
        self._evicted(alloc.evicted_tiles, self.frame - alloc.evicted_last_used, self.last)
        if np.any(alloc.slots < 0):
            got = alloc.slots[alloc.slots >= 0]
            vt.pool.free(got)
            raise BudgetError(f"{vt.path}: {ids.size} tiles need cache slots and the tile cache has {got.size} to give")
        if pin:
            vt.pool.pin(alloc.slots)
        return alloc.slots

    def _load_blocking(self, vt: VirtualTexture, ids: np.ndarray, slots: np.ndarray, what: str) -> None:
        assert self._uploader is not None
        try:
            ok, reasons = self._uploader.load_now(self.frame, ids, vt.pool, slots)
        except BaseException:
            vt.pool.free(slots)
            raise
        if not ok.all():
            vt.pool.free(slots)  # nothing of this call is marked resident: the texture stays as it was
            raise TileCorruptError(f"{what} {reasons[0]} ({len(reasons)} bad tiles); run `texstream verify`")
        vt.pool.mark_resident(slots, self.frame)
        self._tables.set_resident(ids, slots)
        self._pages.upload(self._tables)

    # ---- budget -------------------------------------------------------------------------------
    def set_budget(self, megabytes: float) -> None:
        """Change the VRAM budget at run time; the cache pools shrink or grow (the tiles that stay
        are copied on the GPU).

        Parameters
        ----------
        megabytes : float
            The new budget in MiB (finite, positive).

        Raises
        ------
        ValueError
            Not a finite positive number.
        BudgetError
            Too small for what must stay resident (pinned levels, page tables, staging ring).
        EngineError
            The streamer is released.
        """
        self._check_open()
        if isinstance(megabytes, bool) or not isinstance(megabytes, int | float) or not math.isfinite(megabytes):
            raise ValueError(f"budget must be a finite number of MiB, got {megabytes!r}")
        nbytes = int(megabytes * (1 << 20))
        if nbytes <= 0:
            raise ValueError(f"budget must be positive, got {megabytes!r} MiB")
        if nbytes < self.budget.budget:
            self._plan_pools(budget=nbytes)  # shrink first, then lower the budget
            self.budget.set_budget(nbytes)
        else:
            self.budget.set_budget(nbytes)
            self._plan_pools()
        self._pages.upload(self._tables)

    # ---- the frame ----------------------------------------------------------------------------
    def update(self) -> FrameStats:
        """Advance one frame: read the newest GPU feedback, decide what to load and evict, issue
        the finished reads' uploads and update the page tables.

        Call it once per frame on the GL thread, before the draws that sample virtual textures. It
        never waits for I/O.

        Returns
        -------
        FrameStats
            What this frame did (also `Streamer.last`); `stats()` adds the running totals.

        Raises
        ------
        EngineError
            An I/O thread failed unexpectedly (once; its batch is retried), or the streamer is
            released.
        """
        self._check_open()
        self._binds_since_update.fill(0)
        self._last_update = time.monotonic()
        t0, c0 = time.perf_counter(), time.thread_time()
        self.frame += 1
        frame = self.frame
        st = FrameStats(frame=frame)
        up = self._uploader
        if up is not None:
            up.reclaim()
        self._fit_feedback()

        # 1. Feedback -> wanted pages (bias applied); touch the tiles they need. Until newer feedback
        # arrives, the newest wanted pages are assumed to be needed still. Under a bias, finer tiles
        # the draws still sample are not touched: they age out and make room for what the budget can
        # hold (a frame in flight never loses a tile it samples: the slots' overwrite gate).
        self._feedback.end_frame()
        raw = self._feedback.collect(frame)
        if self.freeze_feedback:
            raw = []
        wanted = Wanted.empty()
        if raw and self.textures:
            result = self._reducer.reduce(np.concatenate(raw) if len(raw) > 1 else raw[0])
            self._sampled = result.wanted
            wanted = self._reducer.coarsen(result.wanted, self.budget.bias_levels)
            bias_levels = self.budget.bias_levels
            self._pool_set.step_bias(
                self._space, self._tables, wanted, lambda: self._reducer.coarsen(self._sampled, bias_levels - 1)
            )
            self._needed = wanted
            self._feedback_frames.append(frame)
        self._wanted = wanted
        st.feedback_age = self._feedback.age
        st.wanted_pages = len(wanted)
        self._pool_set.touch(self._space, self._tables, self._needed, frame)

        if up is not None:
            # 2. Finished reads -> uploads -> page tables.
            self._apply_drained(up.drain(), st)
            tu = time.perf_counter()
            uploaded = up.upload(
                frame, self._pool_set.by_index, self.config.upload_tiles_per_frame, self.config.upload_bytes_per_frame
            )
            self._apply_uploaded(uploaded, st)
            st.upload_ms = (time.perf_counter() - tu) * 1e3

            # 3. Requests -> cache slots -> read batches; reads nobody wants any more are cancelled:
            # those of tiles in none of the last cancel_after_frames feedback readbacks (counted in
            # readbacks, not frames: on a real GPU feedback may skip frames, and a load must outlive
            # that gap). After the scheduler's update, which marks this frame's wanted tiles.
            requests = self._scheduler.update(frame, wanted, up.free_slots)
            self._totals["cancelled"] += requests.cancelled
            if len(self._feedback_frames) == self._feedback_frames.maxlen:
                stale = up.cancel_stale(self._scheduler.last_wanted, self._feedback_frames[0])
                if len(stale):
                    self._pool_set.free_loads(stale)
                    self._totals["cancelled"] += len(stale)
            st.requested = self._dispatch(requests.ids, requests.prefetch, st)
            st.in_flight = up.in_flight
            st.stalls = up.ring.stall_count

        # 4. Page tables to the GPU; the next draw's feedback buffer.
        self._pages.upload(self._tables)
        st.missing_pages = int(np.count_nonzero(~self._tables.is_resident(wanted.ids))) if len(wanted) else 0
        self._feedback.begin_frame(frame)
        st.queued = self._scheduler.queued_count
        st.update_ms = (time.perf_counter() - t0) * 1e3
        st.update_cpu_ms = (time.thread_time() - c0) * 1e3
        assert self.budget.usage <= self.budget.budget, "engine VRAM usage exceeds the budget"
        self.last = st
        return st

    def _apply_drained(self, drained: Drained, st: FrameStats) -> None:
        st.read_batches = len(drained.read_seconds)
        st.read_seconds = float(sum(drained.read_seconds))
        failed = drained.failed
        if not len(failed):
            return
        self._pool_set.free_loads(failed)
        self._scheduler.mark_failed(failed.tiles, self.frame)
        for tex in np.unique(failed.tex).tolist():
            vt = self._by_id.get(tex)
            if vt is not None:
                vt.mark_failed(failed.tiles[failed.tex == tex])
        st.failed += len(failed)
        self._totals["failed"] += len(failed)
        log.warning("%d tile loads failed, first: %s", len(failed), drained.reasons[0])

    def _apply_uploaded(self, up: Uploaded, st: FrameStats) -> None:
        loads = up.loads
        if not len(loads):
            return
        self._pool_set.mark_resident(loads, self.frame)
        self._tables.set_resident(loads.tiles, loads.cache_slot)
        self._scheduler.mark_resident(loads.tiles)
        st.uploads, st.upload_bytes, st.uploaded = len(loads), up.nbytes, up
        st.latency_frames = up.latency_frames
        self._latencies.extend(up.latency_frames.tolist())
        self._totals["uploads"] += len(loads)
        self._totals["upload_bytes"] += up.nbytes

    def _dispatch(self, ids: np.ndarray, prefetch: np.ndarray, st: FrameStats) -> int:
        """Reserve cache slots for this frame's requests (evicting LRU tiles) and start their loads.
        Prefetch takes free slots only, and not the reserve kept for demand: evicting for it would
        trade tiles the screen used a few frames ago for tiles it may never use (under budget
        pressure: endless re-uploads)."""
        if ids.size == 0:
            return 0
        assert self._uploader is not None
        tex = self._space.tex[ids].astype(np.int64)
        pool_of = self._pool_set.of_tex[tex]
        keep = np.ones(ids.size, bool)
        slots = np.full(ids.size, -1, np.int64)
        for p in np.unique(pool_of).tolist():
            pool = self._pool_set.by_index[p]
            assert pool is not None
            m = np.flatnonzero(pool_of == p)
            pre = m[prefetch[m]]
            allowed = max(0, pool.free_count - self._pool_set.reserve(pool) - int(m.size - pre.size))
            keep[pre[allowed:]] = False
            m = m[keep[m]]
            alloc = pool.allocate(self.frame, ids[m], tex[m], self._space.level[ids[m]])
            self._evicted(alloc.evicted_tiles, self.frame - alloc.evicted_last_used, st)
            slots[m] = alloc.slots
        go = keep & (slots >= 0)
        n = self._uploader.submit(self.frame, ids[go], pool_of[go], slots[go])
        for ev in self._pool_set.keep_free(self.frame):  # slots past their gate for the coming frames
            self._evicted(ev.evicted_tiles, self.frame - ev.evicted_last_used, st)
        self._totals["requested"] += n
        return n

    def _evicted(self, tiles: np.ndarray, age: np.ndarray, st: FrameStats) -> None:
        if tiles.size:
            self._tables.set_absent(tiles)
            st.evicted += int(tiles.size)
            st.evicted_tiles = np.concatenate([st.evicted_tiles, tiles])
            st.evicted_age = np.concatenate([st.evicted_age, age])
            self._totals["evicted"] += int(tiles.size)

    def _loading(self, ids: np.ndarray) -> np.ndarray:
        return self._uploader.load_of[ids] >= 0 if self._uploader is not None else np.zeros(ids.size, bool)

    def pressure(self, wanted: Wanted | None = None) -> dict[str, tuple[int, int]]:
        """Per pool: (working set, slots) of `wanted` (default this frame's): the wanted tiles plus their
        parents (trilinear samples both), pinned levels excluded, against the unpinned slots."""
        return self._pool_set.pressure(self._space, self._tables, self._wanted if wanted is None else wanted)

    def bind_shared(self) -> None:
        """Bind the page-table and feedback buffers every virtual texture samples through."""
        assert self._pages.entries >= self._space.used, "the page-table buffer does not hold every texture"
        self._pages.bind(VT_PAGES_BINDING)
        self._feedback.bind()

    # ---- convenience --------------------------------------------------------------------------
    def make_all_resident(self, vt: VirtualTexture) -> None:
        """Load every tile of `vt` now (blocking) and pin it: the all-resident reference image.

        Parameters
        ----------
        vt : VirtualTexture
            A texture this streamer opened.

        Raises
        ------
        BudgetError
            The whole texture does not fit the budget (nothing changes).
        TileCorruptError
            A tile is damaged (nothing stays loaded or pinned).
        """
        self._check_open()
        ids = self._space.tile_ids(vt.id)
        resident = self._tables.is_resident(ids)
        have, ids = ids[resident], ids[~resident]
        assert self._uploader is not None
        self._pool_set.free_loads(self._uploader.cancel(ids))
        pool = vt.pool
        others = pool.evictable_mask(self.frame) & (pool.tex != vt.id)
        if ids.size > pool.free_count + int(np.count_nonzero(others)):
            pages = self.budget.reserved("feedback") + self.budget.reserved("page-tables")
            fixed = pages + self._pinned_layers_bytes(full=vt.id)
            raise BudgetError(
                f"{vt.path}: all {vt.header.tile_count} tiles need "
                f"{vt.header.tile_count * vt.header.tile_raw_size / 2**20:.1f} MiB of cache and the "
                f"tile cache holds {pool.capacity} slots",
                minimum_bytes=self._minimum_budget(fixed, vt.header.tile_raw_size),
            )
        held = self._tables.own[have].astype(np.int64)
        newly = held[~pool.pinned[held]]
        pool.pin(newly)  # so that making room evicts none of this texture's tiles
        try:
            slots = self._allocate_blocking(vt, ids, pin=True)
            self._load_blocking(vt, ids, slots, what="all-resident")
        except BaseException:
            pool.unpin(newly)
            raise

    def _note_bind(self, tex_id: int) -> None:
        """A texture is bound for drawing (`VirtualTexture.bind`): warn once when one texture keeps
        being drawn for seconds without an update()."""
        binds = self._binds_since_update
        binds[tex_id] += 1
        if self._warned_no_update or binds[tex_id] < NO_UPDATE_BINDS:
            return
        if time.monotonic() - self._last_update < NO_UPDATE_SECONDS:
            return
        self._warned_no_update = True
        message = (
            f"a virtual texture was drawn {int(binds[tex_id])} times over {NO_UPDATE_SECONDS:g} s without "
            "Streamer.update(): nothing streams and it stays blurred; call streamer.update() once per frame"
        )
        log.warning("%s", message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)

    # ---- introspection: explicit hooks for tools, benchmarks and tests -------------------------
    @property
    def tile_capacity(self) -> int:
        """Size of the tile-id space (ids of every open texture are below it; it grows on `open`)."""
        return self._space.capacity

    @property
    def sampled_pages(self) -> Wanted:
        """The newest feedback's pages before the mip bias (what the draws sample); a new object each
        time new feedback arrives."""
        return self._sampled

    def inject_feedback(self, tile_ids: np.ndarray) -> bool:
        """Add page ids to this frame's feedback as if the coming draw had written them (drive the
        streamer without drawing). False when this frame records no feedback."""
        self._check_open()
        return self._feedback.inject(tile_ids)

    def validate(self) -> None:
        """Check the streamer's invariants (tools and tests; costs a GPU readback): the page tables on
        the GPU equal the CPU's, every texture's table and every pool are consistent, and the engine's
        memory is within the budget. Raises EngineError naming the first broken one."""
        self._check_open()
        used = self._space.used
        if used and self._pages.buffer is not None:
            gpu = np.frombuffer(self._pages.buffer.read(size=used * 4), np.uint32)
            bad = np.flatnonzero(gpu != self._tables.entry[:used])
            if bad.size:
                raise EngineError(
                    f"page table on the GPU differs from the CPU's at {bad.size} entries, first id {bad[0]}"
                )
        try:
            for vt in self.textures:
                vt.table.validate()
            for pool in self.pools.values():
                pool.check()
        except AssertionError as exc:
            raise EngineError(f"streamer state is inconsistent: {exc}") from None
        if self.budget.usage > self.budget.budget:
            raise EngineError(f"engine memory {self.budget.usage} exceeds the budget {self.budget.budget}")

    def io_status(self) -> IOStatus:
        """The I/O threads and the staging ring now."""
        up = self._uploader
        if up is None:
            return IOStatus(self.config.io_threads, 0, 0, self.config.native, None)
        return IOStatus(up.io.thread_count, up.io.stuck_count, up.io.pending, up.native is not None, up.ring.stats())

    @property
    def busy(self) -> bool:
        """True while loads are queued, being read or waiting to upload."""
        return bool(self._scheduler.queued_count or (self._uploader is not None and self._uploader.busy))

    def memory_summary(self) -> str:
        """What the engine holds on the GPU, per pool and per texture, as a readable table.

        Returns
        -------
        str
            Several lines, with totals against the budget.
        """
        self._check_open()
        from ..telemetry.memory import memory_summary

        return memory_summary(self)

    def network(self) -> NetworkSummary:
        """Requests, bytes, latency and cache figures of the textures read by URL (zeros without any)."""
        remote = self._uploader.remote_stats() if self._uploader is not None else []
        return summarize(remote, self._closed_network)

    def stats(self) -> StreamerStats:
        """The latest `update()` and the streamer as a whole (`StreamerStats`; `.as_dict()` for export)."""
        return streamer_stats(self)

    # ---- lifetime -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("streamer is released")
        self._check_thread()
        if self._context_released:
            raise EngineError("the streamer's GL context was released before the streamer")

    @property
    def _context_released(self) -> bool:
        return type(self.ctx.mglo).__name__ == "InvalidObject"  # what moderngl leaves after ctx.release()

    def _check_thread(self) -> None:
        if threading.get_ident() != self._owner:
            raise EngineError(
                f"streamer used from thread {threading.current_thread().name!r}: it belongs to the thread "
                "that made it (the one its GL context is current on)"
            )

    def release(self) -> None:
        """Stop the I/O threads and free every GL object the engine made; calling it again does
        nothing. Also runs on ``with Streamer(...) as s:`` exit.

        Reads in progress get `StreamerConfig.shutdown_wait_s` seconds; a read that hangs longer is
        abandoned (its thread ends when the read returns, and the staging buffer stays mapped until
        then).

        Raises
        ------
        EngineError
            The GL context was released before the streamer (the threads are stopped anyway).
        """
        if self._closed:
            return
        self._check_thread()
        if self._context_released:
            self._closed = True
            if self._uploader is not None:
                self._uploader.io.shutdown(0.0)  # GL objects died with the context; stop the threads
            raise EngineError("the streamer's GL context was released before the streamer")
        self._closed = True
        if self._uploader is not None:
            self._uploader.release()
            self.budget.release("staging-ring")
        for vt in self.textures:
            vt.closed = True
            vt.reader.close()
        self._pool_set.release()
        self.textures.clear()
        self._pages.release()
        self._feedback.release()
        self.budget.release("feedback")

    def __del__(self) -> None:
        if self._closed or threading.get_ident() != getattr(self, "_owner", None):
            return
        warnings.warn(f"{self!r} was not released; releasing it now", ResourceWarning, stacklevel=1)
        try:
            self.release()
        except Exception:  # noqa: BLE001 (collection at exit: the context may be gone)
            pass

    def __repr__(self) -> str:
        return f"<Streamer: {len(self.textures)} textures{', released' if self._closed else ''}>"

    def __enter__(self) -> Streamer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
