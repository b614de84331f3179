"""Feedback reduction: the raw page ids the GPU appended become unique wanted pages with coverage.

Contract with shaders/vt.glsl: one uint32 per feedback entry, the tile id of the page a fragment
wanted (`tiles.TileSpace`: ``pages[base + level] + y * tiles_x + x``, the same index the page-table
lookup uses). `FeedbackReducer.reduce` drops entries that name no tile of an open texture (counted:
a texture closed while its draws were in flight, or garbage), counts each unique page (its coverage:
how many feedback samples wanted it) and applies the budget's mip bias (each page replaced by its
ancestor ``floor(bias)`` levels up, clamped at the coarsest level; counts of merged pages add up).

Unique-with-counts is a histogram over the tile id space (`np.bincount`, one pass over the entries and
one over the ids in use) when the space is not much larger than the entries, else a sort
(`unique_counts`): at 1920x1080 the histogram is about 5x faster than the sort; numpy 2's ``np.unique``
takes a hash path that is several times slower than either on these arrays.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .tiles import TileSpace

__all__ = [
    "CompactFeedback",
    "CompactionChoice",
    "FeedbackReducer",
    "FeedbackResult",
    "FeedbackLoop",
    "Wanted",
    "histogram_counts",
    "same_feedback",
    "snapshot_feedback",
    "unique_counts",
    "unique_sums",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wanted:
    """Unique tile ids wanted this frame (ascending) with their coverage counts (int64 arrays), and,
    when the reduction counted them on the way (`FeedbackReducer.wanted_pages`), how many of the pages
    each cache pool holds (else None: count them from the ids)."""

    ids: np.ndarray
    counts: np.ndarray
    pool_pages: np.ndarray | None = None

    @classmethod
    def empty(cls) -> Wanted:
        z = np.zeros(0, np.int64)
        return cls(z, z)

    def __len__(self) -> int:
        return int(self.ids.size)

    @property
    def coverage(self) -> int:
        return int(self.counts.sum())

    def select(self, mask: np.ndarray) -> Wanted:
        return Wanted(self.ids[mask], self.counts[mask])


@dataclass(frozen=True)
class FeedbackResult:
    """One reduced feedback buffer (or several, concatenated)."""

    wanted: Wanted
    samples: int  # entries read
    invalid: int  # entries naming no tile of an open texture (dropped)
    bias_levels: int  # whole levels the pages were coarsened by


@dataclass(frozen=True)
class CompactFeedback:
    """One feedback buffer already reduced on the GPU (shaders/vt_feedback_compact.glsl): unique ids, in
    no particular order, with how many entries named each; `samples` entries were read, `invalid` of
    them named an id past the id space (dropped on the GPU)."""

    ids: np.ndarray
    counts: np.ndarray
    samples: int
    invalid: int


class CompactionChoice:
    """Whether the next feedback buffer is compacted on the GPU, chosen by measuring both ways.

    Compaction (engine/runtime/feedback.py) trades the CPU's pass over every entry for two compute
    dispatches, a larger readback and a few GL calls a frame. Which costs the render thread less
    depends on the driver and on how many entries the draws write: on a software rasterizer the
    dispatches run on the CPU too, and a small screen writes few entries. The streamer reports each
    frame's feedback cost on the render thread (closing the buffer, reading it, reducing it) with the
    way the buffers it read were made (`record`); the choice runs `probe_frames` frames each way,
    keeps the way whose median is lower, and tries the other way again every `reprobe_frames` frames.
    No GL, no clock: the costs are given.

    Parameters
    ----------
    available : bool
        Compaction can run (compute shaders, a work buffer in the budget); False: never compact.
    probe_frames : int
        Frames measured each way before choosing.
    reprobe_frames : int
        Frames the chosen way runs before the other is measured again.
    """

    def __init__(self, available: bool, *, probe_frames: int = 16, reprobe_frames: int = 600) -> None:
        if probe_frames < 1 or reprobe_frames < 1:
            raise ValueError(f"probe_frames and reprobe_frames must be >= 1, got {probe_frames!r}, {reprobe_frames!r}")
        self.available = available
        self.probe_frames, self.reprobe_frames = probe_frames, reprobe_frames
        self.compact = available  # the way the next buffer is made: compaction is measured first
        self.chosen: bool | None = None  # the cheaper way once both were measured
        self._costs: dict[bool, deque[float]] = {w: deque(maxlen=probe_frames) for w in (True, False)}
        self._frames = 0  # frames measured since the way last changed

    def median(self, compact: bool) -> float | None:
        """Median seconds of the latest frames measured that way (None before any)."""
        c = self._costs[compact]
        return float(np.median(c)) if c else None

    def record(self, compacted: bool, seconds: float) -> None:
        """One frame's feedback cost on the render thread, for buffers made `compacted` (frames that
        read buffers made the other way, closed before a switch, are not counted)."""
        if not self.available or compacted != self.compact:
            return
        costs = self._costs[compacted]
        costs.append(seconds)
        self._frames += 1
        if self.chosen is not None and self.compact == self.chosen:
            if self._frames >= self.reprobe_frames:  # the other way may have become cheaper
                self._costs[not self.chosen].clear()
                self._switch(not self.chosen)
            return
        if len(costs) < self.probe_frames:
            return
        other = self._costs[not compacted]
        if len(other) < self.probe_frames:  # the other way is not measured yet
            self._switch(not compacted)
            return
        self.chosen = self.median(True) <= self.median(False)  # type: ignore[operator]
        self._switch(self.chosen)

    def _switch(self, compact: bool) -> None:
        if compact != self.compact:
            log.debug("feedback: %s the GPU", "compacting on" if compact else "not compacting on")
        self.compact, self._frames = compact, 0


HISTOGRAM_IDS_PER_ENTRY = 8  # the histogram path while the id space is at most this many ids per entry


def _histogram_bound(v: np.ndarray) -> int:
    """One past the largest value when `v` (integers) is dense enough for a histogram, else 0."""
    if v.size < 64 or v.dtype.kind not in "iu":
        return 0
    hi = int(v.max())
    if hi >= HISTOGRAM_IDS_PER_ENTRY * v.size or (v.dtype.kind == "i" and int(v.min()) < 0):
        return 0
    return hi + 1


def unique_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique values and how often each occurs (a histogram when the values are dense, else a
    sort)."""
    v = np.asarray(values).ravel()
    bound = _histogram_bound(v)
    if bound:
        hist = np.bincount(v, minlength=bound)
        uniq = hist.nonzero()[0]
        return uniq.astype(v.dtype), hist[uniq].astype(np.int64)
    v = np.sort(v)
    if v.size == 0:
        return v, np.zeros(0, np.int64)
    starts = np.concatenate([[0], (v[1:] != v[:-1]).nonzero()[0] + 1])
    counts = np.diff(np.append(starts, v.size))
    return v[starts], counts.astype(np.int64)


def histogram_counts(values: np.ndarray, n_ids: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Sorted unique values below `n_ids`, how often each occurs, and how many values were not below
    `n_ids` (a histogram of `n_ids` bins: never larger, whatever the values)."""
    v = np.asarray(values).ravel()
    if v.size == 0 or n_ids <= 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), int(v.size)
    outside = 0
    if int(v.max()) >= n_ids or (v.dtype.kind == "i" and int(v.min()) < 0):
        inside = (v >= 0) & (v < n_ids)
        outside = int(v.size - np.count_nonzero(inside))
        v = v[inside]
    hist = np.bincount(v)  # as long as the largest id needs: the bins past it would all be empty
    uniq = hist.nonzero()[0]
    return uniq, hist[uniq].astype(np.int64), outside


def unique_sums(keys: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys and the summed weight of each (a histogram when the keys are dense, else a
    sort)."""
    k = np.asarray(keys).ravel()
    if k.size == 0:
        return k.astype(np.int64), np.zeros(0, np.int64)
    bound = _histogram_bound(k)
    if bound:
        present = np.bincount(k, minlength=bound).nonzero()[0]
        sums = np.bincount(k, weights=np.asarray(weights, np.float64).ravel(), minlength=bound)[present]
        return present.astype(np.int64), np.rint(sums).astype(np.int64)
    order = np.argsort(k, kind="stable")
    ks = k[order]
    starts = np.concatenate([[0], (ks[1:] != ks[:-1]).nonzero()[0] + 1])
    return ks[starts].astype(np.int64), np.add.reduceat(np.asarray(weights, np.int64)[order], starts)


def _unique_in_order(ids: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """One GPU-compacted buffer's ids (unique, in no order) ascending with their counts, by scattering
    them into a table over the ids when they are dense (cheaper than sorting them); None when they are
    sparse or not unique after all (then they are summed by `unique_sums`)."""
    bound = _histogram_bound(ids)
    if not bound:
        return None
    at = np.full(bound, -1, np.int64)
    at[ids] = np.arange(ids.size)
    present = (at >= 0).nonzero()[0]
    if present.size != ids.size:  # an id listed twice
        return None
    return present, counts[at[present]]


def same_feedback(a: Sequence[np.ndarray | CompactFeedback], b: Sequence[np.ndarray | CompactFeedback]) -> bool:
    """Whether two frames' feedback batches hold the same entries in the same order (then they reduce
    to the same pages). Cheap when they differ: sizes first, then a short prefix, then the rest."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, CompactFeedback) != isinstance(y, CompactFeedback):
            return False
        pairs = ((x.ids, y.ids), (x.counts, y.counts)) if isinstance(x, CompactFeedback) else ((x, y),)
        for u, v in pairs:
            u, v = np.asarray(u), np.asarray(v)
            if u.shape != v.shape or u.dtype != v.dtype:
                return False
            if not (np.array_equal(u[:64], v[:64]) and np.array_equal(u, v)):
                return False
    return True


SNAPSHOT_MAX_ENTRIES = 1 << 16  # feedback larger than this is not kept for `same_feedback`


def snapshot_feedback(batches: Sequence[np.ndarray | CompactFeedback]) -> list[np.ndarray | CompactFeedback] | None:
    """A copy of feedback batches that later changes to the caller's arrays do not reach; None when
    they hold over `SNAPSHOT_MAX_ENTRIES` entries (raw feedback of a large screen: copying it every
    frame would cost about what reducing it does)."""
    size = sum(b.ids.size if isinstance(b, CompactFeedback) else np.asarray(b).size for b in batches)
    if size > SNAPSHOT_MAX_ENTRIES:
        return None
    return [
        CompactFeedback(np.array(b.ids), np.array(b.counts), b.samples, b.invalid)
        if isinstance(b, CompactFeedback)
        else np.array(b)
        for b in batches
    ]


# (values, weights or None, n_ids, level, tex, follow, pool_of or None, pool_pages or None, scratch, bits,
# out_ids, out_counts, stats) -> pages written, or -1: ``ts_feedback_pages``
FeedbackLoop = Callable[..., int]
NO_FOLLOWERS = np.full((0, 0), -1, np.int32)  # a follower table of no sets


class FeedbackReducer:
    """Reduces raw feedback entries against the open textures' tile ids (vectorized).

    Parameters
    ----------
    space
        The tile id space.
    feedback_loop
        The compiled reduction (`touch.DeciderLoops.feedback_pages`: one pass over the entries that
        counts them, drops ids of no tile and expands texture sets, where numpy takes a dozen calls),
        or None: numpy, the same pages.
    """

    def __init__(self, space: TileSpace, *, feedback_loop: FeedbackLoop | None = None) -> None:
        self.space = space
        self._loop = feedback_loop
        self._scratch = np.zeros(0, np.int64)  # the loop's counts and presence bits, left zeroed by it
        self._bits = np.zeros(0, np.uint64)
        self._out_ids = np.zeros(0, np.int64)  # what it writes, copied out
        self._out_counts = np.zeros(0, np.int64)
        self._stats = np.zeros(2, np.int64)  # entries past the id space, entries naming no tile

    def _pages_compiled(
        self,
        values: np.ndarray,
        weights: np.ndarray | None,
        follow: np.ndarray,
        pool_of: np.ndarray | None = None,
        n_pools: int = 0,
    ) -> tuple[Wanted, int]:
        """The distinct tiles `values` name (uint32; each weighing `weights`, or 1) with their
        coverage, expanded onto `follow`'s pages, in one call of the compiled loop, with the pages
        per pool when `pool_of` (per texture id) is given; and how many entries (by weight) were
        dropped for naming no tile."""
        assert self._loop is not None
        space = self.space
        values = np.ascontiguousarray(values.ravel())
        k = follow.shape[1]
        capacity = space.capacity
        if self._scratch.size < capacity:
            self._scratch = np.zeros(capacity, np.int64)
            self._bits = np.zeros(-(-capacity // 64), np.uint64)
        n_ids = space.used
        room = min(values.size, n_ids) * (k + 1)
        if self._out_ids.size < room:
            self._out_ids = np.empty(max(room, 2 * self._out_ids.size, 4096), np.int64)
            self._out_counts = np.empty_like(self._out_ids)
        pool_pages = None if pool_of is None else np.zeros(n_pools, np.int64)
        n = self._loop(
            values, weights, n_ids, space.level, space.tex, follow, pool_of, pool_pages, self._scratch, self._bits,
            self._out_ids, self._out_counts, self._stats,
        )  # fmt: skip
        if n < 0:  # the follower table names a page past the id space: never as SetTable builds it
            raise ValueError("feedback: a texture set's follower table names a page outside the tile id space")
        invalid = int(self._stats[0] + self._stats[1])
        return Wanted(self._out_ids[:n].copy(), self._out_counts[:n].copy(), pool_pages), invalid

    def wanted_pages(
        self,
        batches: Sequence[np.ndarray | CompactFeedback],
        follow: np.ndarray,
        expand: Callable[[Wanted], Wanted],
        pool_of: np.ndarray,
        n_pools: int,
    ) -> Wanted:
        """A frame's wanted pages: `reduce_batches(batches).wanted` expanded by `expand` (the texture
        sets' `SetTable.expand`, whose table is `follow`). One buffer (the usual frame) goes through one
        call of the compiled loop when there is one, which also counts the pages of each of `n_pools`
        pools (`pool_of`: per texture id, int64) into `Wanted.pool_pages`; the same pages either way."""
        if self._loop is not None and len(batches) == 1:
            b = batches[0]
            if isinstance(b, CompactFeedback):
                ids, counts = np.asarray(b.ids), np.asarray(b.counts)
                if ids.dtype == counts.dtype == np.uint32 and ids.size <= counts.size:
                    return self._pages_compiled(ids, counts[: ids.size], follow, pool_of, n_pools)[0]
            elif np.asarray(b).dtype == np.uint32:
                return self._pages_compiled(np.asarray(b), None, follow, pool_of, n_pools)[0]
        return expand(self.reduce_batches(batches).wanted)

    def reduce(self, raw: np.ndarray, bias: float = 0.0) -> FeedbackResult:
        """Unique wanted pages with coverage counts, coarsened by floor(bias) levels.

        Parameters
        ----------
        raw
            Feedback entries (uint32 tile ids), any shape.
        bias
            Feedback mip bias in levels (>= 0).
        """
        ids = np.asarray(raw)
        if not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"feedback entries must be integer tile ids, got dtype {ids.dtype}")
        if not (math.isfinite(bias) and bias >= 0):
            raise ValueError(f"mip bias must be a finite number >= 0, got {bias!r}")
        total = int(ids.size)
        n_ids = self.space.used
        if total and self._loop is not None and ids.dtype == np.uint32:
            wanted, invalid = self._pages_compiled(ids, None, NO_FOLLOWERS)
            uniq, counts = wanted.ids, wanted.counts
        else:
            outside = 0
            if total and n_ids <= HISTOGRAM_IDS_PER_ENTRY * total:
                uniq, counts, outside = histogram_counts(ids, n_ids)
            else:
                uniq, counts = unique_counts(ids)
            uniq = uniq.astype(np.int64)
            valid = self.space.is_tile(uniq)
            invalid = outside + int(counts[~valid].sum())
            uniq, counts = uniq[valid], counts[valid]
        if invalid:
            log.debug("feedback: %d of %d entries name no tile and were dropped", invalid, total)
        b = math.floor(bias)
        if b and uniq.size:
            uniq, counts = unique_sums(self.space.ancestors(uniq, b), counts)
        return FeedbackResult(Wanted(uniq, counts), total, invalid, b)

    def reduce_batches(self, batches: Sequence[np.ndarray | CompactFeedback], bias: float = 0.0) -> FeedbackResult:
        """`reduce` over several buffers at once: raw ones (uint32 entries) and ones compacted on the
        GPU (`CompactFeedback`) alike; the same pages and counts as reducing all their entries."""
        if len(batches) == 1 and isinstance(batches[0], CompactFeedback):
            return self._reduce_compact(batches[0], bias)
        raw = [b for b in batches if not isinstance(b, CompactFeedback)]
        compact = [b for b in batches if isinstance(b, CompactFeedback)]
        if not compact:
            return self.reduce(np.concatenate(raw) if len(raw) != 1 else raw[0], bias)
        if not (math.isfinite(bias) and bias >= 0):
            raise ValueError(f"mip bias must be a finite number >= 0, got {bias!r}")
        ids = [np.asarray(c.ids, np.int64) for c in compact]
        counts = [np.asarray(c.counts, np.int64) for c in compact]
        samples = sum(c.samples for c in compact)
        invalid = sum(c.invalid for c in compact)
        if raw:
            r = self.reduce(np.concatenate(raw))
            ids.append(r.wanted.ids)
            counts.append(r.wanted.counts)
            samples, invalid = samples + r.samples, invalid + r.invalid
        uniq, total = unique_sums(np.concatenate(ids), np.concatenate(counts))  # a few thousand: sorted here
        valid = self.space.is_tile(uniq)
        invalid += int(total[~valid].sum())
        uniq, total = uniq[valid], total[valid]
        b = math.floor(bias)
        if b and uniq.size:
            uniq, total = unique_sums(self.space.ancestors(uniq, b), total)
        return FeedbackResult(Wanted(uniq, total), samples, invalid, b)

    def _reduce_compact(self, c: CompactFeedback, bias: float) -> FeedbackResult:
        """`reduce_batches` of one buffer compacted on the GPU (the usual frame) in a dozen numpy
        calls: its ids are unique already, so they are only put in order (scattered into a table
        over the ids when dense, else sorted) and checked against the open textures."""
        if not (math.isfinite(bias) and bias >= 0):
            raise ValueError(f"mip bias must be a finite number >= 0, got {bias!r}")
        b = math.floor(bias)
        ids, counts = np.asarray(c.ids).astype(np.int64), np.asarray(c.counts).astype(np.int64)
        if ids.size == 0:
            return FeedbackResult(Wanted.empty(), c.samples, c.invalid, b)
        ordered = _unique_in_order(ids, counts)
        if ordered is None:
            order = np.argsort(ids)
            uniq, total = ids[order], counts[order]
            if uniq.size > 1 and (uniq[1:] == uniq[:-1]).any():  # not as the shader promises: summed
                uniq, total = unique_sums(uniq, total)
        else:
            uniq, total = ordered
        inside = int(uniq[0]) >= 0 and int(uniq[-1]) < self.space.capacity  # ascending: the ends bound it
        valid = self.space.level[uniq] >= 0 if inside else self.space.is_tile(uniq)
        invalid = c.invalid
        if not valid.all():
            invalid += int(total[~valid].sum())
            uniq, total = uniq[valid], total[valid]
        if b and uniq.size:
            uniq, total = unique_sums(self.space.ancestors(uniq, b), total)
        return FeedbackResult(Wanted(uniq, total), c.samples, invalid, b)

    def coarsen(self, wanted: Wanted, levels: int) -> Wanted:
        """`wanted` with each page replaced by its ancestor `levels` levels up (counts merged)."""
        if levels <= 0 or not len(wanted):
            return wanted
        return Wanted(*unique_sums(self.space.ancestors(wanted.ids, levels), wanted.counts))
