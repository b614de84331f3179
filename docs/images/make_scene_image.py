"""Render the documentation's picture of the scene demo (`texstream demo scene`) headless (EGL).

    .venv/bin/python docs/images/make_scene_image.py            # docs/images/demo-scene.png
    .venv/bin/python docs/images/make_scene_image.py --out DIR

The built-in scene (four materials, six procedural textures up to 8192², baked into texstream's cache
on first use, about 20 s on two cores) is drawn at one moment of its flight once streaming has
settled, and written as a 256-colour PNG like the other pictures (`make_images.py`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from make_images import SIZE, SMALL, save_small_png

from texstream.apps.demo import Demo, DemoConfig
from texstream.gl.context import headless_context

HERE = Path(__file__).resolve().parent
VIEW_SECONDS = 6.0  # climbing out from the pillars and spheres, the panels and the ground beyond


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder for the PNG file (default: docs/images)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    from PIL import Image

    ctx = headless_context()
    try:
        demo = Demo(ctx, DemoConfig(scene="scene", headless=True, size=SIZE, frames=30 * 60), progress=True)
        color, depth = ctx.renderbuffer(SIZE, 4), ctx.depth_renderbuffer(SIZE)
        fbo = ctx.framebuffer(color_attachments=[color], depth_attachment=depth)
        try:
            demo.show_overlay = False
            pose = demo.path.pose(VIEW_SECONDS)
            settled = 0
            for i in range(600):  # until nothing the view wants is missing or loading, 3 frames in a row
                record = demo.frame(pose, fbo, SIZE)
                ctx.finish()
                done = i >= 3 and record.wanted_pages > 0 and record.missing_pages == 0
                settled = settled + 1 if done and not demo.streamer.busy else 0
                if settled >= 3:
                    break
            else:
                raise SystemExit("the view did not converge in 600 frames")
            data = fbo.read(components=3, alignment=1)
            img = Image.frombuffer("RGB", SIZE, data, "raw", "RGB", 0, -1).copy()
        finally:
            for obj in (fbo, color, depth):
                obj.release()
            demo.close()
    finally:
        ctx.release()
    path = args.out / "demo-scene.png"
    n = save_small_png(img, path, SMALL)
    print(f"{path}: {n / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
