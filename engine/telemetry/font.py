"""A glyph atlas rasterized with Pillow, and vectorized text layout for the overlay (no GL here).

Every glyph of the character set is drawn once with Pillow into one 8-bit coverage image; text is
laid out as one quad per visible glyph, at whole-pixel positions with the glyph's exact size, so a
nearest-sampled quad reproduces Pillow's own rendering of that glyph pixel for pixel. Positions
follow Pillow's basic layout: the pen advances by each glyph's advance (``getlength``) and every
glyph origin is rounded to the nearest pixel. Kerning is not applied (Pillow's basic layout applies
none for fonts without a ``kern`` table, which includes its bundled font).

Font choice (`load_font`): Pillow's bundled scalable font (``ImageFont.load_default(size=...)``,
Aileron Regular through FreeType, Pillow >= 10.1; tabular digits, so numbers line up), else DejaVu
Sans Mono when installed, else Pillow's fixed bitmap font (its size cannot change; logged).

Characters outside the atlas (anything beyond Latin-1, or a glyph the font lacks) draw as ``?``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = ["CHARSET", "GlyphAtlas", "GlyphQuads", "load_font"]

log = logging.getLogger(__name__)

PilFont = ImageFont.FreeTypeFont | ImageFont.ImageFont
CHARSET = "".join(chr(c) for c in range(32, 127)) + "°µ±·×"  # printable ASCII plus a few units
_FALLBACK_FILES = ("DejaVuSansMono.ttf", "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf")
_PAD = 1  # empty texels around each glyph in the atlas


def load_font(size: float) -> tuple[PilFont, str]:
    """A scalable font at `size` pixels and a name for it (see the module docstring for the order)."""
    if not size > 0:
        raise ValueError(f"font size must be positive, got {size!r}")
    try:
        font = ImageFont.load_default(size=size)
    except (TypeError, OSError, ImportError) as exc:  # Pillow < 10.1, or no FreeType
        log.debug("Pillow's bundled scalable font is unavailable: %s", exc)
    else:
        if isinstance(font, ImageFont.FreeTypeFont):
            family, style = font.getname()
            return font, f"{family} {style} {size:g}px (Pillow bundled)"
    for path in _FALLBACK_FILES:
        try:
            font = ImageFont.truetype(path, size=size, layout_engine=ImageFont.Layout.BASIC)
        except (OSError, ImportError):
            continue
        family, style = font.getname()
        return font, f"{family} {style} {size:g}px"
    log.warning("no scalable font (Pillow without FreeType, no DejaVu): the overlay uses Pillow's bitmap font")
    return ImageFont.load_default(), "Pillow bitmap font"


@dataclass(frozen=True)
class GlyphQuads:
    """Laid-out glyphs: pixel rectangles (x, y, w, h) and atlas texel origins (u, v), int32 arrays."""

    x: np.ndarray
    y: np.ndarray
    w: np.ndarray
    h: np.ndarray
    u: np.ndarray
    v: np.ndarray

    def __len__(self) -> int:
        return int(self.x.size)

    @classmethod
    def concat(cls, parts: list[GlyphQuads]) -> GlyphQuads:
        if not parts:
            z = np.zeros(0, np.int32)
            return cls(z, z, z, z, z, z)
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("x", "y", "w", "h", "u", "v")))


class GlyphAtlas:
    """The glyphs of `CHARSET` in one coverage image, plus per-character metrics as lookup tables.

    Parameters
    ----------
    font
        A Pillow font (FreeType or bitmap).
    name
        How logs and `describe` call the font.
    charset
        The characters to rasterize; ``?`` is always included.
    """

    def __init__(self, font: PilFont, name: str = "", charset: str = CHARSET) -> None:
        self.font = font
        self.name = name or "custom font"
        bad = [c for c in charset if ord(c) > 255]
        if bad:
            raise ValueError(f"glyph atlas charset must be Latin-1 characters, got {''.join(bad[:8])!r}")
        chars = sorted(set(charset) | {"?"})
        if isinstance(font, ImageFont.FreeTypeFont):
            ascent, descent = font.getmetrics()
        else:  # bitmap font: no metrics; its boxes start at the top of the line
            ascent, descent = int(font.getbbox("Ag")[3]), 0
        self.ascent, self.descent = int(ascent), int(descent)
        self.line_height = self.ascent + self.descent + 1
        # Per-character tables indexed by Latin-1 code; missing characters map to "?".
        self._remap = np.full(256, ord("?"), np.int64)
        self.advance = np.zeros(256, np.float64)
        self._ox = np.zeros(256, np.int32)
        self._oy = np.zeros(256, np.int32)
        self._w = np.zeros(256, np.int32)
        self._h = np.zeros(256, np.int32)
        self._u = np.zeros(256, np.int32)
        self._v = np.zeros(256, np.int32)
        glyphs: list[tuple[int, Image.Image]] = []
        for ch in chars:
            code = ord(ch)
            try:
                x0, y0, x1, y1 = (int(v) for v in font.getbbox(ch))
                adv = float(font.getlength(ch))
            except (UnicodeEncodeError, OSError, ValueError):
                continue
            self._remap[code] = code
            self.advance[code] = adv
            self._ox[code], self._oy[code] = x0, y0
            if x1 > x0 and y1 > y0:
                img = Image.new("L", (x1 - x0, y1 - y0), 0)
                ImageDraw.Draw(img).text((-x0, -y0), ch, font=font, fill=255)
                glyphs.append((code, img))
        self.image = self._pack(glyphs)
        self._advance_of_byte = self.advance[self._remap].tolist()  # for measure(): plain Python floats
        log.debug("glyph atlas %s: %d glyphs in %dx%d", self.name, len(glyphs), *self.image.size)

    def _pack(self, glyphs: list[tuple[int, Image.Image]]) -> Image.Image:
        """Shelf-pack the glyph images (tallest first) into an atlas at least 256 texels wide."""
        width = max([256] + [img.width + 2 * _PAD for _, img in glyphs])
        x = y = shelf = 0
        placed: list[tuple[int, Image.Image, int, int]] = []
        for code, img in sorted(glyphs, key=lambda g: -g[1].height):
            w, h = img.size
            if x + w + 2 * _PAD > width:
                x, y, shelf = 0, y + shelf, 0
            placed.append((code, img, x + _PAD, y + _PAD))
            x += w + 2 * _PAD
            shelf = max(shelf, h + 2 * _PAD)
        return self._paste(placed, width, y + shelf)

    def _paste(self, placed: list[tuple[int, Image.Image, int, int]], width: int, height: int) -> Image.Image:
        atlas = Image.new("L", (width, max(4, -(-height // 4) * 4)), 0)
        for code, img, px, py in placed:
            atlas.paste(img, (px, py))
            self._u[code], self._v[code] = px, py
            self._w[code], self._h[code] = img.size
        return atlas

    # ---- layout -------------------------------------------------------------------------------
    def codes(self, text: str) -> np.ndarray:
        """Latin-1 codes of `text` with characters outside the atlas replaced by ``?``."""
        raw = np.frombuffer(text.encode("latin-1", errors="replace"), np.uint8)
        return self._remap[raw]

    def measure(self, text: str) -> float:
        """Advance width of `text` in pixels (one line)."""
        adv = self._advance_of_byte
        return float(sum(adv[b] for b in text.encode("latin-1", errors="replace")))

    def layout(self, text: str, x: float, y: float) -> GlyphQuads:
        """Quads of one line of `text` whose top-left (the ascender line) is at pixel (x, y)."""
        return self.layout_many([text], np.array([x], np.float64), np.array([y], np.float64))[0]

    def layout_many(self, texts: list[str], x: np.ndarray, y: np.ndarray) -> tuple[GlyphQuads, np.ndarray]:
        """Lay out many one-line strings in one vectorized pass: string i starts at (x[i], y[i]).

        Returns the quads and, per quad, the index of the string it belongs to.
        """
        lengths = np.fromiter((len(t) for t in texts), np.int64, len(texts))
        codes = self.codes("".join(texts))
        if codes.size != lengths.sum():  # only when a character does not encode to one byte
            raise AssertionError("latin-1 replacement changed the text length")
        span = np.repeat(np.arange(len(texts)), lengths)
        adv = self.advance[codes]
        csum = np.cumsum(adv) - adv  # advance before each character, over all strings
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        first = csum[starts[lengths > 0]] if codes.size else np.zeros(0)
        base = np.zeros(len(texts))
        base[lengths > 0] = first
        pen = np.asarray(x, np.float64)[span] + csum - base[span]
        keep = self._w[codes] > 0
        codes, pen, span = codes[keep], pen[keep], span[keep]
        gx = (np.floor(pen + 0.5) + self._ox[codes]).astype(np.int32)
        gy = (np.floor(np.asarray(y, np.float64)[span] + 0.5) + self._oy[codes]).astype(np.int32)
        return GlyphQuads(gx, gy, self._w[codes], self._h[codes], self._u[codes], self._v[codes]), span

    def describe(self) -> str:
        return f"{self.name}, atlas {self.image.width}x{self.image.height}, line {self.line_height}px"
