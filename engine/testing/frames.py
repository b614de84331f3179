"""Frames for rendering tests: `converge` draws until streaming has settled and returns that frame;
`all_resident` draws the reference with every tile loaded."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..runtime.streamer import Streamer, VirtualTexture

__all__ = ["ConvergenceError", "Draw", "all_resident", "converge", "read_framebuffer"]

Draw = Callable[[], "np.ndarray | None"]  # draws one frame; returns it (or None: read the bound framebuffer)
HISTORY = 8  # frames of telemetry a ConvergenceError shows
FIRST_FEEDBACK_FRAMES = 3  # feedback of a draw reaches update() a few frames later: never done before


class ConvergenceError(AssertionError):
    """The view did not settle within `max_frames`; the message holds the last frames' telemetry."""


@dataclass(frozen=True)
class _Row:
    frame: int
    wanted: int
    missing: int
    in_flight: int
    queued: int
    uploads: int
    failed: int
    resident: int


def read_framebuffer(streamer: Streamer) -> np.ndarray:
    """The context's bound framebuffer as an H x W x 4 uint8 array, top row first."""
    fbo = streamer.ctx.fbo
    w, h = fbo.viewport[2], fbo.viewport[3]
    data = fbo.read(viewport=(0, 0, w, h), components=4, alignment=1)
    return np.frombuffer(data, np.uint8).reshape(h, w, 4)[::-1].copy()


def _frame(streamer: Streamer, draw: Draw) -> np.ndarray:
    image = draw()
    return read_framebuffer(streamer) if image is None else np.asarray(image)


def converge(streamer: Streamer, draw: Draw, *, max_frames: int = 600, settle_frames: int = 2) -> np.ndarray:
    """Run ``streamer.update()`` + `draw` until nothing the feedback wants is missing and no load is
    queued or in flight, for `settle_frames` frames in a row; return the last frame.

    A frame taken before that (the classic flaky rendering test) shows coarser levels still
    streaming in. GPU work is throttled to two frames in flight, as a window's swap chain would.

    Parameters
    ----------
    streamer : Streamer
        The streamer whose textures `draw` samples.
    draw : callable
        Draws one frame and returns it as an H x W x 3 or x 4 uint8 array, or None to have the bound
        framebuffer read (top row first).
    max_frames : int
        Give up after this many frames.
    settle_frames : int
        Consecutive settled frames required.

    Returns
    -------
    numpy.ndarray
        The converged frame.

    Raises
    ------
    ConvergenceError
        Not settled after `max_frames`; the message lists the last frames' wanted, missing, in-flight,
        queued, uploaded and failed counts and which textures had failed tiles.
    """
    if max_frames < 1 or settle_frames < 1:
        raise ValueError(f"max_frames and settle_frames must be >= 1, got {max_frames}, {settle_frames}")
    throttle = streamer.throttle(2)
    rows: list[_Row] = []
    settled = 0
    try:
        for i in range(max_frames):
            st = streamer.update()
            image = _frame(streamer, draw)
            throttle.frame_done()
            stats = streamer.stats()
            rows.append(
                _Row(
                    stats.frame,
                    st.wanted_pages,
                    st.missing_pages,
                    stats.in_flight,
                    stats.queued,
                    st.uploads,
                    st.failed,
                    stats.resident_tiles,
                )
            )
            # settled: feedback of the draws has arrived (it lags a few frames), wants pages, and every
            # wanted page is resident at its wanted level (the streamer's completeness view) with
            # nothing left to load
            fed = st.feedback_age >= 0 and st.wanted_pages > 0
            complete = streamer.completeness().complete
            done = i + 1 >= FIRST_FEEDBACK_FRAMES and fed and complete and not streamer.busy
            settled = settled + 1 if done else 0
            if settled >= settle_frames:
                return image
    finally:
        throttle.release()
    raise ConvergenceError(_report(streamer, rows[-HISTORY:], max_frames))


def _report(streamer: Streamer, rows: list[_Row], max_frames: int) -> str:
    lines = [
        f"the view did not converge in {max_frames} frames; the last {len(rows)}:",
        "  frame  wanted  missing  in-flight  queued  uploads  failed  resident",
    ]
    lines += [
        f"  {r.frame:5d}  {r.wanted:6d}  {r.missing:7d}  {r.in_flight:9d}  {r.queued:6d}  {r.uploads:7d}  "
        f"{r.failed:6d}  {r.resident:8d}"
        for r in rows
    ]
    if rows and all(r.wanted == 0 for r in rows):
        lines.append("  no feedback wanted any page: does the draw bind the texture and sample it (vt_sample)?")
    bad = [f"{vt.path} ({vt.corrupt_tiles} tiles failed)" for vt in streamer.textures if vt.corrupt_tiles]
    if bad:
        lines.append("  failed tiles keep their coarser fallback: " + ", ".join(bad))
    return "\n".join(lines)


def all_resident(streamer: Streamer, draw: Draw, textures: Sequence[VirtualTexture] | None = None) -> np.ndarray:
    """The reference frame: every tile of `textures` (default: every open texture) loaded and pinned,
    then one update and one draw.

    Parameters
    ----------
    streamer : Streamer
        The streamer to load into (use a separate streamer from the one under test: pinned tiles stay).
    draw : callable
        As for `converge`.
    textures : sequence of VirtualTexture, optional
        The textures to load whole.

    Raises
    ------
    BudgetError
        The textures do not fit the streamer's budget whole.
    """
    for vt in textures if textures is not None else list(streamer.textures):
        streamer.make_all_resident(vt)
    streamer.update()
    image = _frame(streamer, draw)
    streamer.ctx.finish()
    return image
