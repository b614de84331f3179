"""The GPU copy of the page tables (`PageTableBuffer`): the mover half of `page_table`.

`page_table.PageTables` decides the entries (numpy, no GL); this buffer holds them on the GPU in one
shader storage buffer and writes the dirty ranges each frame. Render thread only.
"""

from __future__ import annotations

import moderngl

from .budget import BudgetManager
from .page_table import ENTRY_BYTES, PageTables

__all__ = ["PageTableBuffer"]


class PageTableBuffer:
    """The GPU copy of `PageTables.entry`: one shader storage buffer holding every texture's entries,
    grown (at open, never per frame) when the id space outgrows it. Its bytes are reserved in the
    budget under "page-tables" before it is made. Owned by the streamer (render thread)."""

    STEP = 4096  # entries are allocated in steps of this many
    #: Dirty ranges closer than this many entries (16 KiB) go out in one write: one more buffer
    #: write costs the render thread about what copying that many bytes more does.
    WRITE_GAP = 4096

    def __init__(self, ctx: moderngl.Context, budget: BudgetManager, entries: int = STEP) -> None:
        self.ctx, self.budget = ctx, budget
        self.entries = self.entries_for(entries)
        budget.reserve("page-tables", self.nbytes)
        self.buffer: moderngl.Buffer | None = ctx.buffer(reserve=self.nbytes)

    @classmethod
    def entries_for(cls, used: int) -> int:
        return max(1, -(-used // cls.STEP)) * cls.STEP

    @classmethod
    def bytes_for(cls, used: int) -> int:
        """GPU bytes of a buffer holding `used` entries."""
        return cls.entries_for(used) * ENTRY_BYTES

    @property
    def nbytes(self) -> int:
        return self.entries * ENTRY_BYTES

    def growth_bytes(self, used: int) -> int:
        """Bytes the buffer would grow by to hold `used` entries."""
        return max(0, self.entries_for(used) - self.entries) * ENTRY_BYTES

    def fit(self, used: int, tables: PageTables) -> None:
        """Hold `used` entries: a bigger buffer, every entry uploaded again (BudgetError leaves it as it was)."""
        if used <= self.entries:
            return
        new = self.entries_for(used)
        self.budget.reserve("page-tables", new * ENTRY_BYTES)
        old = self.buffer
        self.buffer, self.entries = self.ctx.buffer(reserve=new * ENTRY_BYTES), new
        if old is not None:
            old.release()
        tables.mark_all_dirty()

    def upload(self, tables: PageTables) -> int:
        """Write the dirty ranges, those less than `WRITE_GAP` entries apart as one write (the entries
        between are the tables' current ones, so the buffer stays their copy); returns how many
        writes were made."""
        assert self.buffer is not None
        writes: list[list[int]] = []
        for lo, hi in tables.take_dirty():  # ascending and disjoint
            if writes and lo - writes[-1][1] < self.WRITE_GAP:
                writes[-1][1] = hi
            else:
                writes.append([lo, hi])
        for lo, hi in writes:
            hi = min(hi, self.entries)
            if hi > lo:
                self.buffer.write(tables.entry[lo:hi], offset=lo * ENTRY_BYTES)
        return len(writes)

    def bind(self, binding: int) -> None:
        if self.buffer is not None:
            self.buffer.bind_to_storage_buffer(binding)

    def release(self) -> None:
        if self.buffer is not None:
            self.buffer.release()
            self.buffer = None
            self.budget.release("page-tables")
