"""High dynamic range sources: OpenEXR and Radiance HDR images decoded whole into float32 linear RGB.

Kept apart from `source` so the 8-bit path never imports the HDR readers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class FloatImageSource:
    """A decoded high dynamic range image: (H, W, 3) float32 linear RGB, read as RGBA float32 strips
    (alpha 1.0) by slicing. Opaque, three channels; NaN and negative values are kept (the encoder
    clips them)."""

    forkable = True
    texel_dtype = np.dtype(np.float32)
    channels = 3
    url: str | None = None  # as `PillowSource`'s
    url_version: str | None = None

    def __init__(self, rgb: np.ndarray, name: str, kind: str) -> None:
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.float32 or not rgb.shape[0] or not rgb.shape[1]:
            raise ValueError(f"expected an (H, W, 3) float32 array, got {rgb.shape} {rgb.dtype}")
        self._rgb, self.name, self.kind = rgb, name, kind
        self.height, self.width = int(rgb.shape[0]), int(rgb.shape[1])

    def read_rows(self, y0: int, y1: int) -> np.ndarray:
        if not 0 <= y0 < y1 <= self.height:
            raise ValueError(f"row range {y0}..{y1} is outside 0..{self.height} of {self.name}")
        out = np.empty((y1 - y0, self.width, 4), np.float32)
        for c in range(3):
            out[..., c] = self._rgb[y0:y1, :, c]
        out[..., 3] = 1.0
        return out

    def has_alpha(self) -> bool:
        return False

    def peak(self) -> float:
        """The largest finite texel value (0.0 for an all-black or all-NaN image)."""
        finite = self._rgb[np.isfinite(self._rgb)]
        return float(finite.max()) if finite.size else 0.0

    def describe(self) -> dict:
        return {"source_kind": self.kind, "source_dtype": "float32"}


def open_float_image(path: Path, head: bytes) -> FloatImageSource | None:
    """An OpenEXR or Radiance HDR file (told by `head`, its first bytes) as a `FloatImageSource`;
    None for other files."""
    from ..assets.exr import EXR_MAGIC, read_exr
    from ..assets.hdr import is_hdr_bytes, read_hdr

    if head.startswith(EXR_MAGIC):
        return FloatImageSource(read_exr(path), path.name, "openexr")
    if is_hdr_bytes(head):
        return FloatImageSource(read_hdr(path).rgb, path.name, "radiance-hdr")
    return None
