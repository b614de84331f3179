"""A cache pool's least-recently-used victims (`VictimPicker`, owned by its `slots.SlotLedger`).

A victim is a RESIDENT, unpinned slot unused for ``frames_in_flight`` frames. The best come first:
longest idle (in 1/16 frames, divided by the slot's texture priority), then finer levels (coarser
ones back more pages), then the lowest slot, so the choice is deterministic. Finding them is a pass
over every slot of the pool (the compiled ``ts_victim_keys``, or numpy), tens of microseconds for a
pool of 20k slots on every frame that evicts.

With equal priorities the order of two slots nobody used since does not change as frames pass (both
idle one frame more each frame), so a pass keeps the next best candidates beyond those asked for
(the spares), and a later pick takes them while enough of them were not used, freed or pinned in
between: the same victims a new pass would find, without the pass. Used, freed and pinned spares
fail that check; a slot that came in since was used later than every spare; anything else that could
make a better victim (an unpin, a resize, new priorities) drops the spares (`forget`).
"""

from __future__ import annotations

import numpy as np

from .ledger_loops import LedgerLoops

__all__ = ["IDLE_CLIP", "SLOT_BITS", "VictimPicker"]

SLOT_BITS = 28  # slot numbers fit 28 bits (page-table entries address no more)
IDLE_CLIP = 1 << 28  # victims' idle time in 1/16 frames saturates here (3 days at 60 fps): keys fit 63 bits
SPARE_MIN = 64  # spares a pass keeps at least (three times the count asked for, if more)
_MAX_EVEN_PRIORITY = 16.0  # up to this shared priority, one more frame idle still changes every key


class VictimPicker:
    """Picks a ledger's victims from its arrays (which it only reads); keeps the spares of its last pass."""

    def __init__(self, frames_in_flight: int, resident: int) -> None:
        self.frames_in_flight = frames_in_flight
        self.resident = resident  # the ledger's RESIDENT state value
        self.priority: np.ndarray | None = None  # per texture id (read only; texture_sets.Priorities)
        self.loops: LedgerLoops | None = None  # the compiled pass
        self.passes = 0  # passes over the slots so far (a hook for tests and benchmarks)
        self._keys = np.zeros(0, np.int64)  # the compiled pass's output: the victims' keys
        self._spare = np.zeros(0, np.int64)  # the last pass's next best victims, best first
        self._spare_used = np.zeros(0, np.int64)  # their last use when it found them

    def weigh_by(self, priority: np.ndarray | None, loops: LedgerLoops | None) -> None:
        self.priority, self.loops = priority, loops
        self.forget()

    def forget(self) -> None:
        """Drop the spares: a slot may have become a better victim than they are."""
        self._spare = self._spare_used = np.zeros(0, np.int64)

    def _order_holds(self) -> bool:
        p = self.priority
        return p is None or bool(p[0] <= _MAX_EVEN_PRIORITY and (p == p[0]).all())

    def pick(self, frame: int, count: int, *slots: np.ndarray) -> np.ndarray:
        """The `count` best victims (fewer if there are not as many), best first; `slots`: the ledger's
        state, pinned, last_used, tex and level arrays."""
        state, pinned, last_used = slots[:3]
        if count <= 0:
            return np.zeros(0, np.int64)
        steady = self._order_holds()
        if steady and self._spare.size >= count:
            s = self._spare
            ok = (state[s] == self.resident) & ~pinned[s] & (last_used[s] == self._spare_used)
            good = s[ok]
            if good.size >= count:
                self._spare, self._spare_used = good[count:], self._spare_used[ok][count:]
                return good[:count]
        want = count + max(3 * count, SPARE_MIN) if steady else count
        best = self._pass(frame, want, *slots)
        self.passes += 1
        spare = best[count:] if steady else best[:0]
        self._spare, self._spare_used = spare, last_used[spare]
        return best[:count]

    def _pass(self, frame: int, count: int, *slots: np.ndarray) -> np.ndarray:
        """The `count` best victims by a pass over every slot. The slot in the low bits of the key makes
        every key distinct: numpy's partition runs an order of magnitude slower on the few distinct
        values the frames of an LRU give (3 ms for 256 victims among 20k slots touched in two frames)."""
        state, pinned, last_used, tex, level = slots
        if self.loops is not None:  # one pass over the slots keeping the best keys
            if self._keys.size < count:
                self._keys = np.empty(max(count, 1024), np.int64)
            args = (state, pinned, last_used, tex, level, self.priority, frame, self.frames_in_flight)
            n = self.loops.victim_keys(*args, IDLE_CLIP, SLOT_BITS, count, self._keys)
            if n < 0:
                raise ValueError("a resident slot names a texture outside the priority table")
            return self._keys[:n] & ((1 << SLOT_BITS) - 1)
        candidates = ((state == self.resident) & ~pinned & (last_used <= frame - self.frames_in_flight)).nonzero()[0]
        if candidates.size == 0:
            return candidates
        idle = (frame - last_used[candidates]).astype(np.float64)
        if self.priority is not None:
            idle /= self.priority[tex[candidates].astype(np.int64)]
        key = np.minimum(np.floor(idle * 16), IDLE_CLIP).astype(np.int64) * -64 + level[candidates]
        key = (key << SLOT_BITS) | candidates
        if candidates.size > count:
            pick = np.argpartition(key, count - 1)[:count]
            candidates, key = candidates[pick], key[pick]
        return candidates[np.argsort(key)]
