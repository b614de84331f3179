"""Loads texstream's compiled helper (`_native.c`) and the codec functions it calls, through ctypes.

`load()` returns a `Native` with the two loops, or None when the helper was not built (no C
compiler at install time) or a codec function cannot be found; callers then use their pure-Python
twins, which give the same results.

The decoders and the hash come from the extension modules of the zstandard, lz4 and xxhash packages
texstream depends on (they export the C functions): the same versions the pure-Python path calls, so
both paths judge damaged data alike. The system's libzstd, liblz4 and libxxhash are the fallback.
The modules are opened with RTLD_DEEPBIND: a library loaded late binds its internal calls to the
first definition in the process's global scope, and a GL driver that loads the system's libzstd
(Mesa does) would then mix two zstd versions inside one decode.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

__all__ = [
    "Codecs",
    "HdrFunctions",
    "Native",
    "PoolFunctions",
    "checksum_tiles",
    "choose_uploads",
    "ProceduralFunctions",
    "encode_f32",
    "feedback_pages",
    "hdr_functions",
    "load",
    "load_library",
    "merge_requests",
    "missing_chains",
    "move_pools",
    "plan_uploads",
    "prefetch_pages",
    "procedural_functions",
    "queue_keys",
    "reduce_f32",
    "reduce_rgba8",
    "reduce_twice_rgba8",
    "sample_slots",
    "touch_pools",
    "victim_keys",
    "widen_pages",
]

log = logging.getLogger(__name__)

_i64p = ctypes.POINTER(ctypes.c_int64)
_u64p = ctypes.POINTER(ctypes.c_uint64)
_u8p = ctypes.POINTER(ctypes.c_uint8)
_i32p = ctypes.POINTER(ctypes.c_int32)


class Codecs(ctypes.Structure):
    """`ts_codecs` in _native.c: the decoder and hash entry points."""

    _fields_ = [
        ("zstd_decompress", ctypes.c_void_p),
        ("zstd_is_error", ctypes.c_void_p),
        ("zstd_content", ctypes.c_void_p),
        ("lz4_decompress", ctypes.c_void_p),
        ("xxh3", ctypes.c_void_p),
    ]


@dataclass(frozen=True)
class PoolFunctions:
    """`ts_pool_*` in _native.c: I/O threads with no Python on them (see its comment for the contracts)."""

    create: ctypes._CFuncPtr
    submit_many: ctypes._CFuncPtr
    drain: ctypes._CFuncPtr
    wait: ctypes._CFuncPtr  # releases the GIL (it blocks)
    overdue: ctypes._CFuncPtr
    counts: ctypes._CFuncPtr
    hold: ctypes._CFuncPtr
    close: ctypes._CFuncPtr  # releases the GIL (it waits for the threads)
    release: ctypes._CFuncPtr
    zstd_create: int  # ZSTD_createDCtx / ZSTD_freeDCtx, for each thread's own context
    zstd_free: int


@dataclass(frozen=True)
class Native:
    """The compiled loops plus what they need; see _native.c for the contracts."""

    path: str
    read_batch: ctypes._CFuncPtr  # releases the GIL for the call
    decode_batch: ctypes._CFuncPtr  # releases the GIL for the call
    upload_cells: ctypes._CFuncPtr  # keeps the GIL (render thread, GL)
    upload_runs: ctypes._CFuncPtr | None  # the same, one call per run of layers (None: an older build)
    copy_spans: ctypes._CFuncPtr | None  # buffer-to-buffer copies, keeps the GIL (None: an older build)
    codecs: Codecs
    create_dctx: ctypes._CFuncPtr
    free_dctx: ctypes._CFuncPtr
    libraries: tuple[ctypes.CDLL, ...]  # kept loaded while the function pointers are in use
    pool: PoolFunctions | None = None  # None: an older build (the I/O threads run Python around each read)
    upload_runs_bound: ctypes._CFuncPtr | None = None  # upload_runs with its checks and GL state (None: older)


def _module_file(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.origin and spec.origin != "built-in" else None


def _symbol(
    symbol: str, sonames: tuple[str, ...], modules: tuple[str, ...], deep_bind: bool = True
) -> tuple[ctypes.CDLL, int] | None:
    """The address of C function `symbol`: from the first extension module of `modules`, else the
    first system library of `sonames`, that exports it."""
    deep = getattr(os, "RTLD_DEEPBIND", 0) if deep_bind else 0
    candidates = [(p, ctypes.DEFAULT_MODE | deep) for p in (_module_file(m) for m in modules) if p]
    candidates += [(name, ctypes.DEFAULT_MODE) for name in sonames]
    for path, mode in candidates:
        try:
            lib = ctypes.CDLL(path, mode=mode)
            fn = getattr(lib, symbol)
        except (OSError, AttributeError):
            continue
        return lib, ctypes.cast(fn, ctypes.c_void_p).value or 0
    return None


@functools.cache
def load() -> Native | None:
    """The compiled helper, or None (logged once) when it or a codec function is missing."""
    path = _module_file("texstream.native._native")
    if path is None:
        log.info("texstream's compiled helper is not built: streaming I/O and uploads use pure Python")
        return None
    return load_library(path)


def load_library(path: str, *, deep_bind: bool = True) -> Native | None:
    """The helper compiled at `path` (`load()` passes the installed one; the sanitizer tests a build
    of their own), or None when it or a codec function cannot be loaded.

    `deep_bind=False` opens the codec modules without RTLD_DEEPBIND, which the address sanitizer's
    runtime refuses; only a process that loads no second zstd (no GL driver) may do so.
    """
    zstd = (("libzstd.so.1", "libzstd.1.dylib"), ("zstandard._cffi",))
    wanted = {
        "zstd_decompress": ("ZSTD_decompressDCtx", *zstd),
        "zstd_is_error": ("ZSTD_isError", *zstd),
        "zstd_content": ("ZSTD_getFrameContentSize", *zstd),
        "zstd_create": ("ZSTD_createDCtx", *zstd),
        "zstd_free": ("ZSTD_freeDCtx", *zstd),
        "lz4_decompress": ("LZ4_decompress_safe", ("liblz4.so.1", "liblz4.1.dylib"), ("lz4.block._block",)),
        "xxh3": ("XXH3_64bits", ("libxxhash.so.0", "libxxhash.0.dylib"), ("xxhash._xxhash",)),
    }
    found: dict[str, tuple[ctypes.CDLL, int]] = {}
    for key, (symbol, sonames, modules) in wanted.items():
        hit = _symbol(symbol, sonames, modules, deep_bind)
        if hit is None or not hit[1]:
            log.info(
                "no C function %s found (zstandard/lz4/xxhash packages or system library): pure Python I/O", symbol
            )
            return None
        found[key] = hit
    try:
        gil_free = ctypes.CDLL(path)
        gil_held = ctypes.PyDLL(path)
        read_batch = gil_free.ts_read_batch
        decode_batch = gil_free.ts_decode_batch
        upload_cells = gil_held.ts_upload_cells
        upload_runs = getattr(gil_held, "ts_upload_runs", None)
        copy_spans = getattr(gil_held, "ts_copy_spans", None)
        upload_runs_bound = getattr(gil_held, "ts_upload_runs_bound", None)
    except (OSError, AttributeError) as exc:
        log.warning("texstream's compiled helper %s does not load (%s): pure Python I/O", Path(path).name, exc)
        return None
    read_batch.restype = ctypes.c_int64
    read_batch.argtypes = (
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int64,
        _i64p,
        _i64p,
        ctypes.c_int64,
        _u64p,
        _i64p,
        ctypes.c_void_p,
        ctypes.c_int64,
        _u8p,
        ctypes.c_uint8,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.POINTER(Codecs),
        _i32p,
        _i32p,
    )
    decode_batch.restype = ctypes.c_int64
    decode_batch.argtypes = (
        ctypes.c_int,
        ctypes.c_int64,
        ctypes.c_void_p,
        _i64p,
        _i64p,
        ctypes.c_int64,
        _u64p,
        _i64p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.POINTER(Codecs),
        _i32p,
    )
    upload_cells.restype = None
    upload_cells.argtypes = (
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int64,
        _i64p,
        _i64p,
        _i64p,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_int,
        _i64p,
    )
    if upload_runs is not None:
        upload_runs.restype = None
        # the arrays as plain addresses (c_void_p): the render thread passes ints, converted without
        # building a ctypes pointer object per array per frame
        upload_runs.argtypes = (
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_void_p,
        )
    if upload_runs_bound is not None:
        upload_runs_bound.restype = ctypes.c_int64
        _u, _int = ctypes.c_uint, ctypes.c_int
        upload_runs_bound.argtypes = (
            (ctypes.c_void_p, _u, _u, _u, _int, _int, _int, _int, _u, _int, _int)
            + (ctypes.c_int64,) * 3
            + (ctypes.c_void_p,) * 5
        )
    if copy_spans is not None:
        copy_spans.restype = None
        copy_spans.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    codecs = Codecs(
        *(found[k][1] for k in ("zstd_decompress", "zstd_is_error", "zstd_content", "lz4_decompress", "xxh3"))
    )
    create = ctypes.CFUNCTYPE(ctypes.c_void_p)(found["zstd_create"][1])
    free = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p)(found["zstd_free"][1])
    libs = tuple(lib for lib, _ in found.values())
    pool = _pool_functions(gil_free, gil_held, found["zstd_create"][1], found["zstd_free"][1])
    native = Native(
        path,
        read_batch,
        decode_batch,
        upload_cells,
        upload_runs,
        copy_spans,
        codecs,
        create,
        free,
        libs,
        pool,
        upload_runs_bound,
    )
    log.debug("texstream's compiled helper: %s", path)
    return native


_ptr, _i64, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int  # the loops' argument types


def _pool_functions(
    gil_free: ctypes.CDLL, gil_held: ctypes.PyDLL, zstd_create: int, zstd_free: int
) -> PoolFunctions | None:
    """The `ts_pool_*` functions, or None when the helper predates them. The calls that return at once
    keep the GIL (a few microseconds on the render thread); `wait` and `close` block, so they drop it."""
    try:
        fns = {name: getattr(gil_held, f"ts_pool_{name}") for name in ("create", "submit_many", "drain", "overdue")}
        fns |= {name: getattr(gil_held, f"ts_pool_{name}") for name in ("counts", "hold", "release")}
        fns |= {name: getattr(gil_free, f"ts_pool_{name}") for name in ("wait", "close")}
    except AttributeError:
        return None
    d = ctypes.c_double
    signatures = {
        "create": (_ptr, (_i64, _ptr, _i64, _ptr, ctypes.c_uint8, _i64, ctypes.POINTER(Codecs), _ptr, _ptr)),
        "submit_many": (_i64, (_ptr, _i64, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr)),
        "drain": (_i64, (_ptr, _i64, _ptr, _ptr, _ptr)),
        "wait": (_i64, (_ptr, d)),
        "overdue": (_i64, (_ptr, d, _i64, _ptr)),
        "counts": (None, (_ptr, _ptr)),
        "hold": (None, (_ptr, _i64)),
        "close": (_i64, (_ptr, d, _i64, _ptr, _ptr)),
        "release": (None, (_ptr,)),
    }
    for name, (restype, argtypes) in signatures.items():
        fns[name].restype, fns[name].argtypes = restype, argtypes
    return PoolFunctions(**fns, zstd_create=zstd_create, zstd_free=zstd_free)


def _compiled_loop(
    symbol: str, argtypes: tuple, missing: str, *, path: str | None = None, keep_gil: bool = False
) -> ctypes._CFuncPtr | None:
    """The helper's `symbol` (a loop in plain C returning int64: 0 or a count, < 0 for arguments it
    refused; see _native.c), or None when the helper is not built or predates it (`missing` says what
    numpy then does, logged). Bake loops are called through ctypes.CDLL, which releases the GIL;
    `keep_gil` (the render thread's loops, a few microseconds a call: releasing the lock would only
    invite a wait to take it back) through ctypes.PyDLL. `path`: a helper other than the installed one
    (the sanitizer tests' build)."""
    path = path or _module_file("texstream.native._native")
    if path is None:
        return None
    try:
        fn = getattr((ctypes.PyDLL if keep_gil else ctypes.CDLL)(path), symbol)
    except (OSError, AttributeError) as exc:  # a helper built before the function existed
        log.info("texstream's compiled helper has no %s (%s): %s", symbol, exc, missing)
        return None
    fn.restype = ctypes.c_int64
    fn.argtypes = argtypes
    return fn


@functools.cache
def reduce_rgba8() -> ctypes._CFuncPtr | None:
    """``ts_mip_reduce_rgba8`` (a bake band's first mip reduction; see _native.c), or None when the helper
    is not built: `mips` then reduces with numpy, to the same bits. Needs no codec function."""
    args = (_ptr, _i64, _i64, _i64, _ptr, _int, _int, _ptr, _i64)
    return _compiled_loop("ts_mip_reduce_rgba8", args, "numpy reduces")


@functools.cache
def reduce_f32() -> ctypes._CFuncPtr | None:
    """``ts_mip_reduce_f32`` (the reductions after a band's first), or None as for `reduce_rgba8`."""
    args = (_ptr, _i64, _i64, _i64, _int, _ptr, _i64)
    return _compiled_loop("ts_mip_reduce_f32", args, "numpy reduces")


@functools.cache
def encode_f32() -> ctypes._CFuncPtr | None:
    """``ts_mip_encode_f32`` (float32 linear texels to 8-bit codes in a bake band), or None as for
    `reduce_rgba8`: `mips` then encodes with numpy, to the same bits."""
    args = (_ptr, _i64, _i64, _i64, _ptr, _int, _ptr, _i64)
    return _compiled_loop("ts_mip_encode_f32", args, "numpy encodes")


@functools.cache
def reduce_twice_rgba8() -> ctypes._CFuncPtr | None:
    """``ts_mip_reduce_twice_rgba8`` (a band's first two reductions in one pass: the middle level as
    8-bit codes, the next as float32), or None as for `reduce_rgba8`: `mips` then makes them one by one."""
    args = (_ptr, _i64, _i64, _i64, _ptr, _int, _int, _ptr, _int, _ptr, _i64, _i64, _i64, _ptr, _i64)
    return _compiled_loop("ts_mip_reduce_twice_rgba8", args, "the levels are made one by one")


@functools.cache
def checksum_tiles() -> Callable[[memoryview, int, int], np.ndarray] | None:
    """The xxh3-64 of each of a buffer's `n` back-to-back tiles of `size` bytes as a uint64 array, in
    one call of ``ts_checksum_tiles`` (the hash the pack's index records, from the same xxhash library
    the pure-Python path calls); None when the helper or the hash is missing (`codec` then hashes
    tile by tile)."""
    native = load()
    if native is None:
        return None
    try:
        fn = ctypes.CDLL(native.path).ts_checksum_tiles
    except (OSError, AttributeError) as exc:
        log.info("texstream's compiled helper has no ts_checksum_tiles (%s): tiles are hashed one by one", exc)
        return None
    fn.restype = ctypes.c_int64
    fn.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(Codecs), ctypes.c_void_p)
    codecs = ctypes.byref(native.codecs)
    import numpy as np

    def checksums(data: memoryview, n: int, size: int) -> np.ndarray:
        if n < 0 or size < 0 or len(data) < n * size:
            raise ValueError(f"{len(data)} bytes do not hold {n} tiles of {size} bytes")
        src = np.frombuffer(data, np.uint8, n * size)
        out = np.empty(n, np.uint64)
        if n and fn(src.ctypes.data, n, size, codecs, out.ctypes.data) != 0:
            raise RuntimeError("ts_checksum_tiles refused its arguments")
        return out

    return checksums


@functools.cache
def feedback_pages(path: str | None = None) -> ctypes._CFuncPtr | None:
    """``ts_feedback_pages`` (a frame's feedback entries to its wanted pages: counted, checked against
    the open textures' tiles and expanded onto texture sets' followers in one call, see _native.c)
    from the helper at `path` (None: the installed one), or None when it is not built or predates it:
    `feedback_reduce.FeedbackReducer` and `texture_sets.SetTable` then do it with numpy, to the same
    pages."""
    args = (_i64, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64, _ptr, _i64, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr)
    return _compiled_loop("ts_feedback_pages", args, "numpy reduces the feedback", path=path, keep_gil=True)


@functools.cache
def sample_slots(path: str | None = None) -> ctypes._CFuncPtr | None:
    """``ts_sample_slots`` (the cache slots a frame's pages and their parents sample, by pool), or None
    as for `feedback_pages`: `touch.SampledSlots` then finds them with numpy, the same slots."""
    args = (_i64, _ptr, _ptr, _ptr, _ptr, _i64, _ptr, _i64, _i64, _i64, _ptr, _i64, _ptr)
    return _compiled_loop("ts_sample_slots", args, "numpy finds the slots to touch", path=path, keep_gil=True)


@functools.cache
def missing_chains(path: str | None = None) -> ctypes._CFuncPtr | None:
    """``ts_missing_chains`` (the request scheduler's missing chains of a frame's wanted pages, weighed
    and summed), or None as for `feedback_pages`: `requests.RequestScheduler` then walks them with
    numpy, to the same tiles and weights."""
    args = (_i64, *(_ptr,) * 6, _i64, _ptr, _ptr, *(_i64,) * 3, *(_ptr,) * 6)
    return _compiled_loop("ts_missing_chains", args, "numpy walks the missing chains", path=path, keep_gil=True)


@functools.cache
def prefetch_pages(path: str | None = None) -> ctypes._CFuncPtr | None:
    """``ts_prefetch_pages`` (the scheduler's prefetch candidates: neighbours and children of a frame's
    wanted pages, weighed), or None as for `feedback_pages`: the scheduler then finds them with numpy."""
    args = (_i64, *(_ptr,) * 7, _i64, *(_ptr,) * 4, *(_i64,) * 3, *(_ptr,) * 4)
    return _compiled_loop("ts_prefetch_pages", args, "numpy finds the prefetch candidates", path=path, keep_gil=True)


@functools.cache
def merge_requests(path: str | None = None) -> ctypes._CFuncPtr | None:
    """``ts_merge_requests`` (the scheduler queueing a frame's asked-for tiles), or None as for
    `feedback_pages`: the scheduler then queues them with numpy, to the same state."""
    args = (_i64, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr)
    return _compiled_loop("ts_merge_requests", args, "numpy queues the requests", path=path, keep_gil=True)


@functools.cache
def queue_keys(path: str | None = None) -> ctypes._CFuncPtr | None:
    """``ts_queue_keys`` (the scheduler's queue cleaned and keyed for the frame's order), or None as
    for `feedback_pages`: the scheduler then does it with numpy, to the same queue and keys."""
    args = (_i64, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64, _ptr, _ptr, _ptr, _ptr)
    return _compiled_loop("ts_queue_keys", args, "numpy orders the queue", path=path, keep_gil=True)


@functools.cache
def move_pools(path: str | None = None) -> ctypes._CFuncPtr | None:
    """``ts_move_pools`` (a frame's arrivals into the cache slots of every pool, all or nothing), or
    None as for `feedback_pages`: the ledgers then mark them with numpy."""
    args = (_i64, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64, _i64)
    return _compiled_loop("ts_move_pools", args, "numpy marks slots resident", path=path, keep_gil=True)


@functools.cache
def touch_pools(path: str | None = None) -> ctypes._CFuncPtr | None:
    """``ts_touch_pools`` (a use of the sampled cache slots of every pool), or None as for
    `feedback_pages`: the ledgers then record it with numpy."""
    args = (_i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64)
    return _compiled_loop("ts_touch_pools", args, "numpy records slot uses", path=path, keep_gil=True)


@functools.cache
def choose_uploads(path: str | None = None) -> ctypes._CFuncPtr | None:
    """``ts_choose_uploads`` (the READY loads a frame uploads, under its caps), or None as for
    `feedback_pages`: `upload_choice.choose_numpy` then chooses them."""
    args = (_i64, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _i64, _i64, _i64, _ptr, _ptr)
    return _compiled_loop("ts_choose_uploads", args, "numpy chooses the uploads", path=path, keep_gil=True)


@functools.cache
def plan_uploads(path: str | None = None) -> ctypes._CFuncPtr | None:
    """``ts_plan_uploads`` (a frame's upload calls: runs of cache layers per pool), or None as for
    `feedback_pages`: `upload_choice.plan_numpy` then plans them."""
    args = (_i64, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr)
    return _compiled_loop("ts_plan_uploads", args, "numpy plans the upload calls", path=path, keep_gil=True)


@functools.cache
def widen_pages(path: str | None = None) -> ctypes._CFuncPtr | None:
    """``ts_widen_pages`` (a new view's pages with their same-level neighbours), or None as for
    `feedback_pages`: `requests.RequestScheduler.widened` then widens with numpy."""
    args = (_i64, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _ptr, _ptr, _ptr, _ptr)
    return _compiled_loop("ts_widen_pages", args, "numpy widens the new view's pages", path=path, keep_gil=True)


@functools.cache
def victim_keys(path: str | None = None) -> ctypes._CFuncPtr | None:
    """``ts_victim_keys`` (a cache pool's least-recently-used victims, in one pass over the slots),
    or None as for `feedback_pages`: the ledger then picks them with numpy."""
    args = (_i64, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64, _i64, _i64, _ptr)
    return _compiled_loop("ts_victim_keys", args, "numpy picks the victims", path=path, keep_gil=True)


@dataclass(frozen=True)
class HdrFunctions:
    """The Radiance reader's compiled loops (see _native.c): ``ts_hdr_scanlines`` and ``ts_rgbe_to_float``."""

    path: str
    scanlines: ctypes._CFuncPtr  # releases the GIL for the call
    rgbe_to_float: ctypes._CFuncPtr


@functools.cache
def hdr_functions(path: str | None = None) -> HdrFunctions | None:
    """The Radiance reader's loops from the helper at `path` (None: the installed one; the sanitizer
    tests pass a build of their own), or None when it is not built or predates them: `assets.hdr`
    then decodes in Python and numpy, with the same results."""
    path = path or _module_file("texstream.native._native")
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        scanlines, to_float = lib.ts_hdr_scanlines, lib.ts_rgbe_to_float
    except (OSError, AttributeError) as exc:
        log.info("texstream's compiled helper has no Radiance decoder (%s): Python decodes", exc)
        return None
    scanlines.restype = ctypes.c_int64
    scanlines.argtypes = (
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_int64),
    )
    to_float.restype = None
    to_float.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)
    return HdrFunctions(path, scanlines, to_float)


@dataclass(frozen=True)
class ProceduralFunctions:
    """The procedural generators' compiled loops (see _native.c): ``ts_lattice_noise``,
    ``ts_subdivide_add`` and ``ts_height_rows``, called through ctypes.CDLL (the interpreter lock is
    released for each call: one lattice block or one band of rows)."""

    path: str
    lattice_noise: ctypes._CFuncPtr
    subdivide_add: ctypes._CFuncPtr
    height_rows: ctypes._CFuncPtr


@functools.cache
def procedural_functions(path: str | None = None) -> ProceduralFunctions | None:
    """The procedural generators' loops from the helper at `path` (None: the installed one; the
    sanitizer tests pass a build of their own), or None when it is not built or predates them:
    `bake.procedural` then generates with numpy, to the same bits."""
    path = path or _module_file("texstream.native._native")
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        noise, subdivide, rows = lib.ts_lattice_noise, lib.ts_subdivide_add, lib.ts_height_rows
    except (OSError, AttributeError) as exc:
        log.info("texstream's compiled helper has no procedural generator (%s): numpy generates", exc)
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    noise.restype = None
    noise.argtypes = (i64, i64, i64, i64, ctypes.c_uint32, ctypes.c_float, ptr, i64)
    subdivide.restype = i64
    subdivide.argtypes = (ptr, i64, i64, i64, i64, i64, i64, i64, i64, i64, ptr, i64, ptr, i64)
    rows.restype = i64
    rows.argtypes = (ptr, i64, i64, i64, i64, i64, i64, i64, i64, ctypes.c_int, ptr, ptr, ptr, i64, ptr, i64, ptr, i64)
    return ProceduralFunctions(path, noise, subdivide, rows)
