"""A time budget for one frame's uploads: what an upload call costs on this driver, measured.

An upload's cost on the render thread is mostly the driver's fixed cost per sub-image call (about
8 us on NVIDIA whatever the size) plus a cost per byte (the driver's copy out of the staging ring).
`UploadCost` keeps moving estimates of both from what each frame's uploads took (calls, bytes,
seconds), as a least-squares fit over exponentially weighted frames held near a prior, so it adapts
to the driver within a few frames and never swings on one slow frame. `within_budget` picks which
upload calls of a frame fit a time budget: in priority order, at least one (so a small budget still
converges, one call per frame at worst).

Plain numpy; no GL, no thread (`uploader.Uploader` measures and calls this).
"""

from __future__ import annotations

import numpy as np

__all__ = ["UploadCost", "within_budget"]

PRIOR_CALL_S = 8e-6  # seconds per upload call (NVIDIA's driver, measured)
PRIOR_BYTE_S = 0.4e-9  # seconds per byte (about 2.4 GB/s from a host staging buffer)


class UploadCost:
    """Moving estimates of seconds per upload call and per byte, from measured frames.

    Parameters
    ----------
    decay
        Weight a frame's observation keeps per later frame (0 < decay < 1): 0.9 forgets a frame's
        measurement in a few tens of frames.
    prior_weight
        How many typical frames (16 calls, 16 tiles of 9 KiB) the prior counts for: it holds the
        fit when every frame has the same bytes per call (one unknown then), and is what `predict`
        answers before the first measurement.
    """

    def __init__(self, decay: float = 0.9, prior_weight: float = 1.0) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay!r}")
        if prior_weight <= 0:
            raise ValueError(f"prior_weight must be positive, got {prior_weight!r}")
        self.decay = decay
        self.per_call = PRIOR_CALL_S
        self.per_byte = PRIOR_BYTE_S
        # ridge towards the prior, scaled like a typical frame's moments (keeps the system well posed)
        self._ridge = np.array([prior_weight * 16.0**2, prior_weight * (16.0 * 9248) ** 2])
        self._moments = np.zeros(5)  # sum of w * (c*c, c*b, b*b, c*t, b*t)
        self.frames = 0

    def observe(self, calls: int, nbytes: int, seconds: float) -> None:
        """One frame's uploads: `calls` sub-image calls of `nbytes` bytes in all took `seconds`."""
        if calls <= 0 or not np.isfinite(seconds) or seconds < 0:
            return
        c, b, t = float(calls), float(nbytes), float(seconds)
        self._moments = self._moments * self.decay + np.array([c * c, c * b, b * b, c * t, b * t])
        self.frames += 1
        scc, scb, sbb, sct, sbt = self._moments
        rc, rb = self._ridge
        a = np.array([[scc + rc, scb], [scb, sbb + rb]])
        rhs = np.array([sct + rc * PRIOR_CALL_S, sbt + rb * PRIOR_BYTE_S])
        per_call, per_byte = np.linalg.solve(a, rhs)
        self.per_call, self.per_byte = max(float(per_call), 0.0), max(float(per_byte), 0.0)
        if self.per_call == 0.0 and self.per_byte == 0.0:  # nothing measurable: keep the prior's shape
            self.per_call, self.per_byte = PRIOR_CALL_S * 1e-3, PRIOR_BYTE_S * 1e-3

    def predict(self, calls: np.ndarray | int, nbytes: np.ndarray | int) -> np.ndarray:
        """Seconds the given calls and bytes are expected to take (vectorized)."""
        return np.asarray(calls, np.float64) * self.per_call + np.asarray(nbytes, np.float64) * self.per_byte


def within_budget(priority: np.ndarray, nbytes: np.ndarray, cost: UploadCost, budget_s: float) -> np.ndarray:
    """Which upload calls to issue: most urgent first (lowest `priority`, e.g. the submission order
    of the call's first load) while the predicted time of those taken stays within `budget_s`;
    always the most urgent one. Returns a bool mask over the calls."""
    n = int(np.asarray(priority).size)
    take = np.zeros(n, bool)
    if n == 0:
        return take
    order = np.argsort(np.asarray(priority), kind="stable")
    spent = np.cumsum(cost.predict(np.ones(n), np.asarray(nbytes)[order]))
    keep = spent <= budget_s
    keep[0] = True
    take[order[keep]] = True
    return take
