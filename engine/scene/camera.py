"""Cameras looking at a textured plane, as 4x4 matrices (numpy, float32, column-major for GL).

The plane spans world x in [0, W], y in [0, H] (level-0 texel units) at z = 0, y growing down the
image as its rows do: (x/W, y/H) is the point's place on the image from its top-left corner, and its
texture coordinates (GL origin, v = 0 at the bottom row) are (x/W, 1 - y/H), which the scenes'
vertex shaders hand on. A `View` names what the camera sees: the image point at the screen centre
(cx, cy as fractions of the width and height from the top-left corner), the zoom there (screen
pixels per level-0 texel: 1 is 1:1, below 1 minified, above magnified), the tilt away from looking
straight down (0: orthographic top view, exact texel-to-pixel mapping) and the yaw (rotation about
the plane's normal), both in degrees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["View", "look_at", "orthographic", "perspective", "plane_mvp"]


@dataclass(frozen=True)
class View:
    cx: float = 0.5
    cy: float = 0.5
    zoom: float = 1.0
    tilt: float = 0.0
    yaw: float = 0.0

    def __post_init__(self) -> None:
        if not self.zoom > 0:
            raise ValueError(f"zoom must be positive, got {self.zoom!r}")
        if not 0 <= self.tilt < 89:
            raise ValueError(f"tilt must be in [0, 89) degrees, got {self.tilt!r}")

    @classmethod
    def parse(cls, text: str) -> View:
        """'cx,cy,zoom[,tilt,yaw]' -> View; ValueError naming the text when malformed."""
        try:
            parts = [float(v) for v in text.split(",")]
        except ValueError:
            raise ValueError(f"view must be cx,cy,zoom[,tilt[,yaw]] numbers, got {text!r}") from None
        if not 3 <= len(parts) <= 5:
            raise ValueError(f"view must be cx,cy,zoom[,tilt[,yaw]], got {text!r}")
        return cls(*parts)


def orthographic(left: float, right: float, bottom: float, top: float, near: float, far: float) -> np.ndarray:
    m = np.identity(4)
    m[0, 0] = 2 / (right - left)
    m[1, 1] = 2 / (top - bottom)
    m[2, 2] = -2 / (far - near)
    m[0, 3] = -(right + left) / (right - left)
    m[1, 3] = -(top + bottom) / (top - bottom)
    m[2, 3] = -(far + near) / (far - near)
    return m


def perspective(fovy_deg: float, aspect: float, near: float, far: float) -> np.ndarray:
    f = 1 / math.tan(math.radians(fovy_deg) / 2)
    m = np.zeros((4, 4))
    m[0, 0] = f / aspect
    m[1, 1] = f
    m[2, 2] = (far + near) / (near - far)
    m[2, 3] = 2 * far * near / (near - far)
    m[3, 2] = -1
    return m


def look_at(eye: np.ndarray, target: np.ndarray, up: np.ndarray) -> np.ndarray:
    f = target - eye
    f = f / np.linalg.norm(f)
    s = np.cross(f, up)
    s = s / np.linalg.norm(s)
    u = np.cross(s, f)
    m = np.identity(4)
    m[0, :3], m[1, :3], m[2, :3] = s, u, -f
    m[:3, 3] = -m[:3, :3] @ eye
    return m


FOV_Y = 60.0
# The camera side of the plane. With image rows growing downwards (v = 0 at the top of the screen)
# and x growing to the right, the viewer looks at the plane from -z.
NORMAL = np.array([0.0, 0.0, -1.0])


def plane_mvp(view: View, tex_w: int, tex_h: int, fb_w: int, fb_h: int) -> np.ndarray:
    """Model-view-projection (row-major float64; transpose for GL) for `view` of a W x H plane."""
    centre = np.array([view.cx * tex_w, view.cy * tex_h, 0.0])
    yaw = math.radians(view.yaw)
    # Screen "up" on the plane: +y rotated by yaw (image rows grow downwards: v = 0 at the top).
    up = np.array([-math.sin(yaw), -math.cos(yaw), 0.0])
    if view.tilt == 0:
        half_w, half_h = fb_w / (2 * view.zoom), fb_h / (2 * view.zoom)
        eye = centre + NORMAL
        return orthographic(-half_w, half_w, -half_h, half_h, 0.5, 2.0) @ look_at(eye, centre, up)
    dist = fb_h / (2 * view.zoom * math.tan(math.radians(FOV_Y) / 2))
    tilt = math.radians(view.tilt)
    back = -up  # the camera stands back along the screen-down direction, raised by cos(tilt)
    eye = centre + dist * (math.sin(tilt) * back + math.cos(tilt) * NORMAL)
    far = dist * 1000.0
    return perspective(FOV_Y, fb_w / fb_h, dist * 0.01, far) @ look_at(eye, centre, up)
