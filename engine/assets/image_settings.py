"""Bake settings for an image file, chosen by its name and content unless given.

The rules, first match wins (every field given in `ImageBakeSettings` overrides its rule):

=====================  =========================================================================
high dynamic range     BC6H, linear: an OpenEXR or Radiance HDR file (float texels), whatever its
                       name; its values are kept as half floats, never clipped to [0, 1].
normal map             BC5, linear. Named so (``*_normal*``, ``*_nrm*``, ``*_n.<ext>``,
                       ``normal*``; any case, ``-`` for ``_`` too) or detected: on a copy of at most 256² texels, the
                       vectors ``2 * rgb - 1`` average near (0, 0) in x and y, point out of the
                       surface (z > 0 for 95 % of texels, mean z above 0.5) and are unit length
                       (within 0.15 for 90 % of texels). A file with real alpha is never detected
                       as one (BC5 would drop the alpha), only named.
alpha                  BC7, sRGB: the file has real alpha (some alpha below 255).
grey data              BC4, linear: a grey file (one channel, or R = G = B on the sampled copy)
                       named as data (``*_rough*``, ``*_metal*``, ``*_ao*``, ``*_occlusion*``,
                       ``*_height*``, ``*_disp*``, ``*_bump*``, ``*_gloss*``, ``*_specular*``,
                       ``*_mask*``, ``*_opacity*``), or a 16-bit / float grey file (a height field).
other data             BC1, linear: a colour file named as data (a packed occlusion-roughness-metal map).
colour                 BC1, sRGB: everything else (a grey photo included).
=====================  =========================================================================

The content facts (`ImageContent`) depend on the file's bytes only and are cached with its digest;
the name rules are applied on every call, so one file's bytes under two names may bake twice.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import BakeConfig
from ..errors import SourceError
from ..pack.format import AddressMode, Supercompression, TexelFormat

log = logging.getLogger(__name__)

__all__ = ["ContentKind", "ImageBakeSettings", "ImageContent", "analyse_source", "classify", "settings_for"]

SAMPLE_SIDE = 256  # the content checks look at a copy of at most this many texels a side

_NORMAL_NAME = re.compile(r"^normal|[_-]normal|[_-]nrm|[_-]n$", re.IGNORECASE)  # matched on the stem
_DATA_NAME = re.compile(r"[_-](rough|metal|ao|occlusion|height|disp|bump|gloss|specular|mask|opacity)", re.IGNORECASE)


class ContentKind(enum.Enum):
    """What an image holds, as far as the bake is concerned."""

    HDR = "hdr"
    COLOUR = "colour"
    COLOUR_ALPHA = "colour-alpha"
    NORMAL_MAP = "normal-map"
    GREY_DATA = "grey-data"
    DATA = "data"


@dataclass(frozen=True, kw_only=True)
class ImageContent:
    """Facts about an image's pixels (not its name), from one look at a downsampled copy.

    Attributes
    ----------
    width, height : int
    channels : int
        what the file stores: 1 grey, 2 grey + alpha, 3 RGB, 4 RGBA
    alpha : bool
        some alpha below 255
    grey : bool
        one channel, or R = G = B on the sampled copy
    deep : bool
        a grey file of more than 8 bits a channel (16-bit integer or float): a height field
    normal_like : bool
        the sampled RGB reads as unit tangent-space normals (see the module's rules)
    hdr : bool
        float texels (OpenEXR, Radiance HDR): linear values that may exceed 1
    """

    width: int
    height: int
    channels: int
    alpha: bool
    grey: bool
    deep: bool
    normal_like: bool
    hdr: bool = False

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ImageContent:
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        if set(data) != set(fields):
            raise ValueError(f"content record fields {sorted(data)} are not {sorted(fields)}")
        ints = ("width", "height", "channels")
        for name, value in data.items():
            if not isinstance(value, int if name in ints else bool):
                raise ValueError(f"content record field {name} is {value!r}")
        return cls(**data)


@dataclass(frozen=True, kw_only=True)
class ImageBakeSettings:
    """How an image is baked. None fields are chosen by the image's name and content (module rules).

    Attributes
    ----------
    texel_format : TexelFormat | None
        None: by content (bc1, bc7 for alpha, bc5 for normal maps, bc4 for grey data, bc6h for HDR)
    srgb : bool | None
        None: sRGB for colour, linear for data and normal maps
    tile_size, border, address_mode, supercompression, zstd_level, bc7_quality
        as in `texstream.BakeConfig`
    """

    texel_format: TexelFormat | None = None
    srgb: bool | None = None
    # the pack geometry and encoding default to the baker's own defaults (one place: BakeConfig)
    tile_size: int = BakeConfig.tile_size
    border: int = BakeConfig.border
    address_mode: AddressMode = BakeConfig.address_mode
    supercompression: Supercompression = BakeConfig.supercompression
    zstd_level: int = BakeConfig.zstd_level
    bc7_quality: str = BakeConfig.bc7_quality

    def __post_init__(self) -> None:
        if self.texel_format is not None:
            object.__setattr__(self, "texel_format", TexelFormat(self.texel_format))
        object.__setattr__(self, "address_mode", AddressMode(self.address_mode))
        object.__setattr__(self, "supercompression", Supercompression(self.supercompression))
        self.bake_config()  # the bake's own checks, now rather than at bake time

    @property
    def resolved(self) -> bool:
        """Whether nothing is left to choose."""
        return self.texel_format is not None and self.srgb is not None

    def bake_config(self, *, jobs: int = 0, progress: bool = False) -> BakeConfig:
        return BakeConfig(
            texel_format=self.texel_format,
            srgb=self.srgb,
            tile_size=self.tile_size,
            border=self.border,
            address_mode=self.address_mode,
            supercompression=self.supercompression,
            zstd_level=self.zstd_level,
            bc7_quality=self.bc7_quality,
            jobs=jobs,
            progress=progress,
        )

    def key_fields(self) -> dict:
        """What the pack's bytes depend on, as JSON values (a resolved settings' part of the cache key)."""
        fields = {
            "texel_format": None if self.texel_format is None else self.texel_format.name.lower(),
            "srgb": self.srgb,
            "tile_size": self.tile_size,
            "border": self.border,
            "address_mode": self.address_mode.name.lower(),
            "supercompression": self.supercompression.name.lower(),
        }
        if self.supercompression is Supercompression.ZSTD:
            fields["zstd_level"] = self.zstd_level
        if self.texel_format is TexelFormat.BC7:
            fields["bc7_quality"] = self.bc7_quality
        return fields


def classify(name: str, content: ImageContent) -> ContentKind:
    """The kind of an image from its file name and content facts (the module's rules, in order)."""
    stem = Path(name).stem
    if content.hdr:
        return ContentKind.HDR
    if _NORMAL_NAME.search(stem) and content.channels >= 3:
        return ContentKind.NORMAL_MAP
    if content.normal_like and not content.alpha:
        return ContentKind.NORMAL_MAP
    if content.alpha:
        return ContentKind.COLOUR_ALPHA
    data_named = bool(_DATA_NAME.search(stem))
    if content.grey and (data_named or content.deep):
        return ContentKind.GREY_DATA
    if data_named:
        return ContentKind.DATA
    return ContentKind.COLOUR


_KIND_FORMAT = {
    ContentKind.HDR: (TexelFormat.BC6H, False),
    ContentKind.COLOUR: (TexelFormat.BC1, True),
    ContentKind.COLOUR_ALPHA: (TexelFormat.BC7, True),
    ContentKind.NORMAL_MAP: (TexelFormat.BC5, False),
    ContentKind.GREY_DATA: (TexelFormat.BC4, False),
    ContentKind.DATA: (TexelFormat.BC1, False),
}


def settings_for(kind: ContentKind, given: ImageBakeSettings | None = None) -> ImageBakeSettings:
    """`given` with its None fields filled by the rule for `kind`: a given format keeps its own sRGB
    default (colour formats sRGB unless the kind is data), a given sRGB flag is kept as it is (and
    sRGB without a given format picks bc1, as bc4 and bc5 hold linear data only)."""
    given = given or ImageBakeSettings()
    fmt, srgb = _KIND_FORMAT[kind]
    if given.texel_format is not None:
        fmt = given.texel_format
        srgb = srgb and fmt.colour
    if given.srgb is not None:
        srgb = given.srgb
        if srgb and not fmt.colour and given.texel_format is None:  # sRGB asked for: a colour format
            fmt = TexelFormat.BC7 if kind is ContentKind.COLOUR_ALPHA else TexelFormat.BC1
    return dataclasses.replace(given, texel_format=fmt, srgb=srgb)


# ---- content checks -------------------------------------------------------------------------------
def analyse_source(source: object, path: Path) -> ImageContent:
    """The content facts of an opened `texstream.bake.source` Source of the file at `path`.

    In-memory sources are sampled by striding; streamed (libvips) ones through libvips' thumbnail,
    which reads big tiled or pyramidal files at a reduced size and streams the rest, and their
    alpha through the source's own exact `has_alpha` (a thumbnail averages small holes away).
    """
    width, height, channels = int(source.width), int(source.height), int(source.channels)  # type: ignore[attr-defined]
    if getattr(source, "texel_dtype", np.uint8) != np.uint8:  # float texels: HDR whatever they show
        return ImageContent(
            width=width,
            height=height,
            channels=channels,
            alpha=False,
            grey=False,
            deep=False,
            normal_like=False,
            hdr=True,
        )
    if getattr(source, "forkable", False):
        sample = _strided_sample(source, width, height)
    else:
        sample = _vips_sample(path, channels)
    own_alpha = getattr(source, "has_alpha", None)
    if channels not in (2, 4):
        alpha = False
    elif callable(own_alpha):
        alpha = bool(own_alpha())
    else:
        alpha = bool(int(sample[..., 3].min()) < 255)
    rgb = sample[..., :3]
    grey = channels <= 2 or bool(np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 1], rgb[..., 2]))
    mode = str(getattr(source, "mode", ""))
    deep = grey and channels <= 2 and _deep_mode(mode)
    normal_like = channels >= 3 and not grey and _normal_like(rgb)
    return ImageContent(
        width=width, height=height, channels=channels, alpha=alpha, grey=grey, deep=deep, normal_like=normal_like
    )


def _deep_mode(mode: str) -> bool:
    """Pillow's 16-bit / 32-bit / float grey modes, or libvips' non-uchar formats (``interp/format/bands``)."""
    if mode.startswith("I") or mode == "F":
        return True
    parts = mode.split("/")
    return len(parts) == 3 and parts[1] not in ("uchar", "char")


def _strided_sample(source: object, width: int, height: int) -> np.ndarray:
    step_y = max(1, -(-height // SAMPLE_SIDE))
    step_x = max(1, -(-width // SAMPLE_SIDE))
    rows = [source.read_rows(y, y + 1)[0, ::step_x] for y in range(0, height, step_y)]  # type: ignore[attr-defined]
    return np.ascontiguousarray(np.stack(rows))


def _vips_sample(path: Path, channels: int) -> np.ndarray:
    import pyvips

    from ..bake.source import to_rgba  # the same channel rules as the bake's strips

    try:
        img = pyvips.Image.thumbnail(str(path), SAMPLE_SIDE, height=SAMPLE_SIDE, size="down", fail_on="error")
        fmt = str(img.format)
        if fmt in ("float", "double"):
            img = (img.cast("double").clamp(min=0.0, max=1.0) * 255.0).rint()
        elif fmt != "uchar":
            img = (img.cast("double").clamp(min=0.0, max=65535.0) / 257.0).rint()
        img = img.cast("uchar")
        if img.bands > 4:
            img = img.extract_band(0, n=4)
        data = np.frombuffer(img.write_to_memory(), np.uint8).reshape(img.height, img.width, img.bands)
    except pyvips.Error as exc:
        reason = (str(getattr(exc, "detail", "") or exc).strip().splitlines() or ["unreadable"])[-1]
        raise SourceError(f"{path}: cannot read a downsampled copy: {reason}") from None
    if data.shape[2] != channels:
        log.debug("%s: the thumbnail has %d bands, the file %d", path, data.shape[2], channels)
    return to_rgba(data)[0]


def _normal_like(rgb: np.ndarray) -> bool:
    v = rgb.reshape(-1, 3).astype(np.float32) * (2.0 / 255.0) - 1.0
    if v.shape[0] < 16:
        return False
    mean = v.mean(axis=0)
    length = np.sqrt((v * v).sum(axis=1))
    return bool(
        abs(mean[0]) < 0.15
        and abs(mean[1]) < 0.15
        and mean[2] > 0.5
        and (v[:, 2] > 0.0).mean() >= 0.95
        and (np.abs(length - 1.0) < 0.15).mean() >= 0.90
    )
