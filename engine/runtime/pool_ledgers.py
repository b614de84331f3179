"""A frame's passes over every cache pool's ledger at once (`PoolLedgers`): the arrivals of all pools
and the uses of all pools, one compiled call each, where `slots.SlotLedger` takes one pool a call.
The ledgers' state changes here and in `slots` only; without the compiled passes it goes ledger by
ledger through `SlotLedger`'s own numpy methods, to the same state."""

from __future__ import annotations

import numpy as np

from .ledger_loops import LedgerLoops
from .slots import CacheSlotState, SlotLedger

__all__ = ["PoolLedgers"]

_LOADING = int(CacheSlotState.LOADING)
_RESIDENT = int(CacheSlotState.RESIDENT)


class PoolLedgers:
    """Every pool's ledger (index: pool index; None: no pool), for the passes that update all of a
    frame's pools in one compiled call each (the ledgers' arrays change only here and in `slots`);
    without the compiled passes, ledger by ledger with numpy, to the same state.

    Parameters
    ----------
    ledgers
        The owner's list of ledgers by pool index, read at every call (pools come and go).
    loops
        The compiled passes (`touch.DeciderLoops.ledger`), or None: numpy.
    """

    def __init__(self, ledgers: list[SlotLedger | None], loops: LedgerLoops | None = None) -> None:
        self.ledgers, self._loops = ledgers, loops
        self._held: tuple[np.ndarray, ...] = ()  # the arrays `_table` points into, kept alive with it
        self._table = np.zeros((3, 0), np.int64)

    def _addresses(self) -> np.ndarray:
        """(state address, last_used address, capacity) per pool index up to the last ledger (zeros
        for none), rebuilt when a ledger's arrays changed (growing or shrinking replaces them)."""
        arrays = tuple(a for g in self.ledgers if g is not None for a in (g.state, g.last_used))
        if len(arrays) != len(self._held) or any(a is not b for a, b in zip(arrays, self._held, strict=True)):
            live = [p for p, g in enumerate(self.ledgers) if g is not None]
            table = np.zeros((3, live[-1] + 1 if live else 0), np.int64)
            for p in live:
                g = self.ledgers[p]
                assert g is not None
                size = min(g.state.size, g.last_used.size)  # the arrays' own sizes bound the compiled writes
                table[:, p] = (g.state.ctypes.data, g.last_used.ctypes.data, size)
            self._held, self._table = arrays, table
        return self._table

    def mark_resident(self, slots: np.ndarray, pools: np.ndarray, frame: int) -> None:
        """`SlotLedger.mark_resident` of a frame's arrivals: slot slots[i] of the ledger of pool
        pools[i]. All or nothing through the compiled pass; refused, numpy names the slot."""
        slots, pools = np.ascontiguousarray(slots, np.int64).ravel(), np.ascontiguousarray(pools, np.int64).ravel()
        if self._loops is not None and slots.size:
            if self._loops.move_pools(slots, pools, self._addresses(), frame, _LOADING, _RESIDENT) == 0:
                return
        for p in np.unique(pools).tolist():  # (refused, or numpy: a pool named by no ledger raises)
            ledger = self.ledgers[p] if 0 <= p < len(self.ledgers) else None
            if ledger is None:
                raise ValueError(f"an arrival names pool {p}, which has no ledger")
            ledger.mark_resident(slots[pools == p], frame)

    def touch(self, sampled: np.ndarray, counts: np.ndarray, frame: int) -> None:
        """`SlotLedger.touch` of a frame's sampled slots: pool p's are sampled[p, :counts[p]]
        (`touch.SampledSlots.grouped`)."""
        if self._loops is not None:
            table = self._addresses()
            if table.shape[1] <= sampled.shape[0]:
                self._loops.touch_pools(sampled, counts, table, frame)
                return
        for p, ledger in enumerate(self.ledgers[: sampled.shape[0]]):
            if ledger is not None:
                ledger.touch(sampled[p, : int(counts[p])], frame)
