"""The compiled passes a `slots.SlotLedger` and `pool_ledgers.PoolLedgers` can be handed
(`touch.DeciderLoops.ledger`, built in `compiled_loops`), as types: both run on numpy alone without
them, to the same state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["LedgerLoops", "MoveLoop", "TouchLoop", "VictimLoop"]

# (state, pinned, last_used, tex, level, priority or None, frame, frames_in_flight, idle_clip, slot_bits,
# count, out_keys) -> victims, or -1: ``ts_victim_keys``, `SlotLedger._pick_victims`'s twin
VictimLoop = Callable[..., int]
# (slots, pools, table, frame, from_state, to_state) -> 0, or < 0 when refused (nothing written), table
# (3 x pools: state addresses, last_used addresses, capacities): ``ts_move_pools``, per pool
# `SlotLedger.mark_resident`'s twin
MoveLoop = Callable[[np.ndarray, np.ndarray, np.ndarray, int, int, int], int]
# (slots: pools x stride, counts, table, frame) -> slots touched: ``ts_touch_pools``, per pool
# `SlotLedger.touch`'s twin
TouchLoop = Callable[[np.ndarray, np.ndarray, np.ndarray, int], int]


@dataclass(frozen=True, kw_only=True)
class LedgerLoops:
    """The ledgers' compiled passes (`touch.DeciderLoops.ledger`): each replaces a dozen numpy calls a
    frame (per pool) with one call, to the same state."""

    victim_keys: VictimLoop  # a ledger's least-recently-used victims (`SlotLedger._pick_victims`)
    move_pools: MoveLoop  # a frame's arrivals in every pool (`pool_ledgers.PoolLedgers.mark_resident`)
    touch_pools: TouchLoop  # a frame's sampled slots in every pool (`pool_ledgers.PoolLedgers.touch`)
