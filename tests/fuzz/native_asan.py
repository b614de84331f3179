"""The compiled helper (engine/native/_native.c) under AddressSanitizer + UndefinedBehaviorSanitizer,
fed by the fuzz corpus.

``python -m tests.fuzz.native_asan build DIR``   compile a sanitized copy into DIR (gcc or clang)
``python -m tests.fuzz.native_asan replay LIB [TARGET...]``  run its entry points on the corpus inputs
                                                 (pack, header, tile); must run with the sanitizer
                                                 runtime preloaded (`sanitized_env`)
``python -m tests.fuzz.native_asan DIR``         both (what `make fuzz-native` runs)

The replay drives the real read path (`io_workers.read_batch`: `ts_read_batch` for local packs; the
compiled reader pool's threads, `ts_pool_*`, with a read held, given up and closed on) and
`ts_decode_batch` directly: every pack input of the corpus that opens is read whole, then again with
each tile damaged and with the file cut short; every tile input is decoded under each codec; every
Radiance picture input (hdr), then each of its cuts and byte flips, is decoded from an exact-size
buffer by `ts_hdr_scanlines` and `ts_rgbe_to_float`; the procedural generators' loops (procedural:
no corpus) make terrain, normal map and lattice blocks of odd sizes into exact-size arrays, and are
handed lattices one sample short, which they must refuse without touching memory; the render
thread's decider loops (deciders: no corpus) reduce feedback and expand texture sets, find the slots
pages sample, mark and touch ledger slots and walk the scheduler's missing chains on random and
hostile tables. Each answer is
compared with the pure-Python twin's (the contract in _native.c: same status codes, same texels).
Any sanitizer report aborts the process (-fno-sanitize-recover, halt_on_error), so the replay's exit
status says it all. Python's own allocator is switched to malloc (PYTHONMALLOC) so buffers the helper
writes have exact bounds the sanitizer checks.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
SOURCE = ROOT / "engine" / "native" / "_native.c"
FLAGS = (
    "-shared",
    "-fPIC",
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-pthread",
)


def compiler() -> str | None:
    """The C compiler to build with: $CC, else gcc, else clang."""
    for name in (os.environ.get("CC"), "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def asan_runtime(cc: str) -> str | None:
    """The compiler's shared ASan runtime (to preload into an interpreter that was not built with it)."""
    return runtime_library(cc, ("libasan.so", "libclang_rt.asan-x86_64.so"))


def runtime_library(cc: str, names: tuple[str, ...]) -> str | None:
    """The first of the compiler's shared libraries `names` that exists (a sanitizer's runtime)."""
    for name in names:
        try:
            out = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            continue
        path = os.path.realpath(out.stdout.strip())
        if os.path.isabs(path) and os.path.exists(path):
            return path
    return None


def build(
    out_dir: Path,
    source: Path = SOURCE,
    *,
    flags: tuple[str, ...] = FLAGS,
    runtime: Callable[[str], str | None] = asan_runtime,
    runtime_name: str = "AddressSanitizer runtime (libasan)",
    lib_name: str = "_native_sanitized.so",
) -> tuple[Path | None, str]:
    """Compile the sanitized helper (`source`) into `out_dir` with `flags` (AddressSanitizer +
    UndefinedBehaviorSanitizer unless told otherwise): (library, "") or (None, why not)."""
    cc = compiler()
    if cc is None:
        return None, "no C compiler (gcc or clang) to build the sanitized helper"
    if runtime(cc) is None:
        return None, f"{cc} has no shared {runtime_name}"
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        return None, f"Python's headers are not installed ({include}/Python.h)"
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / lib_name
    proc = subprocess.run(
        [cc, *flags, f"-I{include}", str(source), "-o", str(lib)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        sanitizers = " ".join(f for f in flags if f.startswith("-fsanitize="))
        return None, f"{cc} {sanitizers} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return lib, ""


def sanitized_env(cc: str) -> dict[str, str]:
    """The environment a replay runs in: the ASan runtime preloaded, every report fatal."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = asan_runtime(cc) or ""
    env["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:exitcode=87"
    env["PYTHONMALLOC"] = "malloc"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


# ---- replay (runs inside the sanitized process) --------------------------------------------------------
def _read_both(batch, raw_size: int, state_slots: int, scratches) -> list[list[int]]:  # noqa: ANN001
    """Status codes of one batch read by each scratch (compiled, then Python), in fresh exact rings."""
    import numpy as np

    from texstream.runtime.io_workers import read_batch

    results = []
    for scratch in scratches:
        ring = np.zeros(state_slots * raw_size, np.uint8)
        state = np.zeros(state_slots, np.uint8)
        status, _ = read_batch(batch, ring, raw_size, state, 255, scratch)
        results.append(status.tolist())
    return results


def _read_pooled(batch, raw_size: int, state_slots: int, native, *, hang: bool) -> list[int]:  # noqa: ANN001
    """Status codes of one batch read by the compiled reader pool (`ts_pool_*`), cut
    into three batches submitted in one call. With `hang`, the first one's read is held, given up
    (its thread retired and replaced) while the others are read, the pool closed with that thread
    still inside it, then released, and closed again."""
    import numpy as np

    from texstream.runtime.io_workers import ReadBatch
    from texstream.runtime.native_readers import NativeReaders

    ring = np.zeros(state_slots * raw_size, np.uint8)
    state = np.zeros(state_slots, np.uint8)
    readers = NativeReaders(2, ring, raw_size, state, 255, native)
    fields = ("tiles", "ring_slots", "file_offsets", "stored", "checksums")
    cuts = np.array_split(np.arange(len(batch)), 3)
    parts = [
        ReadBatch(k, batch.source, *(getattr(batch, f)[c[0] : c[-1] + 1] for f in fields))
        for k, c in enumerate(cuts)
        if c.size
    ]
    results = []
    deadline = time.monotonic() + 60.0

    def collect(count: int) -> None:
        while len(results) < count:
            if time.monotonic() > deadline:
                raise AssertionError("the compiled reader pool never returned a batch")
            readers.wait(0.01)
            results.extend(readers.drain())

    try:
        if hang:
            readers.hold(1)
            readers.submit(parts[:1])
            while readers.counts().queued:  # not yet taken by a thread
                time.sleep(0.001)
            while not readers.overdue(0.0):
                time.sleep(0.001)
            readers.submit(parts[1:])
            collect(len(parts) - 1)
            first = readers.shutdown(0.01)
            assert not first.stopped and first.dropped == 0 and not first.finished, "the held read kept no thread"
            readers.hold(0)
            again = readers.shutdown(30.0)
            assert again.stopped and len(again.finished) == 1 and again.finished[0].abandoned
            results.extend(again.finished)
        else:
            readers.submit(parts)
            collect(len(parts))
    finally:
        readers.hold(0)
        readers.shutdown(30.0)
    results.sort(key=lambda r: r.batch.batch_id)
    status = np.concatenate([r.status for r in results]) if results else np.zeros(0, np.int32)
    return status.tolist()


def _replay_pack(data: bytes, folder: Path, scratches, label: str) -> int:  # noqa: ANN001
    import numpy as np

    from texstream.errors import PackFormatError
    from texstream.pack.reader import PackReader
    from texstream.runtime.io_workers import ReadBatch, TileSource

    from .harness import pack_bytes

    body = pack_bytes(data)
    path = folder / "replay.tpk"
    path.write_bytes(body)
    try:
        reader = PackReader(path)
    except PackFormatError:
        return 0
    checked = 0
    with reader:
        h = reader.header
        idx = reader.index
        order = np.argsort(idx["offset"], kind="stable")
        count = int(order.size)
        source = TileSource(reader.fileno(), h.supercompression, h.tile_raw_size, int(idx["stored_size"].max()), "r")

        def batch() -> ReadBatch:
            return ReadBatch(
                batch_id=0,
                source=source,
                tiles=order.astype(np.int64),
                ring_slots=np.arange(count, dtype=np.int64),
                file_offsets=idx["offset"][order].astype(np.int64),
                stored=idx["stored_size"][order].astype(np.int64),
                checksums=idx["checksum"][order].astype(np.uint64),
            )

        variants = [("as written", None)]
        variants += [
            (f"tile {k} damaged", int(idx["offset"][order[k]] + idx["stored_size"][order[k]] // 2))
            for k in range(min(count, 8))
        ]
        variants.append(("cut short", -1))
        pristine = path.read_bytes()
        for name, where in variants:
            damaged = bytearray(pristine)
            if where is not None and where >= 0:
                damaged[where] ^= 0x5A
            path.write_bytes(bytes(damaged if where != -1 else pristine[: int(idx["offset"][order[-1]]) + 1]))
            native, python = _read_both(batch(), h.tile_raw_size, count, scratches)
            if native != python:
                raise AssertionError(f"{label} ({name}): compiled statuses {native} != Python's {python}")
            if scratches[0].native.pool is not None:
                pooled = _read_pooled(batch(), h.tile_raw_size, count, scratches[0].native, hang=where is None)
                if pooled != python:
                    raise AssertionError(f"{label} ({name}): the reader pool's statuses {pooled} != Python's {python}")
            checked += 1
    return checked


def _replay_tile(data: bytes, native_lib, scratch, label: str) -> int:  # noqa: ANN001
    import numpy as np

    from texstream.errors import TileCorruptError
    from texstream.pack import codec
    from texstream.pack.format import Supercompression
    from texstream.runtime.io_workers import ReadStatus

    from .harness import tile_input

    _, raw_size, stored = tile_input(data)
    if not stored:
        return 0
    checked = 0
    for mode in Supercompression:
        try:
            expected_sum = codec.checksum(codec.decompress(stored, mode, raw_size))
            want = ReadStatus.OK
        except TileCorruptError:
            expected_sum, want = 0, ReadStatus.DECODE_ERROR
        src = (ctypes.c_uint8 * len(stored)).from_buffer_copy(stored)  # exact bounds: the sanitizer sees overreads
        ring = (ctypes.c_uint8 * raw_size)()
        where = np.zeros(1, np.int64)
        sizes = np.array([len(stored)], np.int64)
        sums = np.array([expected_sum], np.uint64)
        slots = np.zeros(1, np.int64)
        status = np.zeros(1, np.int32)
        native_lib.decode_batch(
            int(mode),
            1,
            ctypes.addressof(src),
            where.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
            sizes.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
            raw_size,
            sums.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)),
            slots.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
            ctypes.addressof(ring),
            raw_size,
            scratch.dctx,
            ctypes.byref(native_lib.codecs),
            status.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
        )
        got = ReadStatus(int(status[0]))
        if got != want:
            raise AssertionError(f"{label} as {mode.name.lower()}: compiled decode says {got.name}, Python {want.name}")
        checked += 1
    return checked


def _replay_hdr(data: bytes, lib: Path, label: str) -> int:
    """`data`, each of its cuts (every 7th byte) and 16 byte flips, decoded by the sanitized helper
    and by Python: the same texels or the same refusal."""
    import numpy as np

    from texstream.assets.hdr import parse_hdr, use_scanline_decoder
    from texstream.errors import SourceError

    def outcome(variant: bytes, kind: str) -> tuple[str, object]:
        use_scanline_decoder(kind, str(lib) if kind == "native" else None)
        exact = (ctypes.c_uint8 * len(variant)).from_buffer_copy(variant)  # exact bounds for the sanitizer
        try:
            image = parse_hdr(memoryview(exact), label, max_texels=1 << 20)
        except SourceError as exc:
            return "refused", str(exc)
        return "image", (image.rgb.shape, image.rgb.tobytes())

    body = data.find(b"\n\n") + 2 if b"\n\n" in data else 0
    variants = [data] + [data[:cut] for cut in range(body, len(data), 7)]
    rng = np.random.default_rng(len(data))
    for _ in range(16 if len(data) > body else 0):
        flipped = bytearray(data)
        flipped[int(rng.integers(body, len(data)))] ^= 1 << int(rng.integers(8))
        variants.append(bytes(flipped))
    try:
        for k, variant in enumerate(variants):
            native, python = outcome(variant, "native"), outcome(variant, "python")
            if native != python:
                raise AssertionError(f"{label} (variant {k}): compiled {native[0]} != Python's {python[0]}")
    finally:
        use_scanline_decoder("auto")
    return len(variants)


def _replay_procedural(lib: Path) -> int:
    """Terrain, normals and lattice blocks by the sanitized loops against numpy's, then calls whose
    lattice or scratch is one sample short: refused (-1), nothing read or written out of bounds."""
    import numpy as np

    from texstream.bake.procedural import fbm_lattice, normal_rows, terrain_rows, use_generator_loops
    from texstream.native import procedural_functions

    functions = procedural_functions(str(lib))
    if functions is None:
        raise AssertionError(f"{lib} has no procedural generator loops")
    cases = [(0, 1, 1, 1, 0), (0, 9, 9, 9, 2**32 - 1), (5, 40, 333, 200, 7), (197, 200, 64, 200, 1), (0, 2, 2, 3000, 5)]
    checks = 0
    try:
        for case in cases:
            for generator in (terrain_rows, normal_rows):
                use_generator_loops("native", str(lib))
                native = generator(*case)
                use_generator_loops("numpy")
                if not np.array_equal(native, generator(*case)):
                    raise AssertionError(f"procedural {generator.__name__}{case}: compiled rows != numpy's")
                checks += 1
        for level in (1, 3):
            use_generator_loops("native", str(lib))
            native = fbm_lattice(-3, 20, -5, 77, level, 4096, 9)
            use_generator_loops("numpy")
            if not np.array_equal(native, fbm_lattice(-3, 20, -5, 77, level, 4096, 9)):
                raise AssertionError(f"procedural lattice at level {level}: compiled != numpy's")
            checks += 1
    finally:
        use_generator_loops("auto")
    # Lattice blocks one row or column short of the texels asked for, a scratch one float short.
    width, y0, y1 = 50, 10, 20
    rows, cols = (y1 - 1) // 2 + 2 - (y0 - 2) // 2, (width - 1) // 2 + 3  # procedural._parent_range
    k = np.zeros(10, np.float32)
    bins = np.array([2, 2, 2], np.int64)
    table = np.zeros(8, np.uint32)
    out = np.zeros((y1 - y0, width, 4), np.uint8)
    for short_rows, short_cols, short_scratch in ((0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)):
        g1 = np.zeros((rows - short_rows, cols - short_cols), np.float32)
        scratch = np.zeros(g1.shape[1] + 4 * (width + 4) - short_scratch, np.float32)
        got = functions.height_rows(
            g1.ctypes.data, g1.shape[0], g1.shape[1], g1.shape[1], (y0 - 2) // 2, -1, y0, y1, width, 0,
            k.ctypes.data, bins.ctypes.data, table.ctypes.data, table.size, out.ctypes.data, out.strides[0],
            scratch.ctypes.data, scratch.size,
        )  # fmt: skip
        want = 0 if (short_rows, short_cols, short_scratch) == (0, 0, 0) else -1
        if got != want:
            raise AssertionError(f"ts_height_rows with a lattice short by {short_rows, short_cols}: {got}, not {want}")
        coarse = np.zeros((4 - short_rows, 5 - short_cols), np.float32)  # exactly fine [1, 7) x [1, 9)
        fine = np.zeros((6, 8), np.float32)
        tmp = np.zeros(3 * coarse.shape[1] + 4 - short_scratch, np.float32)
        got = functions.subdivide_add(
            coarse.ctypes.data, coarse.shape[0], coarse.shape[1], coarse.shape[1], 0, 0, 1, 7, 1, 9,
            tmp.ctypes.data, tmp.size, fine.ctypes.data, 8,
        )  # fmt: skip
        if got != want:
            raise AssertionError(f"ts_subdivide_add with a block short by {short_rows, short_cols}: {got}, not {want}")
        checks += 2
    return checks


def _replay_deciders(lib: Path) -> int:
    """The render thread's loops (the feedback reduction with texture sets' page expansion and pool
    counts, raw and compacted, the slots a frame's pages sample, the scheduler's missing chains,
    prefetch candidates, queueing and order, a cache pool's eviction candidates) on random tables
    against numpy's, from exact-size buffers, then on hostile tables: ids past the table, follower
    entries past it, a parent table with a cycle (the walk is bounded), entries past every id, chains
    past MAX_LEVELS, a texture past the priority table."""
    import numpy as np

    from texstream.native import (
        feedback_pages,
        merge_requests,
        missing_chains,
        move_pools,
        prefetch_pages,
        queue_keys,
        sample_slots,
        touch_pools,
        victim_keys,
    )
    from texstream.pack.format import PackHeader
    from texstream.runtime.feedback_reduce import Wanted
    from texstream.runtime.page_table import PageTables
    from texstream.runtime.texture_sets import SetTable
    from texstream.runtime.tiles import MAX_LEVELS, MAX_TEXTURES, TileSpace
    from texstream.runtime.touch import SampledSlots

    reduce, sample = feedback_pages(str(lib)), sample_slots(str(lib))
    chains, prefetch, merge = missing_chains(str(lib)), prefetch_pages(str(lib)), merge_requests(str(lib))
    keys, victims = queue_keys(str(lib)), victim_keys(str(lib))
    move, touch = move_pools(str(lib)), touch_pools(str(lib))
    if None in (reduce, sample, chains, prefetch, merge, keys, victims, move, touch):
        raise AssertionError(f"{lib} has no texture-set or touch loops")
    rng = np.random.default_rng(7)
    checks = 0
    for case in range(8):
        sizes = [int(x) for x in rng.choice([256, 512, 1024, 2048], 4)]
        space = TileSpace()
        headers = {t: PackHeader(width=w, height=w, tile_size=128) for t, w in enumerate(sizes)}
        for t, h in headers.items():
            space.register(t, h)
        sets = SetTable(space)
        sets.add(0, [0, 1, 2, 3], headers)
        follow = np.ascontiguousarray(sets.follow)
        capacity, k = follow.shape
        ids = np.unique(rng.choice(space.used, size=40)).astype(np.int64)
        ids = ids[space.is_tile(ids)]
        counts = rng.integers(1, 9, ids.size).astype(np.int64)
        if case == 7:  # hostile: an id past the table and a follower entry past it
            ids = np.append(ids, capacity + 3)
            counts = np.append(counts, 1)
            follow[int(ids[0])] = capacity + 1
        pool_of = np.full(MAX_TEXTURES, -1, np.int64)
        pool_of[:4] = [0, 1, 0, 1]
        values, weights = ids.astype(np.uint32), counts.astype(np.uint32)
        scratch, bits = np.zeros(capacity, np.int64), np.zeros(-(-capacity // 64), np.uint64)
        room = min(values.size, int(space.used)) * (k + 1)
        out_ids, out_counts = np.empty(room, np.int64), np.empty(room, np.int64)
        pool_pages, stats = np.empty(2, np.int64), np.empty(2, np.int64)
        n = reduce(
            values.size, values.ctypes.data, weights.ctypes.data, space.used, space.level.ctypes.data,
            space.tex.ctypes.data, follow.ctypes.data, k, capacity, pool_of.ctypes.data, MAX_TEXTURES, 2,
            pool_pages.ctypes.data, scratch.ctypes.data, bits.ctypes.data, out_ids.ctypes.data, out_counts.ctypes.data,
            stats.ctypes.data,
        )  # fmt: skip
        if case == 7:
            if n != -1 or scratch.any() or bits.any():
                raise AssertionError(f"ts_feedback_pages on hostile ids: {n}, scratch left dirty: {scratch.any()}")
        else:
            want = sets.expand(Wanted(ids, counts))
            per_pool = np.bincount(pool_of[space.tex[want.ids].astype(np.int64)], minlength=2)
            if not (
                np.array_equal(out_ids[:n], want.ids)
                and np.array_equal(out_counts[:n], want.counts)
                and np.array_equal(pool_pages, per_pool)
            ):
                raise AssertionError(f"ts_feedback_pages case {case}: compiled pages != numpy's")
        tables = PageTables(space)
        resident = rng.choice(space.used, size=space.used // 3, replace=False)
        tables.own[resident] = rng.integers(0, 500, resident.size)
        parent = space.parent.copy()
        if case == 7:  # a cycle of two pages, neither resident
            a, b = (int(x) for x in np.flatnonzero(tables.own[: space.used] < 0)[:2])
            parent[a], parent[b] = b, a
            ids = np.array([a, b, capacity - 1], np.int64)
        stride = 2 * ids.size
        out, out_count = np.empty(2 * stride, np.int64), np.empty(2, np.int64)
        got = sample(
            ids.size, ids.ctypes.data, parent.ctypes.data, tables.own.ctypes.data, space.tex.ctypes.data, capacity,
            pool_of.ctypes.data, MAX_TEXTURES, 2, MAX_LEVELS, out.ctypes.data, stride, out_count.ctypes.data,
        )  # fmt: skip
        if case != 7:
            plain = SampledSlots(space, tables).by_pool(ids, pool_of, [0, 1])
            for p, slots in plain:
                mine = out[p * stride : p * stride + int(out_count[p])]
                if not np.array_equal(np.sort(mine), np.sort(slots)):
                    raise AssertionError(f"ts_sample_slots case {case}, pool {p}: compiled slots != numpy's")
        elif got < 0:
            raise AssertionError(f"ts_sample_slots on a parent cycle refused in-range ids: {got}")
        values = rng.integers(0, capacity + 40, int(rng.integers(1, 3000))).astype(np.uint32)
        values[::7] = np.uint32(0xFFFFFFFF)
        n_ids = int(space.used)
        scratch_counts, bits = np.zeros(capacity, np.int64), np.zeros(-(-capacity // 64), np.uint64)
        room = min(values.size, n_ids)
        hist_ids, hist_counts, stats = np.empty(room, np.int64), np.empty(room, np.int64), np.zeros(2, np.int64)
        m = reduce(
            values.size, values.ctypes.data, None, n_ids, space.level.ctypes.data, space.tex.ctypes.data, None, 0,
            capacity, None, 0, 0, None, scratch_counts.ctypes.data, bits.ctypes.data, hist_ids.ctypes.data,
            hist_counts.ctypes.data, stats.ctypes.data,
        )  # fmt: skip
        inside = values[values < n_ids]
        want_ids, want_counts = np.unique(inside, return_counts=True)
        tile = space.level[want_ids] >= 0
        if not (
            np.array_equal(hist_ids[:m], want_ids[tile])
            and np.array_equal(hist_counts[:m], want_counts[tile])
            and int(stats[0]) == values.size - inside.size
            and int(stats[1]) == int(want_counts[~tile].sum())
            and not scratch_counts.any()
            and not bits.any()
        ):
            raise AssertionError(f"ts_feedback_pages case {case} (raw entries): compiled counts != numpy's")
        checks += _replay_ledger_moves(move, touch, rng, hostile=case == 7)
        checks += 3 + _replay_chains(chains, prefetch, merge, keys, space, tables, rng, hostile=case == 7)
        checks += _replay_victims(victims, rng, hostile=case == 7)
        checks += _replay_uploads(lib, rng, hostile=case == 7)
        checks += _replay_widen(lib, space, tables, rng, hostile=case == 7)
    return checks


def _replay_widen(lib: Path, space, tables, rng, *, hostile: bool) -> int:  # noqa: ANN001
    """``ts_widen_pages`` from exact-size buffers against `RequestScheduler.widened`'s numpy walk (pages
    at grid edges, ids of no tile); hostile: a page past the table, refused with the scratch clean."""
    import numpy as np

    from texstream.config import StreamerConfig
    from texstream.native import widen_pages
    from texstream.runtime.feedback_reduce import Wanted
    from texstream.runtime.requests import RequestScheduler
    from texstream.runtime.tiles import MAX_LEVELS, MAX_TEXTURES

    widen = widen_pages(str(lib))
    if widen is None:
        raise AssertionError(f"{lib} has no widening loop")
    capacity = space.parent.size
    ids = np.unique(rng.choice(space.used, size=int(rng.integers(1, 60)))).astype(np.int64)  # tiles and holes
    if hostile:
        ids = np.append(ids, capacity + 2)
    n = ids.size
    counts = rng.integers(1, 9, n).astype(np.int64)
    scratch, bits = np.zeros(capacity, np.int64), np.zeros(-(-capacity // 64), np.uint64)
    out_ids, out_counts = np.empty(9 * n, np.int64), np.empty(9 * n, np.int64)
    got = widen(
        n, ids.ctypes.data, counts.ctypes.data, capacity, space.tex.ctypes.data, space.level.ctypes.data,
        space.level_first.ctypes.data, space.tiles_x.ctypes.data, space.tiles_y.ctypes.data, MAX_TEXTURES, MAX_LEVELS,
        scratch.ctypes.data, bits.ctypes.data, out_ids.ctypes.data, out_counts.ctypes.data,
    )  # fmt: skip
    if scratch.any() or bits.any():
        raise AssertionError("ts_widen_pages left its scratch dirty")
    if hostile:
        if got != -1:
            raise AssertionError(f"ts_widen_pages with a page past the table: {got}, not refused")
        return 1
    sched = RequestScheduler(StreamerConfig(), space, tables, lambda t: np.zeros(np.size(t), bool))
    want = sched.widened(Wanted(ids, counts))
    if not (np.array_equal(out_ids[:got], want.ids) and np.array_equal(out_counts[:got], want.counts)):
        raise AssertionError("ts_widen_pages: compiled pages != numpy's")
    return 1


def _replay_uploads(lib: Path, rng, *, hostile: bool) -> int:  # noqa: ANN001
    """``ts_choose_uploads`` and ``ts_plan_uploads`` on exact-size ring arrays against numpy's choice
    and plan; hostile: a load whose pool or cache slot lies outside the tables, which both must refuse."""
    import numpy as np

    from texstream.runtime.upload_choice import RingLoads, UploadChoice, choose_numpy, plan_numpy

    n, n_pools, capacity = int(rng.integers(1, 200)), int(rng.integers(1, 4)), 256
    choice = UploadChoice(n, True, str(lib))
    if not choice.compiled:
        raise AssertionError(f"{lib} has no upload choice loops")
    state = rng.choice(np.array([3, 1, 0], np.uint8), n)
    seq, pool = rng.integers(0, n, n), rng.integers(0, n_pools, n)
    cache_slot = np.empty(n, np.int64)
    for p in range(n_pools):  # distinct slots in each pool
        mine = pool == p
        cache_slot[mine] = rng.permutation(capacity)[: int(mine.sum())]
    nbytes = rng.integers(1, 100, n)
    tables = [np.ascontiguousarray(rng.integers(0, 12, capacity)) for _ in range(n_pools)]
    args = (RingLoads(state, seq, pool, cache_slot, nbytes), 3)
    if hostile:
        bad = int(rng.integers(0, n))
        state[bad] = 3
        cache_slot[bad] = capacity + 5
        try:
            choice.choose(*args, tables, 10, n, 1 << 40)
        except ValueError:
            pass
        else:
            raise AssertionError("ts_choose_uploads with a cache slot past the table: not refused")
        layers = np.zeros(n_pools, np.int64)  # pools with no layers
        try:
            choice.plan(np.array([bad], np.int64), pool, cache_slot, layers, layers)
        except ValueError:
            return 2
        raise AssertionError("ts_plan_uploads with a pool of no layers: not refused")
    caps = (int(rng.integers(1, n + 1)), int(rng.integers(1, 5000)))
    chosen = choice.choose(*args, tables, 10, *caps)
    if not np.array_equal(chosen, choose_numpy(*args, tables, 10, *caps)):
        raise AssertionError("ts_choose_uploads: compiled choice != numpy's")
    layers, max_run = rng.integers(1, 40, n_pools), rng.integers(0, 3, n_pools)
    got, want = (
        choice.plan(chosen, pool, cache_slot, layers, max_run),
        plan_numpy(chosen, pool, cache_slot, layers, max_run),
    )
    if [(u.pool, u.ring_slots.tolist(), u.runs.tolist()) for u in got] != [
        (u.pool, u.ring_slots.tolist(), u.runs.tolist()) for u in want
    ]:
        raise AssertionError("ts_plan_uploads: compiled plan != numpy's")
    return 2


def _replay_ledger_moves(move, touch, rng, *, hostile: bool) -> int:  # noqa: ANN001
    """``ts_move_pools`` and ``ts_touch_pools`` on three pools' exact-size ledger arrays (the middle
    one absent) against numpy; hostile: a slot past its pool and an entry naming the absent pool among
    the arrivals (refused, nothing written), uses past a pool and counts past the row (skipped)."""
    import numpy as np

    caps = [int(rng.integers(1, 300)), 0, int(rng.integers(1, 300))]
    frame = int(rng.integers(0, 1000))
    states = [rng.integers(0, 3, c).astype(np.uint8) for c in caps]
    uses = [rng.integers(0, 2000, c).astype(np.int64) for c in caps]
    table = np.array(
        [
            [a.ctypes.data if c else 0 for a, c in zip(states, caps, strict=True)],
            [a.ctypes.data if c else 0 for a, c in zip(uses, caps, strict=True)],
            caps,
        ],
        np.int64,
    )
    slots = np.concatenate([np.flatnonzero(states[p] == 1) for p in (0, 2)]).astype(np.int64)
    pools = np.concatenate([np.full(int((states[p] == 1).sum()), p) for p in (0, 2)]).astype(np.int64)
    if hostile:
        slots, pools = np.append(slots, [caps[0] + 5, 0]), np.append(pools, [0, 1])
    want_states, want_uses = [a.copy() for a in states], [a.copy() for a in uses]
    if not hostile:
        for s, p in zip(slots.tolist(), pools.tolist(), strict=True):
            want_states[p][s] = 2
            want_uses[p][s] = max(want_uses[p][s], frame)
    rows = table.ctypes.data
    got = move(slots.size, slots.ctypes.data, pools.ctypes.data, 3, rows, rows + 24, rows + 48, frame, 1, 2)
    same = all(np.array_equal(a, b) for a, b in zip(states + uses, want_states + want_uses, strict=True))
    if (got < 0) != hostile or not same:
        raise AssertionError(f"ts_move_pools (hostile={hostile}): {got}, state or uses differ from numpy's")
    width = 40
    sampled = rng.integers(-3, max(caps) + (9 if hostile else 0), (3, width)).astype(np.int64)
    counts = rng.integers(0, width + (20 if hostile else 1), 3).astype(np.int64)
    expected = 0
    for p in (0, 2):
        row = sampled[p, : min(int(counts[p]), width)]
        inside = row[(row >= 0) & (row < caps[p])]
        want_uses[p][inside] = frame + 1
        expected += inside.size
    n = touch(3, sampled.ctypes.data, width, counts.ctypes.data, rows + 24, rows + 48, frame + 1)
    if n != expected or not all(np.array_equal(a, b) for a, b in zip(uses, want_uses, strict=True)):
        raise AssertionError(f"ts_touch_pools (hostile={hostile}): {n} touched, uses differ from numpy's")
    return 2


def _replay_victims(victims, rng, *, hostile: bool) -> int:  # noqa: ANN001
    """``ts_victim_keys`` on exact-size ledger arrays against the documented keys (weighed or not, a
    random number of victims);
    hostile: a resident slot naming a texture past the priority table, refused."""
    import numpy as np

    from texstream.runtime.tiles import MAX_TEXTURES

    n, frame = int(rng.integers(1, 3000)), 500
    state, pinned = rng.integers(0, 3, n).astype(np.uint8), (rng.random(n) < 0.1).astype(np.uint8)
    last_used = rng.integers(0, frame + 1, n).astype(np.int64)
    tex, level = rng.integers(0, 4, n).astype(np.int16), rng.integers(0, 12, n).astype(np.int8)
    priority = rng.uniform(0.1, 5.0, MAX_TEXTURES)
    if hostile:
        state[0], pinned[0], last_used[0], tex[0] = 2, 0, 0, MAX_TEXTURES + 1
    count = int(rng.integers(1, n + 5))
    out_keys = np.empty(count, np.int64)
    for weighed in (False, True):
        got = victims(
            n, state.ctypes.data, pinned.ctypes.data, last_used.ctypes.data, tex.ctypes.data, level.ctypes.data,
            priority.ctypes.data if weighed else None, MAX_TEXTURES, frame, 2, 1 << 28, 28, count, out_keys.ctypes.data,
        )  # fmt: skip
        if hostile and weighed:
            if got != -1:
                raise AssertionError(f"ts_victim_keys with a texture past the priority table: {got}, not refused")
            continue
        want = np.flatnonzero((state == 2) & (pinned == 0) & (last_used <= frame - 2))
        idle = (frame - last_used[want]).astype(np.float64)
        if weighed:
            idle /= priority[tex[want]]
        key = (np.minimum(np.floor(idle * 16), 1 << 28).astype(np.int64) * -64 + level[want]) << 28 | want
        if not np.array_equal(out_keys[:got], np.sort(key)[:count]):
            raise AssertionError("ts_victim_keys: compiled victims != numpy's")
    return 2


def _replay_chains(chains, prefetch, merge, keys, space, tables, rng, *, hostile: bool) -> int:  # noqa: ANN001
    """``ts_missing_chains``, ``ts_prefetch_pages``, ``ts_merge_requests`` and ``ts_queue_keys`` from
    exact-size buffers against the scheduler's numpy passes (random coverage, priorities other than 1 in odd draws);
    hostile: an id past the table, a parent cycle (the walk is bounded), a level count past
    MAX_LEVELS (a chain too long), an id past the scheduler's arrays: refused or bounded, the
    scratch clean again either way."""
    import numpy as np

    from texstream.config import StreamerConfig
    from texstream.runtime.feedback_reduce import Wanted
    from texstream.runtime.requests import SCORE_LIMIT, RequestScheduler
    from texstream.runtime.tiles import MAX_LEVELS, MAX_TEXTURES

    capacity = space.parent.size
    tiles = np.flatnonzero(space.is_tile(np.arange(space.used)))
    priority = np.ones(MAX_TEXTURES)
    if rng.random() < 0.5:
        priority[:4] = rng.choice([0.5, 1.0, 2.5, 1e12], 4)
    level_count = space.level_count.copy()
    calls = [(np.unique(rng.choice(tiles, size=int(rng.integers(1, 80)))).astype(np.int64), space.parent, True)]
    if hostile:
        calls = [(np.array([int(tiles[0]), capacity + 3], np.int64), space.parent, False)]
        cycle = np.flatnonzero(tables.own[: space.used] < 0)
        cycle = cycle[space.is_tile(cycle)][:2].astype(np.int64)
        parent = space.parent.copy()
        parent[cycle[0]], parent[cycle[1]] = cycle[1], cycle[0]  # two pages, neither resident
        calls.append((cycle, parent, None))
        calls.append((tiles[:5].astype(np.int64), space.parent, False))
        level_count[: MAX_TEXTURES // 2] = MAX_LEVELS + 5  # on the last call: chains too long
    nothing = np.full_like(tables.own, -1)  # no tile resident: the last hostile call's chains reach the top
    for k, (ids, par, compare) in enumerate(calls):
        n = ids.size
        counts = rng.integers(0, 9, n).astype(np.int64)
        lc = level_count if hostile and k == len(calls) - 1 else space.level_count
        scratch, bits = np.zeros(capacity, np.int64), np.zeros(-(-capacity // 64), np.uint64)
        gap, resident = np.empty(2 * n, np.int64), np.empty(n, np.uint8)
        out_ids, out_weights = np.empty(n * MAX_LEVELS, np.int64), np.empty(n * MAX_LEVELS, np.int64)
        m = chains(
            n, ids.ctypes.data, counts.ctypes.data, par.ctypes.data,
            (nothing if hostile and k == len(calls) - 1 else tables.own).ctypes.data, space.level.ctypes.data,
            space.tex.ctypes.data, capacity, lc.ctypes.data, priority.ctypes.data, MAX_TEXTURES, MAX_LEVELS,
            SCORE_LIMIT, scratch.ctypes.data, bits.ctypes.data, gap.ctypes.data, resident.ctypes.data,
            out_ids.ctypes.data, out_weights.ctypes.data,
        )  # fmt: skip
        if scratch.any() or bits.any() or m > n * MAX_LEVELS:
            raise AssertionError(f"ts_missing_chains call {k}: {m} tiles, scratch left dirty: {scratch.any()}")
        if compare is False and m != -1:
            raise AssertionError(f"ts_missing_chains call {k} on hostile tables: {m}, not refused")
        if compare:
            sched = RequestScheduler(StreamerConfig(), space, tables, lambda i: np.zeros(i.size, bool), priority)
            dk, dw, res = sched._demand(Wanted(ids, counts))  # the numpy twin
            if not (
                np.array_equal(out_ids[:m], dk) and np.array_equal(out_weights[:m], dw)
                and np.array_equal(resident.view(bool), res)
            ):  # fmt: skip
                raise AssertionError(f"ts_missing_chains call {k}: compiled chains != numpy's")
            pk, pw = sched._prefetch(Wanted(ids, counts), res)  # the numpy twin
            out_ids, out_weights = np.empty(8 * n, np.int64), np.empty(8 * n, np.int64)
            m = prefetch(
                n, ids.ctypes.data, counts.ctypes.data, resident.ctypes.data, space.tex.ctypes.data,
                space.level.ctypes.data, par.ctypes.data, tables.own.ctypes.data, capacity,
                space.level_first.ctypes.data, space.tiles_x.ctypes.data, space.tiles_y.ctypes.data,
                priority.ctypes.data, MAX_TEXTURES, MAX_LEVELS, SCORE_LIMIT, scratch.ctypes.data, bits.ctypes.data,
                out_ids.ctypes.data, out_weights.ctypes.data,
            )  # fmt: skip
            if (
                scratch.any()
                or bits.any()
                or not (np.array_equal(out_ids[:m], pk) and np.array_equal(out_weights[:m], pw))
            ):
                raise AssertionError(f"ts_prefetch_pages call {k}: compiled candidates != numpy's")
            _replay_merge(merge, keys, sched, dk, dw, rng)
    if hostile:  # an id past the scheduler's arrays: refused before anything changes
        sched = RequestScheduler(StreamerConfig(), space, tables, lambda i: np.zeros(i.size, bool), priority)
        state = sched.state.copy()
        ids, z = np.array([0, capacity], np.int64), np.zeros(2, np.uint8)
        fresh, counts = np.empty(2, np.int64), np.empty(2, np.int64)
        got = merge(
            2, ids.ctypes.data, ids.ctypes.data, z.ctypes.data, 5, 0, SCORE_LIMIT, capacity, sched.state.ctypes.data,
            sched.retry_at.ctypes.data, sched.last_wanted.ctypes.data, sched.score.ctypes.data, sched.tier.ctypes.data,
            fresh.ctypes.data, counts.ctypes.data,
        )  # fmt: skip
        if got != -1 or not np.array_equal(state, sched.state):
            raise AssertionError(f"ts_merge_requests on an id past the arrays: {got}, state changed")
    return len(calls)


def _replay_merge(merge, keys, sched, ids, weights, rng) -> None:  # noqa: ANN001
    """``ts_merge_requests`` on copies of a scheduler's arrays (some tiles failed, some loading) from
    exact-size buffers, against the numpy `_merge` on the originals; then ``ts_queue_keys`` on the
    queue that made (some of it stale, some loading) against the numpy `_live_queue`."""
    import dataclasses

    import numpy as np

    from texstream.runtime.requests import SCORE_LIMIT
    from texstream.runtime.tiles import MAX_LEVELS

    n, frame = ids.size, 9
    if n == 0:
        return
    sched.mark_failed(ids[::3], 4)  # some back-offs over by frame 9, some not
    sched.mark_failed(ids[1::5], 7)
    loading = (rng.random(n) < 0.2).astype(np.uint8)
    sched.loading = lambda i: loading.astype(bool)
    names = ("state", "retry_at", "last_wanted", "score", "tier")
    arrays = [getattr(sched, f).copy() for f in names]
    fresh, counts = np.empty(n, np.int64), np.empty(2, np.int64)
    got = merge(
        n, ids.ctypes.data, weights.ctypes.data, loading.ctypes.data, frame, 1, SCORE_LIMIT, arrays[0].size,
        *(a.ctypes.data for a in arrays), fresh.ctypes.data, counts.ctypes.data,
    )  # fmt: skip
    queue, retried = sched.queue.copy(), sched.stats.retried
    queued = sched._merge(frame, ids, weights, 1)  # the numpy twin
    new = np.setdiff1d(sched.queue, queue)
    same = all(np.array_equal(a, getattr(sched, f)) for a, f in zip(arrays, names, strict=True))
    if not (
        same and int(counts[0]) == queued and int(counts[1]) == sched.stats.retried - retried
        and np.array_equal(np.sort(fresh[:got]), new)
    ):  # fmt: skip
        raise AssertionError("ts_merge_requests: compiled queueing != numpy's")
    q = sched.queue.copy()  # then the queue cleaned and keyed, some of it stale, some loading
    sched.last_wanted[q[::4]] = frame - 20
    loading = (rng.random(q.size) < 0.2).astype(np.uint8)
    sched.loading = lambda i: loading.astype(bool)
    state = sched.state.copy()
    flags, out_q, out_keys = np.empty(q.size, np.uint8), np.empty(q.size, np.int64), np.empty(q.size, np.uint64)
    space, tables = sched.space, sched.tables
    got = keys(
        q.size, q.ctypes.data, loading.ctypes.data, state.size, state.ctypes.data, space.level.ctypes.data,
        tables.own.ctypes.data, sched.last_wanted.ctypes.data, sched.score.ctypes.data, sched.tier.ctypes.data, frame,
        8, MAX_LEVELS, SCORE_LIMIT, flags.ctypes.data, out_q.ctypes.data, out_keys.ctypes.data, counts.ctypes.data,
    )  # fmt: skip
    sched.config = dataclasses.replace(sched.config, cancel_after_frames=8)
    kept, key, cancelled = sched._live_queue(frame, q)  # the numpy twin
    if not (
        np.array_equal(out_q[:got], kept) and np.array_equal(out_keys[:got], key)
        and int(counts[0]) == cancelled and np.array_equal(state, sched.state)
    ):  # fmt: skip
        raise AssertionError("ts_queue_keys: compiled queue and keys != numpy's")


def _replay_mips(lib: Path) -> int:
    """The bake's mip loops (ts_mip_reduce_rgba8, ts_mip_reduce_f32, ts_mip_encode_f32 and
    ts_mip_reduce_twice_rgba8) of the sanitized build on exact-size arrays of odd and even widths
    (vector bodies and their tails) against numpy's path, then calls with a row stride one texel
    short, an empty width or rows the source does not make: refused (-1), nothing touched."""
    import numpy as np

    from texstream.bake import mips
    from texstream.bake.mips import Transfer
    from texstream.pack.format import AddressMode

    cdll = ctypes.CDLL(str(lib))
    i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    reduce8, reduce32, encode = cdll.ts_mip_reduce_rgba8, cdll.ts_mip_reduce_f32, cdll.ts_mip_encode_f32
    twice = cdll.ts_mip_reduce_twice_rgba8
    reduce8.argtypes = (ptr, i64, i64, i64, ptr, c_int, c_int, ptr, i64)
    reduce32.argtypes = (ptr, i64, i64, i64, c_int, ptr, i64)
    encode.argtypes = (ptr, i64, i64, i64, ptr, c_int, ptr, i64)
    twice.argtypes = (ptr, i64, i64, i64, ptr, c_int, c_int, ptr, c_int, ptr, i64, i64, i64, ptr, i64)
    for fn in (reduce8, reduce32, encode, twice):
        fn.restype = i64
    rng = np.random.default_rng(5)
    checks = 0
    previous = mips.use_native_reduce(False)  # the reference: numpy's path
    try:
        for m, w in ((2, 1), (2, 3), (4, 7), (6, 333), (2, 1031), (8, 64)):
            u8 = rng.integers(0, 256, (m, w, 4), np.uint8)
            f32 = rng.random((m, w, 4), np.float32) * np.float32(1.5) - np.float32(0.25)
            wo = (w + 1) // 2
            for srgb, alpha in ((True, True), (True, False), (False, True)):
                t = Transfer(srgb=srgb, alpha=alpha)
                for mode in AddressMode:
                    wrap = int(mode is AddressMode.WRAP)
                    out = np.empty((m // 2, wo, 4), np.float32)
                    pairs = mips._pair_table(srgb)
                    got = reduce8(
                        u8.ctypes.data,
                        m,
                        w,
                        w * 4,
                        pairs.ctypes.data,
                        int(srgb and alpha),
                        wrap,
                        out.ctypes.data,
                        wo * 4,
                    )
                    if got != 0 or not np.array_equal(out.view(np.uint32), t.reduce(u8, None, mode).view(np.uint32)):
                        raise AssertionError(f"ts_mip_reduce_rgba8 {m}x{w} {t} {mode}: status {got} or texels differ")
                    got = reduce32(f32.ctypes.data, m, w, w * 4, wrap, out.ctypes.data, wo * 4)
                    if got != 0 or not np.array_equal(out.view(np.uint32), t.reduce(f32, None, mode).view(np.uint32)):
                        raise AssertionError(f"ts_mip_reduce_f32 {m}x{w} {mode}: status {got} or texels differ")
                    checks += 2
                codes = np.empty((m, w, 4), np.uint8)
                mask = (0b0111 if alpha else 0b1111) if srgb else 0
                table = mips._encode_table(True)
                for first_pair in (0, 1):
                    rows2 = (m // 2 - first_pair) // 2
                    if rows2 < 1:
                        continue
                    w2 = (wo + 1) // 2
                    mid, last = np.empty((m // 2, wo, 4), np.uint8), np.empty((rows2, w2, 4), np.float32)
                    got = twice(
                        u8.ctypes.data, m, w, w * 4, pairs.ctypes.data, int(srgb and alpha), 0, table.ctypes.data,
                        mask, mid.ctypes.data, wo * 4, first_pair, rows2, last.ctypes.data, w2 * 4,
                    )  # fmt: skip
                    one = t.reduce(u8, None, AddressMode.CLAMP)
                    two = t.reduce(one[first_pair : first_pair + 2 * rows2], None, AddressMode.CLAMP)
                    if got != 0 or not np.array_equal(mid, t.encode(one)) or not np.array_equal(last, two):
                        raise AssertionError(f"ts_mip_reduce_twice_rgba8 {m}x{w} {t} from {first_pair}: differs")
                    checks += 1
                got = encode(f32.ctypes.data, m, w, w * 4, table.ctypes.data, mask, codes.ctypes.data, w * 4)
                if got != 0 or not np.array_equal(codes, t.encode(f32)):
                    raise AssertionError(f"ts_mip_encode_f32 {m}x{w} {t}: status {got} or codes differ")
                checks += 1
    finally:
        mips.use_native_reduce(previous)
    u8 = np.zeros((2, 5, 4), np.uint8)
    f32 = np.zeros((2, 5, 4), np.float32)
    out = np.zeros((1, 3, 4), np.float32)
    codes = np.zeros((2, 5, 4), np.uint8)
    pairs, table = mips._pair_table(True), mips._encode_table(True)
    refusals = (
        reduce8(u8.ctypes.data, 2, 5, 16, pairs.ctypes.data, 0, 0, out.ctypes.data, 12),  # source stride short
        reduce8(u8.ctypes.data, 2, 5, 20, pairs.ctypes.data, 0, 0, out.ctypes.data, 8),  # output stride short
        reduce8(u8.ctypes.data, 2, 0, 20, pairs.ctypes.data, 0, 0, out.ctypes.data, 12),  # no width
        reduce32(f32.ctypes.data, 2, 5, 16, 0, out.ctypes.data, 12),
        reduce32(f32.ctypes.data, -2, 5, 20, 0, out.ctypes.data, 12),
        encode(f32.ctypes.data, 2, 5, 20, table.ctypes.data, 0, codes.ctypes.data, 16),
        twice(  # a last row from middle rows the source does not make
            u8.ctypes.data,
            2,
            5,
            20,
            pairs.ctypes.data,
            0,
            0,
            table.ctypes.data,
            0,
            codes.ctypes.data,
            12,
            0,
            1,
            out.ctypes.data,
            8,
        ),  # fmt: skip
    )
    if any(r != -1 for r in refusals) or out.any() or codes.any():
        raise AssertionError(f"the mip loops took a geometry they must refuse: {refusals}")
    return checks + len(refusals) + _replay_checksums(lib)


def _replay_checksums(lib: Path) -> int:
    """ts_checksum_tiles of the sanitized build on exact-size buffers of tiles against xxhash's."""
    import numpy as np
    import xxhash

    from texstream.native import Codecs, load_library

    native = load_library(str(lib), deep_bind=False)
    if native is None:
        raise AssertionError(f"cannot load {lib} with its codecs")
    fn = ctypes.CDLL(str(lib)).ts_checksum_tiles
    fn.restype = ctypes.c_int64
    fn.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(Codecs), ctypes.c_void_p)
    rng = np.random.default_rng(2)
    for n, size in ((1, 1), (3, 9248), (7, 1), (2, 0)):
        data = rng.integers(0, 256, n * size, np.uint8)
        out = np.empty(n, np.uint64)
        got = fn(data.ctypes.data, n, size, ctypes.byref(native.codecs), out.ctypes.data)
        want = [xxhash.xxh3_64_intdigest(data[i * size : (i + 1) * size].tobytes()) for i in range(n)]
        if got != 0 or out.tolist() != want:
            raise AssertionError(f"ts_checksum_tiles of {n} tiles of {size} bytes: status {got} or digests differ")
    return 4


def replay(
    lib: Path, targets: tuple[str, ...] = ("pack", "header", "tile", "hdr", "procedural", "mips", "deciders")
) -> int:
    """Every corpus and crash input of the pack, header, tile and hdr targets, the procedural
    generators' loops, the bake's mip loops and the render thread's decider loops, through the
    sanitized helper."""
    from texstream.native import load_library
    from texstream.runtime.io_workers import _Scratch

    if not hasattr(ctypes.CDLL(None), "__asan_report_load1"):
        print("the sanitizer runtime is not loaded (run with sanitized_env: LD_PRELOAD)", file=sys.stderr)
        return 2
    native = load_library(str(lib), deep_bind=False)
    if native is None:
        print(f"cannot load the sanitized helper {lib} (or a codec function it needs)", file=sys.stderr)
        return 2
    scratches = (_Scratch(native), _Scratch(None))
    inputs = 0
    checks = 0
    with tempfile.TemporaryDirectory(prefix="texstream-asan-") as tmp:
        for target in targets:
            if target == "procedural":
                checks += _replay_procedural(lib)
                continue
            if target == "deciders":
                checks += _replay_deciders(lib)
                continue
            if target == "mips":
                checks += _replay_mips(lib)
                continue
            files = sorted((HERE / "corpus" / target).glob("*")) + sorted((HERE / "crashes" / target).glob("*"))
            for f in files:
                label = f"{target}/{f.name}"
                if target == "tile":
                    checks += _replay_tile(f.read_bytes(), native, scratches[0], label)
                elif target == "hdr":
                    checks += _replay_hdr(f.read_bytes(), lib, label)
                else:
                    checks += _replay_pack(f.read_bytes(), Path(tmp), scratches, label)
                inputs += 1
    for s in scratches:
        s.close()
    print(f"sanitized helper: {inputs} corpus inputs, {checks} batches compared with the Python path, no report")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "replay":
        return replay(Path(argv[1]), *([tuple(argv[2:])] if argv[2:] else []))
    if len(argv) == 2 and argv[0] == "build":
        lib, why = build(Path(argv[1]))
        print(lib or why, file=sys.stdout if lib else sys.stderr)
        return 0 if lib else 1
    if len(argv) == 1:
        lib, why = build(Path(argv[0]))
        if lib is None:
            print(f"cannot run the sanitizer replay: {why}", file=sys.stderr)
            return 1
        command = [sys.executable, "-m", "tests.fuzz.native_asan", "replay", str(lib)]
        return subprocess.run(command, cwd=ROOT, env=sanitized_env(compiler() or "gcc"), check=False).returncode
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
