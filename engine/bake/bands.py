"""The worker side of a bake: what one process does with a `BandJob` or `CutJob`.

A band becomes finished tiles (mips, slots with borders, block compression, supercompression,
checksum) and its rows of the next stage's level. The same code runs in the bake's own worker
processes (`init_worker` then `run_job`, state inherited from the fork server), inline when a bake
has one job, and on a Dask worker (`run_job_in_this_process`).
"""

from __future__ import annotations

import mmap
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ..errors import EngineError
from ..pack import codec
from ..pack.format import AddressMode, TexelFormat
from ..pack.writer import EncodedTiles
from . import bcn
from .jobs import BandJob, CutJob, JobResult, RingRef, RingWindow, Settings
from .mips import BLEED_ROWS, LevelRows, Transfer, band_levels, bleed
from .source import Source, texel_dtype
from .tiler import LevelCutter, resolve
from .workers import Task, check_interrupt

__all__ = [
    "InlinePool",
    "WorkerState",
    "execute",
    "gather_rows",
    "init_worker",
    "run_job",
    "run_job_in_this_process",
    "warm_tables",
    "warm_worker_tables",
]


@dataclass
class WorkerState:
    settings: Settings
    ring: mmap.mmap | None = None
    source: Source | None = None  # read in place (one job, in this process)
    ring_fd: Any = None  # workers.PassedFd of the ring's memfd, mapped by each worker
    ring_size: int = 0


_worker: WorkerState | None = None


def init_worker(state: WorkerState) -> None:
    global _worker
    _tune_malloc()
    if state.ring_fd is not None:
        state.ring = mmap.mmap(state.ring_fd.fd, state.ring_size)
        os.close(state.ring_fd.fd)
        state.ring_fd = None
    _worker = state
    warm_tables(state.settings)


def _tune_malloc() -> None:
    """Keep freed band buffers in the heap (glibc): every band allocates the same ~100 MiB, and
    returning it to the kernel each time costs a page fault per 4 KiB when it comes back."""
    mallopt = _mallopt()
    if mallopt is not None:
        mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
        mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD


@lru_cache(maxsize=1)
def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's mallopt, or None elsewhere."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def warm_tables(settings: Settings) -> None:
    _warm_transfer(settings.transfer)


def _warm_transfer(t: Transfer) -> None:
    t.reduce(np.zeros((2, 2, 4), np.uint8), None, AddressMode.CLAMP)
    t.encode(np.zeros((1, 1, 4), np.float32))


def warm_worker_tables() -> None:
    """Build every transfer's tables (run once in the fork server; workers inherit them)."""
    for srgb in (False, True):
        for alpha in (False, True):
            _warm_transfer(Transfer(srgb=srgb, alpha=alpha))


def run_job(job: BandJob | CutJob) -> JobResult:
    assert _worker is not None, "worker not initialised"
    return execute(job, _worker)


def run_job_in_this_process(settings: Settings, job: BandJob | CutJob) -> JobResult:
    """Run one job in a process this bake did not start (a Dask worker): its state is made once per
    process and settings, as `init_worker` makes it for the bake's own workers."""
    return execute(job, _settled_state(settings))


@lru_cache(maxsize=4)
def _settled_state(settings: Settings) -> WorkerState:
    _tune_malloc()
    warm_tables(settings)
    return WorkerState(settings)


def execute(job: BandJob | CutJob, state: WorkerState) -> JobResult:
    """Run one job (in a worker process, or inline when jobs == 1), timed (`JobResult.cpu_seconds`)."""
    started, cpu = time.perf_counter(), time.thread_time()
    res = _execute(job, state)
    if isinstance(res.tiles, EncodedTiles):  # laid out here, in parallel: one write for the writer
        at = job.payload_at if state.ring is not None else None
        into = memoryview(state.ring)[at[0] : at[0] + at[1]] if at is not None else None  # type: ignore[arg-type]
        try:
            res.tiles = res.tiles.packed(state.settings.header.alignment, into)
        finally:
            if into is not None:
                into.release()
    res.cpu_seconds = time.thread_time() - cpu
    res.started, res.finished = started, time.perf_counter()
    return res


def _execute(job: BandJob | CutJob, state: WorkerState) -> JobResult:
    if isinstance(job, CutJob):
        res = JobResult()
        h = state.settings.header
        w, lh = h.level_dims(job.level)
        cutter = LevelCutter(w, lh, h.tile_size, h.border, h.address_mode)
        _encode_row(state.settings, cutter, job.level, job.ty, job.rows, res.tiles)
        return res
    return _run_band(job, state)


def _encode_row(
    settings: Settings, cutter: LevelCutter, level: int, ty: int, rows: np.ndarray, out: EncodedTiles
) -> None:
    h = settings.header
    slots = cutter.cut_row(rows)
    raw = bcn.encode_slots(slots, h.texel_format, bc7_quality=settings.bc7_quality, srgb=h.srgb, alpha=settings.alpha)
    stored, digests = codec.encode_many(raw, h.tile_raw_size, h.supercompression, settings.zstd_level)
    out.add_row(level, ty, stored, digests)


def _band_input(job: BandJob, state: WorkerState, lo: int, hi: int) -> np.ndarray:
    ref = job.data
    if isinstance(ref, RingWindow):
        assert state.ring is not None
        ring = ref.ring.view(state.ring)
        pieces = ref.ring.pieces(ref.lo, ref.hi)
        if len(pieces) == 1:
            at, n, _ = pieces[0]
            return ring[at : at + n]
        rows = np.empty((ref.hi - ref.lo, ref.ring.width, 4), np.float32)
        for at, n, k in pieces:
            rows[k : k + n] = ring[at : at + n]
        return rows
    if isinstance(ref, RingRef):
        assert state.ring is not None
        a = np.frombuffer(state.ring, np.dtype(ref.dtype), ref.rows * ref.width * 4, ref.offset)
        return a.reshape(ref.rows, ref.width, 4)
    if ref is not None:
        return ref
    source = job.source or state.source
    assert source is not None
    rows = source.read_rows(lo, hi)
    want = texel_dtype(source)
    if rows.shape != (hi - lo, source.width, 4) or rows.dtype != want:
        raise EngineError(
            f"source {source.name} returned {rows.shape} {rows.dtype} for rows {lo}..{hi}, "
            f"expected ({hi - lo}, {source.width}, 4) {want}"
        )
    return np.ascontiguousarray(rows)


def _run_band(job: BandJob, state: WorkerState) -> JobResult:
    settings = state.settings
    h = settings.header
    st = job.stage
    t, b = h.tile_size, h.border
    a0, b0 = st.content(job.band)
    lo, hi = st.window(job.band)
    data = _band_input(job, state, lo, hi)
    if data.shape[0] != hi - lo:
        raise EngineError(f"band {job.band} of stage {st.index} has {data.shape[0]} rows, expected {hi - lo}")
    res = JobResult()
    transfer = settings.transfer
    if transfer.alpha and (transfer.srgb or transfer.premultiplied or st.index == 0):
        if _opaque(data):
            transfer = Transfer(srgb=transfer.srgb, alpha=False)  # exact for alpha 255 (1.0), and faster
        else:
            res.alpha = st.index == 0
    reductions = st.count - 1 if st.final else st.count
    levels = band_levels(
        LevelRows(st.level, lo, hi, data),
        reductions,
        h.level_dims,
        transfer,
        h.address_mode,
        job.top_row0.__getitem__,
        fuse=not job.want_top,  # the wrap context keeps each level's float row 0
    )
    for lr in levels:
        d = lr.level - st.level
        lw, lh = h.level_dims(lr.level)
        ca = a0 >> d
        cb = lh if b0 >= st.height else b0 >> d
        if d == st.count:  # the next stage's input
            out = lr.data[ca - lr.lo : cb - lr.lo]
            if job.output_ring is None:
                res.output = out.copy()
                break
            assert state.ring is not None
            ring = job.output_ring.view(state.ring)
            for at, n, k in job.output_ring.pieces(ca, cb):
                ring[at : at + n] = out[k : k + n]
            break
        elo, ehi = max(lr.lo, ca - b), min(lr.hi, cb + b)
        enc = _encoded_rows(lr, elo, ehi, transfer)
        if job.want_top:
            assert elo == 0 and lr.lo == 0
            res.top_rows[lr.level] = enc[: min(lh, t + b)].copy()
            res.top_row0[lr.level] = lr.data[0].copy()
        if job.want_bottom:
            assert ehi == lh
            res.bottom_rows[lr.level] = enc[lh - b - elo :].copy() if b else enc[:0].copy()
        cutter = LevelCutter(lw, lh, t, b, h.address_mode)
        ty0, ty1 = ca // t, -(-cb // t)
        if ty0 == 0 and job.skip_row0:
            ty0 = 1
        if ty1 > ty0 and bcn.encodes_blocks_alone(h.texel_format):
            _encode_rows_at_once(settings, cutter, lr.level, ty0, ty1, enc, elo, job, lh, res.tiles)
            continue
        for ty in range(ty0, ty1):
            rows = gather_rows(
                cutter.slot_rows(ty), enc, elo, job.top_rows.get(lr.level), job.bottom_rows.get(lr.level), lh
            )
            _encode_row(settings, cutter, lr.level, ty, rows, res.tiles)
    return res


def _encode_rows_at_once(
    settings: Settings,
    cutter: LevelCutter,
    level: int,
    ty0: int,
    ty1: int,
    enc: np.ndarray,
    elo: int,
    job: BandJob,
    height: int,
    out: EncodedTiles,
) -> None:
    """Tile rows [ty0, ty1) of a level, encoded as one surface: the level's rows and columns of
    those slots (borders and padding resolved by the address mode), each block once, then every
    slot's blocks taken from the grid (slot origins are multiples of 4, so slots share whole
    blocks). The same bytes as `_encode_row` per tile row, with no border texel encoded twice."""
    h = settings.header
    t, b, s = cutter.tile_size, cutter.border, cutter.slot_size
    n = cutter.tiles_x
    fmt = h.texel_format
    rows = resolve(np.arange(ty0 * t - b, ty1 * t + b), height, cutter.mode)
    grid = np.empty((rows.size // 4, (n * t + 2 * b) // 4, fmt.block_bytes), np.uint8)
    # Rows: the longest run of consecutive level rows the band holds is encoded in place; the few
    # rows before and after it (a border resolved by the address mode, padding) are gathered apart.
    a, z = _rows_in_place(rows, elo, enc.shape[0])
    for lo, hi in ((0, a), (a, z), (z, rows.size)):
        if hi > lo:
            if (lo, hi) == (a, z):
                part = enc[rows[a] - elo : rows[a] - elo + (z - a)]
            else:
                part = gather_rows(rows[lo:hi], enc, elo, job.top_rows.get(level), job.bottom_rows.get(level), height)
            _encode_columns(np.ascontiguousarray(part), cutter, fmt, grid[lo // 4 : hi // 4])
    bt, bs = t // 4, s // 4
    g0, g1, g2 = grid.strides
    slots = np.lib.stride_tricks.as_strided(
        grid, (ty1 - ty0, n, bs, bs, grid.shape[2]), (bt * g0, bt * g1, g0, g1, g2), writeable=False
    )
    raw = np.ascontiguousarray(slots)
    stored, digests = codec.encode_many(raw, h.tile_raw_size, h.supercompression, settings.zstd_level)
    for k, ty in enumerate(range(ty0, ty1)):
        out.add_row(level, ty, stored[k * n : (k + 1) * n], digests[k * n : (k + 1) * n])


def _rows_in_place(rows: np.ndarray, elo: int, held: int) -> tuple[int, int]:
    """[a, z): the longest run of `rows` (resolved level rows) that are consecutive rows of the
    band's `held` rows from `elo`, cut to multiples of 4 (whole block rows); (0, 0) if none."""
    inside = (rows >= elo) & (rows < elo + held)
    ok = inside.copy()  # ok[e]: row e continues a run from row e - 1
    ok[1:] &= (np.diff(rows) == 1) & inside[:-1]
    ok[0] = False
    ends = np.append(np.flatnonzero(~ok[1:]) + 1, rows.size)  # where a run cannot go on
    best = (0, 0)
    for k in np.flatnonzero(inside & ~ok).tolist():  # where each run starts
        e = int(ends[np.searchsorted(ends, k + 1)])
        a, z = -(-k // 4) * 4, e // 4 * 4
        if z - a > best[1] - best[0]:
            best = (a, z)
    return best


def _encode_columns(region: np.ndarray, cutter: LevelCutter, fmt: TexelFormat, out: np.ndarray) -> None:
    """The blocks of slot rows `region` (full level rows, C-contiguous) into `out`, a slice of the
    surface's block grid: the left border's columns, the level's and the right border's (and
    padding's). Whole level columns are encoded in place; the few at either edge are gathered."""
    t, b, n = cutter.tile_size, cutter.border, cutter.tiles_x
    inner = min(cutter.width, n * t + b) // 4 * 4
    lb, ib = b // 4, inner // 4
    if lb:
        left = region[:, resolve(np.arange(-b, 0), cutter.width, cutter.mode)]
        out[:, :lb] = bcn.encode_surface(np.ascontiguousarray(left), fmt)
    if ib:
        out[:, lb : lb + ib] = bcn.encode_surface(region, fmt, inner)
    if out.shape[1] > lb + ib:
        right = region[:, resolve(np.arange(inner, n * t + b), cutter.width, cutter.mode)]
        out[:, lb + ib :] = bcn.encode_surface(np.ascontiguousarray(right), fmt)


def _encoded_rows(lr: LevelRows, elo: int, ehi: int, transfer: Transfer) -> np.ndarray:
    """Rows [elo, ehi) of a level as stored: encoded, and bled when the colour has alpha."""
    if not transfer.premultiplied:
        part = lr.data[elo - lr.lo : ehi - lr.lo]
        return part if part.dtype == np.uint8 else transfer.encode(part)
    # The bleed reads BLEED_ROWS rows either side (the stage's margin holds them; at a level's
    # edge there is nothing to read), so every band gives a shared row the same colours.
    blo, bhi = max(lr.lo, elo - BLEED_ROWS), min(lr.hi, ehi + BLEED_ROWS)
    rows = lr.data[blo - lr.lo : bhi - lr.lo]
    enc = rows.copy() if rows.dtype == np.uint8 else transfer.encode(rows)
    bleed(enc, rows, blo, transfer)
    return enc[elo - blo : ehi - blo]


def _opaque(rows: np.ndarray) -> bool:
    """Whether every alpha in a band is 255 (uint8) or exactly 1.0 (float32)."""
    if rows.dtype == np.uint8 and rows.size and rows.flags.c_contiguous and sys.byteorder == "little":
        # Each texel as one little-endian word: alpha is its top byte, so all alpha is 255 exactly
        # when the smallest word is 0xFF000000 or more (one contiguous pass, not every fourth byte).
        return bool(rows.view(np.uint32).min() >= 0xFF000000)
    alpha = rows[..., 3]
    return bool(alpha.min() == (255 if rows.dtype == np.uint8 else 1.0)) if alpha.size else True


def gather_rows(
    idx: np.ndarray, enc: np.ndarray, elo: int, top: np.ndarray | None, bottom: np.ndarray | None, height: int
) -> np.ndarray:
    """Slot rows `idx` (resolved level rows) from the band's encoded rows or the wrap contexts."""
    ehi = elo + enc.shape[0]
    if idx[0] >= elo and idx[-1] < ehi and np.all(np.diff(idx) == 1):
        return enc[idx[0] - elo : idx[-1] - elo + 1]
    if idx.min() >= elo and idx.max() < ehi:  # a clamped edge: rows repeated, all in the band
        return enc[idx - elo]
    out = np.empty((idx.size,) + enc.shape[1:], enc.dtype)
    for k, r in enumerate(idx.tolist()):
        if elo <= r < ehi:
            out[k] = enc[r - elo]
        elif top is not None and r < top.shape[0]:
            out[k] = top[r]
        elif bottom is not None and r >= height - bottom.shape[0]:
            out[k] = bottom[r - (height - bottom.shape[0])]
        else:
            raise AssertionError(f"row {r} of a {height}-row level is in neither the band nor a context")
    return out


class InlinePool:
    """An in-process bake: run each job at submission, in this process (the `WorkerPool` interface)."""

    def __init__(self, state: WorkerState) -> None:
        self.state = state

    def submit(self, job: BandJob | CutJob) -> Task:
        check_interrupt()
        task = Task(job)
        try:
            task.finish(True, execute(job, self.state))
        except Exception as exc:
            task.finish(False, exc)
        return task

    def result(self, task: Task) -> JobResult:
        if not task.ok:
            raise task.value
        return task.value

    def close(self) -> None:
        pass

    def kill(self) -> None:
        pass
