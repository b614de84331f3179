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
  ``coverage * (resident level - wanted level)``, so a parent always weighs at least as much as its
  children.
- Order: demand before prefetch, weight descending, coarser level first, then id. A parent ranks
  ahead of its children, so a frame's cut (a prefix of the order) never takes a child without its
  missing parent, yet a whole chain can be issued in one frame (a camera cut converges in as many
  frames as the caps need, not one level per frame). The top of the order is found with
  ``argpartition``; only those are sorted.
- Queue: tiles beyond this frame's caps stay QUEUED; a queued tile not wanted again for
  ``cancel_after_frames`` frames is dropped.
- Prefetch (``config.prefetch``, below any demand, only when demand leaves room under the tile cap):
  the 4 neighbours of every wanted page and the 4 children of every resident wanted page, when
  their parent is resident.
- Caps: at most ``max_tiles`` tiles, the free staging-ring slots, and ``max_bytes`` bytes per frame.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..config import StreamerConfig
from .feedback_reduce import Wanted, unique_sums
from .page_table import PageTables
from .tiles import MAX_LEVELS, TileSpace

__all__ = ["RequestScheduler", "RequestState", "Requests", "SchedulerStats"]

log = logging.getLogger(__name__)

DEMAND, PREFETCH = 0, 1
MAX_BACKOFF_DOUBLINGS = 10
_SCORE_LIMIT = (1 << 40) - 1


class RequestState(enum.IntEnum):
    """A tile's request state (uint8 per tile id). Loads in flight are the uploader's, not here."""

    NONE = 0  # not asked for (or issued: its load is the uploader's now)
    QUEUED = 1  # wanted and missing; waiting for room under the caps
    FAILED = 2  # its load failed; not asked for again before its back-off ends


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

    Args:
        config: streaming configuration (caps, cancel delay, prefetch, retry back-off).
        space: the tile id space.
        tables: the page tables (residency).
        loading: mask of the given tile ids that have a load in flight (the uploader's answer).
    """

    def __init__(
        self, config: StreamerConfig, space: TileSpace, tables: PageTables, loading: Callable[[np.ndarray], np.ndarray]
    ) -> None:
        self.config, self.space, self.tables, self.loading = config, space, tables, loading
        self.max_tiles = config.upload_tiles_per_frame
        self.max_bytes = config.upload_bytes_per_frame
        self.stats = SchedulerStats()
        n = space.capacity
        self.state = np.zeros(n, np.uint8)
        self.last_wanted = np.zeros(n, np.int64)
        self.score = np.zeros(n, np.int64)
        self.tier = np.zeros(n, np.uint8)
        self.fails = np.zeros(n, np.int64)
        self.retry_at = np.zeros(n, np.int64)
        self.queue = np.zeros(0, np.int64)  # ids in state QUEUED (sorted)
        self._frame = -(1 << 62)
        space.add_listener(self._grow)

    _ARRAYS = ("state", "last_wanted", "score", "tier", "fails", "retry_at")

    def _grow(self, capacity: int) -> None:
        for name in self._ARRAYS:
            a = getattr(self, name)
            setattr(self, name, np.concatenate([a, np.zeros(capacity - a.size, a.dtype)]))

    # ---- queries -------------------------------------------------------------------------------
    @property
    def queued_count(self) -> int:
        return int(self.queue.size)

    @property
    def failed_count(self) -> int:
        return int(np.count_nonzero(self.state == RequestState.FAILED))

    # ---- outcomes ------------------------------------------------------------------------------
    def mark_failed(self, ids: np.ndarray, frame: int) -> None:
        """Loads that failed (corrupt, truncated, unreadable): retry after retry_frames * 2^(n-1)."""
        i = np.unique(np.asarray(ids, np.int64))
        if i.size == 0:
            return
        self.fails[i] += 1
        doublings = np.minimum(self.fails[i] - 1, MAX_BACKOFF_DOUBLINGS)
        self.retry_at[i] = frame + self.config.retry_frames * (1 << doublings)
        self.state[i] = RequestState.FAILED
        self.stats.failed += int(i.size)

    def mark_resident(self, ids: np.ndarray) -> None:
        """Uploaded tiles: their failure history is forgotten."""
        i = np.asarray(ids, np.int64)
        self.fails[i] = 0
        self.state[i] = RequestState.NONE

    def forget(self, start: int, stop: int) -> None:
        """Drop everything known about the tile ids of a closed texture."""
        for name in self._ARRAYS:
            getattr(self, name)[start:stop] = 0
        self.queue = self.queue[(self.queue < start) | (self.queue >= stop)]

    # ---- the per-frame step --------------------------------------------------------------------
    def _demand(self, wanted: Wanted) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ids and weights of the missing chains of the wanted pages, and each wanted page's gap to
        its resident level (0: resident). Chains are built one level at a time, merging siblings
        before going up, so the work shrinks with each level."""
        sp = self.space
        ids, counts = wanted.ids, wanted.counts
        level = sp.level[ids].astype(np.int64)
        top = sp.level_count[sp.tex[ids].astype(np.int64)]
        res = np.minimum(self.tables.resident_level(ids), top)  # nothing resident: up to the top
        gap = res - level
        miss = gap > 0
        m_ids, m_level, m_ceiling = ids[miss], level[miss], res[miss]
        m_weight = np.maximum(counts[miss], 1) * gap[miss]
        out_k, out_w = [], []
        carry_k = carry_w = carry_c = np.zeros(0, np.int64)
        lo = int(m_level.min()) if m_ids.size else 0
        for lv in range(lo, MAX_LEVELS):
            at = m_level == lv
            k = np.concatenate([m_ids[at], carry_k])
            if k.size == 0:
                if not np.any(m_level > lv):
                    break
                continue
            w = np.concatenate([m_weight[at], carry_w])
            c = np.concatenate([m_ceiling[at], carry_c])
            uk, uw = unique_sums(k, w)
            uc = np.empty(uk.size, np.int64)
            uc[np.searchsorted(uk, k)] = c  # merged tiles share their nearest resident ancestor
            out_k.append(uk)
            out_w.append(uw)
            up = lv + 1 < uc
            carry_k = sp.parent[uk[up]].astype(np.int64)
            carry_w, carry_c = uw[up], uc[up]
        dk = np.concatenate(out_k) if out_k else np.zeros(0, np.int64)
        dw = np.concatenate(out_w) if out_w else np.zeros(0, np.int64)
        return dk, dw, gap

    def _prefetch(self, wanted: Wanted, gap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Neighbours of the wanted pages and children of the resident ones, under a resident parent."""
        sp = self.space
        tex, level, x, y = sp.coords(wanted.ids)
        parts_t, parts_l, parts_x, parts_y, parts_w = [], [], [], [], []
        for dx, dy in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            parts_t.append(tex), parts_l.append(level), parts_x.append(x + dx), parts_y.append(y + dy)
            parts_w.append(wanted.counts)
        fine = (level > 0) & (gap == 0)
        for cx, cy in ((0, 0), (1, 0), (0, 1), (1, 1)):
            parts_t.append(tex[fine]), parts_l.append(level[fine] - 1)
            parts_x.append(2 * x[fine] + cx), parts_y.append(2 * y[fine] + cy), parts_w.append(wanted.counts[fine])
        t, lv, px, py, w = (np.concatenate(p) for p in (parts_t, parts_l, parts_x, parts_y, parts_w))
        inside = sp.contains(t, lv, px, py)
        t, lv, px, py, w = t[inside], lv[inside], px[inside], py[inside], w[inside]
        ids = sp.level_first[t, lv] + py * sp.tiles_x[t, lv] + px
        ids, w = unique_sums(ids, np.maximum(w, 1))
        parent = sp.parent[ids].astype(np.int64)
        keep = (parent >= 0) & ~self.tables.is_resident(ids)
        keep[keep] = self.tables.is_resident(parent[keep])
        return ids[keep], w[keep]

    def update(self, frame: int, wanted: Wanted, max_issue: int) -> Requests:
        """Merge this frame's wanted pages into the queue and return the tiles to load now (at most
        `max_issue`, e.g. the staging ring's free slots, besides the configured caps)."""
        if frame < self._frame:
            raise ValueError(f"frame {frame!r} is before the previous update's frame {self._frame}")
        self._frame = frame
        self.stats.frames += 1
        dk, dw, gap = self._demand(wanted) if len(wanted) else (np.zeros(0, np.int64),) * 3
        keys, weights, tiers = [dk], [dw], [np.full(dk.size, DEMAND, np.uint8)]
        if self.config.prefetch and len(wanted) and dk.size < self.max_tiles:
            pk, pw = self._prefetch(wanted, gap)
            fresh = ~np.isin(pk, dk, assume_unique=True)
            (
                keys.append(pk[fresh]),
                weights.append(pw[fresh]),
                tiers.append(np.full(int(fresh.sum()), PREFETCH, np.uint8)),
            )
        new = np.concatenate(keys)
        if new.size:
            st = self.state[new]
            retry = (st == RequestState.FAILED) & (self.retry_at[new] <= frame)
            take = ((st != RequestState.FAILED) | retry) & ~self.loading(new)
            self.stats.retried += int(np.count_nonzero(retry & take))
            n = new[take]
            self.state[n] = RequestState.QUEUED
            self.score[n] = np.minimum(np.concatenate(weights)[take], _SCORE_LIMIT)
            self.tier[n] = np.concatenate(tiers)[take]
            self.last_wanted[n] = frame
            merged = np.sort(np.concatenate([self.queue, n]))
            self.queue = merged[np.concatenate([[True], merged[1:] != merged[:-1]])] if merged.size else merged

        # Drop what was issued, failed, became resident or loading, was closed, or went stale.
        q = self.queue
        live = (self.state[q] == RequestState.QUEUED) & self.space.is_tile(q)
        live[live] = ~self.tables.is_resident(q[live]) & ~self.loading(q[live])
        stale = live & (frame - self.last_wanted[q] >= self.config.cancel_after_frames)
        cancelled = int(np.count_nonzero(stale))
        gone = q[~live | stale]
        self.state[gone[self.state[gone] == RequestState.QUEUED]] = RequestState.NONE
        q = q[live & ~stale]
        self.queue = q
        self.stats.cancelled += cancelled

        # The best `limit` by (tier, weight desc, level desc, id); then the byte cap on that prefix.
        limit = min(self.max_tiles, max_issue, q.size)
        if limit <= 0:
            return Requests(np.zeros(0, np.int64), np.zeros(0, bool), cancelled, int(q.size))
        level = self.space.level[q].astype(np.int64)
        key = (self.tier[q].astype(np.int64) << 58) | ((_SCORE_LIMIT - self.score[q]) << 4) | (MAX_LEVELS - 1 - level)
        if limit < q.size:
            part = np.argpartition(key, limit - 1)[:limit]
        else:
            part = np.arange(q.size)
        chosen = part[np.lexsort((q[part], key[part]))]
        ids = q[chosen]
        nbytes = self.space.tile_bytes[self.space.tex[ids].astype(np.int64)]
        fits = (np.cumsum(nbytes) <= self.max_bytes) | (np.arange(ids.size) == 0)
        ids = ids[fits]
        self.state[ids] = RequestState.NONE
        keep = np.ones(q.size, bool)
        keep[chosen[fits]] = False
        self.queue = q[keep]
        prefetch = self.tier[ids] == PREFETCH
        self.stats.issued += int(ids.size)
        self.stats.issued_prefetch += int(np.count_nonzero(prefetch))
        return Requests(ids, prefetch, cancelled, int(self.queue.size))
