"""How the budget's cache bytes are shared between the cache pools (no GL): `PoolDemand` says what a
pool needs, `plan_capacities` gives each its slots."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BudgetError
from .slots import SlotGeometry

__all__ = ["PoolDemand", "plan_capacities"]


@dataclass(frozen=True)
class PoolDemand:
    """What one pool needs from the budget: its geometry and its textures' pinned and total tiles."""

    geometry: SlotGeometry
    textures: int
    pinned_tiles: int
    total_tiles: int
    current: int  # slots now


def plan_capacities(demands: dict[str, PoolDemand], available: int, max_layers: int) -> dict[str, int]:
    """Slots per pool: `available` bytes shared in proportion to textures x slot bytes, rounded down to
    whole layers, never more than a pool's textures' tiles; a pool whose share is below its pinned
    tiles gets those (whole layers, at least one layer) and the others share what is left.
    BudgetError when the pinned tiles alone do not fit."""

    def nbytes(k: str, slots: int) -> int:
        g = demands[k].geometry
        return slots // g.cells * g.layer_bytes

    need = {}
    for k, d in demands.items():
        g = d.geometry
        need[k] = min(max(g.round_up(d.pinned_tiles), g.cells), max_layers * g.cells)
    if available < 0:
        raise BudgetError(f"VRAM budget too small: page tables, ring and feedback leave {available / 2**20:.1f} MiB")
    if sum(nbytes(k, n) for k, n in need.items()) > available:
        total = sum(nbytes(k, n) for k, n in need.items())
        raise BudgetError(
            f"VRAM budget too small: the pinned levels alone need {total / 2**20:.1f} MiB of cache, "
            f"{available / 2**20:.1f} MiB is left after page tables, ring and feedback"
        )
    weight = {k: d.textures * d.geometry.slot_bytes for k, d in demands.items()}
    held: set[str] = set()  # pools given their pinned minimum; the rest share what those leave
    while True:
        spare = available - sum(nbytes(k, need[k]) for k in held)
        total_w = sum(weight[k] for k in demands if k not in held) or 1
        plan = {k: need[k] for k in held}
        short = []
        for k, d in demands.items():
            if k in held:
                continue
            g = d.geometry
            share = g.round_capacity(int(spare * weight[k] / total_w) // g.slot_bytes)
            plan[k] = min(share, g.round_up(d.total_tiles), max_layers * g.cells)
            if plan[k] < need[k]:
                short.append(k)
        if not short:
            return plan
        held.update(short)
