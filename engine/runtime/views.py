"""The streamer's read-only views and its documented hooks, as a mixin of `Streamer`.

Each view is built from the part that owns the figures: the residency core (`residency.Residency`),
the budget, the uploader's and the feedback ring's own status records. None of them changes state
except the hooks named as such (`inject_feedback`, `make_all_resident`: the all-resident reference,
and `validate`'s GPU readback).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import EngineError
from ..remote import NetworkSummary, summarize
from .feedback_reduce import Wanted
from .frame_stats import FeedbackInfo, IOStatus, StreamerStats, streamer_stats
from .residency import Completeness
from .uploader import LoadState

if TYPE_CHECKING:  # typing only: the attributes the mixin reads are the streamer's own
    from collections.abc import Callable

    from ..config import StreamerConfig
    from .budget import BudgetManager
    from .feedback import FeedbackRing
    from .page_buffer import PageTableBuffer
    from .pool_set import PoolSet
    from .pools import CachePool, PoolKey
    from .residency import Residency
    from .sharing import OpenPacks
    from .staging import StagingRing
    from .texture import VirtualTexture
    from .uploader import Uploader

__all__ = ["StreamerViews"]


class StreamerViews:
    """Read-only views of a `Streamer` (typed records, never string keys) and its test hooks."""

    config: StreamerConfig
    budget: BudgetManager
    freeze_feedback: bool
    _core: Residency
    _uploader: Uploader | None
    _feedback: FeedbackRing
    _pages: PageTableBuffer
    _check_open: Callable[[], None]
    _load_now: Callable[..., None]

    _packs: OpenPacks[VirtualTexture]
    _pool_set: PoolSet

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

    def stats(self) -> StreamerStats:
        """The latest `update()` and the streamer as a whole (`StreamerStats`; `.as_dict()` for export)."""
        up = self._uploader
        return streamer_stats(
            self.last,  # type: ignore[attr-defined]
            self._core,
            self.budget,
            up.ring.stats() if up is not None else None,
            self.network(),
            self.feedback_info(),
            sum(vt.corrupt_tiles for vt in self.textures),
            up.upload_path.value if up is not None else "",
        )

    def completeness(self) -> Completeness:
        """How much of what the newest feedback wants is resident at the level it wants: overall and
        per texture id (`Completeness`). Hold a fade-in or a loading screen until ``.complete``."""
        return self._core.completeness()

    def pressure(self, wanted: Wanted | None = None) -> dict[str, tuple[int, int]]:
        """Per pool name: (working set, slots) of `wanted` (default this frame's): the wanted tiles plus
        their parents (trilinear samples both), pinned levels excluded, against the unpinned slots."""
        names = {p.index: p.name for p in self.pools.values()}
        return {names[i]: v for i, v in self._core.pressure(wanted).items()}

    def io_status(self) -> IOStatus:
        """The I/O threads and the staging ring now."""
        up = self._uploader
        if up is None:
            return IOStatus(self.config.io_threads, 0, 0, self.config.native, None)
        device = up.device.stats() if up.device is not None else None
        textures = up.textures.stats() if up.textures is not None else None
        io = up.io
        return IOStatus(
            io.thread_count,
            io.stuck_count,
            io.pending,
            up.native is not None,
            up.ring.stats(),
            up.upload_path,
            device,
            textures,
        )

    def feedback_info(self) -> FeedbackInfo:
        """The feedback buffers now (`FeedbackInfo`)."""
        fb = self._feedback
        return FeedbackInfo(
            fb.depth, fb.nbytes_each, fb.stride, fb.capacity, fb.dropped, self.freeze_feedback, fb.compacting
        )

    def network(self) -> NetworkSummary:
        """Requests, bytes, latency and cache figures of the textures read by URL (zeros without any)."""
        remote = self._uploader.remote_stats() if self._uploader is not None else []
        return summarize(remote, self._closed_network)  # type: ignore[attr-defined]

    @property
    def busy(self) -> bool:
        """True while loads are queued, being read or waiting to upload."""
        return bool(self._core.scheduler.queued_count or (self._uploader is not None and self._uploader.busy))

    def memory_summary(self) -> str:
        """What the engine holds on the GPU, per pool and per texture, as a readable table.

        Returns
        -------
        str
            Several lines, with totals against the budget.
        """
        self._check_open()
        from ..telemetry.memory import memory_summary  # telemetry builds on the runtime, not back

        return memory_summary(self)  # type: ignore[arg-type]

    def load_states(self, vt: VirtualTexture | None = None) -> dict[LoadState, int]:
        """Loads per `LoadState` now (of one texture, or of all): what is being read, read and waiting
        for its upload, uploading."""
        up = self._uploader
        if up is None:
            return dict.fromkeys(LoadState, 0)
        return up.states(vt.id if vt is not None else None)

    # ---- hooks for tools, benchmarks and tests ----------------------------------------------------
    @property
    def staging_ring(self) -> StagingRing | None:
        """Test hook: the staging ring (its ``fence_factory`` and ``acquire`` may be wrapped for fault
        injection); None before the first texture opens. Programs read `io_status()` instead."""
        return self._uploader.ring if self._uploader is not None else None

    def current_feedback(self) -> np.ndarray:
        """Test hook: the page ids this frame's draws have written so far (a GPU readback)."""
        self._check_open()
        return self._feedback.read_current()

    def sample_slots(self, page_ids: np.ndarray, *, with_parents: bool = False) -> np.ndarray:
        """The cache slot each page samples now (its own tile's or its nearest resident ancestor's);
        `with_parents` appends the slots of the pages' parents (trilinear filtering samples both)."""
        core = self._core
        ids = np.asarray(page_ids, np.int64).ravel()
        if with_parents:
            parents = core.space.parent[ids].astype(np.int64)
            ids = np.concatenate([ids, parents[parents >= 0]])
        return core.tables.sample_slot(ids)

    @property
    def tile_capacity(self) -> int:
        """Size of the tile-id space (ids of every open texture are below it; it grows on `open`)."""
        return self._core.space.capacity

    @property
    def sampled_pages(self) -> Wanted:
        """The newest feedback's pages before the mip bias (what the draws sample); a new object each
        time new feedback arrives."""
        return self._core.sampled

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
        core.check_room(vt.id, ids, str(vt.path))
        ledger = vt.pool.ledger
        ledger.pin(newly)  # so that making room evicts none of this texture's tiles
        try:
            self._load_now(vt, ids, what="all-resident")
        except BaseException:
            ledger.unpin(newly)
            raise

    def inject_feedback(self, tile_ids: np.ndarray) -> bool:
        """Add page ids to this frame's feedback as if the coming draw had written them (drive the
        streamer without drawing). False when this frame records no feedback."""
        self._check_open()
        return self._feedback.inject(tile_ids)

    def validate(self) -> None:
        """Check the streamer's invariants (tools and tests; costs a GPU readback): the page tables on
        the GPU equal the CPU's, the residency core is consistent (every ledger, every table, tables
        pointing only at their own tiles' slots), and the engine's memory is within the budget.
        Raises EngineError naming the first broken one."""
        self._check_open()
        core = self._core
        used = core.space.used
        if used and self._pages.buffer is not None:
            gpu = np.frombuffer(self._pages.buffer.read(size=used * 4), np.uint32)
            bad = np.flatnonzero(gpu != core.tables.entry[:used])
            if bad.size:
                raise EngineError(
                    f"page table on the GPU differs from the CPU's at {bad.size} entries, first id {bad[0]}"
                )
        try:
            core.check()
        except AssertionError as exc:
            raise EngineError(f"streamer state is inconsistent: {exc}") from None
        if self.budget.usage > self.budget.budget:
            raise EngineError(f"engine memory {self.budget.usage} exceeds the budget {self.budget.budget}")
