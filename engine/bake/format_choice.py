"""Which texel format a bake uses, and the creation metadata every pack records.

`choose_format` picks BC1 for opaque colour, BC7 for real alpha and BC6H for float (HDR) sources
when no format was given;
`creation_metadata` records the tool, the source and each creation parameter in the pack.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..config import BakeConfig
from ..pack.format import Supercompression, TexelFormat
from .source import Source, describe, has_alpha, texel_dtype

__all__ = [
    "ALPHA_FORMATS",
    "MIP_FILTER",
    "FormatChoice",
    "choose_format",
    "creation_metadata",
    "warn_dropped_alpha",
]

log = logging.getLogger(__name__)

MIP_FILTER = "box2x2-linear"  # recorded in the metadata
ALPHA_FORMATS = (TexelFormat.BC3, TexelFormat.BC7, TexelFormat.RGBA8)  # formats that keep alpha


@dataclass(frozen=True)
class FormatChoice:
    """The texel format a bake uses, and why.

    alpha: the source has real alpha (some alpha below 255); None when not looked for before the
    bake (a format that keeps alpha was given: the bands report it as they are made) or when the
    source cannot be scanned ahead (then its channel count decides an automatic choice).
    """

    texel_format: TexelFormat
    auto: bool  # chosen by the baker (BakeConfig.texel_format was None)
    alpha: bool | None

    @property
    def drops_alpha(self) -> bool:
        return bool(self.alpha) and self.texel_format not in ALPHA_FORMATS

    def premultiplied(self, srgb: bool) -> bool:
        """Whether mips are filtered premultiplied and transparent texels bled: colour (sRGB) that
        may have real alpha, in a format that keeps it. Linear data (masks, packed channels) is not
        colour weighted by coverage, and is filtered channel by channel."""
        return self.alpha is not False and srgb and self.texel_format in ALPHA_FORMATS


def choose_format(source: Source, config: BakeConfig) -> FormatChoice:
    """bc1 for opaque colour and bc7 for real alpha when no format was given (`BakeConfig.format_for`).
    The source is scanned for alpha ahead only for that choice: with a given format the bands report
    the alpha they see (a scan ahead decodes the whole image once more: 3 CPU-seconds of a 16384²
    file), and a format that drops it is warned about when the bake ends."""
    given = config.texel_format
    if given is None and texel_dtype(source) != np.uint8:  # float texels: HDR, kept so
        return FormatChoice(TexelFormat.BC6H, True, False)
    if source.channels not in (2, 4):
        return FormatChoice(config.format_for(False), given is None, False)
    if given is not None:
        return FormatChoice(given, False, None)
    alpha = has_alpha(source)
    return FormatChoice(config.format_for(alpha is not False), given is None, alpha)


def warn_dropped_alpha(name: str, fmt: TexelFormat) -> None:
    log.warning("%s has alpha; %s drops it (use --format bc3 or bc7)", name, fmt.name.lower())


def creation_metadata(source: Source, config: BakeConfig, choice: FormatChoice | None = None) -> dict:
    """The metadata every pack records: tool, source, and each creation parameter.

    ``format_auto``: the baker chose the format; ``alpha``: the source has real alpha (null when it
    could not be told); ``mip_filter`` ends in ``-premultiplied`` when colour was filtered weighted
    by alpha and transparent texels were bled.
    """
    from ..version import __version__

    choice = choice or choose_format(source, config)
    fmt = choice.texel_format
    srgb = config.srgb if config.srgb is not None else fmt.colour
    premultiplied = choice.premultiplied(srgb)
    meta = {"tool": f"texstream {__version__}", "mip_filter": MIP_FILTER + ("-premultiplied" if premultiplied else "")}
    meta.update(describe(source))
    meta.update(
        {
            "format": fmt.name.lower(),
            "format_auto": choice.auto,
            "alpha": choice.alpha,
            "srgb": srgb,
            "tile_size": config.tile_size,
            "border": config.border,
            "address_mode": config.address_mode.name.lower(),
            "supercompression": config.supercompression.name.lower(),
        }
    )
    if config.supercompression is Supercompression.ZSTD:
        meta["zstd_level"] = config.zstd_level
    if fmt is TexelFormat.BC7:
        meta["bc7_quality"] = config.bc7_quality
    return meta
