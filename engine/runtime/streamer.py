"""The facade: `Streamer(ctx, config)`, `open(path) -> VirtualTexture`, `update()` once a frame.

The streamer is the frame script: `update()` moves records between the residency core
(`residency.Residency`: what is resident and what to load, without GL) and the movers (cache pools,
staging ring and uploader, I/O threads, feedback buffers). Layout and threading contract: the
`texstream.runtime` package docstring; lifetime rules: `ownership.RenderThreadOwned`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import moderngl
import numpy as np

from ..assets.image_packs import ProgressCallback, open_pack_reader
from ..config import StreamerConfig
from ..errors import BudgetError, EngineError, TileCorruptError
from ..gl.gl_ext import GLExt
from ..gl.objects import FrameThrottle
from ..gl.shaders import register_includes
from ..pack.reader import PackReader
from ..remote import NetworkCounters
from . import staging_share
from .budget import BudgetManager
from .budget_advice import open_error
from .budget_verbs import BudgetVerbs
from .compiled_loops import decider_loops
from .feedback import FeedbackRing
from .feedback_bursts import FeedbackBursts
from .frame_stats import FrameStats, IOStatus, PhaseClock
from .io_workers import ReadHook
from .origin import Origin
from .ownership import RenderThreadOwned
from .page_buffer import PageTableBuffer
from .pool_set import PoolSet
from .pools import CachePool, PoolKey
from .residency import Residency
from .sets import SetVerbs, TextureSet
from .sharing import OpenPacks, pack_identity
from .texture import VT_PAGES_BINDING, VirtualTexture, check_bindings
from .texture_sets import check_priority
from .tiles import HEADER, MAX_LEVELS, MAX_TEXTURES
from .update_watch import UpdateWatch
from .uploader import Uploader
from .views import StreamerViews

__all__ = ["FrameStats", "IOStatus", "Streamer", "TextureSet", "VirtualTexture"]

log = logging.getLogger(__name__)


class Streamer(RenderThreadOwned, StreamerViews, SetVerbs, BudgetVerbs):
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

    Raises
    ------
    TypeError
        `config` is not a `StreamerConfig`.
    ValueError
        `budget_mb` conflicts with `config`'s budget, or is not a positive number.
    GLError
        The context lacks a GL feature the engine needs.

    A program's frame loop: docs/getting-started.md and docs/frame-loop.md.
    """

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
        self._claim()
        self.ctx, self.config = ctx, config
        self.gl = GLExt(ctx, debug=config.debug_gl)
        check_bindings(self.gl)
        register_includes(ctx)  # plain ctx.program() resolves #include "texstream/vt.glsl" too
        mem = self.gl.memory_info()
        self.budget = BudgetManager(config.budget, mem.available_bytes if mem else None)
        self._core = Residency(config, self.budget, loops=decider_loops())
        self._pages = PageTableBuffer(ctx, self.budget)
        self._pool_set = PoolSet(self.gl, self.budget, config)
        self._packs: OpenPacks[VirtualTexture] = OpenPacks()
        self._sets: list[TextureSet] = []  # open texture sets (SetVerbs)
        self._uploader: Uploader | None = None
        self._uploader_parts = {"ctx": ctx, "gl": self.gl, "space": self._core.space, "config": config}
        # read_hook (not documented API): fault injection for tests, called on an I/O thread with each batch
        self._uploader_parts |= {"budget": self.budget, "read_hook": read_hook}
        vw, vh = ctx.viewport[2:] if ctx.viewport else (0, 0)
        self._feedback = FeedbackRing.reserved(ctx, self.gl, self.budget, (max(1920, vw), max(1080, vh)), config)
        self._bursts = FeedbackBursts(config.feedback_burst_frames)  # dense feedback after a camera cut
        self.last = FrameStats()
        self.freeze_feedback = False  # True: feedback is read (buffers recycle) but ignored
        self._closed_network = NetworkCounters()  # network totals of closed remote textures
        self._watch = UpdateWatch()  # draws without update() stay blurred: say why, once
        self._closed = False

    # ---- textures -----------------------------------------------------------------------------
    def open(
        self,
        path: str | os.PathLike[str],
        *,
        origin: Origin | str = Origin.BOTTOM_LEFT,
        progress: ProgressCallback | None = None,
        priority: float = 1.0,
    ) -> VirtualTexture:
        """Open a pack for streaming; its coarsest `StreamerConfig.pinned_levels` levels load now.
        A pack that is already open is not loaded again: the new handle shares its residency.

        Parameters
        ----------
        path : str or os.PathLike
            A pack; an image (PNG, JPEG, TIFF, WebP...) or a DDS/KTX2 file, made into a pack once in
            the pack cache (`texstream.assets.resolve_pack`) and leased there until the texture's
            last handle closes; or a URL: ``http(s)://`` or any fsspec filesystem, read through the
            disk cache of `StreamerConfig.remote`.
        origin : Origin or str, optional
            Which image row v = 0 names: `Origin.BOTTOM_LEFT` (default, GL's and moderngl's) or
            `Origin.TOP_LEFT` (glTF, DirectX); per handle, also of a shared pack. `VirtualTexture.origin`.
        progress : callable, optional
            Called with an `ImagePackProgress` while an image is hashed and baked (first open only).
        priority : float, optional
            `VirtualTexture.priority`: > 1 stays sharper under pressure, < 1 gives way first.

        Returns
        -------
        VirtualTexture
            The texture to bind in shaders (``vt.bind(program, name)``).

        Raises
        ------
        PackNotFoundError, PackFormatError, SourceError
            No file at `path`, not a valid pack, or an image or block file that cannot be made one.
        RemoteError
            The URL cannot be reached or read.
        BudgetError
            The budget cannot hold the texture's pinned levels and page table.
        EngineError
            Too many textures open, or the streamer is released.
        """
        self._check_open()
        origin, priority = Origin.parse(origin), check_priority(priority)
        reader = open_pack_reader(path, self.config.remote, progress=progress)  # a cached pack: leased while open
        shared = self._packs.find(pack_identity(reader))
        if shared is not None:
            reader.close()
            vt = self._packs.add(self._handle(shared.id, shared.reader, shared.pool, origin, priority))
            self._on_priority(vt.id)
            return vt
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
                self._feedback.track_ids(core.space.used, self.budget)
                pool = self._pool_set.attach(key, tex_id, core.pinned_tiles(h), h)
            except BaseException:
                core.unregister(tex_id)
                raise
            core.attach(tex_id, h, pool.index, pool.ledger, pool.geometry)
            vt = self._packs.add(self._handle(tex_id, reader, pool, origin, priority), pack_identity(reader))
            self._on_priority(tex_id)
            assert self._uploader is not None
            self._uploader.add_source(tex_id, reader)
            self._plan_pools()
            ids = core.pinned_level_ids(tex_id)
            self._load_now(vt, ids, what="pinned", pinned_levels=True)
        except BaseException as exc:
            if vt is not None:
                self.close(vt)
            reader.close()
            if isinstance(exc, BudgetError):  # name the smallest budget it opens in (key is set: see _make_room)
                new = (*self._pool_set.placement(key, h), h)
                pages = PageTableBuffer.bytes_for(core.space.used + HEADER + h.tile_count)
                raise open_error(str(path), exc, lambda n: core.open_minimum(new, pages, n)) from None
            raise
        log.info("opened %s as texture %d (%s)", path, tex_id, pool.name)
        return vt

    def _handle(
        self, tex_id: int, reader: PackReader, pool: CachePool, origin: Origin, priority: float
    ) -> VirtualTexture:
        core = self._core
        failures = lambda t: (core.corrupt_tiles(t), int(core.failed_loads[t]))  # noqa: E731
        parts = (tex_id, reader, pool, core.space.ranges[tex_id], core.table_view(tex_id))
        hooks = {"on_bind": self._on_bind, "on_close": self.close, "on_priority": self._on_priority}
        return VirtualTexture(*parts, failures=failures, origin=origin, priority=priority, **hooks)

    def close(self, vt: VirtualTexture | TextureSet) -> None:
        """Close a texture handle (or every member of a set). When it is the pack's last handle, its
        loads are cancelled and its cache slots freed once the frames in flight no longer sample them.
        Closing twice does nothing.

        Parameters
        ----------
        vt : VirtualTexture or TextureSet
            A texture or texture set this streamer opened.
        """
        self._check_thread()
        if isinstance(vt, TextureSet):
            return vt.close()
        if not self._packs.remove(vt):
            return
        vt.closed = True
        self._member_closed(vt)
        if self._packs.handles(vt.id):
            return  # another handle on the same pack keeps the residency
        assert self._uploader is not None
        for remote in self._uploader.remote_stats(vt.id):  # its counters outlive it in the totals
            self._closed_network.add(remote)
        empty = self._core.detach(vt.id, self._uploader.remove_source(vt.id))
        self._pool_set.detach(vt.pool, vt.id, empty)
        vt.reader.close()

    def _ensure_uploader(self, tile_bytes: int) -> None:
        sources = [(vt.id, vt.reader) for vt in self.textures]
        up = Uploader.fitting(self._uploader, tile_bytes, sources, **self._uploader_parts)
        if up is not self._uploader:
            self._uploader = up
            self._core.set_loading(up.loading_mask, up.ring.slot_bytes)

    def set_feedback_size(self, size: tuple[int, int]) -> None:
        """Size the feedback buffers for draws of `size` pixels.

        They follow the viewport by themselves; call this when drawing into framebuffers larger
        than the viewport seen at construction.

        Parameters
        ----------
        size : tuple of int
            Width and height in pixels of the largest draw that samples virtual textures.
        """
        self._feedback = self._feedback.resized(size, self.budget, self.config)

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
        self._watch.updated()
        c0, clock = time.thread_time(), PhaseClock()
        core, up = self._core, self._uploader
        st = FrameStats(frame=core.begin_frame())
        if up is not None:
            up.reclaim()  # staging slots whose upload fences signalled
        f0 = time.thread_time()  # the feedback's cost on this thread: compacting pays only if it lowers it
        self._feedback = self._feedback.fitted(self.ctx.viewport, self.budget, self.config)
        self._feedback.end_frame()
        self._pages.bind(VT_PAGES_BINDING)  # the feedback compaction's dispatches used its binding
        raw = self._feedback.collect(st.frame)
        core.open_gates(self._feedback.completed)  # the uploads may write slots the finished draws left
        feedback_cpu, st.feedback_ms = time.thread_time() - f0, clock.lap()
        if up is not None:
            drained = up.drain()
            st.read_batches, st.read_seconds = len(drained.read_seconds), float(sum(drained.read_seconds))
            st.failed, st.drain_ms = len(core.apply(drained=drained)), clock.lap()
            uploaded = up.upload(st.frame, self._pool_set.by_index)  # caps and time budget: the config's
            self._pages.bind(VT_PAGES_BINDING)  # the staging-texture path's fill read the ring through it
            st.upload_ms = clock.lap()
        # Read again what the GPU finished during the drain and the uploads (the last draw, when it
        # keeps up), observed before the uploads enter the page tables: the slots it touches are those
        # the draws sampled through.
        f0 = time.thread_time()
        raw += self._feedback.collect(st.frame)
        st.feedback_ms += clock.lap()
        wanted = core.observe([] if self.freeze_feedback else raw, gpu_done=self._feedback.completed)
        # a jump in the pages (a camera cut) makes the coming draws' feedback dense, and this frame's
        # requests want the new view's pages' neighbours too (`RequestScheduler.widened`)
        dense = self._bursts.step(core.sampled.ids if raw and not self.freeze_feedback else None)
        new_view = self._bursts.jumped and self.config.cut_neighbours
        st.feedback_age, st.wanted_pages, st.reduce_ms = self._feedback.age, len(wanted), clock.lap()
        if not self.freeze_feedback:
            self._feedback.record_cost(raw, feedback_cpu + time.thread_time() - f0)
        if up is not None:
            core.apply(uploaded=uploaded)
            st.upload_ms += clock.lap()  # the uploads' bookkeeping, counted with them as before
            if len(uploaded.loads):
                st.uploads, st.upload_bytes, st.uploaded = len(uploaded.loads), uploaded.nbytes, uploaded
                st.upload_calls, st.latency_frames = up.last_calls, uploaded.latency_frames
            orders = core.orders(up.free_slots, up.cancel_stale, widen=new_view)
            st.select_ms, st.reserve_ms = orders.select_ms, clock.lap() - orders.select_ms
            st.requested = up.submit(st.frame, orders.tiles, orders.pool, orders.cache_slot, start=False)
            st.evicted, st.evicted_tiles, st.evicted_age = len(orders.evicted), orders.evicted.tiles, orders.evicted.age
            st.in_flight, st.stalls, st.submit_ms = up.in_flight, up.ring.stall_count, clock.lap()
        self._pages.upload(core.tables)
        st.page_table_ms = clock.lap()
        st.missing_pages, st.queued = core.missing_pages(wanted), core.scheduler.queued_count
        st.stats_ms = clock.lap()
        st.feedback_stride = self._feedback.begin_frame(st.frame, dense=dense)
        st.feedback_ms += clock.lap()
        if up is not None:  # the reads start last: Python I/O threads (remote packs, hooks) run after it
            up.start_reads()
            st.submit_ms += clock.lap()
        st.update_ms, st.update_cpu_ms = clock.total(), (time.thread_time() - c0) * 1e3
        assert self.budget.usage <= self.budget.budget, "engine VRAM usage exceeds the budget"
        self.last = st
        return st

    def camera_cut(self) -> None:
        """Say that the next `update()`'s frame shows a new view (a camera cut, a teleport): its draws
        and the next `StreamerConfig.feedback_burst_frames` - 1 record dense feedback at once, instead
        of from the update that reads the first feedback showing the jump, one or more frames later.
        Call it before that update(); nothing happens with bursts off."""
        self._check_open()
        self._bursts.cut()

    def throttle(self, depth: int = 2) -> FrameThrottle:
        """A `FrameThrottle` for a headless loop: call its ``frame_done()`` after each frame's draws
        and at most `depth` frames stay queued on the GPU, as a window's swap chain would keep."""
        self._check_open()
        return self.gl.throttle(depth)

    def _on_bind(self, tex_id: int) -> None:
        """A texture is bound for drawing: the shared buffers, and the forgotten-update() watch."""
        self.bind_shared()
        self._watch.bound(tex_id)

    def bind_shared(self) -> None:
        """Bind the page-table and feedback buffers every virtual texture samples through."""
        assert self._pages.entries >= self._core.space.used, "the page-table buffer does not hold every texture"
        self._pages.bind(VT_PAGES_BINDING)
        self._feedback.bind()

    # ---- lifetime -----------------------------------------------------------------------------
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
            staging_share.release_staging(self.budget)
        for vt in self._packs.close_all():
            vt.reader.close()
        for tset in self._sets:
            tset.closed = True
        self._pool_set.release()
        self._pages.release()
        self._feedback.release(self.budget)
        self.budget.release("feedback")

    def __repr__(self) -> str:
        return f"<Streamer: {len(self._packs)} textures{', released' if self._closed else ''}>"
