"""Image comparison for rendering tests: PSNR, a difference image, and an assertion that writes the
actual, expected and difference images where a failing test can be looked at."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

__all__ = ["IDENTICAL_DB", "ImageMismatch", "assert_image_close", "difference_image", "psnr", "read_png", "write_png"]

IDENTICAL_DB = 99.0  # what `psnr` reports for identical images (finite, so it sorts and serialises)


class ImageMismatch(AssertionError):
    """An image is further from its reference than allowed; `paths` are the images written."""

    def __init__(self, message: str, paths: dict[str, Path], db: float) -> None:
        super().__init__(message)
        self.paths = paths
        self.db = db


def _rgb(image: np.ndarray) -> np.ndarray:
    a = np.asarray(image)
    if a.ndim == 2:
        a = a[..., None]
    if a.ndim != 3 or a.shape[2] not in (1, 3, 4):
        raise ValueError(f"expected an H x W, H x W x 3 or H x W x 4 image, got shape {a.shape}")
    if a.dtype != np.uint8:
        raise ValueError(f"expected uint8 pixels, got {a.dtype}")
    return np.repeat(a, 3, axis=2) if a.shape[2] == 1 else a[..., :3]


def psnr(
    image: np.ndarray,
    reference: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    peak: float = 255.0,
    ignore_alpha: bool = True,
) -> float:
    """Peak signal-to-noise ratio in dB of two images or arrays of the same shape.

    The one PSNR of the project: the rendering tests, the bake tests and the benchmarks all use it.

    Parameters
    ----------
    image, reference : numpy.ndarray
        Arrays of the same shape: 8-bit images (grey, RGB or RGBA), single channels, masked pixel
        lists, or float data (give its `peak`).
    mask : numpy.ndarray of bool, optional
        Compare only these pixels (H x W).
    peak : float
        The largest possible value (255 for 8-bit data, 1.0 for normalised floats).
    ignore_alpha : bool
        Drop the fourth channel of H x W x 4 arrays (rendered frames); False compares every channel.

    Returns
    -------
    float
        ``10 log10(peak^2 / MSE)``; `IDENTICAL_DB` (99) when the arrays are equal (finite, so it
        sorts and serialises).
    """
    a, b = np.asarray(image), np.asarray(reference)
    if a.shape != b.shape:
        raise ValueError(f"images differ in shape: {a.shape} and {b.shape}")
    if ignore_alpha and a.ndim == 3 and a.shape[2] == 4:
        a, b = a[..., :3], b[..., :3]
    d = a.astype(np.float64) - b.astype(np.float64)
    if mask is not None:
        d = d[np.asarray(mask, bool)]
    mse = float(np.mean(d * d)) if d.size else 0.0
    return IDENTICAL_DB if mse == 0 else min(IDENTICAL_DB, 10.0 * math.log10(peak * peak / mse))


def difference_image(image: np.ndarray, reference: np.ndarray, gain: float = 8.0) -> np.ndarray:
    """|image - reference| per channel, amplified by `gain` (uint8 RGB): where two frames differ."""
    a, b = _rgb(image).astype(np.int16), _rgb(reference).astype(np.int16)
    return np.clip(np.abs(a - b) * gain, 0, 255).astype(np.uint8)


def write_png(image: np.ndarray, path: Path) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.asarray(image)
    Image.fromarray(a if a.ndim == 2 or a.shape[2] != 1 else a[..., 0]).save(path)
    return path


def read_png(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as img:
        return np.asarray(img.convert("RGBA")).copy()


def safe_name(name: str) -> str:
    """`name` as a file name: runs of anything but letters, digits, ``_.-`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:150] or "image"


def assert_image_close(
    image: np.ndarray,
    reference: np.ndarray,
    min_psnr: float = 45.0,
    *,
    name: str = "image",
    out_dir: str | Path | None = None,
) -> float:
    """Assert that `image` is within `min_psnr` dB of `reference`; returns the PSNR.

    Parameters
    ----------
    image, reference : numpy.ndarray
        uint8 images of the same size (RGB compared, alpha ignored).
    min_psnr : float
        The lowest acceptable PSNR in dB (45 dB: visually identical; streamed frames that converged
        reach it against an all-resident reference).
    name : str
        Names the images written on failure.
    out_dir : path-like, optional
        Where ``<name>-actual.png``, ``<name>-expected.png`` and ``<name>-diff.png`` go on failure
        (under pytest, the `texstream` plugin gives each test its own folder).

    Raises
    ------
    ImageMismatch
        An `AssertionError` whose message gives the PSNR, the threshold and the images written.
    """
    a, b = np.asarray(image), np.asarray(reference)
    if a.shape[:2] != b.shape[:2]:
        raise AssertionError(f"{name}: {a.shape[1]}x{a.shape[0]} image against a {b.shape[1]}x{b.shape[0]} reference")
    db = psnr(a, b)
    if db >= min_psnr:
        return db
    paths: dict[str, Path] = {}
    if out_dir is not None:
        folder, stem = Path(out_dir), safe_name(name)
        paths = {
            "actual": write_png(a, folder / f"{stem}-actual.png"),
            "expected": write_png(b, folder / f"{stem}-expected.png"),
            "diff": write_png(difference_image(a, b), folder / f"{stem}-diff.png"),
        }
    where = "; wrote " + ", ".join(f"{k} {p}" for k, p in paths.items()) if paths else ""
    raise ImageMismatch(f"{name}: PSNR {db:.2f} dB is below {min_psnr:g} dB{where}", paths, db)
