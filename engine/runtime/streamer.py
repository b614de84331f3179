"""The facade: `Streamer(ctx, config)`, `open(path) -> VirtualTexture`, `update()` once a frame.

Per frame, `update()` (render thread, never blocking on disk or on the GPU):

1. polls staging-ring fences and feedback fences; reads the feedback that is ready, reduces it to
   wanted pages (mip bias applied), touches the cache slots those pages sample;
2. steps the budget's mip-bias controller (wanted working set vs cache capacity);
3. asks the scheduler for this frame's loads, reserves a cache slot for each (evicting LRU tiles
   that no frame in flight uses) and a staging slot, and hands them to the I/O threads;
4. uploads finished tiles from the ring into their cache slots (one batch, one fence per pool),
   updates the page tables and uploads their dirty regions;
5. binds a fresh feedback buffer for the coming draw and records telemetry.

GPU memory: every allocation (cache pools, page tables, ring, feedback) is reserved in the
`BudgetManager` before it is made. Pools are sized when textures open or the budget changes: what
the budget leaves after the fixed costs is shared among pools in proportion to their textures'
level-0 tile counts (each pool at least its pinned tiles). A resize creates the new array, copies the
survivors on the GPU and deletes the old one; for that moment both arrays exist (inside `open`,
`close` or `set_budget`, never inside `update`).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType

import moderngl
import numpy as np

from ..config import StreamerConfig
from ..errors import BudgetError, EngineError, TileCorruptError
from ..gl.gl_ext import GLExt, TextureArray, gl_format
from ..pack.format import PackHeader, TexelFormat
from ..pack.reader import PackReader
from .budget import BudgetManager
from .feedback import FeedbackRing
from .feedback_reduce import FeedbackReducer, WantedPages, check_packable
from .io_workers import IOJob, IOWorkers, JobState
from .page_table import PageTable
from .requests import RequestScheduler
from .staging import StagingRing
from .tile_cache import SlotGeometry, SlotPool, TileRecords, tile_keys

log = logging.getLogger(__name__)

PoolKey = tuple[TexelFormat, bool, int]  # format, sRGB, slot size
FIRST_UNIT = 8  # texture units used by virtual textures start here (2 per texture)
MAX_TEXTURES = 255


@dataclass
class FrameStats:
    """Counters of one update(); `Streamer.stats()` returns the latest with running totals."""

    frame: int = 0
    update_ms: float = 0.0
    upload_ms: float = 0.0
    uploads: int = 0
    upload_bytes: int = 0
    requested: int = 0
    wanted_pages: int = 0
    missing_pages: int = 0
    in_flight: int = 0
    queued: int = 0
    evicted: int = 0
    stalls: int = 0
    failed: int = 0
    feedback_age: int = -1
    latency_frames: list[int] = field(default_factory=list)


class CachePool:
    """One format's GL texture array plus its slot bookkeeping, shared by its textures."""

    def __init__(self, streamer: Streamer, key: PoolKey, geometry: SlotGeometry, capacity: int) -> None:
        self.streamer, self.key, self.geometry = streamer, key, geometry
        fmt, srgb, _ = key
        self.name = f"pool/{fmt.name.lower()}{'-srgb' if srgb else ''}/{geometry.slot_size}"
        self.gl_format = gl_format(fmt, srgb)
        cfg = streamer.config
        self.slots = SlotPool(self.name, capacity, geometry, cfg.frames_in_flight)
        # Frame from which each slot may be overwritten: a tile evicted at frame E was still mapped
        # by the page tables of draws E-1, E-2, ... that may be in flight, so the next tile's upload
        # into its slot waits until E + frames_in_flight (no implicit GPU sync, no stale reads).
        self.writable_at = np.zeros(capacity, np.int64)
        self.texture: TextureArray | None = None
        self.textures: list[VirtualTexture] = []
        self.reference_pins = 0  # slots pinned by Streamer.make_all_resident (not pinned levels)
        self._allocate_texture(capacity)

    @property
    def layer_size(self) -> int:
        return self.geometry.layer_size[0]

    def _allocate_texture(self, capacity: int) -> TextureArray:
        layers = capacity // self.geometry.cells
        self.streamer.budget.reserve(self.name, layers * self.geometry.layer_bytes)
        # Plain bilinear sampler: vt_sample does the anisotropic taps itself (portable, exact at 1:1).
        tex = self.streamer.gl.create_texture_array(self.gl_format, self.layer_size, layers)
        self.texture = tex
        return tex

    def resize(self, capacity: int) -> TileRecords:
        """Grow or shrink to `capacity` slots; survivors copied on the GPU. Returns evicted tiles."""
        if capacity == self.slots.capacity:
            return TileRecords.empty()
        result = self.slots.resize(capacity)  # BudgetError (nothing changed) if pins do not fit
        old = self.texture
        assert old is not None
        gl = self.streamer.gl
        new_layers = capacity // self.geometry.cells
        self.streamer.budget.release(self.name)
        self.streamer.budget.reserve(self.name, new_layers * self.geometry.layer_bytes)
        new = gl.create_texture_array(self.gl_format, self.layer_size, new_layers)
        keep = min(result.old_layers, result.new_layers)
        if keep:
            gl.copy_layers(old, 0, new, 0, keep)
        if result.moves_from.size:
            s = self.geometry.slot_size
            fl, fx, fy = self.geometry.locate(result.moves_from)
            tl, tx, ty = self.geometry.locate(result.moves_to)
            moves = zip(fl.tolist(), (fx * s).tolist(), (fy * s).tolist(), tl.tolist(), (tx * s).tolist(),
                        (ty * s).tolist(), strict=True)  # fmt: skip
            gl.copy_cells(old, new, moves, s)
            by_tex = self.streamer._textures_by_id
            for tex_id in np.unique(result.moved.tex).tolist():
                m = result.moved.tex == tex_id
                vt = by_tex.get(tex_id)
                if vt is not None:
                    vt.table.move_slots(result.moves_from[m], result.moves_to[m])
        old.release()
        self.texture = new
        self.writable_at = np.zeros(capacity, np.int64)  # a fresh array: no draw in flight samples it
        if len(result.cancelled):
            self.streamer._cancel_loads(result.cancelled)
        return result.evicted

    def release(self) -> None:
        if self.texture is not None:
            self.texture.release()
            self.texture = None
            self.streamer.budget.release(self.name)


class VirtualTexture:
    """One open pack: its page table (CPU + GPU), its pool, and the uniforms `vt_sample` reads."""

    def __init__(self, streamer: Streamer, tex_id: int, reader: PackReader, pool: CachePool) -> None:
        self.streamer, self.id, self.reader, self.pool = streamer, tex_id, reader, pool
        self.header: PackHeader = reader.header
        self.path = reader.path
        cfg = streamer.config
        self.table = PageTable(self.header, cfg.pinned_levels, pool.geometry)
        w, h = self.table.gpu_texture_size
        self.page_levels = self.table.gpu_level_count
        self._budget_name = f"page-table/{tex_id}"
        streamer.budget.reserve(self._budget_name, self.table.bytes_on_gpu)
        self.page_texture = streamer.gl.create_page_texture(w, h, self.page_levels)
        self.cache_unit = FIRST_UNIT + 2 * tex_id
        self.pages_unit = self.cache_unit + 1
        self.lod_bias = 0.0
        self.corrupt_tiles = 0
        self.closed = False

    # ---- drawing ------------------------------------------------------------------------------
    def bind(self, program: moderngl.Program, name: str) -> None:
        """Bind this texture's cache and page table, and set the `VT_DECLARE(name)` uniforms."""
        if self.closed:
            raise EngineError(f"virtual texture {self.path} is closed")
        h = self.header
        gl = self.streamer.gl
        assert self.pool.texture is not None
        gl.bind_texture_array(self.pool.texture, self.cache_unit)
        gl.bind_texture_2d(self.page_texture, self.pages_unit)
        values = {
            f"{name}_cache": self.cache_unit,
            f"{name}_pages": self.pages_unit,
            f"{name}.size": (h.width, h.height, 1.0 / h.width, 1.0 / h.height),
            f"{name}.tile": (h.tile_size, h.border, h.slot_size, 1.0 / self.pool.layer_size),
            f"{name}.meta": (h.level_count, self.id, int(h.address_mode), max_anisotropy(h.border)),
            f"{name}.bias": (self.lod_bias, 0.0, 0.0, 0.0),
        }
        for key, value in values.items():
            member = program.get(key, None)
            if member is None:
                if key.endswith("_cache") or key.endswith("_pages"):
                    raise EngineError(f"program has no uniform {key}: declare VT_DECLARE({name}) and use it")
                continue
            member.value = value
        self.streamer.feedback.bind()

    def _upload_page_table(self) -> None:
        gl = self.streamer.gl
        for level, rect, data in self.table.take_dirty():
            x, y = rect[0], rect[1]
            gl.write_page_region(self.page_texture, level, x, y, data)

    def release(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.streamer.gl.delete_texture(self.page_texture)
        self.streamer.budget.release(self._budget_name)
        self.reader.close()


class Streamer:
    """Streams tiles of any number of packs into one VRAM budget. Render thread only."""

    def __init__(self, ctx: moderngl.Context, config: StreamerConfig | None = None) -> None:
        self.ctx = ctx
        self.config = config = config or StreamerConfig()
        self.gl = GLExt(ctx, debug=config.debug_gl)
        mem = self.gl.memory_info()
        self.budget = BudgetManager(config.budget, mem.available_bytes if mem else None)
        self.frame = 0
        self.pools: dict[PoolKey, CachePool] = {}
        self.textures: list[VirtualTexture] = []
        self._textures_by_id: dict[int, VirtualTexture] = {}
        self.reducer = FeedbackReducer()
        self.scheduler = RequestScheduler(config)
        self.io = IOWorkers(config.io_threads)
        self.ring: StagingRing | None = None
        # Sized for 1920x1080 (or the current viewport if larger); grown when a larger viewport is seen.
        vw, vh = ctx.viewport[2:] if ctx.viewport else (0, 0)
        self.feedback: FeedbackRing = self._make_feedback((max(1920, vw), max(1080, vh)))
        self._jobs: dict[int, tuple[IOJob, CachePool, int, int]] = {}  # key -> job, pool, cache slot, frame
        self._ready: deque[tuple[IOJob, CachePool, int, int]] = deque()
        self.last = FrameStats()
        self._st = self.last  # the frame being built by update(); evictions are counted into it
        # the newest feedback's pages without the bias, re-touched while no feedback arrives
        self._last_sampled = WantedPages.empty()
        self.totals: dict[str, int] = {"uploads": 0, "upload_bytes": 0, "evicted": 0, "failed": 0, "stalls": 0,
                                       "requested": 0, "cancelled": 0}  # fmt: skip
        self.latencies: deque[int] = deque(maxlen=4096)
        self.freeze_feedback = False  # True: feedback is read (buffers recycle) but ignored
        self._closed = False

    # ---- textures -----------------------------------------------------------------------------
    def open(self, path: str | os.PathLike[str]) -> VirtualTexture:
        """Open a pack; its coarsest `pinned_levels` levels are loaded now (blocking, once)."""
        self._check_open()
        reader = PackReader(path)
        try:
            h = reader.header
            check_packable(h)
            if h.level_count > 16:
                raise EngineError(f"{path}: {h.level_count} levels; the page feedback holds at most 16")
            if len(self.textures) >= MAX_TEXTURES:
                raise EngineError(f"at most {MAX_TEXTURES} virtual textures can be open at once")
            key: PoolKey = (h.texel_format, h.srgb, h.slot_size)
            self._make_room(h, key)
            self._ensure_ring(h.tile_raw_size)
            tex_id = next(i for i in range(MAX_TEXTURES) if i not in self._textures_by_id)
            pool = self.pools.get(key)
            created = pool is None
            if pool is None:
                geometry = self._geometry(h)
                pool = CachePool(self, key, geometry, self._initial_capacity(h, geometry))
                self.pools[key] = pool
            try:
                vt = VirtualTexture(self, tex_id, reader, pool)
            except BaseException:
                if created:
                    pool.release()
                    del self.pools[key]
                raise
            pool.textures.append(vt)
            self.textures.append(vt)
            self._textures_by_id[tex_id] = vt
            self.reducer.register(tex_id, h)
            try:
                self._plan_pools()
                self._load_pinned(vt)
            except BaseException:
                self.close(vt)
                raise
        except BaseException:
            reader.close()
            raise
        log.info("opened %s as texture %d (%s)", path, tex_id, pool.name)
        return vt

    def close(self, vt: VirtualTexture) -> None:
        """Forget a texture: its slots are freed (after frames in flight), its page table released."""
        if vt not in self.textures:
            return
        for key in [k for k, (job, *_rest) in self._jobs.items() if job.tex_id == vt.id]:
            job, pool, slot, _ = self._jobs.pop(key)
            if not self.io.cancel(job):
                job.state = JobState.CANCELLED  # finishes in its thread; dropped when drained
        self._drop_ready(lambda job: job.tex_id == vt.id)
        m = self._last_sampled.tex != vt.id  # its id may be reused by the next open()
        ls = self._last_sampled
        self._last_sampled = WantedPages(ls.tex[m], ls.level[m], ls.x[m], ls.y[m], ls.count[m])
        vt.pool.slots.release_texture(vt.id, self.frame)
        vt.pool.textures.remove(vt)
        self.textures.remove(vt)
        del self._textures_by_id[vt.id]
        self.reducer.unregister(vt.id)
        self.scheduler.forget_texture(vt.id)
        vt.release()
        if not vt.pool.textures:
            vt.pool.release()
            del self.pools[vt.pool.key]

    def _geometry(self, h: PackHeader) -> SlotGeometry:
        max_slots = max(1, self.budget.budget // h.tile_raw_size)
        return SlotGeometry.choose(h.slot_size, h.tile_raw_size, max_slots, max_layers=self.gl.max_array_layers,
                                   max_texture_size=min(self.gl.max_texture_size, 16384))  # fmt: skip

    def _plan_pools(self, budget: int | None = None) -> None:
        """Share what the budget leaves after fixed costs among pools (see module docstring)."""
        names = [p.name for p in self.pools.values()]
        pinned = {k: sum(_pinned_tile_count(vt.header, self.config.pinned_levels) for vt in p.textures)
                  for k, p in self.pools.items()}  # fmt: skip
        # Equal slots per texture: textures drawn over the same surface (albedo + normal map) want about
        # as many tiles each whatever their resolution, so bytes go by slot size, not by texture size.
        weight = {k: len(p.textures) * p.geometry.slot_bytes for k, p in self.pools.items()}
        total_w = sum(weight.values()) or 1
        held = self.budget.usage - sum(self.budget.reserved(n) for n in names)
        left = (self.budget.budget if budget is None else budget) - held
        plan = {}
        for k, p in self.pools.items():
            g = p.geometry
            share = int(left * weight[k] / total_w) // g.slot_bytes
            need = -(-pinned[k] // g.cells) * g.cells
            # Never more slots than the pool's textures have tiles (small packs leave budget unused).
            every = -(-sum(vt.header.tile_count for vt in p.textures) // g.cells) * g.cells
            cap = max(min(g.round_capacity(share), every), need, g.cells)
            cap = min(cap, self.gl.max_array_layers * g.cells)
            plan[k] = cap
        need_bytes = sum(plan[k] // p.geometry.cells * p.geometry.layer_bytes for k, p in self.pools.items())
        if need_bytes > left:
            raise BudgetError(
                f"VRAM budget too small: the pinned levels alone need {need_bytes / 2**20:.1f} MiB of cache, "
                f"{left / 2**20:.1f} MiB is left after page tables, ring and feedback "
                f"(budget {self.budget.budget / 2**20:.1f} MiB)"
            )
        # Shrink first so growth has room.
        for k in sorted(plan, key=lambda k: plan[k] - self.pools[k].slots.capacity):
            evicted = self.pools[k].resize(plan[k])
            self._on_evicted(evicted)

    def _initial_capacity(self, h: PackHeader, geometry: SlotGeometry) -> int:
        pinned = _pinned_tile_count(h, self.config.pinned_levels)
        cap = geometry.round_capacity(max(pinned, geometry.cells)) or geometry.cells
        return max(cap, -(-pinned // geometry.cells) * geometry.cells)

    def _make_room(self, h: PackHeader, key: PoolKey) -> None:
        """Shrink the pools (they share all the budget) so a new texture's fixed costs fit: its page
        table, its pool's first layers when its format is new, a larger ring for larger tiles.
        `open` shares the budget among all pools again once the texture is in."""
        extra = PageTable(h, self.config.pinned_levels).bytes_on_gpu
        if key not in self.pools:
            g = self._geometry(h)
            extra += self._initial_capacity(h, g) // g.cells * g.layer_bytes
        if not self._ring_fits(h.tile_raw_size):
            extra += max(0, self._ring_size(h.tile_raw_size) - self.budget.reserved("staging-ring"))
        if self.pools and extra > self.budget.available:
            self._plan_pools(budget=self.budget.budget - extra)

    def _ring_fits(self, tile_bytes: int) -> bool:
        return self.ring is not None and bool(self.ring.slots) and self.ring.slots[0].capacity >= tile_bytes

    def _ring_size(self, tile_bytes: int) -> int:
        # The ring takes at most a quarter of the budget (small budgets would otherwise be all ring).
        return max(min(self.config.ring_mb << 20, self.budget.budget // 4), 16 * tile_bytes)

    def _ensure_ring(self, tile_bytes: int) -> None:
        if self._ring_fits(tile_bytes):
            return
        if self.ring is not None:
            if self._jobs or self._ready:
                raise EngineError("cannot open a pack with larger tiles while tiles are streaming; open it first")
            self.budget.release("staging-ring")
            self.ring.release()
            self.ring = None
        size = self._ring_size(tile_bytes)
        self.budget.reserve("staging-ring", size)
        self.ring = StagingRing(self.ctx, self.gl, size, tile_bytes)

    def _feedback_capacity(self, fb_size: tuple[int, int]) -> int:
        stride = self.config.feedback_divisor
        return 4 * (-(-fb_size[0] // stride)) * (-(-fb_size[1] // stride))  # up to 4 samples per cell

    def _make_feedback(self, fb_size: tuple[int, int]) -> FeedbackRing:
        ring = FeedbackRing(self.ctx, self.gl, self._feedback_capacity(fb_size), self.config.feedback_divisor)
        self.budget.reserve("feedback", ring.nbytes)
        return ring

    def _fit_feedback(self) -> None:
        """Grow the feedback buffers when the viewport the draws use outgrew them (e.g. a resize)."""
        vp = self.ctx.viewport
        if not vp or self._feedback_capacity((vp[2], vp[3])) <= self.feedback.capacity:
            return
        old = self.feedback
        self.budget.release("feedback")
        try:
            self.feedback = self._make_feedback((vp[2], vp[3]))
        except BudgetError:
            self.budget.reserve("feedback", old.nbytes)  # keep the smaller one; drops are counted
            return
        old.release()

    def _load_pinned(self, vt: VirtualTexture) -> None:
        """Load the coarsest levels synchronously through the ring (the never-black fallback)."""
        h = vt.header
        tiles = [(lv, x, y) for lv in range(h.level_count - vt.table.pinned_levels, h.level_count)
                 for y in range(h.tiles_in_level(lv)[1]) for x in range(h.tiles_in_level(lv)[0])]  # fmt: skip
        tiles.sort(key=lambda t: -t[0])  # coarsest first: parents before children
        pool = vt.pool
        for lv, x, y in tiles:
            slot = pool.slots.allocate(self.frame, vt.id, lv, x, y)
            if slot is None:
                raise BudgetError(f"no cache slot left for pinned tile ({lv}, {x}, {y}) of {vt.path}")
            pool.slots.pin(slot)
            staging = self._acquire_blocking()
            try:
                vt.reader.read_tile_into(lv, x, y, staging.view)
            except TileCorruptError as exc:
                self.ring.abandon(staging)
                raise TileCorruptError(f"{vt.path}: pinned {exc}; run `texstream verify`", lv, x, y) from None
            self.ring.mark_ready(staging, h.tile_raw_size)
            self._upload(pool, [(staging, slot)])
            pool.slots.mark_uploading(slot)
            pool.slots.mark_resident(slot, self.frame)
            vt.table.set_resident(lv, x, y, slot)
        self.scheduler.mark_resident(tile_keys(vt.id, *np.array(tiles).T) if tiles else np.zeros(0, np.int64))
        vt._upload_page_table()

    def _acquire_blocking(self):  # noqa: ANN202 (Slot)
        assert self.ring is not None
        deadline = time.monotonic() + 10.0
        while True:
            self.ring.reclaim()
            slot = self.ring.acquire()
            if slot is not None:
                return slot
            if time.monotonic() > deadline:
                raise EngineError("staging ring never freed a slot (GPU hung?)")
            time.sleep(0.0005)

    # ---- budget -------------------------------------------------------------------------------
    def set_budget(self, megabytes: float) -> None:
        """Change the VRAM budget at run time; pools shrink or grow (survivors copied on the GPU)."""
        nbytes = int(megabytes * (1 << 20))
        if nbytes <= 0:
            raise ValueError(f"budget must be positive, got {megabytes!r} MiB")
        if nbytes < self.budget.budget:
            self._plan_pools(budget=nbytes)  # shrink first, then lower the budget
            self.budget.set_budget(nbytes)
        else:
            self.budget.set_budget(nbytes)
            self._plan_pools()
        for vt in self.textures:
            vt._upload_page_table()

    # ---- the frame ----------------------------------------------------------------------------
    def update(self) -> FrameStats:
        """Once a frame, before drawing with the virtual textures."""
        self._check_open()
        t0 = time.perf_counter()
        self.frame += 1
        frame = self.frame
        st = self._st = FrameStats(frame=frame)
        assert self.ring is not None or not self.textures
        if self.ring is not None:
            self.ring.reclaim()
        self._fit_feedback()

        # 1. Feedback -> wanted pages; touch the slots the draws sampled. Those are the pages the
        # feedback names *without* the mip bias (the shader samples the finest resident level,
        # whatever the bias asks the scheduler to load). Feedback arrives irregularly (its fences
        # signal when the GPU gets there); until newer feedback arrives, the frames in flight are
        # assumed to sample what the newest feedback named, so those slots stay touched.
        raw = self.feedback.collect(frame)
        if self.freeze_feedback:  # keep streaming what is queued; want nothing new
            raw = []
        data = self._feedback_data(raw)
        wanted = self._reduce(data)
        if raw:
            self._last_sampled = wanted if self.budget.bias_levels == 0 else self._reduce(data, 0)
        st.feedback_age = self.feedback.age
        st.wanted_pages = len(wanted)
        self._touch(self._last_sampled, frame)

        # 2. Budget pressure -> mip bias.
        if raw and self.textures:
            self._step_bias(data, wanted)

        # 3. Requests -> cache slots + staging slots -> I/O threads.
        tables = {vt.id: vt.table for vt in self.textures}
        batch = self.scheduler.update(frame, wanted, tables)
        self.totals["cancelled"] += int(batch.cancelled.size)
        st.requested = self._dispatch(batch, frame, st)

        # 4. Finished reads -> uploads -> page tables.
        self._collect_io(st)
        tu = time.perf_counter()
        self._upload_ready(frame, st)
        st.upload_ms = (time.perf_counter() - tu) * 1e3
        for vt in self.textures:
            vt._upload_page_table()
        st.missing_pages = int(np.count_nonzero(~self._resident_mask(wanted))) if len(wanted) else 0

        # 5. Next draw's feedback buffer.
        self.feedback.begin_frame(frame)
        st.in_flight = len(self._jobs)
        st.queued = self.scheduler.queued_count
        st.update_ms = (time.perf_counter() - t0) * 1e3
        if self.ring is not None:
            st.stalls = self.ring.stall_count
        assert self.budget.usage <= self.budget.budget, "engine VRAM usage exceeds the budget"
        self.last = st
        return st

    @staticmethod
    def _feedback_data(raw: list[np.ndarray]) -> np.ndarray:
        if not raw:
            return np.zeros(0, np.uint32)
        return np.concatenate(raw) if len(raw) > 1 else raw[0]

    def _reduce(self, data: np.ndarray, levels: int | None = None) -> WantedPages:
        if not data.size or not self.textures:
            return WantedPages.empty()
        b = self.budget.bias_levels if levels is None else levels
        return self.reducer.reduce(data, bias=float(b)).pages

    def _pressure(self, wanted: WantedPages) -> tuple[int, int]:
        """(working set, slots) of the most loaded pool: the wanted tiles plus their parents (trilinear
        samples both levels; `_touch` keeps both), against the pool's unpinned slots."""
        worst = (0, 1)
        for pool in self.pools.values():
            keys = []
            for vt in pool.textures:
                m = wanted.tex == vt.id
                if not m.any():
                    continue
                lv, x, y = wanted.level[m], wanted.x[m], wanted.y[m]
                first_pinned = vt.table.first_pinned_level
                own = lv < first_pinned
                up = lv + 1 < first_pinned
                keys.append(tile_keys(vt.id, lv[own], x[own], y[own]))
                keys.append(tile_keys(vt.id, lv[up] + 1, x[up] >> 1, y[up] >> 1))
            n = int(np.unique(np.concatenate(keys)).size) if keys else 0
            # Slots pinned by make_all_resident hold streamable levels: they count as capacity.
            cap = max(1, pool.slots.capacity - pool.slots.pinned_count + pool.reference_pins)
            if n * worst[1] > worst[0] * cap:
                worst = (n, cap)
        return worst

    def _step_bias(self, data: np.ndarray, wanted: WantedPages) -> None:
        """One step of the budget's mip-bias controller.

        The pressure is measured on what the current bias makes the screen sample. Only when the
        next step down would cross to a finer level is the finer working set measured instead, so
        the bias falls only when that finer set fits (else the effective level would flip between
        two levels every few frames: one that does not fit and one that fits easily).
        """
        bm, step = self.budget, self.config.budget.bias_step
        need, cap = self._pressure(wanted)
        b = bm.bias_levels
        if b > 0 and need <= self.config.budget.high_water * cap and bm.bias - step < b:
            need, cap = self._pressure(self._reduce(data, b - 1))
        bm.update_bias(need, cap)

    def _touch(self, wanted: WantedPages, frame: int) -> None:
        if not len(wanted):
            return
        for vt in self.textures:
            m = wanted.tex == vt.id
            if m.any():
                slots = vt.table.used_slots(wanted.level[m], wanted.x[m], wanted.y[m])
                vt.pool.slots.touch(slots[slots >= 0], frame)

    def _resident_mask(self, wanted: WantedPages) -> np.ndarray:
        out = np.zeros(len(wanted), bool)
        for vt in self.textures:
            m = wanted.tex == vt.id
            if m.any():
                out[m] = vt.table.is_resident(wanted.level[m], wanted.x[m], wanted.y[m])
        return out

    def _dispatch(self, batch, frame: int, st: FrameStats) -> int:  # noqa: ANN001 (RequestBatch)
        if not len(batch):
            return 0
        dropped: list[np.ndarray] = []
        issued = 0
        # Cache slots are reserved (evicting resident tiles) only for loads the ring can stage now;
        # the rest go back to the scheduler. The batch is in priority order, parents first.
        room = self.ring.free_count if self.ring is not None else 0
        if room < len(batch):
            dropped.append(batch.keys[room:])
        # Prefetch takes free slots only: evicting for it would trade tiles the screen used a few
        # frames ago for tiles it may never use (under budget pressure: endless re-uploads).
        free_left = {key: pool.slots.free_count for key, pool in self.pools.items()}
        for vt in self.textures:
            m = np.flatnonzero(batch.tex[:room] == vt.id)
            if not m.size:
                continue
            pool = vt.pool
            pre = batch.prefetch[m]
            allowed = max(0, free_left[pool.key] - int(np.count_nonzero(~pre)))
            pre_idx = np.flatnonzero(pre)
            if pre_idx.size > allowed:
                cut = np.zeros(m.size, bool)
                cut[pre_idx[allowed:]] = True
                dropped.append(batch.keys[m[cut]])
                m = m[~cut]
            free_left[pool.key] -= m.size
            slots = pool.slots.allocate_many(frame, batch.tex[m], batch.level[m], batch.x[m], batch.y[m])
            self._on_evicted(pool.slots.take_evicted(), pool)
            for i, slot in zip(m.tolist(), slots.tolist(), strict=True):
                if slot < 0:
                    dropped.append(batch.keys[i : i + 1])
                    continue
                staging = self.ring.acquire(tag=int(batch.keys[i])) if self.ring is not None else None
                if staging is None:
                    pool.slots.free(slot)
                    dropped.append(batch.keys[i : i + 1])
                    continue
                job = IOJob(vt.id, int(batch.level[i]), int(batch.x[i]), int(batch.y[i]), vt.reader, staging,
                            staging.view)  # fmt: skip
                self._jobs[int(batch.keys[i])] = (job, pool, slot, frame)
                self.io.submit(job)
                issued += 1
        if dropped:
            self.scheduler.mark_dropped(np.concatenate(dropped))
        self.totals["requested"] += issued
        return issued

    @staticmethod
    def _job_keys(jobs: list[IOJob]) -> np.ndarray:
        """Tile keys of jobs, in one vectorized call (per-tile tile_keys calls cost ~30 us each)."""
        fields = np.array([(j.tex_id, j.level, j.x, j.y) for j in jobs], np.int64).reshape(-1, 4)
        return tile_keys(fields[:, 0], fields[:, 1], fields[:, 2], fields[:, 3])

    def _collect_io(self, st: FrameStats) -> None:
        jobs = self.io.drain()
        for job, key in zip(jobs, self._job_keys(jobs).tolist(), strict=True):
            entry = self._jobs.get(key)
            if entry is None or entry[0] is not job:  # cancelled by close() or a resize
                self._abandon_staging(job)
                continue
            _, pool, slot, _frame = entry
            if job.state is JobState.DONE:
                self.ring.mark_ready(job.slot, self._textures_by_id[job.tex_id].header.tile_raw_size)
                self._ready.append(entry)
                del self._jobs[key]
                continue
            del self._jobs[key]
            self._abandon_staging(job)
            pool.slots.free(slot)
            if job.state is JobState.FAILED:
                st.failed += 1
                self.totals["failed"] += 1
                self._textures_by_id[job.tex_id].corrupt_tiles += 1
                self.scheduler.mark_failed(np.array([key]), self.frame)
                log.warning("tile load failed: %s", job.error)
            else:
                self.scheduler.mark_dropped(np.array([key]))

    def _abandon_staging(self, job: IOJob) -> None:
        if self.ring is not None and job.slot is not None:
            try:
                self.ring.abandon(job.slot)
            except (ValueError, RuntimeError):
                pass

    def _upload_ready(self, frame: int, st: FrameStats) -> None:
        cfg = self.config
        budget_bytes, budget_tiles = cfg.upload_bytes_per_frame, cfg.upload_tiles_per_frame
        by_pool: dict[PoolKey, list[tuple[IOJob, CachePool, int, int]]] = {}
        nbytes = 0
        waiting: list[tuple[IOJob, CachePool, int, int]] = []  # their slot's old tile may still be sampled
        while self._ready and st.uploads < budget_tiles:
            job, pool, slot, started = entry = self._ready[0]
            size = pool.geometry.slot_bytes
            if st.uploads and nbytes + size > budget_bytes:
                break
            self._ready.popleft()
            if pool.writable_at[slot] > frame:
                waiting.append(entry)
                continue
            by_pool.setdefault(pool.key, []).append(entry)
            nbytes += size
            st.uploads += 1
        self._ready.extendleft(reversed(waiting))
        for entries in by_pool.values():
            pool = entries[0][1]
            self._upload(pool, [(job.slot, slot) for job, _, slot, _ in entries])
            slots = np.array([slot for _, _, slot, _ in entries])
            pool.slots.mark_uploading(slots)
            pool.slots.mark_resident(slots, frame)
            for job, _, slot, started in entries:
                self._textures_by_id[job.tex_id].table.set_resident(job.level, job.x, job.y, slot)
                st.latency_frames.append(frame - started)
            self.scheduler.mark_resident(self._job_keys([e[0] for e in entries]))
        self.latencies.extend(st.latency_frames)
        st.upload_bytes = nbytes
        self.totals["uploads"] += st.uploads
        self.totals["upload_bytes"] += nbytes

    def _upload(self, pool: CachePool, items: list) -> None:  # items: (staging slot, cache slot)
        assert self.ring is not None and pool.texture is not None
        s = pool.geometry.slot_size
        stagings = [staging for staging, _ in items]
        layer, cx, cy = pool.geometry.locate(np.array([slot for _, slot in items]))
        regions = [(int(layer[i]), int(cx[i]) * s, int(cy[i]) * s, st.offset, st.nbytes)
                   for i, st in enumerate(stagings)]  # fmt: skip
        with self.ring.batch(stagings) as pbo:
            self.gl.upload_cells(pool.texture, regions, s, pbo)

    def _on_evicted(self, evicted: TileRecords, pool: CachePool | None = None) -> None:
        if not len(evicted):
            return
        if pool is not None:
            pool.writable_at[evicted.slot] = self.frame + self.config.frames_in_flight
        self._st.evicted += len(evicted)
        self.totals["evicted"] += len(evicted)
        for tex_id, level, x, y in zip(evicted.tex.tolist(), evicted.level.tolist(), evicted.x.tolist(),
                                       evicted.y.tolist(), strict=True):  # fmt: skip
            vt = self._textures_by_id.get(tex_id)
            if vt is not None:
                vt.table.set_absent(level, x, y)

    def _cancel_loads(self, records: TileRecords) -> None:
        keys = records.keys()
        for key in keys.tolist():
            entry = self._jobs.pop(key, None)
            if entry is not None and not self.io.cancel(entry[0]):
                entry[0].state = JobState.CANCELLED
        gone = set(keys.tolist())
        self._drop_ready(lambda job: int(tile_keys(job.tex_id, job.level, job.x, job.y)) in gone)
        self.scheduler.mark_dropped(keys)

    def _drop_ready(self, doomed) -> None:  # noqa: ANN001 (IOJob -> bool)
        """Forget finished reads waiting for upload; their staging slots go back to the ring."""
        keep: deque[tuple[IOJob, CachePool, int, int]] = deque()
        for entry in self._ready:
            if doomed(entry[0]):
                self._abandon_staging(entry[0])
            else:
                keep.append(entry)
        self._ready = keep

    # ---- convenience --------------------------------------------------------------------------
    def make_all_resident(self, vt: VirtualTexture) -> None:
        """Load every tile of `vt` now (blocking): the all-resident reference. BudgetError if it cannot fit."""
        h = vt.header
        need = h.tile_count
        if need > vt.pool.slots.capacity - (vt.pool.slots.used_count - vt.table.resident_count):
            raise BudgetError(
                f"{vt.path}: all {need} tiles need {need * h.tile_raw_size / 2**20:.1f} MiB of cache; the "
                f"{vt.pool.name} pool holds {vt.pool.slots.capacity} slots (raise --budget-mb)"
            )
        missing = [(lv, x, y) for lv in range(h.level_count - 1, -1, -1)  # coarse to fine
                   for y in range(h.tiles_in_level(lv)[1]) for x in range(h.tiles_in_level(lv)[0])]  # fmt: skip
        arr = np.array(missing, np.int64).reshape(-1, 3)
        missing = [t for t, r in zip(missing, vt.table.is_resident(arr[:, 0], arr[:, 1], arr[:, 2]), strict=True)
                   if not r]  # fmt: skip
        assert self.ring is not None
        batch_size = max(1, min(256, len(self.ring.slots)))
        for i in range(0, len(missing), batch_size):  # one upload batch (one fence) per chunk
            items = []
            for lv, x, y in missing[i : i + batch_size]:
                slot = vt.pool.slots.allocate(self.frame, vt.id, lv, x, y)
                if slot is None:
                    raise BudgetError(f"{vt.path}: cache full while loading every tile")
                vt.pool.slots.pin(slot)
                vt.pool.reference_pins += 1
                staging = self._acquire_blocking()
                try:
                    vt.reader.read_tile_into(lv, x, y, staging.view)
                except BaseException:
                    self.ring.abandon(staging)
                    raise
                self.ring.mark_ready(staging, h.tile_raw_size)
                items.append((staging, slot, lv, x, y))
            self._upload(vt.pool, [(st, slot) for st, slot, *_ in items])
            for _st, slot, lv, x, y in items:
                vt.pool.slots.mark_uploading(slot)
                vt.pool.slots.mark_resident(slot, self.frame)
                vt.table.set_resident(lv, x, y, slot)
        vt._upload_page_table()

    @property
    def busy(self) -> bool:
        """True while loads are queued, in flight or waiting to upload."""
        return bool(self._jobs or self._ready or self.scheduler.queued_count)

    def memory_summary(self) -> str:
        """A readable table of what the engine holds on the GPU, per pool and per texture."""
        from ..telemetry.memory import memory_summary

        return memory_summary(self)

    def stats(self) -> dict:
        """Telemetry of the latest update() plus running totals (plain dict, stable keys)."""
        st = self.last
        lat = np.array(self.latencies) if self.latencies else np.zeros(1)
        p50, p95, p99 = (float(v) for v in np.percentile(lat, [50, 95, 99]))
        ring = self.ring
        occupancy = 1.0 - ring.free_count / len(ring.slots) if ring is not None and ring.slots else 0.0
        return {
            "frame": st.frame,
            "update_ms": st.update_ms,
            "upload_ms": st.upload_ms,
            "uploads": st.uploads,
            "upload_bytes": st.upload_bytes,
            "requested": st.requested,
            "wanted_pages": st.wanted_pages,
            "missing_pages": st.missing_pages,
            "in_flight": st.in_flight,
            "queued": st.queued,
            "failed": st.failed,
            "feedback_age": st.feedback_age,
            "vram_bytes": self.budget.usage,
            "vram_peak_bytes": self.budget.peak,
            "budget_bytes": self.budget.budget,
            "budget_source": self.budget.source,
            "vram_breakdown": self.budget.breakdown(),
            "mip_bias": self.budget.bias,
            "resident_tiles": sum(vt.table.resident_count for vt in self.textures),
            "corrupt_tiles": sum(vt.corrupt_tiles for vt in self.textures),
            "latency_p50_frames": p50,
            "latency_p95_frames": p95,
            "latency_p99_frames": p99,
            "ring_occupancy": occupancy,
            "ring_stalls": ring.stall_count if ring is not None else 0,
            "feedback_frozen": self.freeze_feedback,
            "feedback_dropped": self.feedback.dropped,
            "totals": dict(self.totals),
        }

    # ---- lifetime -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("streamer is released")

    def release(self) -> None:
        """Stop the I/O threads and free every GL object the engine made (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.io.shutdown(wait=True, on_job=self._abandon_staging)
        except Exception:  # a worker's unexpected error, not yet seen by update(): still free the GPU
            log.exception("an I/O worker failed")
        for job, *_rest in list(self._jobs.values()) + list(self._ready):
            self._abandon_staging(job)  # cancelled before they ran, or read and never uploaded
        self._jobs.clear()
        self._ready.clear()
        for vt in list(self.textures):
            vt.release()
        for pool in self.pools.values():
            pool.release()
        self.textures.clear()
        self.pools.clear()
        self.feedback.release()
        self.budget.release("feedback")
        if self.ring is not None:
            self.ring.release()
            self.budget.release("staging-ring")
            self.ring = None

    def __enter__(self) -> Streamer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def max_anisotropy(border: int) -> int:
    """Anisotropic taps the border allows: at the finer trilinear level the minor axis spans up to 2
    texels, so N taps reach N texels either side; N = B keeps them inside the border."""
    return max(1, min(16, border))


def _pinned_tile_count(h: PackHeader, pinned_levels: int) -> int:
    first = max(0, h.level_count - pinned_levels)
    return int(h.level_first[-1] - h.level_first[first])


__all__ = ["CachePool", "FrameStats", "Streamer", "VirtualTexture"]
