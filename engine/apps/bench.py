"""`texstream bench`: throughput measured against ceilings and baselines taken in the same run.

bench bake: first the block-compression encoders compared (`bench_encoders`), the BC7 presets' speed and
quality (`bench_encoders.bench_bc7_presets`), then bake throughput
in source MPixel/s per format, next to (a) the chosen encoder's own single-thread rate on slots of
the same pixels (no mips, borders, supercompression or I/O: the encoder ceiling of one core) and (b)
a plain libvips pyramid build of the same image (tiled pyramidal TIFF, uncompressed:
the "just make mips and tiles" baseline), with the cores the bake used, the CPU time of the baking
process and of its workers and the baking process's share (the serial fraction: what more cores
cannot speed up), and in the JSON the workers' start-up and each stage's span; then (unless --quick) the
first-use time of `make demo`'s default bake (the 32768² BC1 terrain and the 16384² BC5 normal map,
baked into an empty folder). Absolute times on shared machines are noise; the ratios are the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from ..config import BakeConfig
from ..pack.format import Supercompression, TexelFormat

# The sample photographs: shipped in the package (texstream.sample_images is the repository's assets/).
ASSET_DIRS = (
    Path(__file__).resolve().parent.parent / "sample_images",  # an installed package
    Path(__file__).resolve().parents[2] / "assets",  # a checkout (editable install)
)


def _photo_source(size: int, folder: Path) -> Path:
    """A size x size uncompressed TIFF tiled from a bundled photograph (real image statistics)."""
    import pyvips

    photo = next((d / "astronaut.png" for d in ASSET_DIRS if (d / "astronaut.png").exists()), None)
    if photo is None:
        raise FileNotFoundError("astronaut.png: the package's sample images are missing (reinstall texstream)")
    img = pyvips.Image.new_from_file(str(photo))
    if img.bands == 3:
        img = img.bandjoin(255)
    n = -(-size // img.width)
    # Mirror alternate copies so tile seams are not trivially repeated blocks.
    row = pyvips.Image.arrayjoin([img if i % 2 == 0 else img.fliphor() for i in range(n)])
    row2 = row.flipver()
    full = pyvips.Image.arrayjoin([row if j % 2 == 0 else row2 for j in range(n)], across=1)
    full = full.crop(0, 0, size, size).cast("uchar")
    path = folder / f"source-{size}.tif"
    full.tiffsave(str(path), compression="none", bigtiff=True)
    return path


def _timed(fn) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _encoder_rate(path: Path, fmt: TexelFormat, crop: int, slot: int = 136) -> tuple[float, int]:
    """The chosen encoder's single-thread rate (MPixel/s) on `slot`-sized slots of a crop of the
    source, through `bcn.encode_slot`, the very call the bake makes per tile: the encoder ceiling
    of one core, with no mips, borders, supercompression or I/O."""
    import pyvips

    from ..bake import bcn

    img = pyvips.Image.new_from_file(str(path))
    crop = min(crop, img.width, img.height) // slot * slot
    arr = np.ndarray(buffer=img.crop(0, 0, crop, crop).write_to_memory(), dtype=np.uint8, shape=(crop, crop, 4))
    slots = [
        np.ascontiguousarray(arr[y : y + slot, x : x + slot])
        for y in range(0, crop, slot)
        for x in range(0, crop, slot)
    ]

    def encode_all() -> None:
        for s in slots:
            bcn.encode_slot(s, fmt, srgb=fmt.colour, alpha=False)

    seconds = min(_timed(encode_all) for _ in range(2))
    return len(slots) * slot * slot / seconds / 1e6, crop


def _vips_pyramid_rate(path: Path, folder: Path, tile: int) -> float:
    import pyvips

    img = pyvips.Image.new_from_file(str(path), access="sequential")
    out = folder / "pyramid.tif"
    seconds = _timed(
        lambda: img.tiffsave(
            str(out), tile=True, pyramid=True, compression="none", tile_width=tile, tile_height=tile, bigtiff=True
        )
    )
    out.unlink(missing_ok=True)
    return img.width * img.height / seconds / 1e6


def _stage_spans(timeline: tuple) -> dict[str, list[float]]:
    spans: dict[str, list[float]] = {}
    for t in timeline:
        key = "wrap rows" if t.stage < 0 else f"stage {t.stage}"
        lo, hi = spans.get(key, [t.started, t.finished])
        spans[key] = [min(lo, t.started), max(hi, t.finished)]
    return {k: [round(v, 3) for v in span] for k, span in sorted(spans.items())}


def _demo_first_use_seconds(folder: Path) -> float:
    """Wall time of `make demo`'s first-use bake: the default terrain and normal map
    (`assets.ensure_asset`), baked into an empty folder as on a first run."""
    from .assets import DEFAULT_NORMALS, DEFAULT_TERRAIN, ensure_asset

    demo = folder / "demo-assets"
    demo.mkdir()
    t0 = time.perf_counter()
    for recipe in (DEFAULT_TERRAIN, DEFAULT_NORMALS):
        ensure_asset(recipe, progress=False, folder=demo)
    seconds = time.perf_counter() - t0
    for p in demo.iterdir():
        p.unlink()
    return seconds


def bench_bake(size: int, jobs: int, quick: bool, demo: bool | None = None) -> dict:
    """Bake rates per format against one core's encoder and libvips' pyramid build; with `demo`
    (default: unless `quick`) the first-use time of the demo's default textures too."""
    from ..bake.pipeline import bake_file
    from ..config import usable_cores

    workers = jobs or usable_cores()
    results: dict = {
        "bench": "bake",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores ({usable_cores()} usable), "
        f"{platform.python_implementation()} {platform.python_version()}",
        "size": size,
        "jobs": workers,
        "rows": [],
    }
    with tempfile.TemporaryDirectory(prefix="texstream-bench-") as tmp:
        folder = Path(tmp)
        src = _photo_source(size, folder)
        small = min(size, 2048 if quick else 4096)
        src_small = _photo_source(small, folder) if small != size else src
        # Warm-up, not measured: the worker processes' fork server starts once per process (~0.5 s),
        # and the first read of the source fills the page cache; neither belongs to the first row.
        bake_file(_photo_source(1024, folder), folder / "warm-up.tpk", BakeConfig(jobs=workers, progress=False))
        vips = _vips_pyramid_rate(src, folder, 128)
        results["vips_pyramid_mpix_s"] = round(vips, 1)
        plan = [
            (TexelFormat.BC1, Supercompression.ZSTD, src, size),
            (TexelFormat.BC1, Supercompression.NONE, src, size),
            (TexelFormat.BC1, Supercompression.LZ4, src, size),
            (TexelFormat.BC3, Supercompression.ZSTD, src, size),
            (TexelFormat.BC4, Supercompression.ZSTD, src, size),
            (TexelFormat.BC5, Supercompression.ZSTD, src, size),
            (TexelFormat.BC7, Supercompression.ZSTD, src_small, small),  # ~2 MPixel/s per core: smaller
        ]
        if quick:
            plan = plan[:1] + plan[3:]
        # The first big bake of a process runs slower (measured 31-35 against 42-45 MPixel/s for BC1 +
        # zstd; what warms up is outside the workers): the target row again, last.
        plan.append(plan[0])
        for fmt, sc, path, n in plan:
            ceiling, _crop = _encoder_rate(path, fmt, 2176 if fmt is not TexelFormat.BC7 else 544)
            cfg = BakeConfig(texel_format=fmt, supercompression=sc, jobs=workers, progress=False)
            out = folder / f"bench-{fmt.name.lower()}-{sc.name.lower()}.tpk"
            report = bake_file(path, out, cfg)
            size_bytes = out.stat().st_size
            out.unlink()
            rate = report.mpixels_per_s
            results["rows"].append(
                {
                    "format": fmt.name.lower(),
                    "supercompression": sc.name.lower(),
                    "source_size": n,
                    "seconds": round(report.seconds, 2),
                    "bake_mpix_s": round(rate, 1),
                    "encoder_1core_mpix_s": round(ceiling, 1),
                    "bake_vs_encoder_1core": round(rate / ceiling, 2),
                    "bake_vs_vips_pyramid": round(rate / vips, 2),
                    "cores_used": report.jobs,
                    "pack_mib": round(size_bytes / 2**20, 1),
                    # Where the CPU went: the baking process (reading what workers cannot,
                    # routing, writing) against the workers; its share is the serial part.
                    "main_cpu_s": round(report.main_cpu_seconds, 3),
                    "worker_cpu_s": round(report.worker_cpu_seconds, 3),
                    "serial_fraction": round(report.serial_fraction, 3),
                    # When the first job started (the workers' start-up) and, per stage, when its
                    # first band started and its last one finished, in seconds since the bake began.
                    "first_job_start_s": round(min((t.started for t in report.timeline), default=0.0), 3),
                    "stage_spans_s": _stage_spans(report.timeline),
                }
            )
        if not quick if demo is None else demo:
            results["demo_first_use_s"] = round(_demo_first_use_seconds(folder), 1)
    return results


def print_bake(results: dict) -> None:
    print(
        f"texstream bench bake: {results['size']}^2 photo-derived source, {results['jobs']} jobs, {results['machine']}"
    )
    print(f"libvips pyramid build (tiled TIFF, same image): {results['vips_pyramid_mpix_s']} MPixel/s")
    head = (
        f"{'format':<6} {'super':<5} {'size':>6} {'seconds':>8} {'MPix/s':>8} {'enc 1core':>10} "
        f"{'x enc':>9} {'x vips':>7} {'cores':>6} {'MiB':>7} {'main cpu':>9} {'work cpu':>9} {'serial':>7}"
    )
    print(head)
    for r in results["rows"]:
        print(
            f"{r['format']:<6} {r['supercompression']:<5} {r['source_size']:>6} {r['seconds']:>8} "
            f"{r['bake_mpix_s']:>8} {r['encoder_1core_mpix_s']:>10} {r['bake_vs_encoder_1core']:>9} "
            f"{r['bake_vs_vips_pyramid']:>7} {r['cores_used']:>6} {r['pack_mib']:>7} "
            f"{r['main_cpu_s']:>9} {r['worker_cpu_s']:>9} {r['serial_fraction']:>7}"
        )
    if "demo_first_use_s" in results:
        print(f"make demo's first-use bake (32768² BC1 terrain + 16384² BC5 normals): {results['demo_first_use_s']} s")


def run_bench(args: argparse.Namespace) -> int:
    if args.what == "stream" and getattr(args, "url", None):
        from .bench_remote import run_remote_bench

        run_remote_bench(args.url, quick=args.quick, json_path=args.json)
        return 0
    if args.what == "stream":
        from .bench_stream import run_stream_bench

        run_stream_bench(quick=args.quick, json_path=args.json)
        return 0
    if args.what == "sets":
        from .bench_sets import run_sets_bench

        run_sets_bench(quick=args.quick, json_path=args.json)
        return 0
    if args.what == "soak":
        from .bench_soak import run_soak_bench

        return run_soak_bench(getattr(args, "minutes", None), quick=args.quick, json_path=args.json)
    if args.what == "scene":
        from .bench_scene import run_scene_bench

        run_scene_bench(quick=args.quick, json_path=args.json, telemetry_path=getattr(args, "telemetry", None))
        return 0
    size = 2048 if args.quick and args.size == 16384 else args.size
    if size < 256:
        raise ValueError(f"bench size must be >= 256, got {size}")
    from .bench_encoders import bench_bc7_presets, bench_encoders, print_bc7_presets, print_encoders

    encoder_rows = bench_encoders(args.quick)
    print_encoders(encoder_rows)
    print()
    bc7_rows = bench_bc7_presets(args.jobs, args.quick)
    print_bc7_presets(bc7_rows)
    print()
    results = bench_bake(size, args.jobs, args.quick)
    results["encoders"] = encoder_rows
    results["bc7_presets"] = bc7_rows
    print_bake(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0
