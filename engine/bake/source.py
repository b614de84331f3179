"""Image sources for the baker: anything that yields full-width RGBA8 row strips, top to bottom
(or float32 linear RGBA strips: `float_source.FloatImageSource`, for HDR files, ``texel_dtype`` float32).

Every source presents its pixels as 8-bit RGBA whatever it stores; ``channels`` says what they mean
(1 grey, 2 grey + alpha, 3 RGB, 4 RGBA) so the baker knows whether alpha carries information.

Conversion rules (Pillow modes; libvips images follow the same rules by band count and format):

====================  ==========================================================================
1                     0 -> 0, 1 -> 255, then as L
L                     grey replicated to R, G, B; A = 255
LA, La, PA            RGBA (La is unpremultiplied first; PA expands its palette)
P                     RGBA when the palette or image has transparency, else RGB with A = 255
RGB, RGBX             A = 255 (the X byte is ignored)
RGBA                  as is
RGBa                  unpremultiplied to RGBA
I;16, I;16L/B/N, I    clipped to 0..65535, then round(v / 257) (so 65535 -> 255), then as L
F                     clipped to [0, 1], then round(v * 255), then as L
CMYK, YCbCr, LAB,     converted to RGB by Pillow (libvips: colourspace to sRGB), A = 255
HSV
====================  ==========================================================================

libvips images: 16-bit and other integer formats (any band count) use the I;16 rule per band,
float formats the F rule; 1, 2, 3 and 4 bands mean grey, grey + alpha, RGB and RGBA.

Multi-frame files (GIF, APNG, TIFF pages) use their first frame. EXIF orientation is applied (a
phone photo stored sideways bakes upright): Pillow's ``exif_transpose``, libvips' ``autorot``;
``describe()`` records the tag's value as ``source_orientation`` (1: stored order). Anything else
raises `SourceError` with a one-line message naming the file.

Alpha: ``channels`` says whether the file *can* carry alpha; `has_alpha` says whether it does (any
alpha below 255). An RGBA file whose alpha is all 255 is opaque colour.

High dynamic range files (OpenEXR ``.exr``, Radiance ``.hdr``), told by their first bytes, are
read whole by `texstream.assets.exr` and `texstream.assets.hdr` into a `FloatImageSource`: linear
float32 RGB strips with alpha 1.0, which the baker keeps in float (BC6H) or encodes to 8 bits for
any other format.

Pillow decodes a whole image at once, so images above `VIPS_THRESHOLD` pixels (or that Pillow
cannot read) are opened with libvips and converted strip by strip (sequential access; a file
stored rotated is decoded once by libvips and read from its copy); a 16K^2 image never sits in
memory whole.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
import warnings
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from ..errors import SourceError, first_line
from .png_plain import decode_plain_png

log = logging.getLogger(__name__)

VIPS_THRESHOLD = 16 * 1024 * 1024  # pixels; larger images are streamed through libvips


@runtime_checkable
class Source(Protocol):
    """What the baker reads: full-width RGBA8 strips. Unless a flag below says otherwise, rows are
    requested top to bottom, each row once, by the baker's main process only.

    Optional attributes the baker looks for:

    ``parallel``  True when the source is small to pickle, random-access and deterministic, so
                  worker processes may call `read_rows` on their own copy (procedural sources).
    ``forkable``  True when `read_rows` is random-access and cheap (in-memory images): a bake on
                  one job then reads its bands in place, in any order (with more jobs, the main
                  process copies them into the workers' shared ring as for any other source).
    ``describe()``  a dict for the pack's metadata.
    ``has_alpha()``  whether any alpha is below 255 (see `has_alpha`, which scans sources without it).
    ``read_rows_into(y0, y1, out)``  `read_rows` writing into a given array (saves a copy).
    ``texel_dtype``  numpy dtype of the strips: uint8 (the default) or float32 (linear values).
    """

    name: str
    width: int
    height: int
    channels: int

    def read_rows(self, y0: int, y1: int) -> np.ndarray:
        """Rows [y0, y1) as a (y1 - y0, width, 4) uint8 RGBA array (treat it as read-only)."""
        ...


def texel_dtype(source: object) -> np.dtype:
    """The dtype of a source's strips: uint8 unless it says float32 (`FloatImageSource`)."""
    return np.dtype(getattr(source, "texel_dtype", np.uint8))


def _check_range(source: Source, y0: int, y1: int) -> None:
    if not 0 <= y0 < y1 <= source.height:
        raise ValueError(f"row range {y0}..{y1} is outside 0..{source.height} of {source.name}")


def describe(source: Source) -> dict:
    """Metadata about a source for the pack (its own `describe()` when it has one)."""
    own = getattr(source, "describe", None)
    info = {
        "source": source.name,
        "source_width": source.width,
        "source_height": source.height,
        "source_channels": source.channels,
    }
    if callable(own):
        info.update(own())
    return info


def has_alpha(source: Source) -> bool | None:
    """Whether `source` has real alpha (any texel's alpha below 255); None when it cannot tell.

    1- and 3-channel sources are opaque by their channel rule. Others answer through their own
    ``has_alpha()`` (libvips computes the alpha band's minimum over a second, streaming decode),
    or, when random-access and cheap (``forkable``/``parallel``), by scanning their strips. A source
    read once, top to bottom, without ``has_alpha()`` cannot be scanned ahead: None.
    """
    if source.channels not in (2, 4):
        return False
    own = getattr(source, "has_alpha", None)
    if callable(own):
        return bool(own())
    if not (getattr(source, "forkable", False) or getattr(source, "parallel", False)):
        return None
    step = max(1, _SCAN_TEXELS // max(1, source.width))
    for y in range(0, source.height, step):
        if _alpha_below_255(source.read_rows(y, min(source.height, y + step))):
            return True
    return False


_SCAN_TEXELS = 1 << 22  # texels per strip of an alpha scan


def _alpha_below_255(rgba: np.ndarray) -> bool:
    return bool(rgba.size) and int(rgba[..., 3].min()) < 255


# ---- conversions ---------------------------------------------------------------------------------
def _grey(g: np.ndarray, alpha: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    if out is None:
        out = np.empty(g.shape + (4,), np.uint8)
    for c in range(3):  # one channel at a time: numpy's inner loops then run along the row
        out[..., c] = g
    out[..., 3] = 255 if alpha is None else alpha
    return out


def _rgb(rgb: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    if out is None:
        out = np.empty(rgb.shape[:2] + (4,), np.uint8)
    for c in range(3):  # `out[..., :3] = rgb` would loop over 3 bytes at a time, 5x slower
        out[..., c] = rgb[..., c]
    out[..., 3] = 255
    return out


def _expand(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """(H, W, 1..4) uint8 -> RGBA by the channel rules (grey, grey + alpha, RGB, RGBA)."""
    c = a.shape[2]
    if c == 1:
        return _grey(a[..., 0], None, out)
    if c == 2:
        return _grey(a[..., 0], a[..., 1], out)
    if c == 3:
        return _rgb(a, out)
    if out is None:
        return a
    out[...] = a
    return out


def u16_to_u8(v: np.ndarray) -> np.ndarray:
    """Integers clipped to 0..65535, then round(v / 257) (exact: no ties, since 257 is odd)."""
    v = np.clip(v.astype(np.int64), 0, 65535)
    return ((2 * v + 257) // 514).astype(np.uint8)


def float_to_u8(v: np.ndarray) -> np.ndarray:
    """Floats clipped to [0, 1] (NaN -> 0), then round(v * 255)."""
    v = np.nan_to_num(v.astype(np.float64), nan=0.0, posinf=1.0, neginf=0.0)
    return np.rint(np.clip(v, 0.0, 1.0) * 255.0).astype(np.uint8)


def to_rgba(values: np.ndarray) -> tuple[np.ndarray, int]:
    """(H, W) or (H, W, C<=4) array of uint8 / uint16 / int / float / bool -> (RGBA8, channels)."""
    a = np.asarray(values)
    if a.ndim == 2:
        a = a[..., None]
    if a.ndim != 3 or not 1 <= a.shape[2] <= 4:
        raise ValueError(f"expected an (H, W) or (H, W, 1..4) array, got shape {np.shape(values)}")
    if a.dtype == np.bool_:
        a = a.astype(np.uint8) * np.uint8(255)
    elif a.dtype.kind in "ui" and a.dtype != np.uint8:
        a = u16_to_u8(a)
    elif a.dtype.kind == "f":
        a = float_to_u8(a)
    elif a.dtype != np.uint8:
        raise ValueError(f"unsupported array dtype {a.dtype} (use uint8, uint16, int, float or bool)")
    return np.ascontiguousarray(_expand(a)), a.shape[2]


def pil_to_rgba(img: object) -> tuple[np.ndarray, int]:
    """A Pillow image (first frame) -> (H, W, 4) uint8 RGBA and its channel meaning (rules above)."""
    from PIL import Image

    assert isinstance(img, Image.Image)
    mode = img.mode
    if mode == "1":
        return _grey(np.asarray(img.convert("L"))), 1
    if mode == "L":
        return _grey(np.asarray(img)), 1
    if mode in ("LA", "La"):
        la = np.asarray(img if mode == "LA" else img.convert("LA"))
        return _grey(la[..., 0], la[..., 1]), 2
    if mode == "PA" or (mode == "P" and img.has_transparency_data):
        return np.asarray(img.convert("RGBA")).copy(), 4
    if mode in ("P", "CMYK", "YCbCr", "LAB", "HSV"):
        return _rgb(np.asarray(img.convert("RGB"))), 3
    if mode == "RGB":  # Pillow's own conversion (alpha 255) is 5x faster than numpy's channel copies
        return np.asarray(img.convert("RGBA")), 3
    if mode == "RGBX":
        return _rgb(np.asarray(img)), 3
    if mode in ("RGBA", "RGBa"):
        return np.asarray(img if mode == "RGBA" else img.convert("RGBA")).copy(), 4
    if mode.startswith("I"):  # I;16, I;16L, I;16B, I;16N, I
        return _grey(u16_to_u8(np.asarray(img))), 1
    if mode == "F":
        return _grey(float_to_u8(np.asarray(img))), 1
    try:
        return np.asarray(img.convert("RGBA")).copy(), 4
    except (ValueError, OSError) as exc:
        raise SourceError(f"unsupported image mode {mode!r}: {exc}") from None


# ---- sources ---------------------------------------------------------------------------------------
class ArraySource:
    """An in-memory array (see `to_rgba` for accepted shapes and dtypes), converted per strip."""

    forkable = True

    def __init__(self, array: np.ndarray, name: str = "array") -> None:
        a = np.asarray(array)
        if a.ndim not in (2, 3) or a.shape[0] < 1 or a.shape[1] < 1:
            raise ValueError(f"array must be (H, W) or (H, W, C) with H, W >= 1, got shape {a.shape}")
        to_rgba(a[:1, :1])  # validates channels and dtype up front
        self._array = a
        self.name = name
        self.height, self.width = int(a.shape[0]), int(a.shape[1])
        self.channels = 1 if a.ndim == 2 else int(a.shape[2])

    def read_rows(self, y0: int, y1: int) -> np.ndarray:
        _check_range(self, y0, y1)
        a = self._array[y0:y1]
        if a.ndim == 3 and a.shape[2] == 4 and a.dtype == np.uint8:
            return a
        return to_rgba(a)[0]

    def has_alpha(self) -> bool:
        if self.channels not in (2, 4):
            return False
        step = max(1, _SCAN_TEXELS // self.width)  # converted strip by strip: bounded memory
        return any(_alpha_below_255(self.read_rows(y, min(self.height, y + step))) for y in range(0, self.height, step))

    def describe(self) -> dict:
        return {"source_kind": "array", "source_dtype": str(self._array.dtype)}


class PillowSource:
    """A Pillow image (or a path Pillow opens), decoded and converted once, read by slicing."""

    forkable = True
    url: str | None = None  # the URL `open_source` downloaded the file from
    url_version: str | None = None  # and the version it got (`RemoteVersion.key()`)

    def __init__(self, image: str | os.PathLike[str] | object, name: str | None = None) -> None:
        from PIL import Image, UnidentifiedImageError

        if isinstance(image, Image.Image):
            img = image
            self.name = name or "image"
        else:
            path = Path(image)  # type: ignore[arg-type]
            self.name = name or path.name
            try:
                img = Image.open(path)
            except FileNotFoundError:
                raise SourceError(f"{path}: no such file") from None
            except UnidentifiedImageError:
                raise SourceError(f"{path}: not an image Pillow can read") from None
            except Image.DecompressionBombError:
                raise SourceError(f"{path}: too large for Pillow (open it with open_source or VipsSource)") from None
            except OSError as exc:
                raise SourceError(f"{path}: cannot open: {first_line(exc)}") from None
        self.mode = img.mode
        try:
            self._rgba, self.channels, self.orientation = self._decode(img)
        finally:
            if img is not image:  # opened here: its file is not needed any more
                img.close()
        self.height, self.width = self._rgba.shape[:2]

    def _decode(self, img: object) -> tuple[np.ndarray, int, int]:
        """(RGBA, channels, EXIF orientation) of an opened Pillow image."""
        plain = decode_plain_png(img)
        if plain is not None:
            channels = 1 if plain.ndim == 2 else plain.shape[2]
            rgba = _grey(plain) if channels == 1 else _rgb(plain) if channels == 3 else plain
            return rgba, channels, 1
        from PIL import ImageOps

        try:
            if getattr(img, "n_frames", 1) > 1:
                img.seek(0)  # type: ignore[attr-defined]
            img.load()  # type: ignore[attr-defined]
            orientation = _exif_orientation(img)
            if orientation != 1:
                img = ImageOps.exif_transpose(img)  # type: ignore[arg-type]
            return (*pil_to_rgba(img), orientation)
        except SourceError as exc:
            raise SourceError(f"{self.name}: {exc}") from None
        except (OSError, ValueError, SyntaxError, EOFError) as exc:  # truncated / corrupt data
            raise SourceError(f"{self.name}: cannot decode: {first_line(exc)}") from None

    def read_rows(self, y0: int, y1: int) -> np.ndarray:
        _check_range(self, y0, y1)
        return self._rgba[y0:y1]

    def has_alpha(self) -> bool:
        return self.channels in (2, 4) and _alpha_below_255(self._rgba)

    def describe(self) -> dict:
        return {"source_kind": "pillow", "source_mode": self.mode, "source_orientation": self.orientation}


def _exif_orientation(img: object) -> int:
    """The EXIF orientation tag (1..8) of a Pillow image; 1 when absent or invalid."""
    try:
        value = int(img.getexif().get(0x0112, 1))  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError, OSError, SyntaxError):  # a broken EXIF block
        return 1
    return value if 1 <= value <= 8 else 1


def _quiet_vips_log() -> None:
    """Let only libvips' warnings and errors into Python.

    pyvips routes every GLib message of the VIPS domain, down to debug, through a Python callback
    called from C; libvips reports at info level at the end of every pixel read ("threadpool
    completed"), so each strip ran Python code inside a C callback, where an exception (a signal
    handler's KeyboardInterrupt, say) is printed and lost. Info and debug messages now go to
    GLib's default handler, which drops them unless G_MESSAGES_DEBUG asks for them.
    """
    import pyvips

    handler = getattr(pyvips, "_log_handler_id", None)
    callback = getattr(pyvips, "_log_handler_cb", None)
    if not handler or callback is None or getattr(pyvips, "_texstream_quiet", False):
        return
    try:
        glib, flags = pyvips.glib_lib, pyvips.GLogLevelFlags
        mask = flags.LEVEL_WARNING | flags.LEVEL_CRITICAL | flags.LEVEL_ERROR | flags.FLAG_FATAL
        mask |= flags.FLAG_RECURSION
        glib.g_log_remove_handler(b"VIPS", handler)
        pyvips._log_handler_id = glib.g_log_set_handler(b"VIPS", mask, callback, pyvips.ffi.NULL)
        pyvips._texstream_quiet = True
    except (AttributeError, TypeError) as exc:  # another pyvips layout: leave it as it is
        log.debug("cannot narrow pyvips' log handler: %s", exc)


class VipsSource:
    """A file streamed by libvips, converted to RGBA8 strip by strip.

    Only the strip being read (and libvips' small caches) is in memory, whatever the image's size.
    Formats read sequentially (PNG, JPEG, WebP, ...) are opened with access="sequential": libvips
    then decodes each line once, so rows must be requested top to bottom, and every strip this
    class asks libvips for starts at a multiple of `ALIGN` rows (a new request must start on the
    loader's own strip grid, or libvips reports an out-of-order read); rows read past the end of a
    request wait in a small buffer for the next one. TIFF and .v files, which libvips reads region
    by region, stream the same way (random access decodes a strip TIFF's first region slowly) and
    can also be read region by region in any order (`read_region`, a cluster's workers).
    """

    url: str | None = None  # the URL `open_source` downloaded the file from
    url_version: str | None = None  # and the version it got (`RemoteVersion.key()`)

    ALIGN = 256  # a multiple of every loader's strip height (8, 16, ... 256 rows)
    _REGION_LOADERS = ("tiffload", "vipsload")

    def __init__(self, path: str | os.PathLike[str], name: str | None = None) -> None:
        import pyvips

        _quiet_vips_log()
        self.path = Path(path)
        self.name = name or self.path.name
        try:
            img = pyvips.Image.new_from_file(str(self.path), access="sequential", fail_on="error")
            loader = img.get("vips-loader") if "vips-loader" in img.get_fields() else ""
            self.random = loader.startswith(self._REGION_LOADERS) or self.path.suffix.lower() == ".v"
            self.orientation = _vips_orientation(img)
            # Every orientation but 1 reads the stored rows out of order (a rotation or a vertical
            # flip), which a sequential loader cannot do: libvips then decodes the image once into
            # its own cache (memory, or a temporary file for large images) and rotates from there.
            self.random = self.random or self.orientation != 1
            # Upright files stream sequentially whatever their loader: a strip TIFF opened for random
            # access decodes its first region slowly (1.6 s of an 8192² one, against 0.08 s in
            # sequence: the whole strip set at once). Regions for a cluster's workers open their
            # own random-access image (`read_region`).
            if self.orientation != 1:
                img = pyvips.Image.new_from_file(str(self.path), access="random", fail_on="error").autorot()
            self.mode = f"{img.interpretation}/{img.format}/{img.bands}"
            self._img, self.channels = self._convert(img)
            self._region_img: object | None = None  # random-access image, opened by read_region
        except pyvips.Error as exc:
            raise SourceError(f"{self.path}: cannot open with libvips: {_vips_reason(exc)}") from None
        self.loader = loader
        self.width, self.height = self._img.width, self._img.height
        st = self.path.stat()
        self.file_stamp = (st.st_size, st.st_mtime_ns)  # the file as opened (a cluster's workers check it)
        self._next = 0  # rows before this were handed out
        self._buf = np.empty((0, self.width, self.channels), np.uint8)  # rows [_buf_lo, _fetched)
        self._buf_lo = 0
        self._fetched = 0

    @staticmethod
    def _convert(img: object) -> tuple[object, int]:
        import pyvips

        assert isinstance(img, pyvips.Image)
        interp = str(img.interpretation)
        if interp in ("cmyk", "lab", "labq", "labs", "lch", "cmc", "xyz", "yxy", "hsv", "scrgb"):
            img = img.colourspace("srgb")
        fmt = str(img.format)
        if fmt in ("complex", "dpcomplex"):
            raise SourceError(f"complex-valued images are not supported (format {fmt})")
        if fmt in ("float", "double"):
            img = (img.cast("double").clamp(min=0.0, max=1.0) * 255.0).rint().cast("uchar")
        elif fmt != "uchar":  # ushort, short, uint, int, char: clip 0..65535, round(v / 257)
            img = (img.cast("double").clamp(min=0.0, max=65535.0) / 257.0).rint().cast("uchar")
        if not 1 <= img.bands <= 4:
            raise SourceError(f"{img.bands}-band images are not supported (expected 1 to 4 bands)")
        return img.cast("uchar"), img.bands  # expanded to RGBA per strip (numpy is faster at it)

    def read_rows(self, y0: int, y1: int) -> np.ndarray:
        return self.read_rows_into(y0, y1, None)

    def read_rows_into(self, y0: int, y1: int, out: np.ndarray | None) -> np.ndarray:
        """`read_rows`, written into `out` ((y1 - y0, width, 4) uint8) when given: saves a copy."""
        _check_range(self, y0, y1)
        if y0 < self._next:
            raise ValueError(f"{self.name} streams top to bottom: row {y0} was requested after row {self._next}")
        if self.orientation != 1:  # rotated: libvips serves any rows of its decoded copy
            rows = self._fetch(self._img, y0, y1)
        else:
            if y1 > self._fetched:  # fetch aligned strips up to and past y1; keep the rest buffered
                end = min(self.height, -(-y1 // self.ALIGN) * self.ALIGN)
                new = self._fetch(self._img, self._fetched, end)  # from where the last fetch ended: in order
                old = self._buf[max(0, y0 - self._buf_lo) :]  # buffered rows still wanted
                self._buf = np.concatenate([old, new]) if old.shape[0] else new
                self._buf_lo, self._fetched = self._fetched - old.shape[0], end
            rows = self._buf[y0 - self._buf_lo : y1 - self._buf_lo]
        self._next = y1
        return _expand(rows, out)

    @property
    def region_readable(self) -> bool:
        """Whether rows can be read in any order without decoding the whole file first: a format
        libvips reads region by region (TIFF, .v), stored upright (a rotation is decoded whole)."""
        return self.random and self.orientation == 1

    def read_region(self, y0: int, y1: int) -> np.ndarray:
        """Rows [y0, y1) in any order, any number of times (`region_readable` files only): each
        worker of a cluster bake reads its own bands so."""
        if not self.region_readable:
            raise ValueError(f"{self.name} is read top to bottom only ({self.loader}, orientation {self.orientation})")
        _check_range(self, y0, y1)
        if self._region_img is None:
            import pyvips

            try:
                img = pyvips.Image.new_from_file(str(self.path), access="random", fail_on="error")
            except pyvips.Error as exc:
                raise SourceError(f"{self.path}: cannot open with libvips: {_vips_reason(exc)}") from None
            self._region_img = self._convert(img)[0]
        return _expand(self._fetch(self._region_img, y0, y1))

    def _fetch(self, img: object, y0: int, y1: int) -> np.ndarray:
        import pyvips

        try:
            data = img.crop(0, y0, self.width, y1 - y0).write_to_memory()  # type: ignore[attr-defined]
        except pyvips.Error as exc:
            raise SourceError(f"{self.path}: cannot read rows {y0}..{y1}: {_vips_reason(exc)}") from None
        return np.frombuffer(data, np.uint8).reshape(y1 - y0, self.width, self.channels)

    def has_alpha(self) -> bool:
        """The alpha band's minimum, from a second decode of the file (libvips streams and threads
        it; this source's own stream is left where it is), converted as the strips are."""
        import pyvips

        if self.channels not in (2, 4):
            return False
        try:
            img = pyvips.Image.new_from_file(str(self.path), access="sequential", fail_on="error")
            alpha = self._convert(img)[0].extract_band(self.channels - 1)  # type: ignore[attr-defined]
            return alpha.min() < 255
        except pyvips.Error as exc:
            raise SourceError(f"{self.path}: cannot read its alpha: {_vips_reason(exc)}") from None

    def describe(self) -> dict:
        return {
            "source_kind": "vips",
            "source_mode": self.mode,
            "source_loader": self.loader,
            "source_orientation": self.orientation,
        }


def _vips_orientation(img: object) -> int:
    """The EXIF orientation libvips read (1..8); 1 when absent."""
    try:
        value = int(img.get("orientation")) if "orientation" in img.get_fields() else 1  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return 1
    return value if 1 <= value <= 8 else 1


def _vips_reason(exc: BaseException) -> str:
    """The most specific line of a pyvips error (its detail names the cause; the message rarely)."""
    lines = [ln.strip() for ln in f"{getattr(exc, 'message', '')}\n{getattr(exc, 'detail', '')}".splitlines()]
    lines = [ln for ln in lines if ln]
    detail = [ln for ln in lines if ln != "unable to write to memory" and not ln.startswith("unable to call")]
    return (detail or lines or [type(exc).__name__])[-1]


def open_source(path: str | os.PathLike[str], *, vips_threshold: int = VIPS_THRESHOLD) -> Source:
    """Open an image file: Pillow up to `vips_threshold` pixels, libvips above it or when Pillow
    cannot read the file. Missing, unreadable, truncated or non-image files raise SourceError.

    A URL (http(s)://, or any fsspec filesystem) is downloaded once into the cache's ``sources``
    folder (`texstream.remote.download`) and opened from there; the source remembers its URL
    (`url`, `url_version`) so a cluster's workers can fetch the same version themselves."""
    from PIL import Image, UnidentifiedImageError

    from ..remote.urls import is_remote

    if is_remote(path):
        from ..remote.download import download
        from ..remote.transport import RemoteError

        try:
            got = download(str(path))
        except RemoteError as exc:
            raise SourceError(str(exc)) from None
        source = open_source(got.path, vips_threshold=vips_threshold)
        source.name = Path(urllib.parse.urlsplit(got.url).path).name or got.url  # type: ignore[misc]
        source.url, source.url_version = str(path), got.version.key()  # type: ignore[union-attr]
        return source
    p = Path(path)
    if not p.exists():
        raise SourceError(f"{p}: no such file")
    if p.is_dir():
        raise SourceError(f"{p}: is a folder, not an image")
    try:
        with open(p, "rb") as f:
            head = f.read(80)
    except OSError as exc:
        raise SourceError(f"{p}: cannot open: {first_line(exc)}") from None
    from .float_source import open_float_image  # HDR readers load only for HDR files

    floats = open_float_image(p, head)
    if floats is not None:
        return floats
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(p)
    except Image.DecompressionBombError:
        log.info("%s: too large for Pillow, streaming it with libvips", p)
        return VipsSource(p)
    except UnidentifiedImageError:
        try:
            return VipsSource(p)
        except SourceError:
            raise SourceError(f"{p}: not an image (neither Pillow nor libvips can read it)") from None
    except OSError as exc:
        raise SourceError(f"{p}: cannot open: {first_line(exc)}") from None
    w, h = img.size
    if w * h > vips_threshold:
        try:
            src = VipsSource(p)
        except SourceError as exc:
            log.info("libvips cannot stream %s (%s); decoding it whole with Pillow", p, exc)
        else:
            img.close()
            return src
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return PillowSource(img, name=p.name)
    finally:
        img.close()  # decoded, or not decodable: its file is not needed any more


__all__ = [
    "VIPS_THRESHOLD",
    "ArraySource",
    "PillowSource",
    "Source",
    "VipsSource",
    "describe",
    "float_to_u8",
    "has_alpha",
    "open_source",
    "pil_to_rgba",
    "texel_dtype",
    "to_rgba",
    "u16_to_u8",
]
