"""Texture sets and priorities, without GL: which textures share one feedback stream, and how much a
texture's sharpness counts when the budget cannot hold everything.

Texture sets
------------
The textures of one material (base colour, normal, metallic-roughness, ...) are sampled by the same
fragments with the same texture coordinates, so one of them, the set's *lead*, writes the feedback
of all: the others carry the ``VTInfo.meta`` flag `META_NO_FEEDBACK` (shaders/vt.glsl skips their
feedback write, a uniform branch). The lead is the member with the finest texels (the largest), so
every other member wants the same level or a coarser one. `SetTable.expand` maps the lead's reduced
wanted pages onto every member, in numpy, in time proportional to the wanted pages (never to the
resident tiles):

- level: a member whose largest side is ``2^d`` times smaller than the lead's wants level
  ``floor(l - d)`` where the lead wants ``l`` (a 2048² normal map beside a 4096² albedo wants level
  ``l - 1``), clamped to the member's levels;
- pages: the member pages under the lead page's texture-coordinate rectangle (one page when the
  members' tiles line up, a few when the member's tiles are smaller or its levels are clamped);
- coverage: each member page counts the coverage of the lead pages over it.

From there on the members are ordinary textures: each is scheduled, loaded, evicted and backed off
(a corrupt tile) on its own, so a member whose tiles fail keeps its fallback while the others stream.

Priorities
----------
Every texture id has a priority (float > 0, default 1; `Priorities`). It weighs, under pressure:

- request order: a missing page's weight (coverage x mip gap) is multiplied by it;
- the budget's mip bias: while the bias is above zero, a texture is coarsened by
  ``floor(bias + log2(p_max / p))`` levels (`bias_levels`), ``p_max`` the highest priority among the
  textures the frame wants, so lower priorities give way first and the highest keep the plain bias;
- eviction: `slots.SlotLedger` picks its victims by idle time divided by priority (priority-weighted
  least recently used); pinned levels and tiles a frame in flight may sample are never victims.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from ..pack.format import PackHeader
from .feedback_reduce import Wanted, unique_sums
from .tiles import MAX_TEXTURES, TileSpace

__all__ = [
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "Priorities",
    "SetTable",
    "bias_levels",
    "check_priority",
    "choose_lead",
    "coarsen_by",
]

log = logging.getLogger(__name__)

MIN_PRIORITY = 1e-3  # priorities outside this range are refused: they would only overflow the weights
MAX_PRIORITY = 1e3


def check_priority(value: object) -> float:
    """`value` as a priority (a finite number in MIN_PRIORITY..MAX_PRIORITY), or TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"priority must be a number, got {type(value).__name__}")
    p = float(value)
    if not (math.isfinite(p) and MIN_PRIORITY <= p <= MAX_PRIORITY):
        raise ValueError(f"priority must be a finite number in {MIN_PRIORITY:g}..{MAX_PRIORITY:g}, got {value!r}")
    return p


class Priorities:
    """The priority of every texture id (float64, 1.0 for an id without a texture). Render thread only;
    `values` is public for reading (the scheduler and the ledgers index it), changed through `set`."""

    def __init__(self) -> None:
        self.values = np.ones(MAX_TEXTURES, np.float64)

    def set(self, tex: int, value: float) -> None:
        self.values[tex] = check_priority(value)

    def reset(self, tex: int) -> None:
        self.values[tex] = 1.0

    def get(self, tex: int) -> float:
        return float(self.values[tex])

    @property
    def uniform(self) -> bool:
        """True when every texture has the same priority (priorities then change nothing)."""
        return bool((self.values == self.values[0]).all())


def bias_levels(space: TileSpace, priority: np.ndarray, ids: np.ndarray, bias: float) -> np.ndarray:
    """Levels by which each wanted page is coarsened under the budget's mip `bias` (see the module
    docstring): ``floor(bias)`` for the highest priority the pages' textures have, more for lower
    ones, never below zero. Only called while a bias is in force (a bias of zero coarsens nothing)."""
    n = np.asarray(ids).size
    if n == 0:
        return np.zeros(n, np.int64)
    p = priority[space.tex[ids].astype(np.int64)]
    shift = np.log2(p.max() / p)
    return np.maximum(0, np.floor(bias + shift + 1e-9)).astype(np.int64)


def coarsen_by(space: TileSpace, wanted: Wanted, levels: np.ndarray) -> Wanted:
    """`wanted` with page i replaced by its ancestor `levels[i]` levels up (clamped at the coarsest
    level), coverage of merged pages added up."""
    if not len(wanted) or not levels.size or int(levels.max()) <= 0:
        return wanted
    if int(levels.min()) == int(levels.max()):
        return Wanted(*unique_sums(space.ancestors(wanted.ids, int(levels[0])), wanted.counts))
    out, left = wanted.ids.copy(), levels.copy()
    for _ in range(int(levels.max())):
        up = space.parent[out].astype(np.int64)
        go = (left > 0) & (up >= 0)
        out = np.where(go, up, out)
        left -= 1
    return Wanted(*unique_sums(out, wanted.counts))


def choose_lead(headers: list[PackHeader]) -> int:
    """Index of the set member that writes the feedback: the one with the finest texels (the largest
    side, then the largest area; the first of equals), so every other member maps to the same or a
    coarser level."""
    if not headers:
        raise ValueError("a texture set needs at least one member")
    sizes = [(max(h.width, h.height), h.width * h.height) for h in headers]
    return sizes.index(max(sizes))


class SetTable:
    """The texture sets of one streamer: for each set its lead and its other members (texture ids).

    A texture may belong to several sets (a pack shared by two materials); pairs naming the same
    follower twice only merge coverage. The mapping is computed when sets change into a follower
    table over the tile ids (for each lead tile, the member pages it stands for), so `expand` is
    one gather over all sets at once; with the compiled helper the feedback reduction expands the
    pages itself from `follow` (`feedback_reduce.FeedbackReducer.wanted_pages`), in the same call.

    Parameters
    ----------
    space
        The tile id space (levels, grids and first ids of every texture).
    """

    def __init__(self, space: TileSpace) -> None:
        self.space = space
        self._sets: dict[int, tuple[int, tuple[int, ...]]] = {}
        self._next = 0
        self.width = np.zeros(MAX_TEXTURES, np.int64)
        self.height = np.zeros(MAX_TEXTURES, np.int64)
        self.tile = np.ones(MAX_TEXTURES, np.int64)
        self._pairs: list[tuple[int, int]] = []
        self.follow = np.full((space.capacity, 0), -1, np.int32)  # per tile id: member pages (`_rebuild`)
        self.generation = 0  # counts `_rebuild`s: the lead-to-member mapping changed
        space.add_listener(self._grow)

    def __len__(self) -> int:
        return len(self._sets)

    def add(self, lead: int, members: list[int], headers: dict[int, PackHeader]) -> int:
        """Register a set (its lead and every member, the lead included or not); returns its key."""
        for t in (lead, *members):
            if t not in self.space.ranges or t not in headers:
                raise ValueError(f"texture id {t} is not open")
            h = headers[t]
            self.width[t], self.height[t], self.tile[t] = h.width, h.height, h.tile_size
        key = self._next
        self._next += 1
        self._sets[key] = (lead, tuple(dict.fromkeys(m for m in members if m != lead)))
        self._rebuild()
        return key

    def remove(self, key: int) -> None:
        if self._sets.pop(key, None) is not None:
            self._rebuild()

    def forget_texture(self, tex: int) -> None:
        """A texture closed: it leaves every set (a set it led keeps no pairs: its set object names a
        new lead, see `sets.TextureSet`)."""
        changed = False
        for key, (lead, members) in list(self._sets.items()):
            if lead == tex:
                self._sets[key] = (lead, ())
                changed = True
            elif tex in members:
                self._sets[key] = (lead, tuple(m for m in members if m != tex))
                changed = True
        if changed:
            self._rebuild()

    def members_of(self, key: int) -> tuple[int, tuple[int, ...]]:
        """(lead, followers) of a set."""
        return self._sets[key]

    def _rebuild(self) -> None:
        """Recompute the follower table: row i lists the member pages lead tile i maps to (-1 pads).
        Done when sets change (open, close), so that `expand` is one gather per frame."""
        self.generation += 1
        pairs = sorted({(lead, m) for lead, members in self._sets.values() for m in members})
        self._pairs = pairs
        if not pairs:
            self.follow = np.full((self.space.capacity, 0), -1, np.int32)
            return
        src, dst = [], []
        for lead, member in pairs:
            ids = self.space.tile_ids(lead)
            mapped, at = self._map(ids, np.full(ids.size, member, np.int64))
            src.append(ids[at])
            dst.append(mapped)
        s, d = np.concatenate(src), np.concatenate(dst)
        order = np.lexsort((d, s))
        s, d = s[order], d[order]
        keep = np.concatenate([[True], (s[1:] != s[:-1]) | (d[1:] != d[:-1])])  # a page listed once per lead tile
        s, d = s[keep], d[keep]
        starts = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
        rank = np.arange(s.size) - np.repeat(starts, np.diff(np.append(starts, s.size)))
        self.follow = np.full((self.space.capacity, int(rank.max()) + 1), -1, np.int32)
        self.follow[s, rank] = d

    def _grow(self, capacity: int) -> None:
        extra = np.full((capacity - self.follow.shape[0], self.follow.shape[1]), -1, np.int32)
        self.follow = np.concatenate([self.follow, extra])

    @property
    def pair_count(self) -> int:
        """(lead, follower) pairs over every set."""
        return len(self._pairs)

    def expand(self, wanted: Wanted) -> Wanted:
        """`wanted` plus the pages every set's followers want for their lead's wanted pages (module
        docstring), as one sorted `Wanted`. Cost: a gather of the follower table's rows of the wanted
        pages and a sort of the result, O(wanted pages x followers); nothing else is read."""
        if self.follow.shape[1] == 0 or not len(wanted):
            return wanted
        # Column by column: each column lists member pages in the order of the lead pages (ascending
        # within one lead; columns in member id order), so the concatenation is sorted already when the
        # lead's ids come first, else a few sorted runs that a stable (merging) sort joins fast. Rows
        # are full (no -1) when every lead page has its pages in every follower.
        rows = self.follow[wanted.ids]
        k = rows.shape[1]
        if int(rows.min()) >= 0:
            ids = np.concatenate([wanted.ids, rows.T.ravel()])
            counts = np.tile(wanted.counts, k + 1)
        else:
            cols = rows.T.ravel()
            hit = cols >= 0
            if not hit.any():
                return wanted
            ids = np.concatenate([wanted.ids, cols[hit]])
            counts = np.concatenate([wanted.counts, np.tile(wanted.counts, k)[hit]])
        step = np.diff(ids)
        if ids.size > 1 and int(step.min()) < 0:  # sorted already when the lead's range comes first
            order = np.argsort(ids, kind="stable")
            ids, counts = ids[order], counts[order]
            step = np.diff(ids)
        if ids.size < 2 or int(step.min()) > 0:
            return Wanted(ids, counts)
        first = np.empty(ids.size, bool)  # the first of equal ids (a smaller member's page under several)
        first[0] = True
        np.not_equal(step, 0, out=first[1:])
        starts = np.flatnonzero(first)
        return Wanted(ids[starts], np.add.reduceat(counts, starts))

    def _map(self, lead_ids: np.ndarray, member: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Member pages under lead pages `lead_ids` (one follower texture id per entry), each with the
        index of the lead page it came from."""
        sp = self.space
        lead, lv, x, y = sp.coords(lead_ids)
        wl, hl, tl = self.width[lead], self.height[lead], self.tile[lead]
        wm, hm, tm = self.width[member], self.height[member], self.tile[member]
        d = np.log2(np.maximum(wl, hl) / np.maximum(wm, hm))
        top = sp.level_count[member] - 1
        m = np.clip(np.floor(lv - d + 1e-9), 0, top).astype(np.int64)
        # The lead page covers level-0 texels [x * tl * 2^lv, (x + 1) * tl * 2^lv) of the lead, that is
        # member level-0 texels scaled by wm / wl; member pages at level m span tm * 2^m of those.
        span_l, span_m = tl << lv, tm << m
        x0 = x * span_l * wm // (wl * span_m)
        x1 = -(-(x + 1) * span_l * wm // (wl * span_m)) - 1
        y0 = y * span_l * hm // (hl * span_m)
        y1 = -(-(y + 1) * span_l * hm // (hl * span_m)) - 1
        tx, ty = sp.tiles_x[member, m], sp.tiles_y[member, m]
        x0, x1 = np.minimum(x0, tx - 1), np.clip(x1, 0, tx - 1)
        y0, y1 = np.minimum(y0, ty - 1), np.clip(y1, 0, ty - 1)
        nx, ny = np.maximum(x1 - x0 + 1, 1), np.maximum(y1 - y0 + 1, 1)
        first = sp.level_first[member, m]
        base = first + y0 * tx + x0
        index = np.arange(base.size)
        if int(nx.max()) == 1 and int(ny.max()) == 1:
            return base, index
        ids, at = [], []
        for dy in range(int(ny.max())):
            for dx in range(int(nx.max())):
                ok = (dx < nx) & (dy < ny)
                ids.append(base[ok] + dy * tx[ok] + dx)
                at.append(index[ok])
        return np.concatenate(ids), np.concatenate(at)
