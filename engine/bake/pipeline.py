"""Bake a source into a tile pack: mip pyramid, slots with borders, block compression, in parallel.

How the work is split. The pyramid is made in *stages*; a stage takes one level ``s`` as input
(the source itself, or float32 linear rows from the previous stage), tiles levels ``s .. s+k-1``
and hands level ``s+k`` to the next stage. Its input is cut into *bands* of ``T * 2^(k-1)`` rows,
so that a band holds whole tile rows at every level it tiles, plus a margin of ``B * 2^(k-1)``
rows on each side: the 2x2 box filter of `mips` needs nothing outside a band, and the margin
yields the B border rows of every level. A worker process turns one band into finished tiles
(mips, slots, BCn, supercompression, checksum) and the band's rows of level ``s+k``; the main
process writes the tiles through `PackWriter` (in a deterministic order: results are taken in
submission order) and passes each stage's output on to the next. The last stage holds what is
left (a small level) and tiles it down to one tile.

Who reads the source: workers generate procedural bands themselves (``parallel`` sources, which
pickle small); anything else (in-memory images, libvips streams) is read by the main process, top to
bottom, once (with one job, in-memory ``forkable`` sources are read in place). Band inputs the main
process holds reach the workers through an anonymous shared-memory ring (a memfd handed to each
worker at its start, on Linux), not pickles.

Workers come from the fork server, never from a fork of this (possibly threaded) process; they die
with it, and an interrupt stops them at once: see `workers`. With ``BakeConfig.cluster`` the same
bands run on a Dask cluster's workers instead (`cluster`): no shared ring there, band inputs travel
inside their tasks, and the pack is the same.

Memory is bounded by the band size (`BAND_BYTES`, about four times that per worker) times the jobs
in flight, whatever the image size: neither the source nor any level is ever held whole.

Wrap address mode needs the other end of each level: the first band of a stage returns its
levels' top rows, which the bands at the bottom use (odd-edge texel, padding and bottom border),
and the last band returns its levels' bottom rows, from which the top tile row of each level
(deferred by the first band) is cut at the end.

Bands run in worker processes. The encoder (ispc) and zstd release the GIL, and threads were
measured against processes: on 2 cores a 16384² BC1 + zstd bake ran at the same rate either way
(41-43 against 42-44 MPixel/s), the work around the encoder (mips, borders, slot cutting) being numpy
and Python; processes stay, as they can be killed at once on an interrupt. Any exception, Ctrl-C or SIGTERM
kills the workers, deletes the temporary pack and re-raises (a signal after that cleanup, as the
handler installed before the bake would have); the output path is never left half-written. Scripts
that bake with several jobs need the usual ``if __name__ == "__main__":`` guard (workers import the
main module, as with any spawned multiprocessing worker).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import mmap
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import BakeConfig
from ..errors import EngineError
from ..pack import codec
from ..pack.format import MAX_METADATA, AddressMode, PackHeader, Supercompression, TexelFormat
from ..pack.writer import EncodedTiles, PackWriter
from . import bcn
from .mips import BLEED_ROWS, LevelRows, Transfer, band_levels, bleed
from .source import Source, describe, has_alpha, open_source
from .tiler import LevelCutter
from .workers import PassedFd, Task, WorkerPool, check_interrupt, signals_deferred, start_context

if TYPE_CHECKING:
    from .cluster import ClusterConnection

log = logging.getLogger(__name__)

BAND_BYTES = 32 << 20  # input bytes of one band: bounds worker memory (~4x this) and the ring
FINAL_BYTES = 4 << 20  # a level this small (as float32 RGBA) is finished by one job
MIP_FILTER = "box2x2-linear"  # recorded in the metadata
ALPHA_FORMATS = (TexelFormat.BC3, TexelFormat.BC7, TexelFormat.RGBA8)  # formats that keep alpha


# ---- format choice ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FormatChoice:
    """The texel format a bake uses, and why.

    alpha: the source has real alpha (some alpha below 255); None when not looked for before the
    bake (a format that keeps alpha was given: the bands report it as they are made) or when the
    source cannot be scanned ahead (then its channel count decides an automatic choice).
    """

    texel_format: TexelFormat
    auto: bool  # chosen by the baker (BakeConfig.texel_format was None)
    alpha: bool | None

    @property
    def drops_alpha(self) -> bool:
        return bool(self.alpha) and self.texel_format not in ALPHA_FORMATS

    def premultiplied(self, srgb: bool) -> bool:
        """Whether mips are filtered premultiplied and transparent texels bled: colour (sRGB) that
        may have real alpha, in a format that keeps it. Linear data (masks, packed channels) is not
        colour weighted by coverage, and is filtered channel by channel."""
        return self.alpha is not False and srgb and self.texel_format in ALPHA_FORMATS


def choose_format(source: Source, config: BakeConfig) -> FormatChoice:
    """bc1 for opaque colour and bc7 for real alpha when no format was given (`BakeConfig.format_for`).
    The source is scanned for alpha ahead only for that choice: with a given format the bands report
    the alpha they see (a scan ahead decodes the whole image once more: 3 CPU-seconds of a 16384²
    file), and a format that drops it is warned about when the bake ends."""
    given = config.texel_format
    if source.channels not in (2, 4):
        return FormatChoice(config.format_for(False), given is None, False)
    if given is not None:
        return FormatChoice(given, False, None)
    alpha = has_alpha(source)
    return FormatChoice(config.format_for(alpha is not False), given is None, alpha)


def _warn_dropped_alpha(name: str, fmt: TexelFormat) -> None:
    log.warning("%s has alpha; %s drops it (use --format bc3 or bc7)", name, fmt.name.lower())


# ---- report -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BakeReport:
    """What a bake produced and how fast."""

    path: Path
    width: int
    height: int
    levels: int
    tiles: int
    texel_format: str
    raw_bytes: int  # encoded tile bytes before supercompression
    file_bytes: int  # size of the pack file
    seconds: float
    jobs: int

    @property
    def source_pixels(self) -> int:
        return self.width * self.height

    @property
    def mpixels_per_s(self) -> float:
        return self.source_pixels / 1e6 / max(self.seconds, 1e-9)

    def summary(self) -> str:
        ratio = self.raw_bytes / max(1, self.file_bytes)
        return (
            f"{self.path}: {self.width} x {self.height}, {self.levels} levels, {self.tiles:,} tiles "
            f"{self.texel_format}, {self.file_bytes / 2**20:,.1f} MiB (x{ratio:.2f}) in "
            f"{self.seconds:.2f} s, {self.mpixels_per_s:,.1f} MPixel/s on {self.jobs} jobs"
        )

    def as_dict(self) -> dict:
        return {
            "path": str(self.path),
            "width": self.width,
            "height": self.height,
            "levels": self.levels,
            "tiles": self.tiles,
            "format": self.texel_format,
            "raw_bytes": self.raw_bytes,
            "file_bytes": self.file_bytes,
            "seconds": self.seconds,
            "jobs": self.jobs,
            "source_pixels": self.source_pixels,
            "mpixels_per_s": self.mpixels_per_s,
        }


# ---- stage plan -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    """Levels ``level .. level+count-1`` tiled from bands of level ``level``'s rows."""

    index: int
    level: int
    count: int
    final: bool
    width: int
    height: int
    band: int  # rows of level `level` per band
    margin: int  # extra rows each side

    @property
    def bands(self) -> int:
        return -(-self.height // self.band)

    def content(self, i: int) -> tuple[int, int]:
        return i * self.band, min(self.height, (i + 1) * self.band)

    def window(self, i: int) -> tuple[int, int]:
        a, b = self.content(i)
        return max(0, a - self.margin), min(self.height, b + self.margin)


def plan_stages(
    header: PackHeader,
    band_bytes: int | None = None,
    final_bytes: int | None = None,
    min_bands: int = 1,
    context: int = 0,
) -> list[Stage]:
    """Split the pyramid into stages whose bands stay within `band_bytes` (at least one tile row)
    and, where the level is tall enough, number at least `min_bands` (work for every worker, and a
    short wait for the last band); a level of at most `final_bytes` (as float32 RGBA) is finished
    in one job. `context`: rows each band reads past its border at every level it tiles (bleeding
    colour into transparent texels reads `mips.BLEED_ROWS`)."""
    band_bytes = BAND_BYTES if band_bytes is None else band_bytes
    final_bytes = FINAL_BYTES if final_bytes is None else final_bytes
    t, b = header.tile_size, header.border
    stages: list[Stage] = []
    s = 0
    while s < header.level_count:
        w, h = header.level_dims(s)
        remaining = header.level_count - s
        texel = 4 if s == 0 else 16  # uint8 RGBA source rows, float32 RGBA after
        if remaining == 1 or w * h * 16 <= final_bytes:
            stages.append(Stage(len(stages), s, remaining, True, w, h, h, 0))
            break
        k = 1
        while (
            k + 1 < remaining
            # Two levels per band are worth 4x the memory: a band's float output for the next
            # stage (16 bytes a texel) shrinks 4x with every level, and it travels between processes.
            and (t << k) * w * texel <= (band_bytes if k > 1 else 4 * band_bytes)
            and -(-h // (t << k)) >= min_bands
        ):
            k += 1
        stages.append(Stage(len(stages), s, k, False, w, h, t << (k - 1), (b + context) << (k - 1)))
        s += k
    return stages


# ---- jobs (pickled to workers) ---------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """Everything a worker needs besides the job itself."""

    header: PackHeader
    transfer: Transfer
    bc7_quality: str
    zstd_level: int
    alpha: bool = True  # the source may have real alpha (steers the BC7 encoder)


@dataclass(frozen=True)
class RingRef:
    """A band's rows in the shared ring: byte offset, row count, width, dtype (uint8 or float32)."""

    offset: int
    rows: int
    width: int
    dtype: str


@dataclass
class BandJob:
    stage: Stage
    band: int
    data: RingRef | np.ndarray | None  # None: the worker reads the source itself
    source: Source | None = None  # a picklable source (procedural); else see `data`
    top_rows: dict[int, np.ndarray] = field(default_factory=dict)  # level -> uint8 rows [0, n)
    top_row0: dict[int, np.ndarray] = field(default_factory=dict)  # level -> row 0 as filtered
    bottom_rows: dict[int, np.ndarray] = field(default_factory=dict)  # level -> uint8 rows [h-n, h)
    skip_row0: bool = False  # leave each level's tile row 0 to a later CutJob (wrap)
    want_top: bool = False
    want_bottom: bool = False


@dataclass
class CutJob:
    level: int
    ty: int
    rows: np.ndarray  # (S, width, 4) uint8, already resolved by the address mode


@dataclass
class JobResult:
    tiles: EncodedTiles = field(default_factory=EncodedTiles)
    output: np.ndarray | None = None
    top_rows: dict[int, np.ndarray] = field(default_factory=dict)
    top_row0: dict[int, np.ndarray] = field(default_factory=dict)
    bottom_rows: dict[int, np.ndarray] = field(default_factory=dict)
    alpha: bool = False  # a stage-0 band held alpha below 255


# ---- worker side ------------------------------------------------------------------------------------
@dataclass
class _WorkerState:
    settings: Settings
    ring: mmap.mmap | None = None
    source: Source | None = None  # read in place (one job, in this process)
    ring_fd: Any = None  # workers.PassedFd of the ring's memfd, mapped by each worker
    ring_size: int = 0


_worker: _WorkerState | None = None


def _init_worker(state: _WorkerState) -> None:
    global _worker
    _tune_malloc()
    if state.ring_fd is not None:
        state.ring = mmap.mmap(state.ring_fd.fd, state.ring_size)
        os.close(state.ring_fd.fd)
        state.ring_fd = None
    _worker = state
    _warm_tables(state.settings)


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


def _warm_tables(settings: Settings) -> None:
    _warm_transfer(settings.transfer)


def _warm_transfer(t: Transfer) -> None:
    t.reduce(np.zeros((2, 2, 4), np.uint8), None, AddressMode.CLAMP)
    t.encode(np.zeros((1, 1, 4), np.float32))


def warm_worker_tables() -> None:
    """Build every transfer's tables (run once in the fork server; workers inherit them)."""
    for srgb in (False, True):
        for alpha in (False, True):
            _warm_transfer(Transfer(srgb=srgb, alpha=alpha))


def _run_job(job: BandJob | CutJob) -> JobResult:
    assert _worker is not None, "worker not initialised"
    return _execute(job, _worker)


def run_job_in_this_process(settings: Settings, job: BandJob | CutJob) -> JobResult:
    """Run one job in a process this bake did not start (a Dask worker): its state is made once per
    process and settings, as `_init_worker` makes it for the bake's own workers."""
    return _execute(job, _settled_state(settings))


@lru_cache(maxsize=4)
def _settled_state(settings: Settings) -> _WorkerState:
    _tune_malloc()
    _warm_tables(settings)
    return _WorkerState(settings)


def _execute(job: BandJob | CutJob, state: _WorkerState) -> JobResult:
    """Run one job (in a worker process, or inline when jobs == 1)."""
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
    for tx, slot in cutter.cut(rows):
        raw = bcn.encode_slot(slot, h.texel_format, bc7_quality=settings.bc7_quality, srgb=h.srgb, alpha=settings.alpha)
        stored, digest = codec.encode(raw, h.supercompression, settings.zstd_level)
        out.add(level, tx, ty, stored, digest)


def _band_input(job: BandJob, state: _WorkerState, lo: int, hi: int) -> np.ndarray:
    ref = job.data
    if isinstance(ref, RingRef):
        assert state.ring is not None
        a = np.frombuffer(state.ring, np.dtype(ref.dtype), ref.rows * ref.width * 4, ref.offset)
        return a.reshape(ref.rows, ref.width, 4)
    if ref is not None:
        return ref
    source = job.source or state.source
    assert source is not None
    rows = source.read_rows(lo, hi)
    if rows.shape != (hi - lo, source.width, 4) or rows.dtype != np.uint8:
        raise EngineError(
            f"source {source.name} returned {rows.shape} {rows.dtype} for rows {lo}..{hi}, "
            f"expected ({hi - lo}, {source.width}, 4) uint8"
        )
    return np.ascontiguousarray(rows)


def _run_band(job: BandJob, state: _WorkerState) -> JobResult:
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
        LevelRows(st.level, lo, hi, data), reductions, h.level_dims, transfer, h.address_mode, job.top_row0.__getitem__
    )
    for lr in levels:
        d = lr.level - st.level
        lw, lh = h.level_dims(lr.level)
        ca = a0 >> d
        cb = lh if b0 >= st.height else b0 >> d
        if d == st.count:  # the next stage's input
            res.output = lr.data[ca - lr.lo : cb - lr.lo].copy()
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
        for ty in range(ca // t, -(-cb // t)):
            if ty == 0 and job.skip_row0:
                continue
            rows = _gather(
                cutter.slot_rows(ty), enc, elo, job.top_rows.get(lr.level), job.bottom_rows.get(lr.level), lh
            )
            _encode_row(settings, cutter, lr.level, ty, rows, res.tiles)
    return res


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
    alpha = rows[..., 3]
    return bool(alpha.min() == (255 if rows.dtype == np.uint8 else 1.0)) if alpha.size else True


def _gather(
    idx: np.ndarray, enc: np.ndarray, elo: int, top: np.ndarray | None, bottom: np.ndarray | None, height: int
) -> np.ndarray:
    """Slot rows `idx` (resolved level rows) from the band's encoded rows or the wrap contexts."""
    ehi = elo + enc.shape[0]
    if idx[0] >= elo and idx[-1] < ehi and np.all(np.diff(idx) == 1):
        return enc[idx[0] - elo : idx[-1] - elo + 1]
    out = np.empty((idx.size,) + enc.shape[1:], np.uint8)
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


# ---- main side ---------------------------------------------------------------------------------------
class _Feed:
    """The input rows of one stage, arriving in order, handed out as overlapping band windows.

    Stage 0 either reads the source here (`source`), or leaves reading to the workers (`remote`);
    later stages receive the previous stage's output rows through `add`.
    """

    def __init__(self, stage: Stage, source: Source | None = None, remote: bool = False) -> None:
        self.stage = stage
        self.source = source
        self.remote = remote
        self.next_band = 0
        self.chunks: list[tuple[int, np.ndarray]] = []
        self.have = 0  # rows [0, have) have arrived
        self.dtype = np.dtype(np.uint8 if stage.index == 0 else np.float32)
        self.top: JobResult | None = None
        self.bottom: JobResult | None = None
        self.deferred_sent = False

    @property
    def finished(self) -> bool:
        return self.next_band >= self.stage.bands

    def add(self, start: int, rows: np.ndarray) -> None:
        assert start == self.have, f"stage {self.stage.index}: rows {start}.. arrived after {self.have}"
        if rows.shape[0]:
            self.chunks.append((start, rows))
            self.have += rows.shape[0]

    def ready(self) -> bool:
        if self.finished:
            return False
        if self.source is not None or self.remote:
            return True
        return self.have >= self.stage.window(self.next_band)[1]

    def window_rows(self, out: np.ndarray | None = None) -> np.ndarray:
        """Rows of the next band's window (reading the source as needed), copied into `out` if given
        (else a view when possible); then drops the rows no later band needs."""
        lo, hi = self.stage.window(self.next_band)
        into = getattr(self.source, "read_rows_into", None)
        if out is not None and self.source is not None and self.have < hi and callable(into):
            return self._window_into(lo, hi, out, into)
        if self.source is not None and self.have < hi:
            rows = self.source.read_rows(self.have, hi)
            if rows.shape != (hi - self.have, self.stage.width, 4) or rows.dtype != np.uint8:
                raise EngineError(
                    f"source {self.source.name} returned {rows.shape} {rows.dtype} for rows "
                    f"{self.have}..{hi}, expected ({hi - self.have}, {self.stage.width}, 4) uint8"
                )
            self.add(self.have, rows)
        parts = [(s, c) for s, c in self.chunks if s < hi and s + c.shape[0] > lo]
        if out is None and len(parts) == 1 and parts[0][0] <= lo and parts[0][0] + parts[0][1].shape[0] >= hi:
            s, c = parts[0]
            rows = c[lo - s : hi - s]
        else:
            rows = out if out is not None else np.empty((hi - lo, self.stage.width, 4), self.dtype)
            for s, c in parts:
                a, z = max(lo, s), min(hi, s + c.shape[0])
                rows[a - lo : z - lo] = c[a - s : z - s]
        self._drop(hi)
        return rows

    def _window_into(self, lo: int, hi: int, out: np.ndarray, into: Callable) -> np.ndarray:
        """The source writes the new rows straight into `out`; rows later bands share are kept."""
        for s, c in self.chunks:  # rows [lo, have) from the previous window's tail
            a, z = max(lo, s), min(self.have, s + c.shape[0])
            if z > a:
                out[a - lo : z - lo] = c[a - s : z - s]
        into(self.have, hi, out[self.have - lo :])
        nxt = self.stage.window(self.next_band + 1)[0] if self.next_band + 1 < self.stage.bands else hi
        self.chunks = [(nxt, out[nxt - lo :].copy())] if nxt < hi else []  # `out` is recycled later
        self.have = hi
        return out

    def _drop(self, hi: int) -> None:
        nxt = self.stage.window(self.next_band + 1)[0] if self.next_band + 1 < self.stage.bands else hi
        self.chunks = [(s, c) if s >= nxt else (nxt, c[nxt - s :]) for s, c in self.chunks if s + c.shape[0] > nxt]


class _InlinePool:
    """jobs == 1: run each job at submission, in this process (the `WorkerPool` interface)."""

    def __init__(self, state: _WorkerState) -> None:
        self.state = state

    def submit(self, job: BandJob | CutJob) -> Task:
        check_interrupt()
        task = Task(job)
        try:
            task.finish(True, _execute(job, self.state))
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


_Pool = WorkerPool | _InlinePool  # or cluster.ClusterPool (dask is optional: not imported here)


class _Baker:
    def __init__(
        self,
        source: Source,
        out: Path,
        config: BakeConfig,
        metadata: dict,
        choice: FormatChoice,
        cluster: ClusterConnection | None = None,
    ) -> None:
        self.source = source
        self.cluster = cluster  # opened and closed by `bake`
        self.out = out
        self.config = config
        self.choice = choice
        self.header = PackHeader(
            width=source.width,
            height=source.height,
            texel_format=choice.texel_format,
            srgb=config.is_srgb,
            tile_size=config.tile_size,
            border=config.border,
            address_mode=config.address_mode,
            supercompression=config.supercompression,
        )
        alpha = choice.alpha is not False
        cutout = choice.premultiplied(self.header.srgb)
        transfer = Transfer(srgb=self.header.srgb, alpha=alpha, premultiplied=cutout)
        self.settings = Settings(self.header, transfer, config.bc7_quality, config.zstd_level, alpha)
        # On a cluster, as many jobs as it has worker threads: the band plan and the order of the
        # writes then equal a local bake's with that many jobs, byte for byte.
        self.jobs = max(1, config.jobs or cluster.threads) if cluster is not None else max(1, config.worker_count)
        # BC7 costs ~300x BC1 per texel: smaller bands keep every worker busy to the end.
        slow = self.header.texel_format is TexelFormat.BC7
        band_bytes = BAND_BYTES // 8 if slow else BAND_BYTES
        self.stages = plan_stages(self.header, band_bytes, min_bands=2 * self.jobs, context=BLEED_ROWS if cutout else 0)
        self.alpha_seen = False  # some stage-0 band held alpha below 255
        self.metadata = metadata
        self.max_in_flight = self.jobs + 1  # one band queued behind the running ones: no idle worker
        # Who reads the source: workers generate picklable ones themselves; with one job, this
        # process reads in-memory ones in place; else this process reads it into the ring.
        # On a cluster, workers also read files that libvips reads region by region (`cluster.worker_source`).
        self.band_source: Source | None = source if getattr(source, "parallel", False) else None
        if cluster is not None:
            from .cluster import worker_source

            self.band_source = worker_source(source)
        self.pickled_source = self.band_source is not None
        in_place = cluster is None and self.jobs == 1 and bool(getattr(source, "forkable", False))
        self.shared_source = not self.pickled_source and in_place
        remote = self.pickled_source or self.shared_source
        self.feeds = [_Feed(self.stages[0], None if remote else source, remote)]
        self.feeds += [_Feed(st) for st in self.stages[1:]]
        self.pending: deque[tuple[Task, BandJob | CutJob, int | None]] = deque()
        self.ring: mmap.mmap | None = None
        self.free_slots: list[int] = []
        self.slot_bytes = 0
        self.writer: PackWriter | None = None
        self.bar: Any = None  # tqdm progress bar
        self.raw_bytes = 0

    # ---- pool -------------------------------------------------------------------------------------
    def _start_pool(self) -> _Pool:
        if self.cluster is not None:
            from .cluster import ClusterPool

            return ClusterPool(self.cluster, self.settings)
        state = _WorkerState(self.settings, None, self.source if self.shared_source else None)
        if self.jobs == 1:
            _warm_tables(self.settings)
            return _InlinePool(state)
        # Band inputs the main process holds travel through a shared ring, not pickles.
        sizes = [
            (st.band + 2 * st.margin) * st.width * 4 * (1 if st.index == 0 else 4)
            for st in self.stages
            if st.index > 0 or self.feeds[0].source is not None
        ]
        memfd = getattr(os, "memfd_create", None)
        if sizes and memfd is not None:
            self.slot_bytes = -(-max(sizes) // mmap.PAGESIZE) * mmap.PAGESIZE
            size = self.slot_bytes * self.max_in_flight
            fd = memfd("texstream-bake-ring", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, size)
                self.ring = mmap.mmap(fd, size)
                self.free_slots = list(range(self.max_in_flight))
                state.ring_fd, state.ring_size = PassedFd(fd), size
                return WorkerPool(self.jobs, _init_worker, (state,), _run_job)
            finally:
                os.close(fd)  # the workers got their own copies at their start
        return WorkerPool(self.jobs, _init_worker, (state,), _run_job)

    # ---- scheduling ------------------------------------------------------------------------------
    def _submit(self, pool: _Pool, job: BandJob | CutJob, slot: int | None) -> None:
        self.pending.append((pool.submit(job), job, slot))

    def _pump(self, pool: _Pool) -> None:
        progress = True
        while progress and len(self.pending) < self.max_in_flight:
            progress = False
            for feed in reversed(self.feeds):  # later stages first: frees their buffered rows
                while feed.ready() and len(self.pending) < self.max_in_flight:
                    check_interrupt()
                    job, slot = self._next_band(feed)
                    if job is None:
                        break
                    self._submit(pool, job, slot)
                    progress = True

    def _next_band(self, feed: _Feed) -> tuple[BandJob | None, int | None]:
        st, i = feed.stage, feed.next_band
        wrap = self.header.address_mode is AddressMode.WRAP and st.bands > 1
        needs_top = wrap and i > 0 and st.window(i)[1] >= st.height
        if needs_top and feed.top is None:
            return None, None  # waits for band 0's result
        slot = None
        data: RingRef | np.ndarray | None = None
        if feed.remote:
            pass
        elif self.ring is not None:
            if not self.free_slots:
                return None, None
            slot = self.free_slots.pop()
            lo, hi = st.window(i)
            ref = RingRef(slot * self.slot_bytes, hi - lo, st.width, feed.dtype.name)
            view = np.frombuffer(self.ring, feed.dtype, ref.rows * ref.width * 4, ref.offset)
            feed.window_rows(view.reshape(ref.rows, ref.width, 4))
            del view
            data = ref
        else:
            data = np.ascontiguousarray(feed.window_rows())
        job = BandJob(
            st,
            i,
            data,
            self.band_source if feed.remote and self.pickled_source else None,
            skip_row0=wrap and i == 0,
            want_top=wrap and i == 0,
            want_bottom=wrap and i == st.bands - 1,
        )
        if needs_top:
            assert feed.top is not None
            job.top_rows, job.top_row0 = feed.top.top_rows, feed.top.top_row0
        feed.next_band += 1
        return job, slot

    def _process_oldest(self, pool: _Pool) -> None:
        task, job, slot = self.pending.popleft()
        res = pool.result(task)
        if slot is not None:
            self.free_slots.append(slot)
        writer = self.writer
        assert writer is not None
        self.alpha_seen |= res.alpha
        raw = self.header.tile_raw_size
        writer.add_encoded_batch(res.tiles)
        self.raw_bytes += raw * len(res.tiles)
        if self.bar is not None:
            self.bar.update(len(res.tiles))
        if isinstance(job, CutJob):
            return
        feed = self.feeds[job.stage.index]
        if job.want_top:
            feed.top = res
        if job.want_bottom:
            feed.bottom = res
        if res.output is not None:
            st = job.stage
            self.feeds[st.index + 1].add(st.content(job.band)[0] >> st.count, res.output)
        if feed.top is not None and feed.bottom is not None and not feed.deferred_sent:
            feed.deferred_sent = True
            for cut in self._deferred_cuts(feed):
                self._submit(pool, cut, None)

    def _deferred_cuts(self, feed: _Feed) -> list[CutJob]:
        """Tile row 0 of each level of a wrapped stage, from its top rows and the level's bottom rows."""
        assert feed.top is not None and feed.bottom is not None
        h = self.header
        jobs = []
        for level, top in feed.top.top_rows.items():
            w, lh = h.level_dims(level)
            bottom = feed.bottom.bottom_rows[level]
            cutter = LevelCutter(w, lh, h.tile_size, h.border, h.address_mode)
            rows = _gather(cutter.slot_rows(0), top[:0], 0, top, bottom, lh)
            jobs.append(CutJob(level, 0, rows))
        return jobs

    # ---- run --------------------------------------------------------------------------------------
    def run(self) -> BakeReport:
        start = time.perf_counter()
        self.writer = PackWriter(self.out, self.header, self.metadata)
        pool = None
        failed = True
        try:
            pool = self._start_pool()
            if self.config.progress:
                from tqdm import tqdm

                self.bar = tqdm(
                    total=self.header.tile_count, unit="tile", desc=self.out.name, leave=False, dynamic_ncols=True
                )
            while True:
                self._pump(pool)
                if not self.pending:
                    break
                self._process_oldest(pool)
            unfinished = [f.stage.index for f in self.feeds if not f.finished]
            if unfinished:
                raise EngineError(f"internal error: stages {unfinished} did not finish")
            pool.close()
            pool = None
            check_interrupt()
            if self.choice.alpha is None:  # not scanned ahead: what the bands saw
                self.writer.metadata["alpha"] = self.alpha_seen
                if self.alpha_seen and self.header.texel_format not in ALPHA_FORMATS:
                    _warn_dropped_alpha(self.source.name, self.header.texel_format)
                if not self.alpha_seen:  # opaque bands took the straight filter
                    self.writer.metadata["mip_filter"] = MIP_FILTER
            self.writer.commit()
            failed = False
        finally:
            if self.bar is not None:
                self.bar.close()
            if failed:
                try:
                    if pool is not None:
                        pool.kill()  # at once: no result is wanted any more
                finally:
                    self.writer.abort()
            if self.ring is not None:
                try:
                    self.ring.close()
                except BufferError:  # a view outlived its job (only after an error): the GC frees it
                    pass
        seconds = time.perf_counter() - start
        h = self.header
        return BakeReport(
            path=self.out,
            width=h.width,
            height=h.height,
            levels=h.level_count,
            tiles=h.tile_count,
            texel_format=h.texel_format.name.lower(),
            raw_bytes=self.raw_bytes,
            file_bytes=self.out.stat().st_size,
            seconds=seconds,
            jobs=self.jobs,
        )


# ---- public API ---------------------------------------------------------------------------------------
def bake(
    source: Source,
    out_path: str | os.PathLike[str],
    config: BakeConfig | None = None,
    metadata: dict | None = None,
) -> BakeReport:
    """Bake `source` into a pack at `out_path` (written atomically) and report what it took.

    `metadata` is merged over the automatic metadata (source description, every creation parameter).
    """
    config = config or BakeConfig()
    if not isinstance(config, BakeConfig):
        raise TypeError(f"config must be a BakeConfig, got {type(config).__name__}")
    for attr in ("name", "width", "height", "channels", "read_rows"):
        if not hasattr(source, attr):
            raise TypeError(f"source {source!r} has no {attr!r}: it is not a texstream Source")
    if source.channels not in (1, 2, 3, 4):
        raise ValueError(f"source {source.name} has {source.channels!r} channels, expected 1 to 4")
    out = Path(out_path)
    if out.is_dir():
        raise EngineError(f"output {out} is a folder")
    choice = choose_format(source, config)
    if choice.drops_alpha:
        _warn_dropped_alpha(source.name, choice.texel_format)
    config = dataclasses.replace(config, texel_format=choice.texel_format)
    meta = creation_metadata(source, config, choice)
    meta.update(metadata or {})
    try:  # found out now, not when the pack is written after the whole bake
        size = len(json.dumps(meta, sort_keys=True, separators=(",", ":")).encode())
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metadata must be JSON-serialisable: {exc}") from None
    if size > MAX_METADATA:
        raise ValueError(f"metadata is {size} bytes, over the {MAX_METADATA}-byte cap")
    with signals_deferred():
        cluster = _open_cluster(config.cluster) if config.cluster is not None else None
        try:
            baker = _Baker(source, out, config, meta, choice, cluster)
            stages = [(s.level, s.count, s.bands) for s in baker.stages]
            where = f" on the Dask cluster {config.cluster}" if cluster else ""
            log.info(
                "baking %s (%dx%d) into %s: %d levels, %d tiles, stages %s%s",
                source.name,
                source.width,
                source.height,
                out,
                baker.header.level_count,
                baker.header.tile_count,
                stages,
                where,
            )
            report = baker.run()
        finally:
            if cluster is not None:
                cluster.close()
    log.info("%s", report.summary())
    return report


def _open_cluster(spec: str) -> ClusterConnection:
    from .cluster import ClusterConnection

    return ClusterConnection.open(spec)


def creation_metadata(source: Source, config: BakeConfig, choice: FormatChoice | None = None) -> dict:
    """The metadata every pack records: tool, source, and each creation parameter.

    ``format_auto``: the baker chose the format; ``alpha``: the source has real alpha (null when it
    could not be told); ``mip_filter`` ends in ``-premultiplied`` when colour was filtered weighted
    by alpha and transparent texels were bled.
    """
    from .. import __version__

    choice = choice or choose_format(source, config)
    fmt = choice.texel_format
    srgb = config.srgb if config.srgb is not None else fmt.colour
    premultiplied = choice.premultiplied(srgb)
    meta = {"tool": f"texstream {__version__}", "mip_filter": MIP_FILTER + ("-premultiplied" if premultiplied else "")}
    meta.update(describe(source))
    meta.update(
        {
            "format": fmt.name.lower(),
            "format_auto": choice.auto,
            "alpha": choice.alpha,
            "srgb": srgb,
            "tile_size": config.tile_size,
            "border": config.border,
            "address_mode": config.address_mode.name.lower(),
            "supercompression": config.supercompression.name.lower(),
        }
    )
    if config.supercompression is Supercompression.ZSTD:
        meta["zstd_level"] = config.zstd_level
    if fmt is TexelFormat.BC7:
        meta["bc7_quality"] = config.bc7_quality
    return meta


def bake_file(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    config: BakeConfig | None = None,
    metadata: dict | None = None,
) -> BakeReport:
    """Open an image file (`open_source`: Pillow, or libvips for huge images) and bake it."""
    config = config or BakeConfig()
    if config.cluster is None and config.worker_count > 1:
        start_context()  # the fork server starts (imports, tables) while the file is opened
    with signals_deferred():  # libvips may call into Python while it opens the file, too
        return bake(open_source(path), out, config, metadata)


def bake_procedural(
    out: str | os.PathLike[str],
    size: int,
    pattern: str = "terrain",
    seed: int = 1,
    config: BakeConfig | None = None,
    *,
    height: int | None = None,
    metadata: dict | None = None,
) -> BakeReport:
    """Bake a procedural pattern of `size` x `height` (default square) texels."""
    from .procedural import ProceduralSource

    source = ProceduralSource(pattern, size, size if height is None else height, seed)
    return bake(source, out, config, metadata)


__all__ = [
    "ALPHA_FORMATS",
    "BakeReport",
    "FormatChoice",
    "Stage",
    "bake",
    "bake_file",
    "bake_procedural",
    "choose_format",
    "creation_metadata",
    "plan_stages",
]
