"""The smallest budget that fits: the arithmetic behind a `BudgetError`'s advice. No GL, no threads.

What a streamer cannot do without is fixed: the feedback buffers, the page tables, and the whole
layers of every cache pool that its textures' pinned levels (or an all-resident texture) take, since
a pool grows and shrinks by layers and holds at least one. The staging ring is not fixed: it takes a
quarter of the budget, up to `StreamerConfig.ring_mb`, and at least 16 tiles. The smallest budget B
is therefore the fixed point of ``B = fixed + ring(B)``, reached from below (`minimum_budget`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..errors import BudgetError
from ..pack.format import PackHeader
from ..units import MIB
from .slots import SlotGeometry

__all__ = ["layers_bytes", "minimum_budget", "open_error", "pinned_tiles", "ring_bytes"]

RING_MIN_TILES = 16  # the staging ring holds at least this many tiles, whatever the budget


def ring_bytes(ring_mb: int, budget: int, tile_bytes: int) -> int:
    """Staging-ring bytes under `budget`: `ring_mb`, but at most a quarter of the budget (small
    budgets would otherwise be all ring) and at least `RING_MIN_TILES` tiles of `tile_bytes`."""
    return max(min(ring_mb * MIB, budget // 4), RING_MIN_TILES * tile_bytes)


def minimum_budget(fixed: int, *, ring_mb: int, tile_bytes: int) -> int:
    """Smallest budget B with ``fixed + ring(B) <= B``, ring slots of `tile_bytes`.

    The ring grows with the budget, so B is iterated up from ``fixed + ring(fixed)``; the ring is
    capped (`ring_mb`), so the iteration ends (64 steps bound it regardless).
    """
    b = fixed + ring_bytes(ring_mb, fixed, tile_bytes)
    for _ in range(64):
        nxt = fixed + ring_bytes(ring_mb, b, tile_bytes)
        if nxt <= b:
            break
        b = nxt
    return b


def pinned_tiles(h: PackHeader, levels: int) -> int:
    """Tiles of a pack's `levels` coarsest levels."""
    return int(h.level_first[-1] - h.level_first[max(0, h.level_count - levels)])


def layers_bytes(pools: Iterable[tuple[SlotGeometry, int]]) -> int:
    """GPU bytes of the whole layers that (geometry, tiles) of each pool take, one layer at least."""
    return sum(max(g.round_up(tiles), g.cells) // g.cells * g.layer_bytes for g, tiles in pools)


def _whole_mib(nbytes: int) -> int:
    return -(-nbytes // MIB)


def open_error(what: str, exc: BudgetError, minimum_for: Callable[[int | None], int]) -> BudgetError:
    """The `BudgetError` of a pack that could not open, with the smallest budget in which it opens.

    Parameters
    ----------
    what
        The pack, as the message names it.
    exc
        What did not fit while opening it.
    minimum_for
        The smallest budget in which the open textures and the new one fit, given a number of
        pinned levels (None: the configured number).

    Returns
    -------
    BudgetError
        `exc`'s problem prefixed with `what`, the larger of the two minimums (the failed allocation's
        own and the whole texture's), and fewer pinned levels named where one pinned level would
        lower the advised whole MiB.
    """
    minimum = max(minimum_for(None), exc.minimum_bytes or 0)
    fewer = _whole_mib(minimum_for(1)) < _whole_mib(minimum)
    return BudgetError(f"{what}: {exc.problem}", minimum_bytes=minimum, pinned_levels=fewer)
