"""The compiled reader pool (`ts_pool_*` in engine/native/_native.c) under ThreadSanitizer.

``python -m tests.fuzz.native_tsan stress LIB PACK``  drive a ThreadSanitizer build of the helper's
                                                     reader pool on PACK; must run with the runtime
                                                     preloaded (`tsan_env`)

The stress run submits a pack's tiles in several batches per call to pools of four threads, drains
them while asking for overdue reads, holds and gives up reads (retired threads, replacements),
closes pools with reads still held, and checks every tile against the pack. Any data race or lock
misuse the sanitizer sees ends the process with exit status 66 (halt_on_error), so the exit status
says it all. The pack is baked by the caller: the bake's own libraries are opened with RTLD_DEEPBIND,
which the sanitizer's runtime refuses.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .native_asan import SOURCE, runtime_library
from .native_asan import build as build_sanitized

FLAGS = ("-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=thread", "-pthread")
HELD_EVERY = 3  # every third pool holds its first read until it is given up


def tsan_runtime(cc: str) -> str | None:
    """The compiler's shared ThreadSanitizer runtime, to preload into an uninstrumented interpreter."""
    return runtime_library(cc, ("libtsan.so", "libclang_rt.tsan-x86_64.so"))


def build(out_dir: Path, source: Path = SOURCE) -> tuple[Path | None, str]:
    """Compile the helper (`source`) with -fsanitize=thread into `out_dir`: (library, "") or (None, why not)."""
    return build_sanitized(
        out_dir,
        source,
        flags=FLAGS,
        runtime=tsan_runtime,
        runtime_name="ThreadSanitizer runtime (libtsan)",
        lib_name="_native_tsan.so",
    )


def tsan_env(cc: str) -> dict[str, str]:
    """The environment a stress run needs: the runtime preloaded, every report fatal (exit status 66)."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = tsan_runtime(cc) or ""
    env["TSAN_OPTIONS"] = "halt_on_error=1:exitcode=66:report_signal_unsafe=0"
    root = str(SOURCE.parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def stress(lib: Path, pack: Path, pools: int = 24) -> int:
    """`pools` pools in turn, each reading the whole pack (see the module docstring)."""
    import numpy as np

    from texstream.native import load_library
    from texstream.pack.reader import PackReader
    from texstream.runtime.io_workers import IOWorkers, ReadBatch, TileSource

    native = load_library(str(lib), deep_bind=False)
    if native is None or native.pool is None:
        print(f"cannot load the sanitized helper's reader pool from {lib}", file=sys.stderr)
        return 2
    with PackReader(pack) as reader:
        h, idx = reader.header, reader.index
        n, raw = h.tile_count, h.tile_raw_size
        want = np.frombuffer(b"".join(reader.read_tile(*reader.tile_position(i)) for i in range(n)), np.uint8)
        source = TileSource(reader.fileno(), h.supercompression, raw, int(idx["stored_size"].max()), "stress")
        order = np.argsort(idx["offset"], kind="stable").astype(np.int64)
        parts = np.array_split(order, 12)
        for round_ in range(pools):
            ring = np.zeros(n * raw, np.uint8)
            workers = IOWorkers(4, ring, raw, np.zeros(n, np.uint8), 255, native)
            held = round_ % HELD_EVERY == 0
            batches = [
                ReadBatch(
                    b,
                    source,
                    p,
                    p,
                    idx["offset"][p].astype(np.int64),
                    idx["stored_size"][p].astype(np.int64),
                    idx["checksum"][p].astype(np.uint64),
                )
                for b, p in enumerate(parts)
            ]
            if held:
                workers.hold_compiled_reads(1)
            workers.submit_many(batches[:6])
            workers.submit_many(batches[6:])
            back, given_up = [], []
            deadline = time.monotonic() + 60.0
            while len(back) < len(batches):
                if time.monotonic() > deadline:
                    print(f"pool {round_}: {len(batches) - len(back)} batches never came back", file=sys.stderr)
                    return 1
                back += workers.drain()
                given_up += workers.overdue(0.002 if held else 60.0)
                if given_up:
                    workers.hold_compiled_reads(0)
                time.sleep(0.0005)
            if not workers.shutdown(10.0):
                print(f"pool {round_}: a thread is still inside a read", file=sys.stderr)
                return 1
            if held and (not given_up or sum(r.abandoned for r in back) != len(given_up)):
                print(f"pool {round_}: the held read was not given up and returned abandoned", file=sys.stderr)
                return 1
            if any((r.status != 0).any() for r in back) or not np.array_equal(ring, want):
                print(f"pool {round_}: the ring differs from the pack's tiles", file=sys.stderr)
                return 1
    print(f"reader pool under ThreadSanitizer: {pools} pools, {n} tiles each, no report")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "stress":
        return stress(Path(argv[1]), Path(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
