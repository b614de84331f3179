"""`Streamer.set_budget` and the pools' share of the budget, as a mixin of `Streamer`.

The residency core decides each pool's size (`residency.Residency.plan`), `pool_set.PoolSet` moves the
arrays; this part runs the two when the budget changes or a new texture's fixed costs need room, and
lets the loads follow their renamed cache slots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import staging_share
from .budget import budget_bytes
from .tiles import HEADER

if TYPE_CHECKING:  # typing only: the attributes the mixin reads are the streamer's own
    from collections.abc import Callable

    from ..config import StreamerConfig
    from ..pack.format import PackHeader
    from .budget import BudgetManager
    from .feedback import FeedbackRing
    from .page_buffer import PageTableBuffer
    from .pool_set import PoolSet
    from .pools import CachePool, PoolKey
    from .residency import Residency
    from .uploader import Uploader

__all__ = ["BudgetVerbs"]


class BudgetVerbs:
    """`Streamer.set_budget` and the pool planning behind it and behind `Streamer.open` (a mixin)."""

    config: StreamerConfig
    budget: BudgetManager
    pools: dict[PoolKey, CachePool]
    _core: Residency
    _uploader: Uploader | None
    _feedback: FeedbackRing
    _pages: PageTableBuffer
    _pool_set: PoolSet
    _check_open: Callable[[], None]

    def set_budget(self, megabytes: float) -> None:
        """Change the VRAM budget at run time; the cache pools shrink or grow (the tiles that stay
        are copied on the GPU).

        Parameters
        ----------
        megabytes : float
            The new budget in MiB (finite, positive).

        Raises
        ------
        ValueError
            Not a finite positive number.
        BudgetError
            Too small for what must stay resident (pinned levels, page tables, staging ring).
        EngineError
            The streamer is released.
        """
        self._check_open()
        nbytes = budget_bytes(megabytes)
        if nbytes < self.budget.budget:
            self._plan_pools(budget=nbytes)  # shrink first, then lower the budget
            self.budget.set_budget(nbytes)
        else:
            self.budget.set_budget(nbytes)
            self._plan_pools()
        self._pages.upload(self._core.tables)

    def _plan_pools(self, budget: int | None = None) -> None:
        """Share what the budget leaves after fixed costs among the pools (the core decides, the pools
        move), let the loads follow their renamed cache slots, and cancel the loads whose cache
        slots a shrink removed (nothing to free)."""
        self._feedback.fit_budget(self.budget, self.budget.budget if budget is None else budget)
        for r in self._pool_set.replan(self._core, self.budget.budget if budget is None else budget):
            if self._uploader is not None:
                self._uploader.move_cache_slots(r.pool.index, r.result.moved_from, r.result.moved_to)
                if r.result.cancelled_tiles.size:
                    self._uploader.cancel(r.result.cancelled_tiles)

    def _make_room(self, h: PackHeader, key: PoolKey) -> None:
        """Shrink the pools (they share all the budget) so a new texture's fixed costs fit."""
        used = self._core.space.used + HEADER + h.tile_count
        extra = self._pages.growth_bytes(used) + self._feedback.growth_bytes(used, self.budget)
        extra += self._pool_set.first_layers_bytes(key, self._core.pinned_tiles(h), h)
        if self._uploader is None or self._uploader.ring.slot_bytes < h.tile_raw_size:
            ring = staging_share.staging_bytes(self.config, self.budget, h.tile_raw_size)
            extra += max(0, ring - staging_share.staging_reserved(self.budget))
        if self.pools and extra > self.budget.available:
            self._plan_pools(budget=self.budget.budget - extra)
