"""Request scheduling: which tiles to start loading this frame, in what order.

Input each frame: the unique wanted pages with coverage counts (`WantedPages`, from the feedback
reducer) and the page tables of the registered textures. Output: a `RequestBatch`, the ordered
tiles to hand to the io workers this frame.

Policy:

- Dedup: a page already resident (page table) or in flight (LOADING here) is not requested again;
  a FAILED tile is not requested again before its back-off ends (``retry_frames`` doubling).
- Parents first: a wanted page whose nearest resident ancestor is ``d`` levels up expands into the
  whole missing chain (the ``d`` tiles between it and that ancestor). A tile is issued only when
  its parent is resident, in flight, failed (so one bad tile cannot block its subtree) or issued
  earlier in the same batch.
- Priority: a wanted page's weight is ``coverage * (resident level - wanted level)``; each tile of a
  chain gets the sum of the weights of the wanted pages under it, so a parent always ranks at least
  as high as its children. Order: demand before prefetch, weight descending, coarser level first.
- Queue: tiles that do not fit this frame's caps stay REQUESTED; a queued tile not wanted again for
  ``cancel_after_frames`` frames is cancelled.
- Prefetch (``config.prefetch``, lower priority than any demand, and only computed when this
  frame's new demand leaves room under the tile cap): the 4 neighbours of every wanted page and the
  4 children (next finer level) of every resident wanted page, when their parent is resident.
- Caps: per frame ``upload_tiles_per_frame`` tiles and ``upload_bytes_per_frame`` bytes (each tile
  costs its texture's raw tile size), and at most ``max_in_flight_bytes`` in flight (default the
  staging ring size). The cut is a prefix of the order, so parents-first survives it.

All per-frame work is vectorized over int64 tile keys (`tile_cache.tile_keys`): np.unique, np.isin,
searchsorted, lexsort. Python loops run over textures and levels only.

The caller reports outcomes: `mark_resident` (upload done; optional, resident tiles are also
dropped on sight), `mark_failed` (corrupt / unreadable: back-off), `mark_dropped` (abandoned
without failure) and `mark_loading` for loads it issues itself (the pinned levels).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..config import StreamerConfig
from .feedback_reduce import WantedPages
from .page_table import NO_LEVEL, PageTable
from .tile_cache import TileState, split_tile_keys, tile_keys

__all__ = ["RequestBatch", "RequestScheduler", "SchedulerStats"]

log = logging.getLogger(__name__)

DEMAND, PREFETCH = 0, 1
MAX_BACKOFF_DOUBLINGS = 10
_NEIGHBOURS = ((-1, 0), (1, 0), (0, -1), (0, 1))
_CHILDREN = ((0, 0), (1, 0), (0, 1), (1, 1))


@dataclass(frozen=True)
class RequestBatch:
    """Tiles to start loading this frame, in issue order (parallel arrays)."""

    keys: np.ndarray
    tex: np.ndarray
    level: np.ndarray
    x: np.ndarray
    y: np.ndarray
    nbytes: np.ndarray  # raw tile bytes of each
    prefetch: np.ndarray  # bool: issued for prefetch rather than demand
    cancelled: np.ndarray  # keys dropped from the queue this frame (never issued)
    deferred: int  # queued tiles held back because their parent is missing
    capped: int  # issuable tiles left queued by the per-frame caps

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    @property
    def total_bytes(self) -> int:
        return int(self.nbytes.sum())

    def tuples(self) -> list[tuple[int, int, int, int]]:
        """(tex, level, x, y) per tile; for small lists (tests, logs)."""
        return list(
            zip(self.tex.tolist(), self.level.tolist(), self.x.tolist(), self.y.tolist(), strict=True)
        )


@dataclass
class SchedulerStats:
    """Running totals (telemetry)."""

    frames: int = 0
    issued: int = 0
    issued_prefetch: int = 0
    cancelled: int = 0
    failed: int = 0
    retried: int = 0
    invalid_pages: int = 0


@dataclass(frozen=True)
class _PageInfo:
    valid: np.ndarray  # names a page of a registered texture
    resident: np.ndarray  # resident level at the page (NO_LEVEL: none), int64
    top: np.ndarray  # level count of the page's texture
    nbytes: np.ndarray  # raw tile bytes of the page's texture


def _page_info(
    tables: Mapping[int, PageTable], tex: np.ndarray, level: np.ndarray, x: np.ndarray, y: np.ndarray
) -> _PageInfo:
    """Look pages up in their textures' page tables (one vectorized lookup per texture)."""
    n = tex.shape[0]
    valid = np.zeros(n, bool)
    resident = np.full(n, NO_LEVEL, np.int64)
    top = np.zeros(n, np.int64)
    nbytes = np.zeros(n, np.int64)
    if n == 0:
        return _PageInfo(valid, resident, top, nbytes)
    presorted = bool(np.all(tex[1:] >= tex[:-1]))  # e.g. the scheduler's own key-sorted table
    order = np.arange(n) if presorted else np.argsort(tex, kind="stable")
    stex = tex[order]
    bounds = np.flatnonzero(np.diff(stex)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.append(bounds, n)
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        table = tables.get(int(stex[a]))
        if table is None:
            continue
        idx = order[a:b]
        ok, res = table.lookup(level[idx], x[idx], y[idx])
        idx = idx[ok]
        valid[idx] = True
        resident[idx] = res[ok]
        top[idx] = table.level_count
        nbytes[idx] = table.header.tile_raw_size
    return _PageInfo(valid, resident, top, nbytes)


def _sum_by_key(keys: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique keys and the summed weight of each (int64)."""
    if keys.size == 0:
        return keys.astype(np.int64), weights.astype(np.int64)
    uk, inv = np.unique(keys, return_inverse=True)
    w = np.bincount(inv.ravel(), weights=weights, minlength=uk.size)
    return uk, np.rint(w).astype(np.int64)


class RequestScheduler:
    """Turns wanted pages into an ordered, capped list of tile loads; remembers what is queued,
    in flight and failed.

    Args:
        config: streaming configuration (caps, cancel delay, prefetch, retry back-off).
        max_tiles: tiles issued per frame; default ``config.upload_tiles_per_frame``.
        max_bytes: raw bytes issued per frame; default ``config.upload_bytes_per_frame``.
        max_in_flight_bytes: raw bytes in flight at once; default the staging ring size.
    """

    def __init__(
        self,
        config: StreamerConfig,
        *,
        max_tiles: int | None = None,
        max_bytes: int | None = None,
        max_in_flight_bytes: int | None = None,
    ) -> None:
        self.config = config
        self.max_tiles = config.upload_tiles_per_frame if max_tiles is None else max_tiles
        self.max_bytes = config.upload_bytes_per_frame if max_bytes is None else max_bytes
        self.max_in_flight_bytes = (
            config.ring_mb << 20 if max_in_flight_bytes is None else max_in_flight_bytes
        )
        for name in ("max_tiles", "max_bytes", "max_in_flight_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        self.stats = SchedulerStats()
        self._frame = -(1 << 62)
        # Known tiles, sorted by key: REQUESTED (queued), LOADING (in flight) or FAILED (backing off).
        self._keys = np.zeros(0, np.int64)
        self._state = np.zeros(0, np.uint8)
        self._last = np.zeros(0, np.int64)  # last frame the tile was wanted
        self._score = np.zeros(0, np.int64)
        self._tier = np.zeros(0, np.uint8)
        self._fails = np.zeros(0, np.int64)
        self._retry = np.zeros(0, np.int64)  # frame from which a FAILED tile may be requested again
        self._bytes = np.zeros(0, np.int64)

    _FIELDS = ("_state", "_last", "_score", "_tier", "_fails", "_retry", "_bytes")

    # ---- queries -------------------------------------------------------------------------------
    def state_of(self, keys: np.ndarray) -> np.ndarray:
        """TileState (uint8) of each key as far as the scheduler knows; ABSENT when unknown."""
        k = np.asarray(keys, np.int64).ravel()
        pos, hit = self._find(k)
        out = np.zeros(k.shape[0], np.uint8)
        out[hit] = self._state[pos[hit]]
        return out

    def _count(self, state: TileState) -> int:
        return int(np.count_nonzero(self._state == state))

    @property
    def queued_count(self) -> int:
        return self._count(TileState.REQUESTED)

    @property
    def in_flight_count(self) -> int:
        return self._count(TileState.LOADING)

    @property
    def failed_count(self) -> int:
        return self._count(TileState.FAILED)

    @property
    def in_flight_bytes(self) -> int:
        return int(self._bytes[self._state == TileState.LOADING].sum())

    def _find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.searchsorted(self._keys, keys)
        if self._keys.size == 0:
            return pos, np.zeros(keys.shape[0], bool)
        pc = np.minimum(pos, self._keys.size - 1)
        return pc, self._keys[pc] == keys

    # ---- table maintenance ---------------------------------------------------------------------
    def _keep(self, mask: np.ndarray) -> None:
        self._keys = self._keys[mask]
        for f in self._FIELDS:
            setattr(self, f, getattr(self, f)[mask])

    def _insert(self, keys: np.ndarray) -> np.ndarray:
        """Add unknown keys (state ABSENT, to be set by the caller); returns the positions of `keys`."""
        keys = np.asarray(keys, np.int64)
        _, hit = self._find(keys)
        new = np.unique(keys[~hit])
        if new.size:
            old_pos = np.arange(self._keys.size) + np.searchsorted(new, self._keys)
            size = self._keys.size + new.size
            all_keys = np.empty(size, np.int64)
            is_old = np.zeros(size, bool)
            is_old[old_pos] = True
            all_keys[old_pos] = self._keys
            all_keys[~is_old] = new
            for f in self._FIELDS:
                old = getattr(self, f)
                arr = np.zeros(size, old.dtype)
                arr[old_pos] = old
                setattr(self, f, arr)
            self._keys = all_keys
        return np.searchsorted(self._keys, keys)

    # ---- outcomes ------------------------------------------------------------------------------
    def mark_loading(self, keys: np.ndarray, nbytes: np.ndarray | int = 0) -> None:
        """Loads the caller issued itself (e.g. the pinned levels) are in flight."""
        k = np.unique(np.asarray(keys, np.int64).ravel())
        pos = self._insert(k)
        self._state[pos] = TileState.LOADING
        self._bytes[pos] = nbytes if np.ndim(nbytes) == 0 else np.asarray(nbytes, np.int64).ravel()

    def mark_resident(self, keys: np.ndarray) -> None:
        """Tiles whose upload completed: forget them (their back-off history too)."""
        self._forget(keys)

    def mark_dropped(self, keys: np.ndarray) -> None:
        """In-flight loads abandoned without failing (slot lost in a resize, texture released)."""
        self._forget(keys)

    def _forget(self, keys: np.ndarray) -> None:
        k = np.asarray(keys, np.int64).ravel()
        if k.size and self._keys.size:
            self._keep(~np.isin(self._keys, k))

    def mark_failed(self, keys: np.ndarray, frame: int) -> None:
        """Loads that failed (corrupt, truncated, unreadable): retry after retry_frames * 2^(n-1)."""
        k = np.unique(np.asarray(keys, np.int64).ravel())
        if k.size == 0:
            return
        pos = self._insert(k)
        self._fails[pos] += 1
        doublings = np.minimum(self._fails[pos] - 1, MAX_BACKOFF_DOUBLINGS)
        self._retry[pos] = frame + self.config.retry_frames * (1 << doublings)
        self._state[pos] = TileState.FAILED
        self.stats.failed += int(k.size)
        log.debug("%d tile loads failed at frame %d; next retry from frame %d", k.size, frame,
                  int(self._retry[pos].min()))  # fmt: skip

    def forget_texture(self, tex_id: int) -> None:
        """Drop everything known about a released texture."""
        if self._keys.size:
            self._keep(split_tile_keys(self._keys)[0] != tex_id)

    # ---- the per-frame step --------------------------------------------------------------------
    def _demand(
        self, tables: Mapping[int, PageTable], wanted: WantedPages
    ) -> tuple[np.ndarray, np.ndarray, WantedPages, np.ndarray]:
        """Keys and weights of the missing chains of the wanted pages, the valid wanted pages and
        their gap to the resident level (0: resident).

        Chains are built one level at a time, merging siblings before going up, so the work shrinks
        with each level instead of repeating per wanted page.
        """
        tex, level, x, y, count = wanted.tex, wanted.level, wanted.x, wanted.y, wanted.count
        info = _page_info(tables, tex, level, x, y)
        v = info.valid
        if not v.all():
            bad = int(np.count_nonzero(~v))
            self.stats.invalid_pages += bad
            log.debug("scheduler: dropped %d wanted pages outside their texture", bad)
            tex, level, x, y, count = tex[v], level[v], x[v], y[v], count[v]
        ceiling = np.minimum(info.resident[v], info.top[v])  # nothing resident: chain up to the top
        gap = ceiling - level
        miss = gap > 0
        m_level, m_ceiling = level[miss], ceiling[miss]
        m_keys = tile_keys(tex[miss], m_level, x[miss], y[miss])
        m_weight = np.maximum(count[miss], 1) * gap[miss]
        out_k: list[np.ndarray] = []
        out_w: list[np.ndarray] = []
        carry_k = carry_w = carry_c = np.zeros(0, np.int64)
        lo, hi = (int(m_level.min()), int(m_ceiling.max())) if m_keys.size else (0, 0)
        for lv in range(lo, hi):
            at = m_level == lv
            k = np.concatenate([m_keys[at], carry_k])
            if k.size == 0:
                continue
            w = np.concatenate([m_weight[at], carry_w])
            c = np.concatenate([m_ceiling[at], carry_c])
            uk, inv = np.unique(k, return_inverse=True)
            inv = inv.ravel()
            uw = np.bincount(inv, weights=w, minlength=uk.size)
            uc = np.empty(uk.size, np.int64)
            uc[inv] = c  # every tile merged here has the same nearest resident ancestor
            out_k.append(uk)
            out_w.append(uw)
            up = lv + 1 < uc
            t_, _, x_, y_ = split_tile_keys(uk[up])
            carry_k = tile_keys(t_, lv + 1, x_ >> 1, y_ >> 1)
            carry_w, carry_c = uw[up], uc[up]
        dk = np.concatenate(out_k) if out_k else np.zeros(0, np.int64)
        dw = np.rint(np.concatenate(out_w)).astype(np.int64) if out_w else np.zeros(0, np.int64)
        return dk, dw, WantedPages(tex, level, x, y, count), gap

    def _prefetch(
        self, tables: Mapping[int, PageTable], wanted: WantedPages, gap: np.ndarray, demand: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Neighbours of the wanted pages and children of the resident ones, when their parent is
        resident and they are not demanded already."""
        tex, level, x, y, count = wanted.tex, wanted.level, wanted.x, wanted.y, wanted.count
        parts: list[tuple[np.ndarray, ...]] = []
        for dx, dy in _NEIGHBOURS:
            parts.append((tex, level, x + dx, y + dy, count))
        fine = (level > 0) & (gap == 0)  # children only under a resident page (their parent)
        for cx, cy in _CHILDREN:
            parts.append((tex[fine], level[fine] - 1, 2 * x[fine] + cx, 2 * y[fine] + cy, count[fine]))
        pt, pl, px, py, pc = (np.concatenate([p[i] for p in parts]) for i in range(5))
        inside = (px >= 0) & (py >= 0)
        pk, pw = _sum_by_key(
            tile_keys(pt[inside], pl[inside], px[inside], py[inside]), np.maximum(pc[inside], 1)
        )
        fresh = ~np.isin(pk, demand)
        pk, pw = pk[fresh], pw[fresh]
        pt, pl, px, py = split_tile_keys(pk)
        info = _page_info(tables, pt, pl, px, py)
        keep = info.valid & (info.resident == pl + 1)
        return pk[keep], pw[keep]

    def update(self, frame: int, wanted: WantedPages, tables: Mapping[int, PageTable]) -> RequestBatch:
        """Merge this frame's wanted pages into the queue and return the tiles to load now."""
        if frame < self._frame:
            raise ValueError(f"frame {frame!r} is before the previous update's frame {self._frame}")
        self._frame = frame
        self.stats.frames += 1
        dk, dw, wanted, gap = self._demand(tables, wanted)
        if self.config.prefetch and len(wanted) and self._spare_for_prefetch(dk, frame):
            pk, pw = self._prefetch(tables, wanted, gap, dk)
        else:
            pk, pw = np.zeros(0, np.int64), np.zeros(0, np.int64)
        new_keys = np.concatenate([dk, pk])
        new_score = np.concatenate([dw, pw])
        new_tier = np.concatenate([np.full(dk.size, DEMAND, np.uint8), np.full(pk.size, PREFETCH, np.uint8)])

        # Merge: unknown -> REQUESTED; REQUESTED refreshed; FAILED past its back-off -> REQUESTED.
        pos = self._insert(new_keys)
        st = self._state[pos]
        retry = (st == TileState.FAILED) & (self._retry[pos] <= frame)
        refresh = (st == TileState.ABSENT) | (st == TileState.REQUESTED) | retry
        p = pos[refresh]
        self.stats.retried += int(np.count_nonzero(retry))
        self._state[p] = TileState.REQUESTED
        self._score[p] = new_score[refresh]
        self._tier[p] = new_tier[refresh]
        self._last[p] = frame

        # Drop what became resident or belongs to no texture; cancel stale queued tiles.
        tex, level, x, y = split_tile_keys(self._keys)
        info = _page_info(tables, tex, level, x, y)
        self._bytes = info.nbytes
        stale = (self._state == TileState.REQUESTED) & (frame - self._last >= self.config.cancel_after_frames)
        cancelled = self._keys[stale & info.valid & (info.resident != level)]
        drop = ~info.valid | (info.resident == level) | stale
        if drop.any():
            keep = ~drop
            self._keep(keep)
            tex, level, x, y = tex[keep], level[keep], x[keep], y[keep]
            info = _PageInfo(*(getattr(info, f)[keep] for f in ("valid", "resident", "top", "nbytes")))
        self.stats.cancelled += int(cancelled.size)

        # Order the eligible tiles: demand first, weight descending, coarser first, then key.
        elig = np.flatnonzero(self._state == TileState.REQUESTED)
        order = np.lexsort((self._keys[elig], -level[elig], -self._score[elig], self._tier[elig]))
        e = elig[order]
        ok = self._parents_ready(e, level[e], info.resident[e], info.top[e], tex[e], x[e], y[e])
        issue, deferred = e[ok], int(np.count_nonzero(~ok))

        # Caps: a prefix of the order.
        room = min(self.max_bytes, self.max_in_flight_bytes - self.in_flight_bytes)
        fits = (np.cumsum(self._bytes[issue]) <= room) & (np.arange(1, issue.size + 1) <= self.max_tiles)
        take = issue[fits]
        capped = int(issue.size - take.size)
        self._state[take] = TileState.LOADING
        prefetch = self._tier[take] == PREFETCH
        self.stats.issued += int(take.size)
        self.stats.issued_prefetch += int(np.count_nonzero(prefetch))
        if take.size or cancelled.size:
            log.debug("frame %d: issue %d (%d prefetch), %d capped, %d deferred, %d cancelled, %d in flight",
                      frame, take.size, int(np.count_nonzero(prefetch)), capped, deferred, cancelled.size,
                      self.in_flight_count)  # fmt: skip
        return RequestBatch(
            keys=self._keys[take].copy(),
            tex=tex[take],
            level=level[take],
            x=x[take],
            y=y[take],
            nbytes=self._bytes[take].copy(),
            prefetch=prefetch,
            cancelled=cancelled,
            deferred=deferred,
            capped=capped,
        )

    def _spare_for_prefetch(self, demand: np.ndarray, frame: int) -> bool:
        """Prefetch only when this frame's new demand leaves room under the tile cap."""
        if self._keys.size == 0:
            return demand.size < self.max_tiles
        pos, hit = self._find(demand)
        st = np.where(hit, self._state[pos], TileState.ABSENT)
        busy = hit & ((st == TileState.LOADING) | ((st == TileState.FAILED) & (self._retry[pos] > frame)))
        return int(np.count_nonzero(~busy)) < self.max_tiles

    def _parents_ready(
        self,
        e: np.ndarray,
        level: np.ndarray,
        resident: np.ndarray,
        top: np.ndarray,
        tex: np.ndarray,
        x: np.ndarray,
        y: np.ndarray,
    ) -> np.ndarray:
        """Mask over the ordered candidates `e`: parent resident, in flight, failed, or ready earlier."""
        m = e.size
        if m == 0:
            return np.zeros(0, bool)
        has_parent = level + 1 < top
        base = ~has_parent | (resident == level + 1)
        hp = np.flatnonzero(has_parent & ~base)
        pkeys = tile_keys(tex[hp], level[hp] + 1, x[hp] >> 1, y[hp] >> 1)
        ppos_t, phit = self._find(pkeys)
        pstate = np.where(phit, self._state[ppos_t], TileState.ABSENT)
        base[hp] |= (pstate == TileState.LOADING) | (pstate == TileState.FAILED)
        # Where is each parent in the issue order (if it is a candidate at all)?
        parent_rank = np.full(m, -1, np.int64)
        rank_of_table_pos = np.full(self._keys.size, -1, np.int64)
        rank_of_table_pos[e] = np.arange(m)
        queued_parent = phit & (pstate == TileState.REQUESTED)
        parent_rank[hp[queued_parent]] = rank_of_table_pos[ppos_t[queued_parent]]
        earlier = (parent_rank >= 0) & (parent_rank < np.arange(m))
        ok = base.copy()
        pr = np.maximum(parent_rank, 0)
        for _ in range(int(top.max()) + 1):  # chains are at most `levels` long
            new_ok = base | (earlier & ok[pr])
            if np.array_equal(new_ok, ok):
                break
            ok = new_ok
        return ok
