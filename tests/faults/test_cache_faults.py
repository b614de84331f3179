"""The remote cache with each file operation failing in turn: a cache fault is a miss or a cache
that runs without its folder, never an error of the read, never wrong bytes, never a stale file."""

from __future__ import annotations

import errno
import logging
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from texstream.remote.cache import BlockCache, CacheUnavailable
from texstream.testing.faults import Fault, inject, record

from .sweep import SPACE_KINDS, error_code, open_descriptors

log = logging.getLogger(__name__)

BLOCK = 4096
SLOTS = 24
URL = "http://127.0.0.1:9/pack.tpk"
rng = np.random.default_rng(11)
BLOCKS = [rng.bytes(BLOCK if i % 3 else BLOCK // 3) for i in range(16)]  # some shorter than a block
PACK, URL_ID = BlockCache.pack_ids(URL, "v1")
EARLIER, EARLIER_URL_ID = BlockCache.pack_ids("http://127.0.0.1:9/other.tpk", "v1")  # cached before the sweep
KEPT = 6


def _get(cache: BlockCache, pack: int, count: int) -> list[bytes | None]:
    """Blocks 0..count-1 of `pack` as the cache serves them: bytes, or None for a miss."""
    lengths = np.array([len(b) for b in BLOCKS[:count]], np.int64)
    out = np.zeros((count, BLOCK), np.uint8)
    found = cache.read_blocks(pack, np.arange(count, dtype=np.int64), lengths, out)
    return [out[i, : lengths[i]].tobytes() if found[i] else None for i in range(count)]


def use_cache(folder: Path, pack: int, count: int = len(BLOCKS)) -> tuple[list[bytes | None], list[bytes | None]]:
    """Open the cache, put `count` blocks of `pack`, get them back and the `KEPT` of an earlier pack,
    close: what each read returned."""
    cache = BlockCache(folder, SLOTS * BLOCK, BLOCK)
    try:
        cache.adopt(pack, URL_ID if pack == PACK else EARLIER_URL_ID, len(BLOCKS))
        if pack != EARLIER:
            cache.adopt(EARLIER, EARLIER_URL_ID, len(BLOCKS))
        for i, data in enumerate(BLOCKS[:count]):
            cache.put(pack, URL_ID if pack == PACK else EARLIER_URL_ID, i, data)
        return _get(cache, pack, count), _get(cache, EARLIER, KEPT)
    finally:
        cache.close()


def check_served(got: list[bytes | None], where: str) -> int:
    """Each block is its bytes or a miss, never other bytes; returns how many were served."""
    for i, data in enumerate(got):
        assert data is None or data == BLOCKS[i], f"{where}: block {i} came back with other bytes"
    return sum(data is not None for data in got)


@pytest.mark.parametrize("earlier_count", [0, KEPT], ids=["new folder", "earlier blocks"])
def test_every_operation_of_the_remote_cache_fails_as_a_miss(tmp_path: Path, earlier_count: int) -> None:
    folder, start = tmp_path / "cache", tmp_path / "start"
    start.mkdir()
    if earlier_count:
        assert check_served(use_cache(start, EARLIER, KEPT)[0], "the first use") == KEPT

    def fresh() -> None:  # every run starts from the same files: the same operations in the same order
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(start, folder)

    fresh()
    with record() as dry:
        got, earlier = use_cache(folder, PACK)
    if dry.count() == 0:
        pytest.skip(
            "the remote cache does its file operations without texstream._io (BlockCache's open, put, "
            "get and close): route them through it to sweep it"
        )
    assert check_served(got, "the dry run") == len(BLOCKS)
    assert check_served(earlier, "the dry run") == earlier_count
    files = {p.name for p in folder.iterdir()} | {p.name for p in start.iterdir()}
    injected: Counter[str] = Counter()
    unavailable = runs = kept = 0
    for n, op in enumerate(dry.operations, 1):
        faults = [Fault(at=n, errno=error_code(op.kind, n))]
        if op.kind in SPACE_KINDS:
            faults.append(Fault(at=n, errno=errno.ENOSPC, persistent=True))
        for fault in faults:
            runs += 1
            where = f"fault {fault} (operation {n}: {op.kind} {op.target})"
            fresh()
            descriptors = open_descriptors()
            with inject(fault) as log_:
                try:
                    got, earlier = use_cache(folder, PACK)
                    check_served(got, where)
                    kept += check_served(earlier, where) == earlier_count
                except CacheUnavailable as exc:  # the reader runs without a cache, saying so once
                    unavailable += 1
                    message = str(exc)
                    assert "\n" not in message and str(folder) in message, f"{where}: {message!r}"
            leaked = open_descriptors() - descriptors
            assert not leaked, f"{where} left descriptors {sorted(leaked)} open"
            assert log_.injected, f"{where} was never met: the cache's operations are not deterministic"
            assert log_.injected[0].kind == op.kind, f"{where} met a {log_.injected[0].kind} instead"
            injected.update(m.kind for m in log_.injected)
            left = {p.name for p in folder.iterdir()}
            assert left <= files, f"{where} left {sorted(left - files)}"
            # The next use, with no fault, works: what it puts it serves back, and nothing is wrong.
            got, earlier = use_cache(folder, PACK)
            assert check_served(got, f"the use after {where}") == len(BLOCKS), f"the use after {where} cached nothing"
            check_served(earlier, f"the use after {where}")
    log.info(
        "remote cache (%s): %d operations, %d faults injected in %d runs (%d opened without the cache, %d kept "
        "every earlier block); by kind: %s",
        "earlier blocks" if earlier_count else "new folder",
        dry.count(),
        sum(injected.values()),
        runs,
        unavailable,
        kept,
        ", ".join(f"{k} {v}" for k, v in sorted(injected.items())),
    )
