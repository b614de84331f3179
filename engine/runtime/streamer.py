"""The facade: `Streamer(ctx, config)`, `open(path) -> VirtualTexture`, `update()` once a frame.

The streamer is the frame script: `update()` moves records between the residency core
(`residency.Residency`, which decides what is resident and what to load, without GL) and the movers
(cache pools, staging ring and uploader, I/O threads, feedback buffers), in this order::

    reclaim -> collect feedback -> observe -> apply drains -> upload -> submit orders
            -> upload page tables -> begin the next feedback frame

The layout and the threading contract are in the `texstream.runtime` package docstring. Every method
of `Streamer` and `VirtualTexture` belongs to the thread that owns the GL context (the one that made
the streamer; a call from another thread is an `EngineError`). A streamer dropped without `release()`
is released when it is collected on its own thread (with a `ResourceWarning`, as for an unclosed file).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
import warnings
from types import TracebackType

import moderngl
import numpy as np

from ..config import StreamerConfig
from ..errors import BudgetError, EngineError, TileCorruptError
from ..gl.gl_ext import GLExt
from ..gl.objects import FrameThrottle
from ..pack.format import PackHeader
from ..pack.reader import PackReader
from ..remote import NetworkCounters
from .budget import BudgetManager
from .feedback import FeedbackRing
from .frame_stats import FrameStats, IOStatus
from .io_workers import ReadHook
from .page_buffer import PageTableBuffer
from .pool_set import PoolSet
from .pools import CachePool, PoolKey
from .residency import Residency
from .sharing import OpenPacks, pack_identity
from .texture import VT_PAGES_BINDING, VirtualTexture, check_bindings
from .tiles import HEADER, MAX_LEVELS, MAX_TEXTURES
from .uploader import Uploader
from .views import StreamerViews

__all__ = ["FrameStats", "IOStatus", "Streamer", "VirtualTexture"]

log = logging.getLogger(__name__)

NO_UPDATE_BINDS = 30  # one texture drawn this often without an update() ...
NO_UPDATE_SECONDS = 2.0  # ... over this long: the program forgot to call update() (a slow frame that
# draws many textures once each is not that)


class Streamer(StreamerViews):
    """Streams tiles of any number of packs into one VRAM budget.

    Every method belongs to the thread that made the streamer (the one its GL context is current on);
    reads, decompression and checksums run on the streamer's own I/O threads.

    Parameters
    ----------
    ctx : moderngl.Context
        The context the textures are drawn with (OpenGL 4.5 or later).
    config : StreamerConfig, optional
        Streaming configuration; default ``StreamerConfig()``.
    budget_mb : float, optional
        Shortcut for the VRAM budget in MiB (``StreamerConfig(budget_mb=...)``); a `config` whose
        budget says otherwise is refused.
    read_hook : callable, optional
        Called on an I/O thread before each batch of tile reads, with the batch: fault injection
        in tests (it may sleep, block or raise). Leave it None in programs.

    Raises
    ------
    TypeError
        `config` is not a `StreamerConfig`.
    ValueError
        `budget_mb` conflicts with `config`'s budget, or is not a positive number.
    GLError
        The context lacks a GL feature the engine needs.

    Examples
    --------
    >>> streamer = texstream.Streamer(ctx, budget_mb=256)      # doctest: +SKIP
    >>> terrain = streamer.open("terrain.tpk")                 # doctest: +SKIP
    >>> while running:                                         # doctest: +SKIP
    ...     streamer.update()
    ...     terrain.bind(prog, "u_terrain")
    ...     draw()
    >>> streamer.release()                                     # doctest: +SKIP
    """

    _closed = True  # until __init__ has made everything release() frees

    def __init__(
        self,
        ctx: moderngl.Context,
        config: StreamerConfig | None = None,
        *,
        budget_mb: float | None = None,
        read_hook: ReadHook | None = None,
    ) -> None:
        if config is not None and not isinstance(config, StreamerConfig):
            raise TypeError(f"config must be a StreamerConfig, got {type(config).__name__}")
        config = config or StreamerConfig()
        if budget_mb is not None:
            config = dataclasses.replace(config, budget_mb=budget_mb)
        self._owner = threading.get_ident()
        self._read_hook = read_hook
        self.ctx, self.config = ctx, config
        self.gl = GLExt(ctx, debug=config.debug_gl)
        check_bindings(self.gl)
        mem = self.gl.memory_info()
        self.budget = BudgetManager(config.budget, mem.available_bytes if mem else None)
        self._core = Residency(config, self.budget)
        self._pages = PageTableBuffer(ctx, self.budget)
        self._pool_set = PoolSet(self.gl, self.budget, config)
        self._packs: OpenPacks[VirtualTexture] = OpenPacks()
        self._uploader: Uploader | None = None
        vw, vh = ctx.viewport[2:] if ctx.viewport else (0, 0)
        self._feedback = self._make_feedback((max(1920, vw), max(1080, vh)))
        self.last = FrameStats()
        self.freeze_feedback = False  # True: feedback is read (buffers recycle) but ignored
        self._closed_network = NetworkCounters()  # network totals of closed remote textures
        # draws without update(): the textures would stay at their pinned levels, so say why once
        self._binds_since_update = np.zeros(MAX_TEXTURES, np.int64)  # per texture id
        self._last_update = time.monotonic()
        self._warned_no_update = False
        self._closed = False

    @property
    def frame(self) -> int:
        """Frames advanced by `update()` so far."""
        return self._core.frame

    @property
    def textures(self) -> list[VirtualTexture]:
        """One open handle per open pack (handles on a pack opened twice share its residency)."""
        return self._packs.primaries()

    @property
    def pools(self) -> dict[PoolKey, CachePool]:
        """The cache pools by (texel format, sRGB, slot size)."""
        return self._pool_set.by_key

    # ---- textures -----------------------------------------------------------------------------
    def open(self, path: str | os.PathLike[str]) -> VirtualTexture:
        """Open a pack for streaming; its coarsest `StreamerConfig.pinned_levels` levels load now.
        A pack that is already open is not loaded again: the new handle shares its residency.

        Parameters
        ----------
        path : str or os.PathLike
            A pack file, or a URL: ``http(s)://`` (range requests) or any filesystem fsspec knows
            (``s3://``, ``gs://``, ... with its backend installed), read through the disk cache of
            `StreamerConfig.remote`.

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
        reader = PackReader(path, self.config.remote)
        shared = self._packs.find(pack_identity(reader))
        if shared is not None:
            reader.close()
            return self._packs.add(self._handle(shared.id, shared.reader, shared.pool))
        vt: VirtualTexture | None = None
        core = self._core
        try:
            h = reader.header
            if h.level_count > MAX_LEVELS:
                raise EngineError(f"{path}: {h.level_count} levels; page-table entries hold at most {MAX_LEVELS}")
            if len(self._packs) >= MAX_TEXTURES:
                raise EngineError(f"at most {MAX_TEXTURES} virtual textures can be open at once")
            tex_id = self._packs.free_id()
            key: PoolKey = (h.texel_format, h.srgb, h.slot_size)
            self._make_room(h, key)
            self._ensure_uploader(h.tile_raw_size)
            core.register(tex_id, h)
            try:
                self._pages.fit(core.space.used, core.tables)
                pool = self._pool_set.attach(key, tex_id, core.pinned_tiles(h), h)
            except BaseException:
                core.unregister(tex_id)
                raise
            core.attach(tex_id, h, pool.index, pool.ledger, pool.geometry)
            vt = self._packs.add(self._handle(tex_id, reader, pool), pack_identity(reader))
            assert self._uploader is not None
            self._uploader.add_source(tex_id, reader)
            self._plan_pools()
            ids = core.pinned_level_ids(tex_id)
            self._load_now(vt, ids, what="pinned", pinned_levels=True)
        except BaseException:
            if vt is not None:
                self.close(vt)
            reader.close()
            raise
        log.info("opened %s as texture %d (%s)", path, tex_id, pool.name)
        return vt

    def _handle(self, tex_id: int, reader: PackReader, pool: CachePool) -> VirtualTexture:
        core = self._core
        return VirtualTexture(
            tex_id,
            reader,
            pool,
            core.space.ranges[tex_id],
            core.table_view(tex_id),
            on_bind=self._on_bind,
            on_close=self.close,
            failures=lambda t: (core.corrupt_tiles(t), int(core.failed_loads[t])),
        )

    def close(self, vt: VirtualTexture) -> None:
        """Close a texture handle. When it is the pack's last handle, its loads are cancelled and its
        cache slots freed once the frames in flight no longer sample them. Closing twice does nothing.

        Parameters
        ----------
        vt : VirtualTexture
            A texture this streamer opened.
        """
        self._check_thread()
        if not self._packs.remove(vt):
            return
        vt.closed = True
        if self._packs.handles(vt.id):
            return  # another handle on the same pack keeps the residency
        assert self._uploader is not None
        for remote in self._uploader.remote_stats(vt.id):  # its counters outlive it in the totals
            self._closed_network.add(remote)
        empty = self._core.detach(vt.id, self._uploader.remove_source(vt.id))
        self._pool_set.detach(vt.pool, vt.id, empty)
        vt.reader.close()

    def _plan_pools(self, budget: int | None = None) -> None:
        """Share what the budget leaves after fixed costs among the pools, and apply what moved."""
        available = (self.budget.budget if budget is None else budget) - self._pool_set.held_elsewhere()
        plan = self._core.plan(available, self.gl.max_array_layers)
        for r in self._pool_set.apply(plan, self._core.resize_order(plan), self.frame):
            cancelled = self._core.apply_resize(r.pool.index, r.result)
            if cancelled.size and self._uploader is not None:
                self._uploader.cancel(cancelled)  # their cache slots are gone: nothing to free

    def _make_room(self, h: PackHeader, key: PoolKey) -> None:
        """Shrink the pools (they share all the budget) so a new texture's fixed costs fit."""
        extra = self._pages.growth_bytes(self._core.space.used + HEADER + h.tile_count)
        extra += self._pool_set.first_layers_bytes(key, self._core.pinned_tiles(h), h)
        if self._uploader is None or self._uploader.ring.slot_bytes < h.tile_raw_size:
            extra += max(0, self._ring_size(h.tile_raw_size) - self.budget.reserved("staging-ring"))
        if self.pools and extra > self.budget.available:
            self._plan_pools(budget=self.budget.budget - extra)

    def _ring_size(self, tile_bytes: int) -> int:
        # The ring takes at most a quarter of the budget (small budgets would otherwise be all ring).
        return max(min(self.config.ring_mb << 20, self.budget.budget // 4), 16 * tile_bytes)

    def _ensure_uploader(self, tile_bytes: int) -> None:
        up = self._uploader
        if up is not None and up.ring.slot_bytes >= tile_bytes:
            return
        if up is not None:
            if up.busy or up.ring.batches_in_flight:
                raise EngineError("cannot open a pack with larger tiles while tiles are streaming; open it first")
            for vt in self.textures:
                up.remove_source(vt.id)
            up.release()
            self.budget.release("staging-ring")
        size = self._ring_size(tile_bytes)
        self.budget.reserve("staging-ring", size)
        try:
            up = Uploader(self.ctx, self.gl, self._core.space, self.config, size, tile_bytes, read_hook=self._read_hook)
        except BaseException:
            self.budget.release("staging-ring")
            raise
        self._uploader = up
        self._core.set_loading(up.loading_mask)
        for vt in self.textures:
            up.add_source(vt.id, vt.reader)

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

    def _load_now(self, vt: VirtualTexture, ids: np.ndarray, *, what: str, pinned_levels: bool = False) -> None:
        """Load `ids` now through the uploader's blocking path, pinned (the never-black fallback, or
        an all-resident reference). Nothing of a failed call stays loaded."""
        core, up = self._core, self._uploader
        assert up is not None
        slots, evicted = core.reserve_now(vt.id, ids, pin=True, what=str(vt.path))
        self.last.evicted += len(evicted)
        try:
            ok, reasons = up.load_now(self.frame, ids, vt.pool, slots)
        except BaseException:
            core.abort_now(vt.id, slots)
            raise
        if not ok.all():
            core.abort_now(vt.id, slots)  # the texture stays as it was
            raise TileCorruptError(f"{what} {reasons[0]} ({len(reasons)} bad tiles); run `texstream verify`")
        core.loaded_now(vt.id, ids, slots, pinned_levels=pinned_levels)
        self._pages.upload(core.tables)

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
        self._pages.upload(self._core.tables)

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
        core, up, cfg = self._core, self._uploader, self.config
        st = FrameStats(frame=core.begin_frame())
        if up is not None:
            up.reclaim()  # staging slots whose upload fences signalled
        self._fit_feedback()
        self._feedback.end_frame()
        raw = self._feedback.collect(st.frame)
        wanted = core.observe([] if self.freeze_feedback else raw)
        st.feedback_age, st.wanted_pages = self._feedback.age, len(wanted)
        if up is not None:
            drained = up.drain()
            st.read_batches, st.read_seconds = len(drained.read_seconds), float(sum(drained.read_seconds))
            st.failed = len(core.apply(drained=drained))
            tu = time.perf_counter()
            uploaded = up.upload(
                st.frame, self._pool_set.by_index, cfg.upload_tiles_per_frame, cfg.upload_bytes_per_frame
            )
            core.apply(uploaded=uploaded)
            st.upload_ms = (time.perf_counter() - tu) * 1e3
            if len(uploaded.loads):
                st.uploads, st.upload_bytes, st.uploaded = len(uploaded.loads), uploaded.nbytes, uploaded
                st.latency_frames = uploaded.latency_frames
            orders = core.orders(up.free_slots, up.cancel_stale)
            st.requested = up.submit(st.frame, orders.tiles, orders.pool, orders.cache_slot)
            st.evicted, st.evicted_tiles, st.evicted_age = len(orders.evicted), orders.evicted.tiles, orders.evicted.age
            st.in_flight, st.stalls = up.in_flight, up.ring.stall_count
        self._pages.upload(core.tables)
        st.missing_pages = core.missing_pages(wanted)
        self._feedback.begin_frame(st.frame)
        st.queued = core.scheduler.queued_count
        st.update_ms = (time.perf_counter() - t0) * 1e3
        st.update_cpu_ms = (time.thread_time() - c0) * 1e3
        assert self.budget.usage <= self.budget.budget, "engine VRAM usage exceeds the budget"
        self.last = st
        return st

    def throttle(self, depth: int = 2) -> FrameThrottle:
        """A `FrameThrottle` for a headless loop: call its ``frame_done()`` after each frame's draws
        and at most `depth` frames stay queued on the GPU, as a window's swap chain would keep."""
        self._check_open()
        return self.gl.throttle(depth)

    def _on_bind(self, tex_id: int) -> None:
        """A texture is bound for drawing: bind the shared buffers, and warn once when one texture
        keeps being drawn for seconds without an update()."""
        self.bind_shared()
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

    def bind_shared(self) -> None:
        """Bind the page-table and feedback buffers every virtual texture samples through."""
        assert self._pages.entries >= self._core.space.used, "the page-table buffer does not hold every texture"
        self._pages.bind(VT_PAGES_BINDING)
        self._feedback.bind()

    def make_all_resident(self, vt: VirtualTexture) -> None:
        """Load every tile of `vt` now (blocking) and pin it: the all-resident reference image.

        Raises
        ------
        BudgetError
            The whole texture does not fit the budget (nothing changes).
        TileCorruptError
            A tile is damaged (nothing stays loaded or pinned).
        """
        self._check_open()
        core, up = self._core, self._uploader
        assert up is not None
        ids, newly = core.all_resident_plan(vt.id)
        core.free_loads(up.cancel(ids))
        ledger = vt.pool.ledger
        if ids.size > core.room_for(vt.id):
            h = vt.header
            raise BudgetError(
                f"{vt.path}: all {h.tile_count} tiles need {h.tile_count * h.tile_raw_size / 2**20:.1f} MiB of "
                f"cache; the {vt.pool.name} pool holds {ledger.capacity} slots (raise BudgetConfig.budget_mb)"
            )
        ledger.pin(newly)  # so that making room evicts none of this texture's tiles
        try:
            self._load_now(vt, ids, what="all-resident")
        except BaseException:
            ledger.unpin(newly)
            raise

    # ---- lifetime -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("streamer is released")
        self._check_thread()
        if type(self.ctx.mglo).__name__ == "InvalidObject":  # what moderngl leaves after ctx.release()
            raise EngineError("the streamer's GL context was released before the streamer")

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
        if type(self.ctx.mglo).__name__ == "InvalidObject":
            self._closed = True
            if self._uploader is not None:
                self._uploader.io.shutdown(0.0)  # GL objects died with the context; stop the threads
            raise EngineError("the streamer's GL context was released before the streamer")
        self._closed = True
        if self._uploader is not None:
            self._uploader.release()
            self.budget.release("staging-ring")
        for vt in self._packs.close_all():
            vt.reader.close()
        self._pool_set.release()
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
        return f"<Streamer: {len(self._packs)} textures{', released' if self._closed else ''}>"

    def __enter__(self) -> Streamer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
