"""The `texstream` command line.

User errors print one line on stderr and exit non-zero, without a traceback: 2 for usage (bad
arguments), 1 for bad data (unreadable image, corrupt pack, missing file). Set TEXSTREAM_DEBUG=1
to get the traceback as well.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

# No command does linear algebra that BLAS threads would speed up, and OpenBLAS starting its thread
# pool as numpy loads costs about 40 ms of CPU time (a tenth of a small bake's whole command): one
# thread unless the user's environment says otherwise. Set before the imports below load numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .._shadow import check_not_shadowed  # noqa: E402
from ..config import BakeConfig  # noqa: E402
from ..errors import BudgetError, EngineError  # noqa: E402
from ..pack.format import AddressMode, PackHeader, Supercompression, TexelFormat  # noqa: E402
from .progress import ImagePackBar  # noqa: E402

check_not_shadowed()  # a `texstream` folder imported in place of the package: say which, not "no __version__"

log = logging.getLogger("texstream")

EXIT_DATA = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad command-line arguments (exit 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage + error)
        raise UsageError(f"{self.prog}: {message}")


# ---- shared option groups ---------------------------------------------------------------------
def _add_encoding_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("encoding")
    g.add_argument(
        "--format",
        default="auto",
        help="auto (default: bc1, or bc7 when the image has alpha), bc1, bc3, bc4, bc5, bc7 or rgba8",
    )
    srgb = g.add_mutually_exclusive_group()
    srgb.add_argument(
        "--srgb", dest="srgb", action="store_true", default=None, help="colour data (default for colour formats)"
    )
    srgb.add_argument(
        "--linear", dest="srgb", action="store_false", help="linear data: normal maps, masks (default for bc4/bc5)"
    )
    g.add_argument("--tile", type=int, default=128, help="tile content size: 64, 128 (default) or 256")
    g.add_argument("--border", type=int, default=4, help="border texels, multiple of 4 (default 4)")
    g.add_argument("--address", default="clamp", help="clamp (default) or wrap")
    g.add_argument("--supercompression", default="zstd", help="none, zstd (default) or lz4")
    g.add_argument(
        "--zstd-level", type=int, default=BakeConfig.zstd_level, help="zstd level 1..19 (default %(default)s)"
    )
    g.add_argument(
        "--bc7-quality",
        default="normal",
        help="fast (~26 MPixel/s a core, 39.9 dB), balanced (~8 MPixel/s, 43.1 dB), normal (default; 1.7 "
        "MPixel/s, 43.8 dB) or slow (0.47 MPixel/s, 44.4 dB); dB: PSNR on assets/astronaut.png",
    )
    g.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="worker processes (default: every core; an image of up to 4096² bakes in this process)",
    )
    g.add_argument(
        "--cluster",
        default=None,
        metavar="ADDRESS",
        help="run the bands on a Dask cluster: local:N (N worker processes started for the bake) or a "
        "scheduler's address (tcp://host:8786); needs the cluster extra",
    )
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def _bake_config(args: argparse.Namespace) -> BakeConfig:
    try:
        return BakeConfig(
            texel_format=None if args.format == "auto" else TexelFormat.parse(args.format),
            srgb=args.srgb,
            tile_size=args.tile,
            border=args.border,
            address_mode=AddressMode.parse(args.address),
            supercompression=Supercompression.parse(args.supercompression),
            zstd_level=args.zstd_level,
            bc7_quality=args.bc7_quality,
            jobs=args.jobs,
            progress=args.progress and sys.stderr.isatty(),
            cluster=args.cluster,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _check_output(path: Path) -> None:
    if path.suffix != ".tpk":
        raise UsageError(f"output {path} should end in .tpk")
    if not path.parent.is_dir() and str(path.parent):
        raise UsageError(f"output folder {path.parent} does not exist")


# ---- commands ---------------------------------------------------------------------------------
def cmd_bake(args: argparse.Namespace) -> int:
    from ..assets.load import is_block_file
    from ..bake.pipeline import bake_file

    if is_block_file(args.src):
        return _bake_block_file(args)
    cfg = _bake_config(args)
    out = Path(args.out)
    _check_output(out)
    report = bake_file(args.src, out, cfg)
    print(report.summary())
    return 0


def _bake_block_file(args: argparse.Namespace) -> int:
    """`bake FILE.dds|FILE.ktx2`: re-tile the file's blocks (no re-encoding; the format is the file's)."""
    from ..assets import RetileConfig, read_block_file, retile_to_pack

    cfg = _bake_config(args)
    out = Path(args.out)
    _check_output(out)
    texture = read_block_file(args.src)
    have = texture.texel_format.name.lower()
    if cfg.texel_format is not None and cfg.texel_format is not texture.texel_format:
        raise UsageError(
            f"--format {args.format}: {args.src} holds {texture.format_name} blocks, which are copied, not "
            f"re-encoded (use --format auto or {have})"
        )
    retile = RetileConfig(
        tile_size=cfg.tile_size,
        border=cfg.border,
        address_mode=cfg.address_mode,
        supercompression=cfg.supercompression,
        zstd_level=cfg.zstd_level,
        bc7_quality=cfg.bc7_quality,
        srgb=cfg.srgb,
        jobs=cfg.jobs,
    )
    print(retile_to_pack(texture, out, retile).summary())
    return 0


def _byte_size(text: str) -> int:
    """'1073741824', '512M', '2G' -> bytes; UsageError otherwise."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1:] if t[-1:] in units else ""
    number = t[: len(t) - len(unit)]
    if not number.isdigit() or int(number) < 1:
        raise UsageError(f"--max-size must be a positive number of bytes, optionally with K, M or G, got {text!r}")
    return int(number) * units[unit]


def cmd_export(args: argparse.Namespace) -> int:
    from ..assets.export import export_ktx2

    out = Path(args.out)
    if out.suffix.lower() != ".ktx2":
        raise UsageError(f"output {out} should end in .ktx2")
    if str(out.parent) and not out.parent.is_dir():
        raise UsageError(f"output folder {out.parent} does not exist")
    if args.supercompression not in ("none", "zstd"):
        raise UsageError(f"--supercompression must be none or zstd, got {args.supercompression!r}")
    report = export_ktx2(args.pack, out, supercompression=args.supercompression, max_bytes=_byte_size(args.max_size))
    print(report.summary())
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from ..bake.pipeline import bake_procedural

    cfg = _bake_config(args)
    out = Path(args.out)
    _check_output(out)
    if args.size < 1:
        raise UsageError(f"--size must be positive, got {args.size}")
    if args.height is not None and args.height < 1:
        raise UsageError(f"--height must be positive, got {args.height}")
    try:  # what a pack (and the streamer) can hold, refused before any file is made
        PackHeader(
            width=args.size,
            height=args.size if args.height is None else args.height,  # opaque colour
            tile_size=cfg.tile_size,
            texel_format=cfg.format_for(False),
            srgb=cfg.is_srgb,
        )
    except ValueError as exc:
        raise UsageError(f"--size: {exc}") from None
    report = bake_procedural(out, args.size, args.pattern, args.seed, cfg, height=args.height)
    print(report.summary())
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from ..pack.reader import PackReader

    with PackReader(args.pack) as r:
        info = dict(r.header.describe())
        info["version"] = r.version
        info["file_size"] = r.file_size
        info["payload_bytes"] = int(r.index["stored_size"].sum())
        raw_total = r.header.tile_raw_size * r.header.tile_count
        info["compression_ratio"] = round(raw_total / max(1, info["payload_bytes"]), 3)
        info["level_table"] = [
            {
                "level": i,
                "width": int(e["width"]),
                "height": int(e["height"]),
                "tiles_x": int(e["tiles_x"]),
                "tiles_y": int(e["tiles_y"]),
            }
            for i, e in enumerate(r.header.level_table)
        ]
        info["metadata"] = r.metadata
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    print(f"{args.pack}: texstream pack v{info['version']}, {info['file_size']:,} bytes")
    print(f"  size        {info['width']} x {info['height']}, {info['levels']} levels")
    print(
        f"  format      {info['format']}{' sRGB' if info['srgb'] else ' linear'}, "
        f"tiles {info['tile_size']} + {info['border']} border ({info['slot_size']}^2 slots, "
        f"{info['tile_raw_size']:,} bytes raw)"
    )
    print(
        f"  address     {info['address_mode']}, supercompression {info['supercompression']} "
        f"(x{info['compression_ratio']}), {info['tile_count']:,} tiles"
    )
    for e in info["level_table"]:
        print(
            f"  level {e['level']:2d}    {e['width']:>6} x {e['height']:<6} {e['tiles_x']:>4} x {e['tiles_y']:<4} tiles"
        )
    if info["metadata"]:
        print(f"  metadata    {json.dumps(info['metadata'], sort_keys=True)}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from ..pack.reader import PackReader

    with PackReader(args.pack) as r:
        bad = r.verify()
        total = r.header.tile_count
    if bad:
        for lv, x, y, why in bad:
            print(f"bad tile level {lv} ({x}, {y}): {why}")
        print(f"{args.pack}: {len(bad)} of {total} tiles bad", file=sys.stderr)
        return EXIT_DATA
    print(f"{args.pack}: all {total} tiles ok")
    return 0


def cmd_extract(args: argparse.Namespace) -> int:
    from ..pack.extract import extract_level, image_mode_for, parse_region, write_image
    from ..pack.reader import PackReader

    try:
        region = parse_region(args.region) if args.region else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with PackReader(args.pack) as reader:
        image = extract_level(reader, args.level, region)
        mode = image_mode_for(reader.header.texel_format)
    write_image(image, Path(args.out), mode)
    print(f"wrote {args.out}: {image.shape[1]} x {image.shape[0]}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from ..gl.context import headless_context
    from ..pack.extract import write_image
    from ..scene.camera import View
    from .render import render

    try:
        view = View.parse(args.view)
        w, h = _frame_size(args.size)
        if not (1 <= w <= 16384 and 1 <= h <= 16384):
            raise ValueError(f"size {args.size!r} must be within 1..16384 a side")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.frames < 1:
        raise UsageError(f"--frames must be >= 1, got {args.frames}")
    if args.budget_mb is not None and args.budget_mb <= 0:
        raise UsageError(f"--budget-mb must be positive, got {args.budget_mb}")
    out = Path(args.out)
    ctx = headless_context()
    result = render(
        ctx,
        args.pack,
        view=view,
        size=(w, h),
        frames=args.frames,
        budget_mb=args.budget_mb,
        all_resident=args.all_resident,
        telemetry=args.telemetry,
    )
    write_image(result.frames[-1], out)
    last = result.telemetry[-1]
    print(
        f"wrote {out}: {w} x {h}, {args.frames} frames, {last.resident_tiles} tiles resident, "
        f"VRAM {last.vram_bytes / 2**20:.1f} / {last.budget_bytes / 2**20:.1f} MiB"
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import SCENES, DemoConfig, run

    packs = list(args.packs)
    scene = packs.pop(0) if packs and packs[0] in SCENES else "terrain"  # a pack named so: ./gallery
    try:
        w, h = _frame_size(args.size)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.frames < 1:
        raise UsageError(f"--frames must be >= 1, got {args.frames}")
    if args.budget_mb <= 0:
        raise UsageError(f"--budget-mb must be positive, got {args.budget_mb}")
    if args.seconds is not None and not (0 < args.seconds < float("inf")):
        raise UsageError(f"--seconds must be a positive number, got {args.seconds}")
    cfg = DemoConfig(
        scene=scene,
        packs=tuple(packs),
        size=(w, h),
        budget_mb=args.budget_mb,
        headless=args.headless,
        frames=args.frames,
        seconds=args.seconds,
        out=Path(args.out) if args.out else None,
        telemetry=Path(args.telemetry) if args.telemetry else None,
        overlay=not args.no_overlay,
        objects=args.objects,
        texture_size=args.texture_size,
    )
    run(cfg)
    return 0


def _frame_size(text: str) -> tuple[int, int]:
    """'WxH' as two integers; ValueError naming the option otherwise."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--size must be WxH in pixels (e.g. 1280x720), got {text!r}")
    return int(parts[0]), int(parts[1])


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_bench

    return run_bench(args)


# ---- image files where a pack belongs ---------------------------------------------------------
PACK_HELP = "a pack, or an image file (baked once into the pack cache, $TEXSTREAM_CACHE/packs)"
PACK_COMMANDS = ("info", "verify", "extract", "render", "demo")  # their pack arguments also take images


def _pack_or_image(text: str) -> str:
    """A pack argument as given, or, for an image file, its pack from the image pack cache (baked
    first when needed, with a progress bar on a terminal). Anything else is left for the pack reader,
    whose one-line error points to `texstream bake`."""
    from ..assets.image_packs import resolve_pack

    bar = ImagePackBar() if sys.stderr.isatty() else None
    try:
        return str(resolve_pack(text, progress=bar))
    finally:
        if bar is not None:
            bar.close()


def _resolve_image_arguments(args: argparse.Namespace) -> None:
    """Image files given to a command that takes packs become their cached packs (`_pack_or_image`)."""
    if args.command not in PACK_COMMANDS:
        return
    if hasattr(args, "pack"):
        args.pack = _pack_or_image(args.pack)
    if args.command == "demo":
        from .demo import SCENES

        args.packs = [p if i == 0 and p in SCENES else _pack_or_image(p) for i, p in enumerate(args.packs)]


# ---- entry point ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = _Parser(prog="texstream", description="Stream huge block-compressed textures into a VRAM budget.")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    p.add_argument("--version", action="version", version=f"texstream {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("bake", help="bake an image into a tile pack")
    s.add_argument(
        "src",
        help="source image (any format Pillow or libvips reads; a path or a URL), or a DDS/KTX2 file of "
        "BC1/BC3/BC4/BC5/BC7 blocks, re-tiled without re-encoding",
    )
    s.add_argument("out", help="output pack, .tpk")
    _add_encoding_options(s)
    s.set_defaults(func=cmd_bake)

    s = sub.add_parser("generate", help="bake a procedural texture of any size into a tile pack")
    s.add_argument("out", help="output pack, .tpk")
    s.add_argument("--size", type=int, required=True, help="width in texels (and height unless --height)")
    s.add_argument("--height", type=int, default=None, help="height in texels (default: --size)")
    s.add_argument("--pattern", default="terrain", help="terrain (default), checker or normals")
    s.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    _add_encoding_options(s)
    s.set_defaults(func=cmd_generate)

    s = sub.add_parser("info", help="describe a pack")
    s.add_argument("pack", help=PACK_HELP)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("verify", help="check every tile of a pack (exit 1 listing bad tiles)")
    s.add_argument("pack", help=PACK_HELP)
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("extract", help="decode one level (or a region of it) to an image")
    s.add_argument("pack", help=PACK_HELP)
    s.add_argument("out", help="output image (.png recommended)")
    s.add_argument("--level", type=int, default=0, help="mip level (default 0)")
    s.add_argument("--region", default=None, help="x,y,w,h in texels of that level")
    s.set_defaults(func=cmd_extract)

    s = sub.add_parser("export", help="write a pack's levels as a standard KTX2 file")
    s.add_argument("pack")
    s.add_argument("out", help="output file, .ktx2")
    s.add_argument("--supercompression", default="none", help="none (default) or zstd")
    s.add_argument(
        "--max-size", default="1G", help="refuse packs whose levels exceed this many bytes of blocks (default 1G)"
    )
    s.set_defaults(func=cmd_export)

    s = sub.add_parser("render", help="render a textured plane headless through EGL")
    s.add_argument("pack", help=PACK_HELP)
    s.add_argument("--out", required=True, help="output image (.png)")
    s.add_argument("--size", default="512x512", help="WxH (default 512x512)")
    s.add_argument(
        "--view",
        default="0.5,0.5,1",
        help="cx,cy,zoom[,tilt,yaw]: image point at the centre (fractions from top-left), pixels per texel, degrees",
    )
    s.add_argument("--frames", type=int, default=30, help="frames to stream before the image is taken (default 30)")
    s.add_argument("--budget-mb", type=float, default=None, help="VRAM budget (default: driver free memory less 10%%)")
    s.add_argument("--all-resident", action="store_true", help="load every tile first (the reference image)")
    s.add_argument("--telemetry", default=None, help="per-frame telemetry output: .jsonl, or .csv for CSV")
    s.set_defaults(func=cmd_render)

    s = sub.add_parser("demo", help="fly over huge textures streamed in a small budget (terrain, gallery, scene)")
    s.add_argument(
        "packs",
        nargs="*",
        help="the scene, terrain (default), gallery or scene; then, for the terrain, an albedo pack and an optional "
        "BC5 normal map (default: the built-in terrain), for scene a .glb or .gltf file (default: a built-in "
        "scene); image files are baked once into the pack cache",
    )
    s.add_argument("--headless", action="store_true", help="render through EGL to PNG frames (default without display)")
    s.add_argument("--frames", type=int, default=60, help="headless frame count (default 60)")
    s.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="headless: seconds of the flight the frames are spread over (default: the whole flight, 30 s)",
    )
    s.add_argument("--objects", type=int, default=128, help="gallery: objects, each its own texture (default 128)")
    s.add_argument(
        "--texture-size",
        type=int,
        default=4096,
        help="gallery: texels a side of each texture; built-in scene: of its textures, the ground's twice it "
        "(default 4096)",
    )
    s.add_argument("--out", default=None, help="headless output folder (default: the cache's demo-frames/)")
    s.add_argument("--size", default="1280x720", help="window or frame size WxH (default 1280x720)")
    s.add_argument("--budget-mb", type=float, default=192.0, help="VRAM budget (default 192 MiB)")
    s.add_argument("--telemetry", default=None, help="per-frame telemetry output: .jsonl, or .csv for CSV")
    s.add_argument("--no-overlay", action="store_true", help="start without the telemetry overlay")
    s.set_defaults(func=cmd_demo)

    s = sub.add_parser("bench", help="measure throughput against ceilings measured in the same run")
    s.add_argument(
        "what",
        nargs="?",
        default="bake",
        choices=["bake", "stream", "scene", "soak", "sets"],
        help="bake, stream, scene, soak (leaks and invariants over a long run) or sets (a texture set's "
        "render-thread cost against one texture); default bake",
    )
    s.add_argument("--minutes", type=_positive_float, default=None, help="bench soak: run this long")
    s.add_argument(
        "--url",
        nargs="?",
        const="local",
        default=None,
        help="bench stream: stream the pan from a server too and compare with disk (no value: a local nginx; "
        "else a base URL serving the bench's pack)",
    )
    s.add_argument("--telemetry", default=None, help="bench scene: per-frame JSONL telemetry of every path")
    s.add_argument("--quick", action="store_true", help="small sizes, for CI")
    s.add_argument("--size", type=int, default=16384, help="source image size for bench bake (default 16384)")
    s.add_argument("--jobs", type=int, default=0, help="worker processes (default: every core)")
    s.add_argument("--json", default=None, help="also write the results to this JSON file")
    s.set_defaults(func=cmd_bench)
    for command in sub.choices.values():  # global options are accepted after the command too
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p


class _Terminated(KeyboardInterrupt):
    """SIGTERM, unwinding like Ctrl-C (writers delete their temporary files); exit 143."""

    signum = signal.SIGTERM


def _on_sigterm(signum: int, frame: object) -> None:
    # A bake defers signals while it runs (bake.workers) and calls this only after its cleanup.
    raise _Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    debug = os.environ.get("TEXSTREAM_DEBUG") == "1"
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        _resolve_image_arguments(args)
        return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:
        print(f"texstream {args.command}: interrupted", file=sys.stderr)
        return 128 + int(getattr(exc, "signum", signal.SIGINT))  # 130 for Ctrl-C, 143 for SIGTERM
    except BrokenPipeError:  # output piped into a reader that stopped early (| head): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (UsageError, EngineError, ValueError, OSError) as exc:
        if debug and not isinstance(exc, UsageError):
            raise
        message, code = _describe_error(exc)
        print(f"texstream {args.command}: {message}", file=sys.stderr)
        return code


def _describe_error(exc: BaseException) -> tuple[str, int]:
    """One line and an exit code: usage (2) for bad arguments or values, data (1) for the rest."""
    if isinstance(exc, UsageError | ValueError):  # ValueErrors from the engine name the bad value
        return str(exc), EXIT_USAGE
    if isinstance(exc, BudgetError):  # the advice in this program's words: its flag, not the config field
        return exc.advice("--budget-mb", None), EXIT_DATA
    if isinstance(exc, EngineError):  # already one line naming the file (a missing pack too)
        return str(exc), EXIT_DATA
    if isinstance(exc, FileNotFoundError):
        return f"{exc.filename or exc}: file not found", EXIT_DATA
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}", EXIT_DATA
    return str(exc), EXIT_DATA


if __name__ == "__main__":
    sys.exit(main())
