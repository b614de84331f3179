"""OpenEXR images (``.exr``) as float32 RGB, through the ``openexr`` package (the ASWF's bindings).

The package is imported on first use, so it is needed only to read EXR files. The header is read
first and the data window's size checked against `MAX_TEXELS` before any pixel is decoded. The
channels used: R, G, B (any pixel type: half, float or uint, all read as float32), or a lone Y
(grey, replicated); other layers are ignored. An alpha channel (A) is dropped with a one-line warning
naming the file: BC6H, the format float images bake to, holds RGB only. Multi-part
files use their first part; deep and subsampled images are refused. Every failure is one
`SourceError` line naming the file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from ..errors import SourceError

__all__ = ["EXR_MAGIC", "MAX_TEXELS", "read_exr"]

log = logging.getLogger(__name__)

EXR_MAGIC = b"v/1\x01"
MAX_TEXELS = 1 << 26  # as for Radiance pictures: 768 MiB of float32 RGB


def read_exr(path: str | os.PathLike[str], *, max_texels: int = MAX_TEXELS) -> np.ndarray:
    """The (height, width, 3) float32 RGB of the EXR file at `path`, top row first.

    Raises
    ------
    SourceError
        one line naming the file: unreadable, not an EXR, too large, or without colour channels
    """
    p = Path(path)
    try:
        import OpenEXR
    except ImportError:
        raise SourceError(f"{p}: reading OpenEXR files needs the openexr package (pip install openexr)") from None
    try:
        with open(p, "rb") as f:
            if f.read(4) != EXR_MAGIC:
                raise SourceError(f"{p}: not an OpenEXR file")
    except OSError as exc:
        raise SourceError(f"{p}: cannot read: {exc.strerror or exc}") from None
    try:
        with OpenEXR.File(str(p), header_only=True) as f:  # the header is the file's: read it inside
            header = f.header()
            lo, hi = (np.asarray(corner, np.int64) for corner in header["dataWindow"])
            storage = str(header.get("type", ""))
            sampling = {c.name: (int(c.xSampling), int(c.ySampling)) for c in header.get("channels", [])}
        width, height = int(hi[0] - lo[0]) + 1, int(hi[1] - lo[1]) + 1
        if width < 1 or height < 1 or width * height > max_texels:
            raise SourceError(f"{p}: {width:,} x {height:,} texels is outside 1..{max_texels:,} texels")
        if "deep" in storage.lower():
            raise SourceError(f"{p}: deep OpenEXR images are not supported")
        names = set(sampling)
        if any(xy != (1, 1) for xy in sampling.values()):
            raise SourceError(f"{p}: subsampled channels are not supported")
        wanted = ["R", "G", "B"] if {"R", "G", "B"} <= names else ["Y"] if "Y" in names else None
        if wanted is None:
            raise SourceError(f"{p}: no R, G, B or Y channel (it has {', '.join(sorted(names))[:120] or 'none'})")
        with OpenEXR.File(str(p), separate_channels=True) as f:
            channels = f.channels()
            planes = [np.array(channels[n].pixels, np.float32) for n in wanted]  # copies: the file owns its arrays
    except SourceError:
        raise
    except Exception as exc:  # the bindings raise RuntimeError, ValueError, KeyError...: all a bad file
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise SourceError(f"{p}: cannot read as OpenEXR: {reason}") from None
    if "A" in names:
        log.warning("%s: its alpha channel is dropped (BC6H packs hold RGB only)", p)
    if any(plane.shape != (height, width) for plane in planes):
        raise SourceError(f"{p}: channel sizes differ from the {width} x {height} data window")
    rgb = np.empty((height, width, 3), np.float32)
    for c in range(3):
        rgb[..., c] = planes[c if len(planes) == 3 else 0]
    return rgb
