"""Request scheduling: which tiles to start loading this frame, in what order.

Input each frame: the unique wanted pages with their coverage (`Wanted`, from the feedback reducer),
the page tables (what is resident) and the uploader's loads (what is in flight). Output: `Requests`,
the tiles to load now, best first. State is one dense array per field over the tile id space
(`RequestState` per tile), so every step is fancy indexing over all textures at once.

Policy:

- Dedup: a page already resident or with a load in flight is not requested; a FAILED tile is not
  requested again before its back-off ends (``retry_frames``, doubling per failure).
- Missing chains: a wanted page whose nearest resident ancestor is ``d`` levels up asks for the
  ``d`` tiles between them. Each tile of a chain weighs the sum, over the wanted pages under it, of
  ``coverage * (resident level - wanted level) * priority`` (the texture's, `texture_sets`), so a
  parent always weighs at least as much as its children.
- Order: this frame's demand, then this frame's prefetch, each by weight descending, coarser level
  first; then tiles queued in earlier frames and not wanted in this one, coarser level first (their
  weights are stale); ties by id. A parent ranks ahead of its children, so a frame's cut (a prefix
  of the order) never takes a child without its missing parent, yet a whole chain can be issued in
  one frame (a camera cut converges in as many frames as the caps need, not one level per frame).
  The top of the order is found with ``argpartition``; only those are sorted.
- Queue: tiles beyond this frame's caps stay QUEUED; a queued tile not wanted again for
  ``cancel_after_frames`` frames is dropped. ``last_wanted`` also follows tiles whose load is in
  flight, so the uploader cancels reads nobody wants any more by the same rule.
- Prefetch (``config.prefetch``, below any demand, only when this frame's queued demand leaves room
  under the caps; recomputed every other frame, as the candidates move slowly with the view):
  the 4 neighbours of every wanted page and the 4 children of every resident wanted page, when
  their parent is resident.
- Caps: at most ``max_tiles`` tiles, the free staging-ring slots, and ``max_bytes`` bytes per frame.

The demand, the prefetch candidates, the queueing and the queue's cleaning and keys each run as one
compiled pass when the helper is built (`SchedulerLoops`, handed in: this module loads no compiled
code); the numpy code here is their twin and gives the same requests.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..config import StreamerConfig
from .feedback_reduce import Wanted, unique_sums
from .int_sets import sorted_unique
from .page_table import PageTables
from .tiles import MAX_LEVELS, MAX_TEXTURES, TileSpace

__all__ = ["SCORE_LIMIT", "RequestScheduler", "RequestState", "Requests", "SchedulerLoops", "SchedulerStats"]

log = logging.getLogger(__name__)

DEMAND, PREFETCH = 0, 1
NEVER = -(1 << 40)  # last_wanted of a tile never wanted
MAX_BACKOFF_DOUBLINGS = 10
SCORE_LIMIT = (1 << 27) - 1  # weights saturate here (27 bits of the ordering key)


class RequestState(enum.IntEnum):
    """A tile's request state (uint8 per tile id). Loads in flight are the uploader's, not here."""

    NONE = 0  # not asked for (or issued: its load is the uploader's now)
    QUEUED = 1  # wanted and missing; waiting for room under the caps
    FAILED = 2  # its load failed; not asked for again before its back-off ends


# plain ints of the states for per-frame array code (enum attribute lookups are slow)
_NONE = int(RequestState.NONE)
_QUEUED = int(RequestState.QUEUED)
_FAILED = int(RequestState.FAILED)


@dataclass(frozen=True, kw_only=True)
class SchedulerLoops:
    """The scheduler's compiled passes (`compiled_loops.decider_loops` builds them from the helper;
    numpy's twins give the same answers). Each returns a count, or -1 for arguments it refused."""

    # (ids, counts, parent, own, level, tex, level_count, priority, scratch, bits, gap, resident,
    # out_ids, out_weights) -> tiles: ``ts_missing_chains``, `_demand`'s walk
    missing_chains: Callable[..., int]
    # (ids, counts, resident, tex, level, parent, own, level_first, tiles_x, tiles_y, priority, scratch,
    # bits, out_ids, out_weights) -> candidates: ``ts_prefetch_pages``, `_prefetch`
    prefetch_pages: Callable[..., int]
    # (ids, weights, loading, frame, tier, state, retry_at, last_wanted, score, tiers, out_fresh, counts)
    # -> fresh tiles: ``ts_merge_requests``, `_merge`
    merge_requests: Callable[..., int]
    # (q, loading, state, level, own, last_wanted, score, tiers, frame, cancel_after, flags, out_q,
    # out_keys, counts) -> entries kept: ``ts_queue_keys``, `_live_queue`
    queue_keys: Callable[..., int]
    # (ids, counts, tex, level, (level_first, tiles_x, tiles_y), scratch, bits, out_ids, out_counts) -> pages,
    # or -1 (ids it refuses: numpy widens those): ``ts_widen_pages``, `widened` (None: an older helper)
    widen_pages: Callable[..., int] | None = None


@dataclass(frozen=True)
class Requests:
    """Tiles to start loading this frame, best first (parallel arrays)."""

    ids: np.ndarray
    prefetch: np.ndarray  # bool: asked for by prefetch rather than demand
    cancelled: int  # queued tiles dropped this frame (not wanted for cancel_after_frames)
    capped: int  # queued tiles left for later frames by the caps

    def __len__(self) -> int:
        return int(self.ids.size)


@dataclass
class SchedulerStats:
    """Running totals (telemetry)."""

    frames: int = 0
    issued: int = 0
    issued_prefetch: int = 0
    cancelled: int = 0
    failed: int = 0
    retried: int = 0


class RequestScheduler:
    """Turns wanted pages into an ordered, capped list of tile loads. Render thread only.

    Parameters
    ----------
    config
        Streaming configuration (caps, cancel delay, prefetch, retry back-off).
    space
        The tile id space.
    tables
        The page tables (residency).
    loading
        Mask of the given tile ids that have a load in flight (the uploader's answer).
    priority
        Priority per texture id (read, never written: `texture_sets.Priorities` owns it); default 1.
    loops
        The compiled passes (`SchedulerLoops`), or None: numpy, the same requests.
    """

    def __init__(
        self,
        config: StreamerConfig,
        space: TileSpace,
        tables: PageTables,
        loading: Callable[[np.ndarray], np.ndarray],
        priority: np.ndarray | None = None,
        *,
        loops: SchedulerLoops | None = None,
    ) -> None:
        self.config, self.space, self.tables, self.loading = config, space, tables, loading
        self.priority = np.ones(MAX_TEXTURES) if priority is None else priority
        self._loops = loops
        # the compiled walk's buffers, kept between frames (its scratch and marks are zero between calls)
        self._scratch, self._bits = np.zeros(0, np.int64), np.zeros(0, np.uint64)
        self._gap, self._resident = np.zeros(0, np.int64), np.zeros(0, np.uint8)
        self._out_ids, self._out_weights = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self._fresh, self._merged = np.zeros(0, np.int64), np.zeros(2, np.int64)  # the merge's outputs
        self._flags, self._keys, self._kept = np.zeros(0, np.uint8), np.zeros(0, np.uint64), np.zeros(0, np.int64)
        self.max_tiles = config.request_tiles_per_frame or config.upload_tiles_per_frame
        self.max_bytes = config.upload_bytes_per_frame
        self.stats = SchedulerStats()
        n = space.capacity
        self.state = np.zeros(n, np.uint8)
        self.last_wanted = np.full(n, NEVER, np.int64)
        self.score = np.zeros(n, np.int64)
        self.tier = np.zeros(n, np.uint8)
        self.fails = np.zeros(n, np.int64)
        self.retry_at = np.zeros(n, np.int64)
        # ids in state QUEUED, in the order they were queued: the selection orders them by key (ids
        # are unique), so the queue needs no sort; a sorted insert cost 10-60 µs a merge
        self.queue = np.zeros(0, np.int64)
        self._frame = -(1 << 62)
        # (wanted ids, tables version, id-space generation) of the latest step that found no tile
        # to ask for, demand and prefetch both looked at: the same again finds nothing again
        self._quiet: tuple[np.ndarray, int, int] | None = None
        space.add_listener(self._grow)

    _ARRAYS = ("state", "last_wanted", "score", "tier", "fails", "retry_at")

    def _grow(self, capacity: int) -> None:
        for name in self._ARRAYS:
            a = getattr(self, name)
            fill = NEVER if name == "last_wanted" else 0
            setattr(self, name, np.concatenate([a, np.full(capacity - a.size, fill, a.dtype)]))

    # ---- queries -------------------------------------------------------------------------------
    @property
    def queued_count(self) -> int:
        return int(self.queue.size)

    @property
    def failed_count(self) -> int:
        return int(np.count_nonzero(self.state == _FAILED))

    # ---- outcomes ------------------------------------------------------------------------------
    def mark_failed(self, ids: np.ndarray, frame: int) -> None:
        """Loads that failed (corrupt, truncated, unreadable): retry after retry_frames * 2^(n-1)."""
        i = np.unique(np.asarray(ids, np.int64))
        if i.size == 0:
            return
        self.fails[i] += 1
        doublings = np.minimum(self.fails[i] - 1, MAX_BACKOFF_DOUBLINGS)
        self.retry_at[i] = frame + self.config.retry_frames * (1 << doublings)
        self.state[i] = _FAILED
        self.stats.failed += int(i.size)
        self._quiet = None

    def mark_resident(self, ids: np.ndarray) -> None:
        """Uploaded tiles: their failure history is forgotten."""
        i = np.asarray(ids, np.int64)
        self.fails[i] = 0
        self.state[i] = _NONE
        self._quiet = None

    def forget(self, start: int, stop: int) -> None:
        """Drop everything known about the tile ids of a closed texture."""
        for name in self._ARRAYS:
            getattr(self, name)[start:stop] = NEVER if name == "last_wanted" else 0
        self.queue = self.queue[(self.queue < start) | (self.queue >= stop)]
        self._quiet = None

    # ---- the per-frame step --------------------------------------------------------------------
    def _demand(self, wanted: Wanted) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ids and weights of the missing chains of the wanted pages, and a mask of the wanted pages
        that are resident. A missing page's chain is itself and its ancestors below the nearest
        resident one; each weighs coverage x gap, summed over the pages under it."""
        if self._loops is not None and len(wanted):
            return self._demand_compiled(wanted)
        sp, tables = self.space, self.tables
        ids = wanted.ids
        miss = ~tables.is_resident(ids)
        if not miss.any():
            z = np.zeros(0, np.int64)
            return z, z, ~miss
        m_ids = ids[miss]
        anc = tables.nearest_resident(m_ids)
        level = sp.level[m_ids].astype(np.int64)
        top = sp.level_count[sp.tex[m_ids].astype(np.int64)]
        ceiling = np.where(anc >= 0, sp.level[np.maximum(anc, 0)], top)
        weight = self._weigh(np.maximum(wanted.counts[miss], 1) * (ceiling - level), m_ids)
        keys, weights = [m_ids], [weight]
        cur, w, stop = m_ids, weight, ceiling - level - 1  # ancestors still to add per chain
        while cur.size:
            go = stop > 0
            cur, w, stop = sp.parent[cur[go]].astype(np.int64), w[go], stop[go] - 1
            keys.append(cur)
            weights.append(w)
        dk, dw = unique_sums(np.concatenate(keys), np.concatenate(weights))
        return dk, dw, ~miss

    def _demand_compiled(self, wanted: Wanted) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`_demand` in one compiled pass over the pages (``ts_missing_chains``): the same tiles,
        weights and mask, without a numpy call per level walked."""
        sp = self.space
        ids = np.ascontiguousarray(wanted.ids, np.int64)
        counts = np.ascontiguousarray(wanted.counts, np.int64)
        n = ids.size
        self._buffers(n, MAX_LEVELS)
        got = self._loops.missing_chains(  # type: ignore[union-attr]
            ids, counts, sp.parent, self.tables.own, sp.level, sp.tex, sp.level_count, self.priority,
            self._scratch, self._bits, self._gap, self._resident, self._out_ids, self._out_weights,
        )  # fmt: skip
        if got < 0:
            raise ValueError("requests: a wanted page, its texture or a parent is outside the tables")
        resident = self._resident[:n].view(bool).copy()
        return self._out_ids[:got].copy(), self._out_weights[:got].copy(), resident

    def _prefetch(self, wanted: Wanted, resident: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Neighbours of the wanted pages and children of the resident ones, under a resident parent."""
        if self._loops is not None and len(wanted):
            return self._prefetch_compiled(wanted, resident)
        sp = self.space
        ids, counts = wanted.ids, wanted.counts
        tex = sp.tex[ids].astype(np.int64)
        level = sp.level[ids].astype(np.int64)
        first = sp.level_first[tex, level]
        tx, ty = sp.tiles_x[tex, level], sp.tiles_y[tex, level]
        off = ids - first
        x, y = off % tx, off // tx
        parts = [ids[x > 0] - 1, ids[x < tx - 1] + 1, ids[y > 0] - tx[y > 0], ids[y < ty - 1] + tx[y < ty - 1]]
        wparts = [counts[x > 0], counts[x < tx - 1], counts[y > 0], counts[y < ty - 1]]
        fine = ((level > 0) & resident).nonzero()[0]
        if fine.size:
            t, lv = tex[fine], level[fine] - 1
            ctx, cty = sp.tiles_x[t, lv], sp.tiles_y[t, lv]
            base = sp.level_first[t, lv] + 2 * y[fine] * ctx + 2 * x[fine]
            right, down = 2 * x[fine] + 1 < ctx, 2 * y[fine] + 1 < cty
            parts += [base, base[right] + 1, base[down] + ctx[down], base[right & down] + ctx[right & down] + 1]
            c = counts[fine]
            wparts += [c, c[right], c[down], c[right & down]]
        pk, pw = unique_sums(np.concatenate(parts), np.maximum(np.concatenate(wparts), 1))
        pw = self._weigh(pw, pk)
        keep = ~self.tables.is_resident(pk)
        pk, pw = pk[keep], pw[keep]
        keep = self.tables.is_resident(np.maximum(sp.parent[pk].astype(np.int64), 0)) & (sp.parent[pk] >= 0)
        return pk[keep], pw[keep]

    def _prefetch_compiled(self, wanted: Wanted, resident: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`_prefetch` in one compiled pass (``ts_prefetch_pages``): the same candidates and weights."""
        sp = self.space
        ids = np.ascontiguousarray(wanted.ids, np.int64)
        self._buffers(ids.size, 8)
        got = self._loops.prefetch_pages(  # type: ignore[union-attr]
            ids, np.ascontiguousarray(wanted.counts, np.int64), np.ascontiguousarray(resident).view(np.uint8),
            sp.tex, sp.level, sp.parent, self.tables.own, sp.level_first, sp.tiles_x, sp.tiles_y, self.priority,
            self._scratch, self._bits, self._out_ids, self._out_weights,
        )  # fmt: skip
        if got < 0:
            raise ValueError("requests: a wanted page or a prefetch candidate is outside the tables")
        return self._out_ids[:got].copy(), self._out_weights[:got].copy()

    def widened(self, wanted: Wanted) -> Wanted:
        """`wanted` with the eight same-level neighbours of every page (coverage 1 where new). The
        first feedback of a new view is sparse: the pages it misses cover few pixels, at the view's
        edges and where its level changes, next to pages it found; wanting them at once saves the
        round trip (feedback, read, upload) that finding them later costs."""
        sp, ids = self.space, wanted.ids
        widen = self._loops.widen_pages if self._loops is not None else None
        if widen is not None and ids.size:
            self._buffers(ids.size, 9)
            counts = np.ascontiguousarray(wanted.counts, np.int64)
            grids = (sp.level_first, sp.tiles_x, sp.tiles_y)
            got = widen(
                ids, counts, sp.tex, sp.level, grids, self._scratch, self._bits, self._out_ids, self._out_weights
            )
            if got >= 0:
                return Wanted(self._out_ids[:got].copy(), self._out_weights[:got].copy())
        pages = ids[sp.is_tile(ids)]  # (a page of no tile has no grid)
        tex, level = sp.tex[pages].astype(np.int64), sp.level[pages].astype(np.int64)
        tx, ty = sp.tiles_x[tex, level], sp.tiles_y[tex, level]
        off = pages - sp.level_first[tex, level]
        x, y = off % tx, off // tx
        parts = [ids]
        for dx, dy in ((-1, -1), (0, -1), (1, -1), (-1, 0), (1, 0), (-1, 1), (0, 1), (1, 1)):
            inside = (x + dx >= 0) & (x + dx < tx) & (y + dy >= 0) & (y + dy < ty)
            parts.append((pages + dx + dy * tx)[inside])
        out = sorted_unique(np.concatenate(parts))
        at = np.minimum(np.searchsorted(ids, out), ids.size - 1)
        return Wanted(out, np.where(ids[at] == out, wanted.counts[at], 1).astype(np.int64))

    def _buffers(self, n: int, per_page: int) -> None:
        """The compiled passes' buffers, large enough for `n` pages of `per_page` outputs each."""
        if self._scratch.size < self.space.capacity:
            capacity = self.space.capacity
            self._scratch, self._bits = np.zeros(capacity, np.int64), np.zeros(-(-capacity // 64), np.uint64)
        if self._resident.size < n or self._out_ids.size < n * per_page:
            room = max(n, 1024)
            self._gap, self._resident = np.empty(2 * room, np.int64), np.empty(room, np.uint8)
            out = room * max(MAX_LEVELS, 8)
            self._out_ids, self._out_weights = np.empty(out, np.int64), np.empty(out, np.int64)

    def _weigh(self, weights: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """`weights` of tiles `ids` times their texture's priority (rounded up; unchanged at 1)."""
        p = self.priority[self.space.tex[ids].astype(np.int64)]
        if ids.size == 0 or (p == 1.0).all():
            return weights
        return np.minimum(np.ceil(weights * p), SCORE_LIMIT).astype(np.int64)

    def _merge(self, frame: int, ids: np.ndarray, weights: np.ndarray, tier: int) -> int:
        """Queue `ids` (unique) with this frame's weights; returns how many were queued."""
        if ids.size == 0:
            return 0
        if self._loops is not None:
            return self._merge_compiled(frame, ids, weights, tier)
        st = self.state[ids]
        retry = (st == _FAILED) & (self.retry_at[ids] <= frame)
        loading = self.loading(ids)
        self.last_wanted[ids[loading]] = frame  # still wanted: its read is not cancelled as stale
        take = ((st != _FAILED) | retry) & ~loading
        self.stats.retried += int(np.count_nonzero(retry & take))
        n = ids[take]
        fresh = self.state[n] != _QUEUED
        self.state[n] = _QUEUED
        self.score[n] = np.minimum(weights[take], SCORE_LIMIT)
        self.tier[n] = tier
        self.last_wanted[n] = frame
        if fresh.any():
            self.queue = np.concatenate([self.queue, n[fresh]])
        return int(n.size)

    def _merge_compiled(self, frame: int, ids: np.ndarray, weights: np.ndarray, tier: int) -> int:
        """`_merge` in one compiled pass (``ts_merge_requests``); the fresh tiles join the queue in the
        order numpy's twin appends them."""
        ids = np.ascontiguousarray(ids, np.int64)
        loading = np.ascontiguousarray(self.loading(ids), bool).view(np.uint8)
        if self._fresh.size < ids.size:
            self._fresh = np.empty(max(ids.size, 1024), np.int64)
        fresh = self._loops.merge_requests(  # type: ignore[union-attr]
            ids, np.ascontiguousarray(weights, np.int64), loading, frame, tier, self.state, self.retry_at,
            self.last_wanted, self.score, self.tier, self._fresh, self._merged,
        )  # fmt: skip
        if fresh < 0:
            raise ValueError("requests: a tile to queue is outside the tables")
        self.stats.retried += int(self._merged[1])
        if fresh:
            self.queue = np.concatenate([self.queue, self._fresh[:fresh]])
        return int(self._merged[0])

    def _live_queue(self, frame: int, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """The queue without what was issued, failed, became resident or loading, was closed, or went
        stale (those still QUEUED become NONE), each entry's ordering key, and how many went stale.

        Order (one uint64 key): this frame's demand, then this frame's prefetch, both by weight desc,
        coarser first; then tiles queued earlier and not wanted this frame (their weights are old, so
        they go coarser first: a parent before its child). Ties by id."""
        live = (self.state[q] == _QUEUED) & self.space.is_tile(q)
        live[live] = ~self.tables.is_resident(q[live]) & ~self.loading(q[live])
        stale = live & (frame - self.last_wanted[q] >= self.config.cancel_after_frames)
        gone = q[~live | stale]
        self.state[gone[self.state[gone] == _QUEUED]] = _NONE
        q = q[live & ~stale]
        level = (MAX_LEVELS - 1 - self.space.level[q]).astype(np.uint64)
        fresh = self.last_wanted[q] == frame
        klass = np.where(fresh, self.tier[q], 2).astype(np.uint64)
        score = np.where(fresh, SCORE_LIMIT - np.minimum(self.score[q], SCORE_LIMIT), 0).astype(np.uint64)
        key = (klass << np.uint64(62)) | (score << np.uint64(35)) | (level << np.uint64(31)) | q.astype(np.uint64)
        return q, key, int(np.count_nonzero(stale))

    def _live_queue_compiled(self, frame: int, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """`_live_queue` in one compiled pass (``ts_queue_keys``)."""
        n = q.size
        if self._flags.size < n:
            room = max(n, 1024)
            self._flags, self._keys = np.empty(room, np.uint8), np.empty(room, np.uint64)
            self._kept = np.empty(room, np.int64)
        loading = np.ascontiguousarray(self.loading(q), bool).view(np.uint8)
        kept = self._loops.queue_keys(  # type: ignore[union-attr]
            np.ascontiguousarray(q, np.int64), loading, self.state, self.space.level, self.tables.own, self.last_wanted,
            self.score, self.tier, frame, self.config.cancel_after_frames, self._flags, self._kept, self._keys,
            self._merged,
        )  # fmt: skip
        if kept < 0:
            raise ValueError("requests: a queued tile is outside the tables")
        return self._kept[:kept].copy(), self._keys[:kept].copy(), int(self._merged[0])

    def _still_quiet(self, wanted: Wanted) -> bool:
        """Whether the latest quiet step (nothing missing, nothing to prefetch, nothing queued) saw
        the same wanted pages against the same residency: then this one would find nothing either
        (with no candidate, neither coverage counts nor back-offs nor loads in flight matter)."""
        q = self._quiet
        if q is None or q[1] != self.tables.version or q[2] != self.space.generation or self.queue.size:
            return False
        return q[0] is wanted.ids or np.array_equal(q[0], wanted.ids)

    def update(self, frame: int, wanted: Wanted, max_issue: int, *, widen: bool = False) -> Requests:
        """Merge this frame's wanted pages into the queue and return the tiles to load now (at most
        `max_issue`, e.g. the staging ring's free slots, besides the configured caps). `widen`: a new
        view (`feedback_bursts`): its pages' same-level neighbours are wanted too (`widened`), when it
        wants no more pages than a frame may issue."""
        if frame < self._frame:
            raise ValueError(f"frame {frame!r} is before the previous update's frame {self._frame}")
        # a new view's neighbours, unless it wants more pages than a frame loads: its next feedback then
        # comes before they would load (and widening that many pages costs a millisecond or more)
        if widen and 0 < len(wanted) <= self.max_tiles:
            wanted = self.widened(wanted)
        self._frame = frame
        self.stats.frames += 1
        room = min(self.max_tiles, max_issue)
        if len(wanted) and not self._still_quiet(wanted):
            self._quiet = None
            dk, dw, resident = self._demand(wanted)
            queued = self._merge(frame, dk, dw, DEMAND)
            # prefetch candidates follow the view slowly: recomputed every other frame (half the cost)
            looked = not self.config.prefetch
            if self.config.prefetch and queued < room and frame % 2 == 0:
                pk, pw = self._prefetch(wanted, resident)
                self._merge(frame, pk[self.last_wanted[pk] != frame], pw[self.last_wanted[pk] != frame], PREFETCH)
                looked = pk.size == 0
            if looked and dk.size == 0 and self.queue.size == 0:
                self._quiet = (wanted.ids, self.tables.version, self.space.generation)

        # Drop what was issued, failed, became resident or loading, was closed, or went stale.
        q = self.queue
        if q.size == 0:
            return Requests(np.zeros(0, np.int64), np.zeros(0, bool), 0, 0)
        q, key, cancelled = self._live_queue_compiled(frame, q) if self._loops else self._live_queue(frame, q)
        self.queue = q
        self.stats.cancelled += cancelled
        limit = min(room, q.size)
        if limit <= 0:
            return Requests(np.zeros(0, np.int64), np.zeros(0, bool), cancelled, int(q.size))
        part = np.argpartition(key, limit - 1)[:limit] if limit < q.size else np.arange(q.size)
        chosen = part[np.argsort(key[part])]
        ids = q[chosen]
        nbytes = self.space.tile_bytes[self.space.tex[ids].astype(np.int64)]
        fits = (np.cumsum(nbytes) <= self.max_bytes) | (np.arange(ids.size) == 0)
        ids = ids[fits]
        self.state[ids] = _NONE
        keep = np.ones(q.size, bool)
        keep[chosen[fits]] = False
        self.queue = q[keep]
        prefetch = self.tier[ids] == PREFETCH
        self.stats.issued += int(ids.size)
        self.stats.issued_prefetch += int(np.count_nonzero(prefetch))
        return Requests(ids, prefetch, cancelled, int(self.queue.size))
