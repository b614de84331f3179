"""Batched tile reads into ring slots: `read_batch` on both paths (the compiled helper and the
pure-Python loop) for every codec, damaged / truncated / unreadable / skipped tiles, coalesced runs
across gaps, the two paths agreeing on every status, and the `IOWorkers` thread pool.

No GL: the ring is plain numpy memory here. Packs are baked once per module (1024 texels, 64-texel
tiles: 341 BC1 tiles of 2592 bytes)."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig
from texstream.errors import EngineError
from texstream.native import load as load_native
from texstream.pack.format import Supercompression
from texstream.pack.reader import PackReader
from texstream.runtime.io_workers import (
    MAX_GAP,
    IOWorkers,
    ReadBatch,
    ReadResult,
    ReadStatus,
    TileSource,
    _Scratch,
    read_batch,
)

from ..require import skip_unless_native

CODECS = list(Supercompression)
STRIDE = 3072  # larger than a tile (2592 bytes): the bytes past each tile must stay untouched
SENTINEL = 0xA5
SKIP = 7  # the skip_state value used here; other state values never skip


@dataclass
class Pack:
    path: Path
    reader: PackReader
    tiles: list[bytes]  # every tile's raw bytes, in index order (PackReader.read_tile)

    @property
    def index(self) -> np.ndarray:
        return self.reader.index

    @property
    def raw(self) -> int:
        return self.reader.header.tile_raw_size

    def position(self, level: int, x: int, y: int) -> int:
        return self.reader.header.tile_index(level, x, y)


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Supercompression, Pack]]:
    root = tmp_path_factory.mktemp("io-packs")
    out = {}
    for sc in CODECS:
        path = root / f"{sc.name.lower()}.pack"
        bake_procedural(path, 1024, "terrain", 1, BakeConfig(tile_size=64, jobs=1, progress=False, supercompression=sc))
        reader = PackReader(path)
        tiles = [reader.read_tile(*reader.tile_position(i)) for i in range(reader.header.tile_count)]
        out[sc] = Pack(path, reader, tiles)
    yield out
    for p in out.values():
        p.reader.close()


@pytest.fixture(params=CODECS, ids=[c.name.lower() for c in CODECS])
def pack(request: pytest.FixtureRequest, packs: dict[Supercompression, Pack]) -> Pack:
    return packs[request.param]


@pytest.fixture(params=["native", "python"])
def scratch(request: pytest.FixtureRequest) -> Iterator[_Scratch]:
    """The read path: `_Scratch(load())` takes the compiled helper, `_Scratch(None)` the Python loop."""
    if request.param == "native":
        native = load_native()
        if native is None:
            skip_unless_native("texstream's compiled helper (texstream.native) is not built: only the Python path runs")
        s = _Scratch(native)
    else:
        s = _Scratch(None)
    yield s
    s.close()


def source(pack: Pack, fd: int | None = None) -> TileSource:
    h = pack.reader.header
    stored = int(pack.index["stored_size"].max())
    return TileSource(pack.reader.fileno() if fd is None else fd, h.supercompression, h.tile_raw_size, stored, "t")


def make_batch(
    pack: Pack,
    entries: list[int] | np.ndarray,
    slots: list[int] | np.ndarray | None = None,
    *,
    src: TileSource | None = None,
    batch_id: int = 0,
) -> ReadBatch:
    """A batch of index entries into ring `slots` (parallel to `entries`; default 0..n-1), sorted by
    file offset as the uploader sorts them. Tile ids are the index positions."""
    e = np.asarray(entries, np.int64)
    s = np.arange(e.size, dtype=np.int64) if slots is None else np.asarray(slots, np.int64)
    idx = pack.index
    order = np.argsort(idx["offset"][e], kind="stable")
    e, s = e[order], s[order]
    return ReadBatch(
        batch_id,
        src or source(pack),
        e,
        s,
        idx["offset"][e].astype(np.int64),
        idx["stored_size"][e].astype(np.int64),
        np.ascontiguousarray(idx["checksum"][e], np.uint64),
    )


def new_ring(slots: int) -> np.ndarray:
    return np.full(slots * STRIDE, SENTINEL, np.uint8)


def expected_ring(pack: Pack, batch: ReadBatch, ring_slots: int, ok: np.ndarray | None = None) -> np.ndarray:
    """The ring after a read: each good tile's bytes at its slot, every other byte untouched."""
    want = new_ring(ring_slots)
    for k, (tile, slot) in enumerate(zip(batch.tiles.tolist(), batch.ring_slots.tolist(), strict=True)):
        if ok is None or ok[k]:
            want[slot * STRIDE : slot * STRIDE + pack.raw] = np.frombuffer(pack.tiles[tile], np.uint8)
    return want


def assert_slots(ring: np.ndarray, want: np.ndarray, batch: ReadBatch, mask: np.ndarray) -> None:
    for k in np.flatnonzero(mask).tolist():
        s = int(batch.ring_slots[k])
        part = slice(s * STRIDE, (s + 1) * STRIDE)
        assert np.array_equal(ring[part], want[part]), f"slot {s} (tile {int(batch.tiles[k])})"


def read(
    batch: ReadBatch, ring: np.ndarray, scratch: _Scratch, state: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    if state is None:
        state = np.zeros(ring.size // STRIDE, np.uint8)
    status, errnum = read_batch(batch, ring, STRIDE, state, SKIP, scratch)
    assert status.shape == errnum.shape == (len(batch),)
    return status, errnum


def damage(data: bytearray, pack: Pack, i: int, how: str) -> None:
    off, st = int(pack.index["offset"][i]), int(pack.index["stored_size"][i])
    if how == "zero-head":  # a zstd frame loses its magic number
        data[off : off + 4] = bytes(4)
    elif how == "ff-head":  # an lz4 block claims more literals than the tile holds
        data[off : off + 16] = b"\xff" * 16
    elif how == "flip-middle":
        data[off + st // 2] ^= 0xFF
    else:
        raise AssertionError(how)


# The damage each codec's tile gets in the damaged copy, and the status it must come back with.
FILE_DAMAGE = {
    Supercompression.NONE: ("flip-middle", ReadStatus.CHECKSUM),
    Supercompression.ZSTD: ("zero-head", ReadStatus.DECODE_ERROR),
    Supercompression.LZ4: ("ff-head", ReadStatus.DECODE_ERROR),
}


@dataclass
class Damaged:
    pack: Pack  # the intact pack: its index and tiles
    path: Path  # the damaged, truncated copy
    corrupt: list[int]  # entries damaged with FILE_DAMAGE
    truncated: list[int]  # the file ends inside the first, before the second
    status: ReadStatus  # what a corrupt entry reads as


@pytest.fixture(scope="module")
def damaged_copies(packs: dict[Supercompression, Pack], tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("io-damaged")
    out = {}
    for sc, p in packs.items():
        data = bytearray(p.path.read_bytes())
        corrupt = [p.position(0, 1, 0), p.position(0, 5, 7), p.position(2, 1, 1)]
        how, status = FILE_DAMAGE[sc]
        for i in corrupt:
            damage(data, p, i, how)
        by_offset = np.argsort(p.index["offset"], kind="stable")
        truncated = [int(by_offset[-2]), int(by_offset[-1])]
        cut = int(p.index["offset"][truncated[0]]) + int(p.index["stored_size"][truncated[0]]) // 2
        path = root / f"{sc.name.lower()}.pack"
        path.write_bytes(bytes(data[:cut]))
        out[sc] = Damaged(p, path, corrupt, truncated, status)
    return out


@pytest.fixture
def damaged(pack: Pack, damaged_copies: dict) -> Damaged:
    return damaged_copies[pack.reader.header.supercompression]


# ---- read_batch -----------------------------------------------------------------------------------
def test_reads_exactly_the_packs_tiles_into_their_slots(pack: Pack, scratch: _Scratch) -> None:
    n = pack.reader.header.tile_count
    slots = np.random.default_rng(3).permutation(n)  # slots in no particular order
    batch = make_batch(pack, np.arange(n), slots)
    ring = new_ring(n)
    status, errnum = read(batch, ring, scratch)
    assert (status == ReadStatus.OK).all(), np.unique(status)
    assert not errnum.any()
    assert np.array_equal(ring, expected_ring(pack, batch, n))  # the tiles and not one byte more


def test_reads_runs_across_gaps_and_far_apart_tiles(pack: Pack, scratch: _Scratch) -> None:
    entries = [0, 1, 2, 5, 9, 40, 41, 120, 121, 125, 300, 340]
    batch = make_batch(pack, entries, slots=np.arange(len(entries))[::-1] * 2)  # scattered slots too
    gaps = batch.file_offsets[1:] - (batch.file_offsets[:-1] + batch.stored[:-1])
    assert (gaps > MAX_GAP).any() and ((gaps > 0) & (gaps <= MAX_GAP)).any(), "the batch must have both kinds of gap"
    ring = new_ring(2 * len(entries))
    status, errnum = read(batch, ring, scratch)
    assert (status == ReadStatus.OK).all() and not errnum.any()
    assert np.array_equal(ring, expected_ring(pack, batch, 2 * len(entries)))


def test_the_python_path_reads_each_run_of_close_tiles_with_one_pread(
    pack: Pack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tiles less than MAX_GAP apart are read with one pread, the gap too; a far tile or a skipped
    one starts a new run."""
    entries = [0, 1, 2, 5, 9, 40, 41, 42, 43, 120, 121, 125, 300, 340]
    batch = make_batch(pack, entries)
    state = np.zeros(len(entries), np.uint8)
    state[batch.ring_slots[7]] = SKIP  # in the middle of a run of close tiles
    calls: list[tuple[int, int]] = []
    preadv = os.preadv

    def counting(fd: int, buffers: list, offset: int) -> int:
        calls.append((offset, sum(len(b) for b in buffers)))
        return preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", counting)
    scratch = _Scratch(None)
    status, _ = read(batch, new_ring(len(entries)), scratch, state)
    monkeypatch.undo()
    scratch.close()
    assert (status == ReadStatus.SKIPPED).sum() == 1 and (status[status != ReadStatus.SKIPPED] == ReadStatus.OK).all()
    ends = batch.file_offsets + batch.stored
    want: list[tuple[int, int]] = []
    start = prev = None
    for k in range(len(batch)):
        if state[batch.ring_slots[k]] == SKIP:
            start = None
            continue
        if start is None or batch.file_offsets[k] - ends[prev] > MAX_GAP:
            start = k
            want.append((int(batch.file_offsets[k]), 0))
        want[-1] = (want[-1][0], int(ends[k]) - want[-1][0])
        prev = k
    assert 3 < len(want) < len(entries)  # the premise: some runs join tiles, some are apart
    assert calls == want


def test_an_empty_batch_reads_nothing(pack: Pack, scratch: _Scratch) -> None:
    ring = new_ring(2)
    status, errnum = read(make_batch(pack, []), ring, scratch)
    assert status.size == errnum.size == 0 and (ring == SENTINEL).all()


def test_damaged_and_truncated_tiles_get_their_status_and_the_rest_are_good(
    damaged: Damaged, scratch: _Scratch
) -> None:
    p = damaged.pack
    good = [0, 3, p.position(0, 2, 0), p.position(0, 6, 7), p.position(1, 0, 0), 339]
    wrong_sum = p.position(0, 9, 9)  # intact data, but the batch's checksum disagrees
    entries = damaged.corrupt + damaged.truncated + good + [wrong_sum]
    fd = os.open(damaged.path, os.O_RDONLY)
    try:
        batch = make_batch(p, entries, src=source(p, fd))
        batch.checksums[batch.tiles == wrong_sum] ^= np.uint64(1)
        ring = new_ring(len(entries))
        status, errnum = read(batch, ring, scratch)
    finally:
        os.close(fd)
    want = {i: ReadStatus.OK for i in good}
    want |= {i: damaged.status for i in damaged.corrupt}
    want |= {i: ReadStatus.TRUNCATED for i in damaged.truncated}
    want[wrong_sum] = ReadStatus.CHECKSUM
    got = {int(t): ReadStatus(int(s)) for t, s in zip(batch.tiles, status, strict=True)}
    assert got == want
    assert not errnum.any()
    ok = status == ReadStatus.OK
    assert_slots(ring, expected_ring(p, batch, len(entries)), batch, ok)


@pytest.mark.parametrize("how", ["closed fd", "directory"])
def test_an_unreadable_source_is_an_io_error_with_its_errno(
    pack: Pack, scratch: _Scratch, how: str, tmp_path: Path
) -> None:
    if how == "closed fd":
        fd = os.dup(pack.reader.fileno())
        os.close(fd)
        with pytest.raises(OSError):
            os.fstat(fd)  # the premise: nothing reopened that number
        want_errno = errno.EBADF
    else:
        fd = os.open(tmp_path, os.O_RDONLY)
        want_errno = errno.EISDIR
    try:
        batch = make_batch(pack, [0, 1, 2, 200], src=source(pack, fd))
        ring = new_ring(4)
        status, errnum = read(batch, ring, scratch)
    finally:
        if how == "directory":
            os.close(fd)
    assert (status == ReadStatus.IO_ERROR).all() and (errnum == want_errno).all()
    assert (ring == SENTINEL).all()
    assert os.strerror(want_errno) in ReadStatus.IO_ERROR.describe(int(errnum[0]))


def test_tiles_whose_state_is_the_skip_state_are_skipped_and_untouched(pack: Pack, scratch: _Scratch) -> None:
    entries = list(range(20))
    batch = make_batch(pack, entries)
    state = np.zeros(len(entries), np.uint8)
    skipped = [0, 4, 5, 11, 19]  # the first, the last, two neighbours, one alone: runs break around them
    state[skipped] = SKIP
    state[[1, 2, 12]] = [1, SKIP - 1, 255]  # other values never skip
    ring = new_ring(len(entries))
    status, errnum = read(batch, ring, scratch, state)
    want = np.where(state[batch.ring_slots] == SKIP, ReadStatus.SKIPPED, ReadStatus.OK)
    assert status.tolist() == want.tolist() and not errnum.any()
    assert np.array_equal(ring, expected_ring(pack, batch, len(entries), ok=want == ReadStatus.OK))


def test_a_stored_size_that_differs_from_the_raw_size_does_not_decode_without_supercompression(
    packs: dict[Supercompression, Pack], scratch: _Scratch
) -> None:
    p = packs[Supercompression.NONE]
    batch = make_batch(p, [0, 1, 2])
    batch.stored[1] -= 16
    ring = new_ring(3)
    status, _ = read(batch, ring, scratch)
    assert status.tolist() == [ReadStatus.OK, ReadStatus.DECODE_ERROR, ReadStatus.OK]


# ---- the two paths agree --------------------------------------------------------------------------
def both_paths(batch: ReadBatch, slots: int, state: np.ndarray) -> tuple:
    native = load_native()
    if native is None:
        skip_unless_native("texstream's compiled helper (texstream.native) is not built: nothing to compare")
    out = []
    for scratch in (_Scratch(native), _Scratch(None)):
        ring = new_ring(slots)
        try:
            status, errnum = read_batch(batch, ring, STRIDE, state, SKIP, scratch)
        finally:
            scratch.close()
        out.append((status, errnum, ring))
    return tuple(out)


def describe(batch: ReadBatch, native: np.ndarray, python: np.ndarray) -> str:
    diff = np.flatnonzero(native != python)
    return "; ".join(
        f"entry {int(batch.tiles[k])}: native {ReadStatus(int(native[k])).name}, "
        f"python {ReadStatus(int(python[k])).name}"
        for k in diff.tolist()
    )


def test_native_and_python_paths_agree_on_a_damaged_batch(pack: Pack, damaged: Damaged) -> None:
    """Every tile of the damaged, truncated copy, some skipped, one with a wrong checksum."""
    n = pack.reader.header.tile_count
    fd = os.open(damaged.path, os.O_RDONLY)
    try:
        batch = make_batch(pack, np.arange(n), src=source(pack, fd))
        batch.checksums[batch.tiles == 100] ^= np.uint64(1 << 40)
        state = np.zeros(n, np.uint8)
        state[::17] = SKIP
        (s_nat, e_nat, r_nat), (s_py, e_py, r_py) = both_paths(batch, n, state)
    finally:
        os.close(fd)
    assert np.array_equal(s_nat, s_py), describe(batch, s_nat, s_py)
    assert np.array_equal(e_nat, e_py)
    kinds = set(ReadStatus(int(s)) for s in s_nat)
    assert {ReadStatus.OK, ReadStatus.SKIPPED, ReadStatus.TRUNCATED, ReadStatus.CHECKSUM} <= kinds
    ok = s_nat == ReadStatus.OK
    assert_slots(r_nat, r_py, batch, ok | (s_nat == ReadStatus.SKIPPED))  # same bytes where defined


def test_native_and_python_paths_agree_on_an_unreadable_source(pack: Pack) -> None:
    fd = os.dup(pack.reader.fileno())
    os.close(fd)
    batch = make_batch(pack, [0, 1, 50], src=source(pack, fd))
    (s_nat, e_nat, _), (s_py, e_py, _) = both_paths(batch, 3, np.array([0, SKIP, 0], np.uint8))
    assert s_nat.tolist() == s_py.tolist() == [ReadStatus.IO_ERROR, ReadStatus.SKIPPED, ReadStatus.IO_ERROR]
    assert e_nat.tolist() == e_py.tolist() == [errno.EBADF, 0, errno.EBADF]


# Bytes near the end of zstd frames whose damage zstd versions judge differently: the zstd inside the
# zstandard package (the Python path's) reports corruption; libzstd 1.5.4 (what texstream.native loads
# on a system that has it) decodes the same frames, to wrong bytes or even to the right ones.
ZSTD_TAIL_DAMAGE = [((0, 3, 1), 16, 0x80), ((0, 2, 3), 14, 0xFF), ((0, 10, 5), 11, 0x01), ((1, 4, 3), 5, 0x01)]


def test_native_and_python_paths_agree_on_zstd_frames_damaged_near_their_end(
    packs: dict[Supercompression, Pack], tmp_path: Path
) -> None:
    """Both paths must decode zstd the same way: a frame one decoder rejects (DECODE_ERROR) and the
    other decodes to garbage (CHECKSUM) gives two statuses for one tile."""
    p = packs[Supercompression.ZSTD]
    data = bytearray(p.path.read_bytes())
    entries = []
    for (lv, x, y), back, xor in ZSTD_TAIL_DAMAGE:
        i = p.position(lv, x, y)
        data[int(p.index["offset"][i]) + int(p.index["stored_size"][i]) - back] ^= xor
        entries += [i, i + 1]  # a damaged tile and an intact neighbour
    path = tmp_path / "tail.pack"
    path.write_bytes(bytes(data))
    fd = os.open(path, os.O_RDONLY)
    try:
        batch = make_batch(p, entries, src=source(p, fd))
        (s_nat, _, _), (s_py, _, _) = both_paths(batch, len(entries), np.zeros(len(entries), np.uint8))
    finally:
        os.close(fd)
    intact = ~np.isin(batch.tiles, entries[::2])
    assert (s_py[intact] == ReadStatus.OK).all() and (s_nat[intact] == ReadStatus.OK).all()
    assert np.array_equal(s_nat, s_py), describe(batch, s_nat, s_py)


# ---- IOWorkers ------------------------------------------------------------------------------------
def drain_all(workers: IOWorkers) -> list[ReadResult]:
    """Drain until every submitted batch came back (a hang guard, not a speed check)."""
    out: list[ReadResult] = []
    deadline = time.monotonic() + 60.0
    while workers.pending:
        assert time.monotonic() < deadline, f"{workers.pending} batches never came back"
        out += workers.drain()
        time.sleep(0.001)
    return out


class GatedBatch(ReadBatch):
    """A batch whose read waits for the test (the reading thread calls len() first)."""

    def __len__(self) -> int:
        gates[self.batch_id][0].set()
        assert gates[self.batch_id][1].wait(60), "the test never opened the gate"
        return super().__len__()


gates: dict[int, tuple[threading.Event, threading.Event]] = {}


def gated(batch: ReadBatch) -> GatedBatch:
    gates[batch.batch_id] = (threading.Event(), threading.Event())
    return GatedBatch(*(getattr(batch, f) for f in ReadBatch.__dataclass_fields__))


def native_or_none(path: str):
    if path == "python":
        return None
    native = load_native()
    if native is None:
        skip_unless_native("texstream's compiled helper (texstream.native) is not built")
    return native


@pytest.mark.parametrize("path", ["native", "python"])
def test_threads_drain_every_batch_exactly_once(packs: dict[Supercompression, Pack], path: str) -> None:
    p = packs[Supercompression.ZSTD]
    n = p.reader.header.tile_count
    ring = new_ring(n)
    state = np.zeros(n, np.uint8)
    workers = IOWorkers(4, ring, STRIDE, state, SKIP, native_or_none(path))
    try:
        assert workers.thread_count == 4
        order = np.random.default_rng(5).permutation(n)
        batches = [make_batch(p, part, part, batch_id=b) for b, part in enumerate(np.array_split(order, 40))]
        for b in batches:
            workers.submit(b)
        assert workers.pending == len(batches)
        first = workers.wait(60)
        assert first is not None and workers.pending == len(batches) - 1
        results = [first, *drain_all(workers)]
        assert workers.pending == 0 and workers.drain() == []
        assert sorted(r.batch.batch_id for r in results) == list(range(len(batches)))
        for r in results:
            assert (r.status == ReadStatus.OK).all() and not r.errnum.any() and r.seconds >= 0
            assert r.status.size == len(r.batch)
        want = new_ring(n)
        for i in range(n):
            want[i * STRIDE : i * STRIDE + p.raw] = np.frombuffer(p.tiles[i], np.uint8)
        assert np.array_equal(ring, want)
    finally:
        assert workers.shutdown(30)


def test_shutdown_drops_queued_batches_and_returns_true(packs: dict[Supercompression, Pack]) -> None:
    p = packs[Supercompression.LZ4]
    ring = new_ring(8)
    workers = IOWorkers(1, ring, STRIDE, np.zeros(8, np.uint8), SKIP, None)
    busy = gated(make_batch(p, [0, 1], [0, 1], batch_id=0))
    workers.submit(busy)
    assert gates[0][0].wait(60), "the thread never took the batch"
    for b in range(1, 4):  # queued behind the busy one: never read
        workers.submit(make_batch(p, [2 * b, 2 * b + 1], [2 * b, 2 * b + 1], batch_id=b))
    assert workers.pending == 4
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(workers.shutdown(60)))
    stopper.start()
    deadline = time.monotonic() + 60.0
    while workers.pending != 1:  # shutdown dropped the queued batches: only the busy one is left
        assert time.monotonic() < deadline and stopper.is_alive(), "shutdown never dropped the queue"
        time.sleep(0.001)
    gates[0][1].set()  # the read in progress finishes
    stopper.join(60)
    assert stopped == [True]
    results = workers.drain()
    assert [r.batch.batch_id for r in results] == [0] and (results[0].status == ReadStatus.OK).all()
    assert workers.pending == 0
    assert (ring[2 * STRIDE :] == SENTINEL).all()  # the dropped batches' slots were never written
    assert workers.shutdown() is True  # idempotent
    with pytest.raises(RuntimeError, match="shut down"):
        workers.submit(make_batch(p, [0], [0], batch_id=9))


def test_an_unexpected_exception_surfaces_from_drain_once_and_the_threads_go_on(
    packs: dict[Supercompression, Pack],
) -> None:
    p = packs[Supercompression.NONE]
    ring = new_ring(4)
    workers = IOWorkers(2, ring, STRIDE, np.zeros(4, np.uint8), SKIP, None)
    try:
        # A slot outside the state array: the Python loop raises IndexError on its thread.
        workers.submit(make_batch(p, [0, 1], [0, 99], batch_id=0))
        raised = 0
        deadline = time.monotonic() + 60.0
        while workers.pending:
            assert time.monotonic() < deadline, "the failing batch never came back"
            try:
                workers.drain()
            except EngineError as exc:
                assert isinstance(exc.__cause__, IndexError) and "an I/O thread failed: IndexError" in str(exc)
                raised += 1
            time.sleep(0.001)
        assert raised == 1
        assert workers.drain() == []  # reported once
        workers.submit(make_batch(p, [2, 3], [2, 3], batch_id=1))
        (result,) = drain_all(workers)
        assert result.batch.batch_id == 1 and (result.status == ReadStatus.OK).all()
    finally:
        assert workers.shutdown(30)


def test_drain_that_raises_loses_no_finished_batch(packs: dict[Supercompression, Pack]) -> None:
    """The failing batch comes back too (its tiles as IO_ERROR / EIO, so its loads can be freed),
    and so does every batch that finished before the exception was re-raised."""
    p = packs[Supercompression.NONE]
    ring = new_ring(8)
    workers = IOWorkers(1, ring, STRIDE, np.zeros(8, np.uint8), SKIP, None)
    try:
        workers.submit(make_batch(p, [0], [0], batch_id=0))
        workers.submit(make_batch(p, [1, 2], [1, 99], batch_id=1))  # raises IndexError on the thread
        last = gated(make_batch(p, [3], [3], batch_id=2))
        workers.submit(last)
        assert gates[2][0].wait(60)  # the single thread has put batches 0 and 1 in the done queue
        results: list[ReadResult] = []
        with pytest.raises(EngineError, match="IndexError"):
            results += workers.drain()
        gates[2][1].set()
        results += drain_all(workers)
        got = {r.batch.batch_id: r for r in results}
        assert sorted(got) == [0, 1, 2], f"batches lost by the drain that raised: {sorted({0, 1, 2} - set(got))}"
        assert (got[1].status == ReadStatus.IO_ERROR).all() and (got[1].errnum == errno.EIO).all()
    finally:
        gates[2][1].set()
        assert workers.shutdown(30)


def test_thread_count_must_be_positive() -> None:
    with pytest.raises(ValueError, match="io thread count"):
        IOWorkers(0, new_ring(1), STRIDE, np.zeros(1, np.uint8), SKIP, None)


# ---- the compiled threads (no Python on them) ------------------------------------------------------
def compiled_workers(threads: int, ring: np.ndarray, state: np.ndarray) -> IOWorkers:
    native = native_or_none("native")
    if native.pool is None:
        skip_unless_native("texstream's compiled helper predates its reader pool")
    workers = IOWorkers(threads, ring, STRIDE, state, SKIP, native)
    assert workers.compiled is not None and workers.thread_count == threads
    return workers


def submit_held(workers: IOWorkers, batch: ReadBatch) -> None:
    """Submit `batch` as a read that hangs (the compiled threads' test hook) and wait for a thread to
    take it."""
    workers.hold_compiled_reads(1)
    workers.submit(batch)
    wait_for(lambda: workers.compiled.counts().queued == 0, "no thread took the held batch")


def submit_pairs(workers: IOWorkers, pack: Pack, batch_ids: range) -> None:
    """Batch b reads entries 2b and 2b+1 into ring slots 2b and 2b+1."""
    for b in batch_ids:
        workers.submit(make_batch(pack, [2 * b, 2 * b + 1], [2 * b, 2 * b + 1], batch_id=b))


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + 60.0
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def test_compiled_threads_skip_cancelled_loads_and_answer_every_status(packs: dict[Supercompression, Pack]) -> None:
    p = packs[Supercompression.ZSTD]
    ring = new_ring(12)
    state = np.zeros(12, np.uint8)
    state[[1, 4]] = SKIP  # cancelled before the read: never written
    workers = compiled_workers(2, ring, state)
    try:
        # a descriptor that is not open: every tile unreadable, with its errno
        closed = os.open(p.path, os.O_RDONLY)
        os.close(closed)
        bad = make_batch(p, range(6, 12), range(6, 12), src=source(p, closed), batch_id=1)
        workers.submit_many([make_batch(p, range(6), range(6), batch_id=0), bad])  # in one call
        assert workers.pending == 2
        got = {r.batch.batch_id: r for r in drain_all(workers)}
        assert sorted(got) == [0, 1] and not any(r.abandoned for r in got.values())
        want = [ReadStatus.OK, ReadStatus.SKIPPED, ReadStatus.OK, ReadStatus.OK, ReadStatus.SKIPPED, ReadStatus.OK]
        order = got[0].batch.ring_slots  # statuses follow the batch's (file) order
        assert [ReadStatus(int(got[0].status[list(order).index(slot)])) for slot in range(6)] == want
        assert (got[1].status == ReadStatus.IO_ERROR).all() and (got[1].errnum == errno.EBADF).all()
        for slot in range(6):
            tile = ring[slot * STRIDE : slot * STRIDE + p.raw]
            if want[slot] is ReadStatus.OK:
                assert tile.tobytes() == p.tiles[slot]
            else:
                assert (tile == SENTINEL).all()
        assert (ring[6 * STRIDE :] == SENTINEL).all()
    finally:
        assert workers.shutdown(30)


def test_a_hung_compiled_read_is_given_up_and_the_others_keep_moving(packs: dict[Supercompression, Pack]) -> None:
    p = packs[Supercompression.LZ4]
    ring = new_ring(8)
    workers = compiled_workers(2, ring, np.zeros(8, np.uint8))
    try:
        hung = make_batch(p, [0, 1], [0, 1], batch_id=0)
        submit_held(workers, hung)
        assert workers.overdue(30.0) == []  # not late yet
        late: list[ReadBatch] = []
        wait_for(lambda: late.extend(workers.overdue(0.02)) or late, "the hung read was never given up")
        assert late == [hung] and workers.overdue(0.0) == []  # given up once
        assert workers.stuck_count == 1 and workers.thread_count == 2  # retired, and replaced
        submit_pairs(workers, p, range(1, 4))  # the replacement and the other thread read these meanwhile
        moved: list[ReadResult] = []
        wait_for(lambda: moved.extend(workers.drain()) or len(moved) == 3, "batches stuck behind the hung read")
        assert sorted(r.batch.batch_id for r in moved) == [1, 2, 3] and workers.pending == 1
        assert all((r.status == ReadStatus.OK).all() and not r.abandoned for r in moved)
        workers.hold_compiled_reads(0)  # the hung read returns
        (back,) = drain_all(workers)
        assert back.batch is hung and back.abandoned
        wait_for(lambda: workers.stuck_count == 0, "the retired thread never exited")
        assert workers.thread_count == 2
    finally:
        workers.hold_compiled_reads(0)
        assert workers.shutdown(30)


def test_compiled_shutdown_drops_the_queue_and_waits_a_bounded_time(packs: dict[Supercompression, Pack]) -> None:
    p = packs[Supercompression.NONE]
    ring = new_ring(8)
    workers = compiled_workers(1, ring, np.zeros(8, np.uint8))
    try:
        submit_held(workers, make_batch(p, [0, 1], [0, 1], batch_id=0))
        submit_pairs(workers, p, range(1, 4))  # queued behind the held one: never read
        assert workers.pending == 4
        t0 = time.monotonic()
        assert workers.shutdown(0.2) is False  # the held read is still in progress
        assert time.monotonic() - t0 < 10.0 and workers.pending == 1
        with pytest.raises(RuntimeError, match="shut down"):
            workers.submit(make_batch(p, [0], [0], batch_id=9))
        workers.hold_compiled_reads(0)
        assert workers.shutdown(30) is True  # asked again: the read returned, the threads are gone
        results = workers.drain()
        assert [r.batch.batch_id for r in results] == [0] and (results[0].status == ReadStatus.OK).all()
        assert workers.pending == 0 and workers.thread_count == 0 and workers.stuck_count == 0
        assert (ring[2 * STRIDE :] == SENTINEL).all()  # the dropped batches' slots were never written
    finally:
        workers.hold_compiled_reads(0)
        workers.shutdown(30)


def test_a_read_hook_keeps_the_reads_on_python_threads(packs: dict[Supercompression, Pack]) -> None:
    """The hook runs on the reading thread before each batch: with one, nothing goes to the compiled
    threads (which run no Python)."""
    p = packs[Supercompression.ZSTD]
    seen: list[str] = []
    native = native_or_none("native")
    workers = IOWorkers(
        1, new_ring(4), STRIDE, np.zeros(4, np.uint8), SKIP, native, lambda b: seen.append(b.source.name)
    )
    try:
        assert workers.compiled is None
        workers.submit(make_batch(p, [0, 1], [0, 1], batch_id=0))
        (r,) = drain_all(workers)
        assert seen == ["t"] and (r.status == ReadStatus.OK).all()
    finally:
        assert workers.shutdown(30)
