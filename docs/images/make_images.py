"""Render the documentation's screenshots headless (EGL) from the demo's terrain flight.

    .venv/bin/python docs/images/make_images.py            # all of them, into docs/images/
    .venv/bin/python docs/images/make_images.py --out DIR

Writes, as palette PNGs (256 colours: a third of the size of full-colour ones, small enough for the
repository):

- ``demo-frame.png``: a converged frame of the default demo (`texstream demo`), no overlay;
- ``overlay.png``: the same view with the telemetry overlay (full size, so its text stays sharp);
- ``debug-mip.png``: the mip colour mode (the demo's M key): the level each pixel sampled;
- ``debug-residency.png``: the residency colour mode (R) during a fast approach, streaming behind:
  green where the wanted level is resident, yellow where one level coarser stands in, red for more.

It uses the demo's default assets (32768² terrain and normal map), baked into texstream's cache on
first use, as `make demo` does (1.5-2 minutes on two cores). The pictures differ slightly from run
to run: streaming depends on how fast the I/O threads are.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from texstream.apps.demo import Demo, DemoConfig
from texstream.gl.context import headless_context

HERE = Path(__file__).resolve().parent
SIZE = (1280, 720)  # the demo's default window; the overlay is drawn at its real size
SMALL = (960, 540)  # the scene-only pictures, downscaled: a page column is narrower than 960 px
VIEW_SECONDS = 26.5  # the moment of the 30 s flight shown: over the coast, land and sea in view
APPROACH_SECONDS = 20.5  # the residency picture: converge here, then fly to VIEW_SECONDS ...
APPROACH_STEP = 0.5  # ... this much flight a frame (30x real time): the new view is still streaming in
MIP_MODE, RESIDENCY_MODE = 1, 2  # the scene's `debug` values (vt_debug_tint in shaders/vt.glsl)


class Shooter:
    """The demo's scene, streamer and overlay drawn into an offscreen framebuffer at fixed poses."""

    def __init__(self, ctx, size: tuple[int, int]) -> None:  # noqa: ANN001
        self.ctx, self.size = ctx, size
        # headless=True: a fixed frame clock, so the overlay's rates read as a 60 fps flight
        self.demo = Demo(ctx, DemoConfig(headless=True, size=size, frames=int(30 * 60)), progress=True)
        self.color = ctx.renderbuffer(size, 4)
        self.fbo = ctx.framebuffer(color_attachments=[self.color])

    def frame(self, seconds: float, *, overlay: bool = False, debug: int = 0) -> dict:
        self.demo.show_overlay = overlay
        self.demo.scene.debug = debug
        return self.demo.frame(self.demo.path.pose(seconds), self.fbo, self.size)

    def converge(self, seconds: float, max_frames: int = 900) -> int:
        """Draw the view until nothing it wants is missing or loading (3 frames in a row)."""
        settled = 0
        for i in range(max_frames):
            record = self.frame(seconds)
            self.ctx.finish()  # at most one frame in flight, as a window's swap would pace it
            done = (
                i >= 3 and record["wanted_pages"] > 0 and record["missing_pages"] == 0 and not self.demo.streamer.busy
            )
            settled = settled + 1 if done else 0
            if settled >= 3:
                return i + 1
        raise SystemExit(f"the view at {seconds} s did not converge in {max_frames} frames")

    def read(self) -> Image.Image:
        w, h = self.size
        data = self.fbo.read(components=3, alignment=1)
        return Image.frombuffer("RGB", (w, h), data, "raw", "RGB", 0, -1).copy()  # bottom-up rows

    def release(self) -> None:
        self.fbo.release()
        self.color.release()
        self.demo.close()


def save_small_png(img: Image.Image, path: Path, size: tuple[int, int] | None = None) -> int:
    """Downscale (optionally), reduce to a 256-colour palette and write with zlib's best level."""
    if size is not None and img.size != size:
        img = img.resize(size, Image.Resampling.LANCZOS)
    img.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        path, format="PNG", optimize=True
    )
    return path.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder for the PNG files (default: docs/images)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ctx = headless_context()
    shots: dict[str, tuple[Image.Image, tuple[int, int] | None]] = {}
    try:
        shooter = Shooter(ctx, SIZE)
        try:
            shooter.converge(APPROACH_SECONDS)
            for t in np.arange(APPROACH_SECONDS + APPROACH_STEP, VIEW_SECONDS + 1e-6, APPROACH_STEP):
                shooter.frame(float(t), debug=RESIDENCY_MODE)
                shooter.ctx.finish()
            shots["debug-residency.png"] = (shooter.read(), SMALL)
            shooter.converge(VIEW_SECONDS)
            shooter.frame(VIEW_SECONDS)
            shots["demo-frame.png"] = (shooter.read(), SMALL)
            shooter.frame(VIEW_SECONDS, overlay=True)
            shots["overlay.png"] = (shooter.read(), None)
            shooter.frame(VIEW_SECONDS, debug=MIP_MODE)
            shots["debug-mip.png"] = (shooter.read(), SMALL)
        finally:
            shooter.release()
    finally:
        ctx.release()
    for name, (img, size) in shots.items():
        n = save_small_png(img, args.out / name, size)
        print(f"{args.out / name}: {n / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
