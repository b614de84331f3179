"""Draw the architecture diagram, docs/images/architecture.svg: bake -> pack -> stream -> render ->
overlay, with the runtime's threads as lanes and the data moving between them.

    python docs/images/architecture.py [--out FILE]

Plain SVG written by hand-placed coordinates (no dependency); the drawing scales to the page width
through its viewBox, so it is never clipped.
"""

from __future__ import annotations

import argparse
from html import escape
from pathlib import Path

OUT = Path(__file__).resolve().parent / "architecture.svg"
WIDTH, HEIGHT = 800, 720
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
INK, MUTED, ARROW = "#1f2328", "#57606a", "#3d4752"
# stage colours: offline, I/O threads, render thread, GPU
OFFLINE, IO, RENDER, GPU = "#eef2ff", "#fff4e5", "#e8f5e9", "#e3f2fd"
OFFLINE_EDGE, IO_EDGE, RENDER_EDGE, GPU_EDGE = "#6366f1", "#f59e0b", "#22c55e", "#3b82f6"


class Svg:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def box(self, x: float, y: float, w: float, h: float, title: str, lines: tuple[str, ...] = (), *,
            fill: str, edge: str) -> None:  # fmt: skip
        self.parts.append(
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="{fill}" stroke="{edge}" stroke-width="1.5"/>'
        )
        top = y + h / 2 - (len(lines) * 16) / 2 + 5
        self.text(x + w / 2, top, title, size=15, weight="600")
        for i, line in enumerate(lines):
            self.text(x + w / 2, top + 18 + i * 16, line, size=12.5, colour=MUTED)

    def lane(self, y: float, h: float, label: str, note: str, *, fill: str, edge: str) -> None:
        self.parts.append(
            f'<rect x="10" y="{y}" width="{WIDTH - 20}" height="{h}" rx="12" fill="{fill}" fill-opacity="0.45" '
            f'stroke="{edge}" stroke-opacity="0.6" stroke-dasharray="6 4"/>'
        )
        self.text(24, y + 26, label, size=15, weight="700", anchor="start", colour=edge)
        self.text(24, y + 42, note, size=12, anchor="start", colour=MUTED)

    def text(self, x: float, y: float, s: str, *, size: float = 13, weight: str = "400", anchor: str = "middle",
             colour: str = INK, italic: bool = False) -> None:  # fmt: skip
        style = ' font-style="italic"' if italic else ""
        self.parts.append(
            f'<text x="{x}" y="{y}" font-size="{size}" font-weight="{weight}" text-anchor="{anchor}" '
            f'fill="{colour}"{style}>{escape(s)}</text>'
        )

    def arrow(self, points: list[tuple[float, float]], label: str = "", at: int = 0, *, dx: float = 0,
              dy: float = -6, dashed: bool = False) -> None:  # fmt: skip
        path = " ".join(f"{'M' if i == 0 else 'L'}{x},{y}" for i, (x, y) in enumerate(points))
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        self.parts.append(
            f'<path d="{path}" fill="none" stroke="{ARROW}" stroke-width="1.6"{dash} marker-end="url(#head)"/>'
        )
        if label:
            (x0, y0), (x1, y1) = points[at], points[at + 1]
            self.text((x0 + x1) / 2 + dx, (y0 + y1) / 2 + dy, label, size=12, colour=MUTED, italic=True)

    def document(self) -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" '
            f'style="max-width:{WIDTH}px;height:auto" font-family="{FONT}" role="img" '
            'aria-label="texstream architecture: bake, pack, stream, render, overlay">\n'
            "<title>texstream architecture</title>\n"
            '<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
            f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{ARROW}"/></marker></defs>\n'
            # an opaque background: the diagram reads the same on the site's light and dark themes
            f'<rect width="{WIDTH}" height="{HEIGHT}" rx="14" fill="#ffffff"/>\n'
        )
        return head + "\n".join(self.parts) + "\n</svg>\n"


COLUMN_X = (150, 312, 474, 636)  # four columns of boxes; the lanes' labels sit left of the first
BOX_W = 150


def col(i: int) -> float:
    return COLUMN_X[i]


def mid(i: int) -> float:
    return COLUMN_X[i] + BOX_W / 2


def draw() -> str:
    s = Svg()
    white = "#ffffff"
    # ---- offline: bake -> pack -> where it is served from
    s.lane(10, 120, "offline", "texstream bake,", fill=OFFLINE, edge=OFFLINE_EDGE)
    s.text(24, 68, "worker processes", size=12, anchor="start", colour=MUTED)
    y, h = 36, 72
    s.box(col(0), y, BOX_W, h, "source image", ("Pillow, libvips strips,", "or procedural tiles"), fill=white,
          edge=OFFLINE_EDGE)  # fmt: skip
    s.box(col(1), y, BOX_W, h, "bake", ("sRGB-correct mips,", "borders, BC1-BC7"), fill=white, edge=OFFLINE_EDGE)
    s.box(col(2), y, BOX_W, h, "pack (.tpk)", ("tiles + index; zstd", "or lz4, xxh3 each"), fill=white,
          edge=OFFLINE_EDGE)  # fmt: skip
    s.box(col(3), y, BOX_W, h, "served from", ("a file, HTTP ranges,", "fsspec (s3://, gs://)"), fill=white,
          edge=OFFLINE_EDGE)  # fmt: skip
    for i in range(3):
        s.arrow([(col(i) + BOX_W, y + h / 2), (col(i + 1) - 2, y + h / 2)])

    # ---- I/O threads
    s.lane(140, 110, "I/O threads", "no GL, no", fill=IO, edge=IO_EDGE)
    s.text(24, 198, "engine state", size=12, anchor="start", colour=MUTED)
    y, h = 160, 70
    s.box(col(1), y, BOX_W, h, "read", ("one read per run", "(pread or range)"), fill=white, edge=IO_EDGE)
    s.box(col(2), y, BOX_W, h, "check + decode", ("xxh3, zstd / lz4", "into a ring slot"), fill=white, edge=IO_EDGE)
    s.arrow([(mid(2), 108), (mid(2), 132), (mid(1), 132), (mid(1), y - 2)], "tile bytes", at=1, dy=-4)
    s.arrow([(col(1) + BOX_W, y + h / 2), (col(2) - 2, y + h / 2)])

    # ---- render thread
    s.lane(260, 230, "render thread", "every GL call;", fill=RENDER, edge=RENDER_EDGE)
    s.text(24, 318, "update() once", size=12, anchor="start", colour=MUTED)
    s.text(24, 334, "a frame", size=12, anchor="start", colour=MUTED)
    y, h = 300, 72
    s.box(col(0), y, BOX_W, h, "feedback", ("wanted pages,", "reduced with numpy"), fill=white, edge=RENDER_EDGE)
    s.box(col(1), y, BOX_W, h, "requests", ("dedup, parents first,", "fit the budget"), fill=white,
          edge=RENDER_EDGE)  # fmt: skip
    s.box(col(2), y, BOX_W, h, "uploader", ("ring -> cache slots,", "fenced, bounded"), fill=white,
          edge=RENDER_EDGE)  # fmt: skip
    s.box(col(3), y, BOX_W, h, "page tables", ("arrays, updated", "incrementally"), fill=white, edge=RENDER_EDGE)
    s.box(col(1), 408, BOX_W, 64, "telemetry", ("frame record, overlay", "(the HUD, drawn last)"), fill=white,
          edge=RENDER_EDGE)  # fmt: skip
    s.arrow([(col(0) + BOX_W, y + h / 2), (col(1) - 2, y + h / 2)])
    s.arrow([(mid(1), y), (mid(1), 232)], "batches", at=0, dx=-32, dy=4)
    s.arrow([(mid(2), 230), (mid(2), y - 2)], "one message", at=0, dx=46, dy=-4)
    s.text(mid(2) + 46, 280, "per batch", size=12, colour=MUTED, italic=True)
    s.arrow([(col(2) + BOX_W, y + h / 2), (col(3) - 2, y + h / 2)])
    s.arrow([(mid(1), y + h), (mid(1), 406)], "stats", at=0, dx=-22, dy=4)

    # ---- GPU
    s.lane(510, 200, "GPU", "your draws", fill=GPU, edge=GPU_EDGE)
    y, h = 560, 72
    s.box(col(0), y, BOX_W, h, "feedback", ("SSBO 7: pages wanted;", "PBO + fence read"), fill=white,
          edge=GPU_EDGE)  # fmt: skip
    s.box(col(1), y, BOX_W, h, "your shader", ("VT_SAMPLE(name, uv),", "coarser fallback"), fill=white,
          edge=GPU_EDGE)  # fmt: skip
    s.box(col(2), y, BOX_W, h, "cache pools", ("a texture array per", "format, units 8-23"), fill=white,
          edge=GPU_EDGE)  # fmt: skip
    s.box(col(3), y, BOX_W, h, "page table", ("SSBO 6: page ->", "cache slot, level"), fill=white, edge=GPU_EDGE)
    s.arrow([(mid(0), y), (mid(0), 374)], "async", at=0, dx=-26, dy=-20)
    s.text(mid(0) - 26, (y + 374) / 2 - 4, "read-back", size=12, colour=MUTED, italic=True)
    s.arrow([(col(1), y + h / 2), (col(0) + BOX_W + 2, y + h / 2)])
    s.arrow([(mid(2), 372), (mid(2), y - 2)], "sub-uploads", at=0, dx=-40, dy=70)
    s.arrow([(col(2), y + h / 2), (col(1) + BOX_W + 2, y + h / 2)])
    s.arrow([(mid(3), 372), (mid(3), y - 2)], "upload", at=0, dx=-28, dy=70)
    s.arrow([(mid(3), y + h), (mid(3), 680), (mid(1), 680), (mid(1), y + h + 2)], "lookups", at=1, dy=-4)
    return s.document()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.write_text(draw(), encoding="utf-8")
    print(args.out)


if __name__ == "__main__":
    main()
