"""`Origin`: which row of the image texture coordinate v = 0 names, per virtual texture.

Packs store their rows top first (the image as it reads). What ``v`` means is a property of the
texture, chosen when it is opened (``streamer.open(path, origin=ts.Origin.TOP_LEFT)``) or set later
(``texture.origin = ...``):

- `Origin.BOTTOM_LEFT` (the default): v = 0 is the image's bottom row, v grows upwards. The OpenGL
  and moderngl convention, and what moderngl-window's image loaders give (``flip_y=True``): a quad
  whose v = 0 lies at the bottom of the screen shows the image right side up.
- `Origin.TOP_LEFT`: v = 0 is the image's top row, v grows downwards. The glTF, DirectX and image-file
  convention.

The choice travels to the shader as one bit of ``VTInfo.meta.z`` (next to the wrap bit), applied
where ``vt.glsl`` turns uv into texel coordinates, so sampling and feedback name the same pages.
"""

from __future__ import annotations

import enum

from ..pack.format import AddressMode

__all__ = ["META_NO_FEEDBACK", "META_TOP_LEFT", "META_WRAP", "Origin", "meta_flags"]

META_WRAP = 1  # VTInfo.meta.z bit: wrap (else clamp); shaders/vt.glsl VT_META_WRAP
META_TOP_LEFT = 2  # VTInfo.meta.z bit: v = 0 is the image's top row; shaders/vt.glsl VT_META_TOP_LEFT
META_NO_FEEDBACK = 4  # VTInfo.meta.z bit: a texture set's member that is not its lead writes no feedback


class Origin(enum.Enum):
    """Where texture coordinates (0, 0) lie on the image: its bottom-left corner (GL) or top-left."""

    BOTTOM_LEFT = "bottom-left"
    TOP_LEFT = "top-left"

    @classmethod
    def parse(cls, value: Origin | str) -> Origin:
        """An `Origin` from itself or its value (``"top-left"``); ValueError naming the choices."""
        if isinstance(value, Origin):
            return value
        try:
            return cls(str(value).lower().replace("_", "-"))
        except ValueError:
            choices = ", ".join(repr(o.value) for o in cls)
            raise ValueError(f"origin must be an Origin or one of {choices}, got {value!r}") from None


def meta_flags(address_mode: AddressMode, origin: Origin, *, feedback: bool = True) -> int:
    """``VTInfo.meta.z`` for a texture: its wrap bit, its origin bit and (for a texture set's member
    whose lead writes the set's feedback) the no-feedback bit."""
    wrap = META_WRAP if address_mode == AddressMode.WRAP else 0
    return wrap | (META_TOP_LEFT if origin is Origin.TOP_LEFT else 0) | (0 if feedback else META_NO_FEEDBACK)
