"""The compiled passes a `slots.SlotLedger` can be handed (`touch.DeciderLoops.ledger`, built in
`compiled_loops`), as types: the ledger runs on numpy alone without them, to the same state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["LedgerLoops", "MoveLoop", "TouchLoop", "VictimLoop"]

# (state, pinned, last_used, tex, level, priority or None, frame, frames_in_flight, idle_clip, slot_bits,
# count, out_keys) -> victims, or -1: ``ts_victim_keys``, `SlotLedger._pick_victims`'s twin
VictimLoop = Callable[..., int]
# (slots, pools or None, pool, state, last_used, frame, from_state, to_state) -> 0, or < 0 when refused
# (nothing written): ``ts_move_slots``, `SlotLedger.mark_resident`'s twin
MoveLoop = Callable[[np.ndarray, np.ndarray | None, int, np.ndarray, np.ndarray, int, int, int], int]
# (slots, last_used, frame) -> slots touched: ``ts_touch_slots``, `SlotLedger.touch`'s twin
TouchLoop = Callable[[np.ndarray, np.ndarray, int], int]


@dataclass(frozen=True, kw_only=True)
class LedgerLoops:
    """A ledger's compiled passes (`touch.DeciderLoops.ledger`): each replaces a dozen numpy calls a
    frame with one call, to the same state."""

    victim_keys: VictimLoop  # the least-recently-used victims (`SlotLedger._pick_victims`)
    move_slots: MoveLoop  # LOADING -> RESIDENT, used at the frame (`SlotLedger.mark_resident`)
    touch_slots: TouchLoop  # slots used at the frame (`SlotLedger.touch`)
