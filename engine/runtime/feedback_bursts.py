"""Denser feedback for a few frames after the wanted pages jump (a camera cut). No GL, no threads.

The draws record one fragment in every stride x stride cell a frame, the fragment rotating, so a page
covering a few pixels (a fine level near the horizon, an edge) is first seen several frames after a
cut, and every late page costs the view one more round trip (feedback, read, upload). After a jump,
`FeedbackBursts` asks for `frames` frames at half the stride (four times the fragments) so those
pages are found in the first frames; then as many frames at the normal stride before another burst
may start, which bounds the feedback's extra cost under back-to-back cuts to half the frames.

A jump: more than `JUMP_SHARE` of the pages in the newest feedback were not in the feedback read
before it (and at least `JUMP_MIN_PAGES` of them). A pan or a dolly changes a small share of the
pages a frame; a cut changes most of them. Comparing the pages before the mip bias (what the draws
sample) keeps a bias step, which coarsens every page, from reading as a jump.
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = ["JUMP_MIN_PAGES", "JUMP_SHARE", "BurstState", "FeedbackBursts", "new_share"]

JUMP_SHARE = 0.5  # share of the newest feedback's pages that were not wanted before: a cut
JUMP_MIN_PAGES = 8  # fewer new pages than this is never a jump (a tiny view's noise)


class BurstState(enum.IntEnum):
    """Where `FeedbackBursts` stands."""

    SPARSE = 0  # the normal stride; a jump starts a burst
    BURST = 1  # the dense stride, for `frames` frames from the jump
    SETTLING = 2  # the normal stride for `frames` frames after a burst; jumps start nothing


def new_share(ids: np.ndarray, before: np.ndarray) -> tuple[int, float]:
    """How many of the sorted unique `ids` are not in the sorted unique `before`, and their share."""
    if ids.size == 0:
        return 0, 0.0
    if before.size == 0:
        return int(ids.size), 1.0
    at = np.minimum(np.searchsorted(before, ids), before.size - 1)
    n = int(np.count_nonzero(before[at] != ids))
    return n, n / ids.size


class FeedbackBursts:
    """Decides, once a frame, whether the coming frame's draws record dense feedback.

    Parameters
    ----------
    frames : int
        Dense frames a jump starts (and normal frames after them before the next burst); 0: never.
    """

    def __init__(self, frames: int) -> None:
        if frames < 0:
            raise ValueError(f"burst frames must be >= 0, got {frames!r}")
        self.frames = frames
        self.state = BurstState.SPARSE
        self.bursts = 0  # bursts started so far
        self._left = 0  # frames left in the current BURST or SETTLING state
        self._before = np.zeros(0, np.int64)  # the pages of the feedback read before the newest
        self.jumped = False  # the latest step's feedback showed a jump (whatever the state)

    def cut(self) -> None:
        """The program says the next frame shows a new view: the next `frames` frames are dense,
        whatever the state (a new burst, or the current one restarted). The jump its feedback shows
        later falls in the burst or the settling after it, and starts nothing more."""
        if self.frames:
            self.state, self._left = BurstState.BURST, self.frames + 1  # the next step() counts one
            self.bursts += 1

    def step(self, pages: np.ndarray | None) -> bool:
        """One frame: `pages`, the sorted unique page ids of the feedback read this frame (before the
        mip bias; None when none was read). Returns whether the coming frame records dense feedback."""
        if self._left:
            self._left -= 1
            if self._left == 0:
                self.state, self._left = (
                    (BurstState.SETTLING, self.frames) if self.state is BurstState.BURST else (BurstState.SPARSE, 0)
                )
        self.jumped = False
        if pages is not None:
            new, share = new_share(pages, self._before)
            self._before = pages
            self.jumped = new >= JUMP_MIN_PAGES and share > JUMP_SHARE
            if self.frames and self.state is BurstState.SPARSE and self.jumped:
                self.state, self._left = BurstState.BURST, self.frames
                self.bursts += 1
        return self.state is BurstState.BURST
