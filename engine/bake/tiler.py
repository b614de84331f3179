"""Cut a level into tile slots: T x T content plus a B-texel border copied from the same level.

Slot ``(x, y)`` of a level covers level texels ``[x*T - B, x*T + T + B)`` in each axis. Every texel
index outside the level (before 0, past the last texel: the border at the level's edge and the
padding of a partial last tile) is resolved by the address mode, clamp (the nearest edge texel)
or wrap (index modulo the level's size), so a slot holds exactly what a filter reading the whole
level would see, and filtering inside one slot equals filtering the level.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..pack.format import AddressMode

log = logging.getLogger(__name__)


def resolve(indices: np.ndarray, size: int, mode: AddressMode) -> np.ndarray:
    """Map texel indices (any integers) into [0, size) by the address mode."""
    if size < 1:
        raise ValueError(f"size must be positive, got {size}")
    idx = np.asarray(indices, np.int64)
    if mode is AddressMode.WRAP:
        return np.mod(idx, size)
    return np.clip(idx, 0, size - 1)


@dataclass(frozen=True)
class LevelCutter:
    """Slot geometry of one level: which level rows a tile row needs, and the column padding."""

    width: int
    height: int
    tile_size: int
    border: int
    mode: AddressMode

    def __post_init__(self) -> None:
        if self.width < 1 or self.height < 1:
            raise ValueError(f"level size must be positive, got {self.width}x{self.height}")
        if self.border < 0 or self.border % 4 or self.tile_size % 4 or self.tile_size < 4:
            raise ValueError(f"tile size {self.tile_size} and border {self.border} must be multiples of 4")
        object.__setattr__(self, "mode", AddressMode(self.mode))

    @property
    def slot_size(self) -> int:
        return self.tile_size + 2 * self.border

    @property
    def tiles_x(self) -> int:
        return -(-self.width // self.tile_size)

    @property
    def tiles_y(self) -> int:
        return -(-self.height // self.tile_size)

    def slot_rows(self, ty: int) -> np.ndarray:
        """Level rows (resolved into [0, height)) of tile row `ty`'s slot, top to bottom."""
        if not 0 <= ty < self.tiles_y:
            raise ValueError(f"tile row {ty} is outside 0..{self.tiles_y - 1}")
        start = ty * self.tile_size - self.border
        return resolve(np.arange(start, start + self.slot_size), self.height, self.mode)

    def cut(self, rows: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """Slots of one tile row: `rows` is (S, width, 4) uint8 (from `slot_rows`); yields (x, slot).

        Each slot is a fresh C-contiguous (S, S, 4) uint8 array, the layout encoders need.
        """
        s, t, b = self.slot_size, self.tile_size, self.border
        if rows.shape != (s, self.width, 4) or rows.dtype != np.uint8:
            raise ValueError(f"expected ({s}, {self.width}, 4) uint8 rows, got {rows.shape} {rows.dtype}")
        for x in range(self.tiles_x):
            c0 = x * t - b
            if c0 >= 0 and c0 + s <= self.width:  # inside the level: a plain copy
                yield x, np.ascontiguousarray(rows[:, c0 : c0 + s])
            else:  # border or padding past an edge: columns resolved by the address mode
                cols = resolve(np.arange(c0, c0 + s), self.width, self.mode)
                yield x, np.ascontiguousarray(rows[:, cols])

    def cut_row(self, rows: np.ndarray) -> np.ndarray:
        """All slots of one tile row at once: `rows` as for `cut` (or float32, for float texels);
        returns a fresh C-contiguous (tiles_x, S, S, 4) array of their dtype, slot `x` at index `x`
        (the layout `bcn.encode_slots` takes).

        The slots inside the level are one strided copy (slot x starts T texels after slot x - 1);
        only the few at the edges, whose columns the address mode resolves, are gathered apart.
        """
        s, t, b = self.slot_size, self.tile_size, self.border
        if rows.shape != (s, self.width, 4) or rows.dtype not in (np.uint8, np.float32):
            raise ValueError(f"expected ({s}, {self.width}, 4) uint8 or float32 rows, got {rows.shape} {rows.dtype}")
        n = self.tiles_x
        out = np.empty((n, s, s, 4), rows.dtype)  # float32 for float texels (BC6H)
        item = rows.dtype.itemsize
        first = -(-b // t)  # the first slot whose columns start inside the level
        last = (self.width - s + b) // t  # the last one whose columns end inside it
        inner = max(0, last - first + 1)
        if inner:
            rows = np.ascontiguousarray(rows)
            start = rows[:, first * t - b :]
            view = np.lib.stride_tricks.as_strided(
                start, shape=(inner, s, s, 4), strides=(t * 4 * item, rows.strides[0], 4 * item, item), writeable=False
            )
            out[first : first + inner] = view
        for x in [*range(0, min(first, n)), *range(first + inner if inner else min(first, n), n)]:
            c0 = x * t - b
            out[x] = rows[:, resolve(np.arange(c0, c0 + s), self.width, self.mode)]
        return out

    def cut_level(self, level: np.ndarray) -> Iterator[tuple[int, int, np.ndarray]]:
        """All slots of a whole (small) level held in memory: yields (x, y, slot)."""
        if level.shape != (self.height, self.width, 4):
            raise ValueError(f"expected a ({self.height}, {self.width}, 4) level, got {level.shape}")
        for y in range(self.tiles_y):
            rows = level[self.slot_rows(y)]
            for x, slot in self.cut(rows):
                yield x, y, slot


__all__ = ["LevelCutter", "resolve"]
