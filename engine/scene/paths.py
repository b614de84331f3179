"""Scripted camera paths over a W x H ground plane, sampled by a deterministic frame clock.

A `CameraPath` is a list of keyframes (time in seconds, eye position, look-at target) played with
Catmull-Rom interpolation; a `cut` keyframe jumps instead of blending (the camera teleports). The
same path and frame rate always give the same poses, so benchmark runs repeat exactly.

Coordinates: world units are level-0 texels of the ground texture; the ground is z = 0 and the
camera flies at z < 0 (the viewer's side of the plane, see camera.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .camera import look_at, perspective

__all__ = ["CameraPath", "Keyframe", "Pose", "flythrough", "named_path", "oversubscribed", "region_cuts", "whip_pans"]

UP = np.array([0.0, 0.0, -1.0])  # away from the ground, on the viewer's side


@dataclass(frozen=True)
class Pose:
    eye: np.ndarray
    target: np.ndarray

    def view_projection(self, aspect: float, fovy: float = 60.0, far: float = 1e5) -> np.ndarray:
        near = max(0.05, abs(float(self.eye[2])) * 0.02)
        return perspective(fovy, aspect, near, far) @ look_at(self.eye, self.target, UP)


@dataclass(frozen=True)
class Keyframe:
    t: float
    eye: tuple[float, float, float]
    target: tuple[float, float, float]
    cut: bool = False  # arrive here instantly (no interpolation from the previous key)


@dataclass
class CameraPath:
    name: str
    keys: list[Keyframe] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.keys) < 1:
            raise ValueError(f"path {self.name!r} needs at least one keyframe")
        times = [k.t for k in self.keys]
        if times != sorted(times):
            raise ValueError(f"path {self.name!r}: keyframe times must increase, got {times}")

    @property
    def duration(self) -> float:
        return self.keys[-1].t

    def cut_times(self) -> list[float]:
        return [k.t for k in self.keys if k.cut]

    def pose(self, t: float) -> Pose:
        keys = self.keys
        t = min(max(t, keys[0].t), keys[-1].t)
        i = max(0, np.searchsorted([k.t for k in keys], t, side="right") - 1)
        if i >= len(keys) - 1:
            k = keys[-1]
            return Pose(np.array(k.eye, float), np.array(k.target, float))
        a, b = keys[i], keys[i + 1]
        if b.cut:  # hold a until the cut
            return Pose(np.array(a.eye, float), np.array(a.target, float))
        u = (t - a.t) / max(b.t - a.t, 1e-9)
        p0 = keys[i - 1] if i > 0 and not a.cut else a
        p3 = keys[i + 2] if i + 2 < len(keys) and not keys[i + 2].cut else b

        def spline(f: str) -> np.ndarray:
            v0, v1, v2, v3 = (np.array(getattr(k, f), float) for k in (p0, a, b, p3))
            return 0.5 * (
                (2 * v1)
                + (-v0 + v2) * u
                + (2 * v0 - 5 * v1 + 4 * v2 - v3) * u * u
                + (-v0 + 3 * v1 - 3 * v2 + v3) * u**3
            )

        return Pose(spline("eye"), spline("target"))

    def frames(self, fps: float) -> int:
        return int(math.floor(self.duration * fps)) + 1


def _ground(w: float, h: float, u: float, v: float) -> tuple[float, float]:
    return u * w, v * h


FLYTHROUGH_WAYPOINTS = ((0.15, 0.2), (0.3, 0.35), (0.45, 0.3), (0.6, 0.5), (0.7, 0.7), (0.85, 0.8))
# Over the land of the default terrain (seed 1): the west coast, the snowy massif, the eastern islands.
DEMO_WAYPOINTS = ((0.06, 0.52), (0.2, 0.6), (0.36, 0.64), (0.5, 0.63), (0.64, 0.55), (0.78, 0.4), (0.82, 0.3))


def flythrough(
    w: int,
    h: int,
    altitude: float = 60.0,
    seconds: float = 20.0,
    waypoints: tuple[tuple[float, float], ...] = FLYTHROUGH_WAYPOINTS,
) -> CameraPath:
    """Low over the ground along a curving line through `waypoints` (image fractions from the
    top-left corner), each key looking at the next: level 0 at the feet, coarse levels at the horizon."""
    pts = list(waypoints)
    if len(pts) < 2:
        raise ValueError(f"a flythrough needs at least 2 waypoints, got {len(pts)}")
    keys = []
    for i, (u, v) in enumerate(pts):
        x, y = _ground(w, h, u, v)
        nu, nv = pts[min(i + 1, len(pts) - 1)] if i + 1 < len(pts) else (u + 0.05, v + 0.05)
        tx, ty = _ground(w, h, nu, nv)
        keys.append(Keyframe(seconds * i / (len(pts) - 1), (x, y, -altitude), (tx, ty, 0.0)))
    return CameraPath("flythrough", keys)


def whip_pans(w: int, h: int, altitude: float = 80.0, seconds: float = 8.0) -> CameraPath:
    """Stand still and turn fast: the visible set changes every frame without moving."""
    cx, cy = _ground(w, h, 0.5, 0.5)
    keys = []
    n = 9
    for i in range(n):
        ang = i * 2.2  # ~126 degrees per key
        keys.append(
            Keyframe(
                seconds * i / (n - 1), (cx, cy, -altitude), (cx + 2000 * math.cos(ang), cy + 2000 * math.sin(ang), 0.0)
            )
        )
    return CameraPath("whip_pans", keys)


def region_cuts(w: int, h: int, altitude: float = 50.0, hold: float = 3.0) -> CameraPath:
    """Cut between far-apart regions, holding each: forces eviction; measures convergence."""
    spots = [(0.1, 0.1), (0.9, 0.85), (0.2, 0.9), (0.85, 0.15), (0.5, 0.5)]
    keys = []
    for i, (u, v) in enumerate(spots):
        x, y = _ground(w, h, u, v)
        eye, tgt = (x, y, -altitude), (x + 300.0, y + 300.0, 0.0)
        keys.append(Keyframe(i * hold, eye, tgt, cut=i > 0))
        keys.append(Keyframe(i * hold + hold * 0.999, eye, tgt))
    return CameraPath("region_cuts", keys)


def oversubscribed(w: int, h: int) -> CameraPath:
    """A high, wide, slowly moving view whose working set is larger than a tight budget."""
    keys = [
        Keyframe(0.0, (*_ground(w, h, 0.3, 0.3), -1500.0), (*_ground(w, h, 0.5, 0.5), 0.0)),
        Keyframe(10.0, (*_ground(w, h, 0.7, 0.3), -1500.0), (*_ground(w, h, 0.5, 0.6), 0.0)),
    ]
    return CameraPath("oversubscribed", keys)


def named_path(name: str, w: int, h: int) -> CameraPath:
    table = {
        "flythrough": flythrough,
        "whip_pans": whip_pans,
        "region_cuts": region_cuts,
        "oversubscribed": oversubscribed,
    }
    if name not in table:
        raise ValueError(f"unknown camera path {name!r} (choose from {', '.join(table)})")
    return table[name](w, h)
