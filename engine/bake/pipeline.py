"""Bake a source into a tile pack: mip pyramid, slots with borders, block compression, in parallel.

How the work is split. The pyramid is made in *stages*; a stage takes one level ``s`` as input
(the source itself, or float32 linear rows from the previous stage), tiles levels ``s .. s+k-1``
and hands level ``s+k`` to the next stage. Its input is cut into *bands* of ``T * 2^(k-1)`` rows,
so that a band holds whole tile rows at every level it tiles, plus a margin of ``B * 2^(k-1)``
rows on each side: the 2x2 box filter of `mips` needs nothing outside a band, and the margin
yields the B border rows of every level. A worker process turns one band into finished tiles
(mips, slots, BCn, supercompression, checksum, the tiles' payload laid out as the pack stores it)
and the band's rows of level ``s+k``; the main process writes each band's payload with one write
through `PackWriter` (in a deterministic order: results are taken in submission order). The last
stage holds what is left (a small level) and tiles it down to one tile.

What the main process does is all that more cores cannot share, so it only routes: on Linux one
anonymous shared memory (a memfd each worker maps at its start) holds every level after the
first in a *ring of rows* (`jobs.LevelRing`): a stage's workers write their output rows into it
and the next stage's workers read their windows from it in place, the main process passing row
numbers only (a band waits while its rows would overwrite rows still to be read); the same memory
holds one payload slot per job in flight, which the main process writes to the pack from.
Measured on the 2-core box for an 8192² BC1 + zstd bake from an uncompressed TIFF, the main
process's share of the bake's CPU time went from 35-44 % (reading the source through libvips,
unpickling levels and tiles, assembling windows) to 7-8 % with 2 or 16 jobs, most of what is
left the kernel's work of writing the pack (BC5's pack, twice the bytes: about 20 %).

Who reads the source: workers generate procedural bands themselves (``parallel`` sources, which
pickle small), and read an uncompressed strip TIFF's bands straight from the file
(`tiff_strips.StripRows`); anything else (in-memory images, PNG
and JPEG, compressed TIFF: libvips streams, which decode top to bottom and are serial by nature)
is read by the main process, top to bottom, once (with one job, in-memory ``forkable`` sources are
read in place), into slots of the same shared memory. Without memfd (not Linux) band inputs and
outputs travel pickled.

Small images (`IN_PROCESS_PIXELS`, with the default job count) bake in process: no workers.

Workers come from the fork server, never from a fork of this (possibly threaded) process; they die
with it, and an interrupt stops them at once: see `workers`. With ``BakeConfig.cluster`` the same
bands run on a Dask cluster's workers instead (`cluster`): no shared ring there, band inputs travel
inside their tasks, and the pack is the same.

Memory is bounded by the band size (`jobs.BAND_BYTES`, about four times that per worker) times the jobs
in flight, whatever the image size: neither the source nor any level is ever held whole (a ring
holds two band windows and the output of every job in flight, `ring_rows`).

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
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..config import BakeConfig
from ..errors import EngineError
from ..pack.format import MAX_METADATA, AddressMode, PackHeader, TexelFormat
from ..pack.writer import PackedTiles, PackWriter
from . import jobs
from .bands import InlinePool, WorkerState, gather_rows, init_worker, run_job, warm_tables
from .feeds import StageFeed
from .format_choice import ALPHA_FORMATS, MIP_FILTER, FormatChoice, choose_format, creation_metadata, warn_dropped_alpha
from .jobs import BandJob, CutJob, LevelRing, RingRef, RingWindow, Settings, Stage, plan_stages
from .mips import BLEED_ROWS, Transfer
from .progress_bar import DelayedBar
from .report import BakeReport, JobTiming
from .source import Source, VipsSource, open_source, texel_dtype
from .tiler import LevelCutter
from .workers import PassedFd, Task, WorkerPool, check_interrupt, signals_deferred, start_context

if TYPE_CHECKING:
    from .cluster import ClusterConnection

log = logging.getLogger(__name__)


# ---- main side ---------------------------------------------------------------------------------------
_Pool = WorkerPool | InlinePool  # or cluster.ClusterPool (dask is optional: not imported here)


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
        floats = self.header.texel_format.float_texels
        transfer = Transfer(srgb=self.header.srgb, alpha=alpha, premultiplied=cutout, float_texels=floats)
        self.settings = Settings(self.header, transfer, config.bc7_quality, config.zstd_level, alpha)
        # On a cluster, as many jobs as it has worker threads: the band plan and the order of the
        # writes then equal a local bake's with that many jobs, byte for byte.
        self.jobs = max(1, config.jobs or cluster.threads) if cluster is not None else max(1, config.worker_count)
        # A small image with the default job count bakes here, in this process: starting workers
        # costs more than they save. The band plan stays that of `jobs` workers, so the pack is the
        # same byte for byte as one the workers would have written.
        self.in_process = cluster is None and (self.jobs == 1 or bakes_in_process(config, source.width * source.height))
        # BC7 costs ~300x BC1 per texel: smaller bands keep every worker busy to the end.
        slow = self.header.texel_format is TexelFormat.BC7
        band_bytes = jobs.BAND_BYTES // 8 if slow else jobs.BAND_BYTES  # read at bake time: tests shrink it
        self.stages = plan_stages(self.header, band_bytes, min_bands=2 * self.jobs, context=BLEED_ROWS if cutout else 0)
        self.alpha_seen = False  # some stage-0 band held alpha below 255
        self.metadata = metadata
        self.max_in_flight = self.jobs + 1  # one band queued behind the running ones: no idle worker
        # Who reads the source: workers generate picklable ones themselves; with one job, this
        # process reads in-memory ones in place; else this process reads it into the ring.
        # On a cluster, workers also read files that libvips reads region by region (`cluster.worker_source`).
        self.band_source: Source | None = source if getattr(source, "parallel", False) else None
        if self.band_source is None and cluster is None and isinstance(source, VipsSource):
            from .tiff_strips import worker_rows  # only libvips sources can be strip TIFFs

            self.band_source = worker_rows(source)  # None unless an uncompressed strip TIFF
        if cluster is not None:
            from .cluster import worker_source

            self.band_source = worker_source(source)
        self.pickled_source = self.band_source is not None
        in_place = self.in_process and bool(getattr(source, "forkable", False))
        self.shared_source = not self.pickled_source and in_place
        remote = self.pickled_source or self.shared_source
        self.feeds = [StageFeed(self.stages[0], None if remote else source, remote, texel_dtype(source))]
        self.feeds += [StageFeed(st) for st in self.stages[1:]]
        self.pending: deque[tuple[Task, BandJob | CutJob, int | None, float]] = deque()
        self.timeline: list[JobTiming] = []
        self.began = time.perf_counter()  # reset when `run` starts
        self.worker_cpu = 0.0
        self.ring: mmap.mmap | None = None
        self.free_slots: list[int] = []
        self.slot_bytes = 0
        self.free_payloads: list[int] = []  # offsets of free payload slots in `ring`
        self.payload_bytes = 0
        self.payload_fd = -1  # the shared memory, where this process reads the payload slots
        self.payload_buffer: bytearray | None = None  # what it reads them into (one slot, reused)
        self.writer: PackWriter | None = None
        self.bar = DelayedBar(self.header.tile_count, self.out.name, config.progress)
        self.raw_bytes = 0

    # ---- pool -------------------------------------------------------------------------------------
    def _start_pool(self) -> _Pool:
        if self.cluster is not None:
            from .cluster import ClusterPool

            return ClusterPool(self.cluster, self.settings)
        state = WorkerState(self.settings, None, self.source if self.shared_source else None)
        if self.in_process:
            warm_tables(self.settings)
            size = self._layout_rings(0)
            if size:
                self.ring = state.ring = mmap.mmap(-1, size)
            return InlinePool(state)
        # Everything the main process would pass between stages stays in shared memory: band
        # inputs it reads from the source in slots, every later level in a ring of rows that one
        # stage's workers write and the next stage's workers read.
        memfd = getattr(os, "memfd_create", None)
        size = 0
        if memfd is not None:
            if self.feeds[0].source is not None:
                st = self.stages[0]
                row_bytes = st.width * 4 * self.feeds[0].dtype.itemsize  # uint8 texels, or float32 (HDR)
                self.slot_bytes = -(-((st.band + 2 * st.margin) * row_bytes) // mmap.PAGESIZE) * mmap.PAGESIZE
            size = self._layout_rings(self.slot_bytes * self.max_in_flight)
            # The tiles' payloads come back the same way: each job lays its tiles out in a slot of
            # its own, which this process writes to the pack from there.
            self.payload_bytes = -(-self._payload_bound() // mmap.PAGESIZE) * mmap.PAGESIZE
            self.free_payloads = [size + k * self.payload_bytes for k in range(self.max_in_flight)]
            size += self.payload_bytes * self.max_in_flight
        if memfd is not None and size:
            fd = memfd("texstream-bake-ring", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, size)
                self.ring = mmap.mmap(fd, size)
                self.free_slots = list(range(self.max_in_flight)) if self.slot_bytes else []
                state.ring_fd, state.ring_size = PassedFd(fd), size
                early = self._read_first_bands()
                pool = self._submitted(WorkerPool(self.jobs, init_worker, (state,), run_job), early)
                # This process reads the payload slots (with preadv, into one reused buffer) rather
                # than through its mapping: a page fault per 4 KiB of a slot it never touched
                # costs it more than the copy, and setting up every slot's pages at once costs
                # it the slots' whole size, most of which no band fills.
                self.payload_fd = os.dup(fd)
                return pool
            finally:
                os.close(fd)  # the workers got their own copies at their start
        early = self._read_first_bands()
        return self._submitted(WorkerPool(self.jobs, init_worker, (state,), run_job), early)

    def _read_first_bands(self) -> list[tuple[BandJob, int | None]]:
        """The first band's job, its rows read from the source now, before the workers start: the
        fork server (started when the bake began) is still importing the pipeline meanwhile, so the
        reading costs no wall time (one band: about as long as the server takes; more would keep
        the workers waiting). The same job as `_pump` would make first."""
        feed = self.feeds[0]
        early: list[tuple[BandJob, int | None]] = []
        while feed.source is not None and not early and feed.ready():
            check_interrupt()
            job, slot = self._next_band(feed)
            if job is None:
                break
            early.append((job, slot))
        return early

    def _submitted(self, pool: WorkerPool, early: list[tuple[BandJob, int | None]]) -> WorkerPool:
        for job, slot in early:
            self._submit(pool, job, slot)
        return pool

    # ---- scheduling ------------------------------------------------------------------------------
    def _submit(self, pool: _Pool, job: BandJob | CutJob, slot: int | None) -> None:
        if self.free_payloads:
            job.payload_at = (self.free_payloads.pop(), self.payload_bytes)
        submitted = time.perf_counter()  # before: an in-process pool runs the job in `submit`
        self.pending.append((pool.submit(job), job, slot, submitted))

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

    def _next_band(self, feed: StageFeed) -> tuple[BandJob | None, int | None]:
        st, i = feed.stage, feed.next_band
        wrap = self.header.address_mode is AddressMode.WRAP and st.bands > 1
        needs_top = wrap and i > 0 and st.window(i)[1] >= st.height
        if needs_top and feed.top is None:
            return None, None  # waits for band 0's result
        output_ring = None
        after = self.feeds[st.index + 1] if st.index + 1 < len(self.feeds) else None
        if after is not None and after.ring is not None:
            _, end = self._output_rows(st, i)
            if end - after.lowest_needed() > after.ring.rows:
                return None, None  # its rows would overwrite rows the next stage still reads
            output_ring = after.ring
        slot = None
        data: RingRef | RingWindow | np.ndarray | None = None
        if feed.remote:
            pass
        elif feed.ring is not None:
            lo, hi = st.window(i)
            data = RingWindow(feed.ring, lo, hi)
            feed.in_flight.append(lo)
        elif self.slot_bytes:
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
            output_ring=output_ring,
        )
        if needs_top:
            assert feed.top is not None
            job.top_rows, job.top_row0 = feed.top.top_rows, feed.top.top_row0
        feed.next_band += 1
        return job, slot

    def _process_oldest(self, pool: _Pool) -> None:
        task, job, slot, submitted = self.pending.popleft()
        res = pool.result(task)
        self.worker_cpu += res.cpu_seconds
        self.timeline.append(
            JobTiming(
                stage=job.stage.index if isinstance(job, BandJob) else -1,
                band=job.band if isinstance(job, BandJob) else job.ty,
                submitted=submitted - self.began,
                started=res.started - self.began,
                finished=res.finished - self.began,
                taken=time.perf_counter() - self.began,
                cpu_seconds=res.cpu_seconds,
            )
        )
        if slot is not None:
            self.free_slots.append(slot)
        writer = self.writer
        assert writer is not None
        self.alpha_seen |= res.alpha
        raw = self.header.tile_raw_size
        tiles = res.tiles
        if isinstance(tiles, PackedTiles) and tiles.outside >= 0:  # laid out in shared memory
            assert self.payload_fd >= 0 and job.payload_at is not None
            if self.payload_buffer is None:
                self.payload_buffer = bytearray(self.payload_bytes)
            with memoryview(self.payload_buffer)[: tiles.outside] as payload:
                done = 0
                while done < tiles.outside:
                    got = os.preadv(self.payload_fd, [payload[done:]], job.payload_at[0] + done)
                    if got <= 0:
                        raise EngineError("internal error: a payload slot ended early")
                    done += got
                writer.add_encoded_batch(dataclasses.replace(tiles, payload=payload, outside=-1))
        else:
            writer.add_encoded_batch(tiles)
        if job.payload_at is not None:
            self.free_payloads.append(job.payload_at[0])
        self.raw_bytes += raw * len(res.tiles)
        self.bar.update(len(res.tiles))
        if isinstance(job, CutJob):
            return
        feed = self.feeds[job.stage.index]
        if feed.ring is not None:
            feed.in_flight.popleft()
        if job.want_top:
            feed.top = res
        if job.want_bottom:
            feed.bottom = res
        if job.output_ring is not None:
            start, end = self._output_rows(job.stage, job.band)
            self.feeds[job.stage.index + 1].add_rows(start, end - start)
        elif res.output is not None:
            st = job.stage
            self.feeds[st.index + 1].add(st.content(job.band)[0] >> st.count, res.output)
        if feed.top is not None and feed.bottom is not None and not feed.deferred_sent:
            feed.deferred_sent = True
            for cut in self._deferred_cuts(feed):
                self._submit(pool, cut, None)

    def _output_rows(self, st: Stage, band: int) -> tuple[int, int]:
        """The rows of level ``st.level + st.count`` that band `band` of stage `st` makes (the
        next stage's input; the same rows `bands._run_band` writes)."""
        a0, b0 = st.content(band)
        height = self.header.level_dims(st.level + st.count)[1]
        return a0 >> st.count, height if b0 >= st.height else b0 >> st.count

    def _payload_bound(self) -> int:
        """The most bytes one job's tiles can take, laid out (the codec's worst case per tile)."""
        h = self.header
        a = h.alignment
        per_tile = -(-h.supercompression.stored_bound(h.tile_raw_size) // a) * a
        most = h.level_table["tiles_x"][0]  # a deferred tile row (wrap)
        for st in self.stages:
            for i in range(st.bands):
                a0, b0 = st.content(i)
                tiles = 0
                for d in range(st.count):
                    lw, lh = h.level_dims(st.level + d)
                    ca, cb = a0 >> d, lh if b0 >= st.height else b0 >> d
                    tiles += (-(-cb // h.tile_size) - ca // h.tile_size) * -(-lw // h.tile_size)
                most = max(most, tiles)
        return int(most) * per_tile

    def _layout_rings(self, base: int) -> int:
        """Place a `LevelRing` for each stage after the first, from byte `base` of the shared
        memory; returns where they end. A ring holds every window a stage's bands read at once
        and the rows the previous stage's bands in flight write, with room to spare, so that it
        never holds back a band the plan would start (the pack's tile order stays the same)."""
        page = mmap.PAGESIZE
        at = base
        for prev, feed in zip(self.feeds, self.feeds[1:], strict=False):
            st = feed.stage
            window = min(st.height, st.band + 2 * st.margin)
            out = max(b - a for a, b in (self._output_rows(prev.stage, i) for i in range(prev.stage.bands)))
            rows = min(st.height, ring_rows(window, out, self.max_in_flight))
            feed.ring = LevelRing(at, rows, st.width)
            at += -(-feed.ring.nbytes // page) * page
        return at

    def _deferred_cuts(self, feed: StageFeed) -> list[CutJob]:
        """Tile row 0 of each level of a wrapped stage, from its top rows and the level's bottom rows."""
        assert feed.top is not None and feed.bottom is not None
        h = self.header
        jobs = []
        for level, top in feed.top.top_rows.items():
            w, lh = h.level_dims(level)
            bottom = feed.bottom.bottom_rows[level]
            cutter = LevelCutter(w, lh, h.tile_size, h.border, h.address_mode)
            rows = gather_rows(cutter.slot_rows(0), top[:0], 0, top, bottom, lh)
            jobs.append(CutJob(level, 0, rows))
        return jobs

    # ---- run --------------------------------------------------------------------------------------
    def run(self) -> BakeReport:
        start, cpu = time.perf_counter(), time.process_time()
        self.began = start
        self.bar.start()
        self.writer = PackWriter(self.out, self.header, self.metadata)
        pool = None
        failed = True
        try:
            pool = self._start_pool()
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
                    warn_dropped_alpha(self.source.name, self.header.texel_format)
                if not self.alpha_seen:  # opaque bands took the straight filter
                    self.writer.metadata["mip_filter"] = MIP_FILTER
            self.writer.commit()
            failed = False
        finally:
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
            if self.payload_fd >= 0:
                os.close(self.payload_fd)
        seconds = time.perf_counter() - start
        main_cpu = time.process_time() - cpu
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
            jobs=1 if self.in_process else self.jobs,
            main_cpu_seconds=main_cpu,
            worker_cpu_seconds=self.worker_cpu,
            timeline=tuple(self.timeline),
        )


def ring_rows(window: int, output: int, in_flight: int) -> int:
    """Rows of a `LevelRing` whose stage reads bands of `window` rows (margins included) from a
    stage whose bands write `output` rows each, with `in_flight` jobs at a time. ``window +
    output`` always makes progress (a band is held back only while rows it would overwrite are
    still read); this leaves room for two windows and every job in flight, enough that no plan
    tried was held back (a held band changes the order of the pack's tiles, not their bytes: the
    pack-bytes tests would see it)."""
    return 2 * window + (in_flight + 2) * output


# ---- public API ---------------------------------------------------------------------------------------
IN_PROCESS_PIXELS = 16 << 20
"""Source pixels (4096²) up to which a bake with the default job count (``BakeConfig.jobs == 0``)
runs in the calling process, with no worker processes: below it, starting the workers (a fork
server that imports the pipeline, then one process per core) takes longer than they save.
Measured through the command line on the 2-core box, BC1 + zstd from PNG, best of three, one job
against two: 2048² 0.98 s against 1.37 s, 2896² 1.05 against 1.63, 4096² 1.37 against 1.97."""


def bakes_in_process(config: BakeConfig, pixels: int) -> bool:
    """Whether a bake of `pixels` source pixels with `config` runs in this process (no workers):
    one job, or the default job count for an image of at most `IN_PROCESS_PIXELS`. An explicit
    ``jobs`` above 1 always gets its workers; a cluster bake always runs on the cluster."""
    if config.cluster is not None:
        return False
    return config.worker_count == 1 or (config.jobs == 0 and pixels <= IN_PROCESS_PIXELS)


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
        warn_dropped_alpha(source.name, choice.texel_format)
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


def bake_file(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    config: BakeConfig | None = None,
    metadata: dict | None = None,
) -> BakeReport:
    """Open an image file (`open_source`: Pillow, or libvips for huge images) and bake it."""
    config = config or BakeConfig()
    if config.cluster is None and not bakes_in_process(config, _image_pixels(path)):
        start_context()  # the fork server starts (imports, tables) while the file is opened
    with signals_deferred():  # libvips may call into Python while it opens the file, too
        return bake(open_source(path), out, config, metadata)


def _image_pixels(path: str | os.PathLike[str]) -> int:
    """The pixel count an image file's header gives (Pillow reads only the header), or a huge
    number when Pillow cannot tell (libvips-only formats, URLs, missing files: `open_source`
    reports those)."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(path) as img:
                return img.size[0] * img.size[1]
    except Exception:  # noqa: BLE001 - any failure only means "not known to be small"
        return 1 << 62


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
    "IN_PROCESS_PIXELS",
    "BakeReport",
    "JobTiming",
    "FormatChoice",
    "Stage",
    "bake",
    "bake_file",
    "bake_procedural",
    "bakes_in_process",
    "choose_format",
    "creation_metadata",
    "plan_stages",
]
