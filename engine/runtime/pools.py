"""Cache pools: per compression format, one GPU texture array of tile slots shared by its textures.

A `CachePool` is the mover half of a pool: it owns the GL texture array, keeps its bytes reserved in
the budget, binds it, and carries out what its `slots.SlotLedger` decides (the ledger says which tile
each slot holds; a resize's plan says which slots survive and where they move, the pool makes the new
array and copies them on the GPU). Everything it reports comes from the ledger's records
(`ResizeResult`); the residency core applies them to the page tables and the loads.
"""

from __future__ import annotations

import logging

import numpy as np

from ..gl.enums import gl_format
from ..gl.gl_ext import GLExt
from ..gl.objects import TextureArray
from ..pack.format import TexelFormat
from .budget import BudgetManager
from .slots import ResizeResult, SlotGeometry, SlotLedger

__all__ = ["CachePool", "PoolKey", "pool_name"]

log = logging.getLogger(__name__)

PoolKey = tuple[TexelFormat, bool, int]  # texel format, sRGB, slot size


def pool_name(key: PoolKey) -> str:
    """The budget and report name of the pool of `key`, e.g. ``pool/bc1-srgb/136``."""
    fmt, srgb, size = key
    return f"pool/{fmt.name.lower()}{'-srgb' if srgb else ''}/{size}"


class CachePool:
    """One format's GL texture array of tile slots plus its ledger. Render thread only.

    Parameters
    ----------
    gl
        The context's raw GL layer (creates and copies the texture array).
    budget
        The VRAM budget; the array's bytes are reserved under `name` before it is made.
    key
        (texel format, sRGB, slot size).
    index
        The pool's number; it samples from texture unit ``first_unit + index``.
    geometry
        Slot size, bytes and cells per layer.
    capacity
        Slots, a multiple of ``geometry.cells``.
    frames_in_flight
        Eviction delay and overwrite delay in frames.
    first_unit
        The first texture unit the engine's pools use.
    """

    def __init__(
        self,
        gl: GLExt,
        budget: BudgetManager,
        key: PoolKey,
        index: int,
        geometry: SlotGeometry,
        capacity: int,
        frames_in_flight: int,
        first_unit: int,
    ) -> None:
        fmt, srgb, _ = key
        self.gl, self.budget, self.key, self.index, self.geometry = gl, budget, key, index, geometry
        self.unit = first_unit + index
        self.gl_format = gl_format(fmt, srgb)
        self.name = pool_name((fmt, srgb, geometry.slot_size))
        self.textures: list[int] = []  # texture ids sampling this pool
        self.ledger = SlotLedger(self.name, capacity, frames_in_flight, geometry.cells)
        self.texture: TextureArray | None = None
        self.texture = self._make_texture(capacity)

    # ---- GL -------------------------------------------------------------------------------------
    def _make_texture(self, capacity: int) -> TextureArray:
        layers = capacity // self.geometry.cells
        self.budget.reserve(self.name, layers * self.geometry.layer_bytes)
        try:
            return self.gl.create_texture_array(self.gl_format, self.geometry.layer_size[0], layers)
        except BaseException:
            self.budget.release(self.name)
            raise

    def bind(self) -> None:
        """Bind the array to this pool's texture unit."""
        assert self.texture is not None
        self.gl.bind_texture_array(self.texture, self.unit)

    def release(self) -> None:
        if self.texture is not None:
            self.texture.release()
            self.texture = None
            self.budget.release(self.name)

    # ---- counts ---------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.ledger.capacity

    @property
    def layers(self) -> int:
        return self.capacity // self.geometry.cells

    @property
    def bytes_on_gpu(self) -> int:
        return self.layers * self.geometry.layer_bytes

    # ---- resizing -------------------------------------------------------------------------------
    def resize(self, capacity: int, frame: int) -> ResizeResult:
        """Grow or shrink to `capacity` slots (whole layers); survivors are copied on the GPU.

        The ledger decides (`SlotLedger.plan_shrink`: pinned tiles, loading slots of the kept layers,
        then the most recently used); this makes the new array, copies the kept layers of every cell and
        the movers' cells, and then applies the plan to the ledger, which renumbers the slots for the
        new layer count (the result lists every renamed slot). BudgetError, changing nothing, when the pinned
        tiles or the new array do not fit. For a moment both the old and the new array exist (inside
        open, close or set_budget, never inside update).
        """
        ledger = self.ledger
        ledger.check_capacity(capacity)
        if capacity == ledger.capacity:
            return ResizeResult.empty()
        plan = ledger.plan_shrink(capacity) if capacity < ledger.capacity else None
        old_tex, old_layers = self.texture, self.layers
        assert old_tex is not None
        self.budget.release(self.name)
        try:
            new_tex = self._make_texture(capacity)
        except BaseException:
            self.budget.reserve(self.name, old_layers * self.geometry.layer_bytes)
            raise
        g, s = self.geometry, self.geometry.slot_size
        keep = min(old_layers, capacity // g.cells)
        if keep:  # the kept layers of every cell, one copy per cell (slots are numbered cell-major)
            cells = np.arange(g.cells)
            x, y = (cells % g.cells_x) * s, (cells // g.cells_x) * s
            columns = zip([0] * g.cells, x.tolist(), y.tolist(), [0] * g.cells, x.tolist(), y.tolist(), strict=True)
            self.gl.copy_cells(old_tex, new_tex, columns, s, depth=keep)
        if plan is None:
            result = ledger.grow(capacity)
        else:
            if plan.moved_from.size:  # survivors of removed layers into free cells of kept ones
                fl, fx, fy = g.locate(plan.moved_from, old_layers)
                tl, tx, ty = g.locate(plan.moved_to, old_layers)  # same cell and layer in the new array
                moves = zip(
                    fl.tolist(),
                    (fx * s).tolist(),
                    (fy * s).tolist(),
                    tl.tolist(),
                    (tx * s).tolist(),
                    (ty * s).tolist(),
                    strict=True,
                )
                self.gl.copy_cells(old_tex, new_tex, moves, s)
            result = ledger.apply_shrink(plan)
        old_tex.release()
        self.texture = new_tex
        ledger.open_gates()  # a fresh array: no draw in flight samples it
        log.info("%s: %d -> %d slots", self.name, old_layers * self.geometry.cells, capacity)
        return result
