"""GPU feedback: the SSBO that `vt_sample` appends wanted pages to, read back without stalling.

A small ring of shader storage buffers: frame N's draw appends into buffer N % depth; at the next
`update()` the buffer is copied on the GPU into a persistent, coherent, read-mapped buffer and a
fence is placed behind the copy; once the fence has signalled the CPU reads the mapped memory
directly. No driver call reads GPU memory (glGetBufferSubData waits for the GPU on some drivers:
~20 ms a frame on NVIDIA), so the CPU never waits for the GPU. Without ARB_buffer_storage the
buffer is read with glGetBufferSubData after its fence. The age of the newest feedback read (in
frames) is reported.

Buffer layout (shaders/vt.glsl, `VTFeedback`): four uints (count, capacity, stride, phase) then
`capacity` entries, each the tile id of a page a fragment wanted (engine/runtime/feedback_reduce.py).
The stride is per frame: a dense frame (`begin_frame(dense=True)`, after a camera cut:
`feedback_bursts`) records at half of it, four times the entries, where the capacity holds them.

Compaction (`FeedbackCompactor`, where the context has compute shaders and persistent mapping): before
the copy, two compute dispatches (shaders/vt_feedback_compact.glsl) turn the buffer's entries, up to
four per 8x8 pixels (130k at 1920x1080), into the list of unique page ids with their counts (a few
thousand), so the CPU reads and reduces that list instead of every entry. The dispatches use the
shader storage bindings 7 (the feedback) and 6 (their work buffer, where the page tables are bound
for drawing: the streamer binds the page tables again right after). Without compute shaders, or when
the budget cannot hold the work buffer, the CPU reduces the raw entries (`FeedbackReducer`): the same
pages and counts. Where compaction can run, it runs only while it pays: the streamer reports each
frame's feedback cost on the render thread (`record_cost`) and `CompactionChoice` keeps the cheaper
way, measuring the other again now and then (on llvmpipe the dispatches cost the render thread more
than the CPU reduction they save).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import moderngl
import numpy as np

from ..config import StreamerConfig
from ..errors import BudgetError
from ..gl.gl_ext import GLExt
from ..gl.objects import FenceLike, MappedBuffer
from ..gl.shaders import compute_shader, shader_file
from .budget import BudgetManager
from .feedback_reduce import CompactFeedback, CompactionChoice

log = logging.getLogger(__name__)

FEEDBACK_BINDING = 7  # VT_FEEDBACK_BINDING in shaders/vt.glsl
HEADER_UINTS = 4
GL_BUFFER_UPDATE_BARRIER_BIT = 0x00000200
GL_SHADER_STORAGE_BARRIER_BIT = 0x00002000
COMPACT_WORK_BINDING = 6  # VTCompactWork in shaders/vt_feedback_compact.glsl (the page tables' binding)
COMPACT_GROUP = 256  # local_size_x of the compaction shader
COMPACT_IDS_STEP = 4096  # the work buffer's counters grow in steps of this many tile ids
# The compaction's work buffer may take at most this share of the budget: it saves CPU time, never
# room, so in a small budget the tile cache keeps those bytes and the CPU reduces the entries.
COMPACT_BUDGET_SHARE = 1 / 32
DEPTH = 4  # feedback buffers in a ring: one per frame in flight
# Buffers sized for dense frames (`feedback_bursts`: four times the entries at half the stride) may take
# at most this share of the budget; past it they keep the normal size, and a dense frame uses half the
# stride only where the draws are small enough for the buffers to hold its entries.
BURST_BUDGET_SHARE = 1 / 16
_PASS_INDEX_BYTES = (np.int32(0).tobytes(), np.int32(1).tobytes())  # the compaction's two passes


class FeedbackCompactor:
    """The GPU half of the feedback reduction: unique page ids with counts, from one feedback buffer.

    Owns the compute program and one work buffer: a 4-uint header, the id list and the count list
    (`list_capacity` each: the fewer of a feedback buffer's entries and the tile ids in use, rounded
    up, since the list holds each valid id once), then one counter per tile id, all zero between
    dispatches (pass 1 clears every counter pass 0 raised). Render thread only.
    """

    def __init__(self, ctx: moderngl.Context, entry_capacity: int) -> None:
        self.ctx, self.entry_capacity = ctx, entry_capacity
        self.list_capacity = entry_capacity  # until `track` names the ids in use
        self.program = compute_shader(ctx, shader_file("texstream/vt_feedback_compact.glsl"))
        self.n_ids = 0  # tile ids in use: entries at or past it are invalid
        self._counters = 0  # counters the work buffer holds
        self.work: moderngl.Buffer | None = None
        self.groups = -(-entry_capacity // COMPACT_GROUP)  # one invocation per entry of a feedback buffer
        # uniforms keep their values between dispatches: the sizes are written when they change, and
        # the pass index as prepacked bytes (a uniform's value setter packs in Python every call)
        self._pass_index = self.program["pass_index"]
        self._sizes_written: tuple[int, int, int] | None = None

    @staticmethod
    def available(ctx: moderngl.Context, gl: GLExt) -> bool:
        """Compute shaders (GL 4.3) and persistent mapping (the readback of the list)."""
        return ctx.version_code >= 430 and gl.has_buffer_storage

    @property
    def hits_at(self) -> int:
        return HEADER_UINTS + 2 * self.list_capacity

    @property
    def list_bytes(self) -> int:
        """Bytes of the header, id list and count list (what is read back)."""
        return self.hits_at * 4

    def list_for(self, n_ids: int) -> int:
        """Entries of the id list (and of the count list) while `n_ids` tile ids are in use."""
        return min(self.entry_capacity, self._counters_for(n_ids))

    @staticmethod
    def _counters_for(n_ids: int) -> int:
        return max(1, -(-n_ids // COMPACT_IDS_STEP)) * COMPACT_IDS_STEP

    def bytes_for(self, n_ids: int) -> int:
        """GPU bytes of the work buffer for `n_ids` tile ids."""
        return (HEADER_UINTS + 2 * self.list_for(n_ids) + self._counters_for(n_ids)) * 4

    @property
    def nbytes(self) -> int:
        return self.work.size if self.work is not None else 0

    def track(self, n_ids: int) -> None:
        """Count tile ids below `n_ids` from now on (the work buffer grows, zeroed, when it must)."""
        need, listed = self.bytes_for(n_ids), self.list_for(n_ids)
        if self.work is None or need > self.work.size or listed != self.list_capacity:
            # a new list length moves the counters: a fresh zeroed buffer (buffers compacted before
            # are read with the length they were compacted with, `_Entry.list_capacity`)
            old, self.work = self.work, self.ctx.buffer(bytes(need))
            if old is not None:
                old.release()
        self.n_ids, self.list_capacity = n_ids, listed

    def run(self, feedback: moderngl.Buffer, entries: int | None = None) -> moderngl.Buffer:
        """Queue the two dispatches over the first `entries` (default: all) of `feedback` (drawn into,
        not yet barriered); returns the work buffer, whose first `list_bytes` hold the list once the
        GPU has run them."""
        assert self.work is not None, "track() sizes the work buffer first"
        work, prog = self.work, self.program
        work.write(bytes(HEADER_UINTS * 4))  # counters are zero already; the header restarts
        feedback.bind_to_storage_buffer(FEEDBACK_BINDING)
        work.bind_to_storage_buffer(COMPACT_WORK_BINDING)
        sizes = (self.n_ids, self.list_capacity, self.hits_at)
        if sizes != self._sizes_written:
            prog["n_ids"], prog["list_capacity"], prog["hits_at"] = sizes
            self._sizes_written = sizes
        for pass_bytes in _PASS_INDEX_BYTES:
            self.ctx.memory_barrier(GL_SHADER_STORAGE_BARRIER_BIT)  # the draws' (then pass 0's) writes
            self._pass_index.write(pass_bytes)
            prog.run(self.groups if entries is None else max(1, -(-entries // COMPACT_GROUP)))
        self.ctx.memory_barrier(GL_BUFFER_UPDATE_BARRIER_BIT)  # pass 1's writes, for the copy
        return work

    def release(self) -> None:
        if self.work is not None:
            self.work.release()
            self.work = None
        self.program.release()


@dataclass
class _Entry:
    buffer: moderngl.Buffer
    readback: MappedBuffer | None = None  # persistent read mapping the buffer is copied into
    frame: int = -1  # frame whose draw wrote it; -1: free
    fence: FenceLike | None = None

    capacity: int = 0  # entries this frame's draws may append (its stride's need, `frame_capacity`)
    compacted: bool = False  # the readback holds a compacted list (`FeedbackCompactor`), not entries
    list_capacity: int = 0  # the compacted list's length (where its counts start)

    def read(self, nbytes: int, offset: int = 0) -> np.ndarray:
        """`nbytes` from byte `offset` (after the fence signalled) as uint32 (a copy)."""
        if self.readback is not None:
            return self.readback.array()[offset : offset + nbytes].view(np.uint32).copy()
        return np.frombuffer(self.buffer.read(size=nbytes, offset=offset), np.uint32)


def dense_stride(stride: int) -> int:
    """The stride of a dense feedback frame: half of `stride` (four times the fragments), at least 1."""
    return max(1, stride // 2)


class FeedbackRing:
    """`depth` feedback SSBOs of `capacity` entries; one is bound for drawing at a time."""

    def __init__(
        self, ctx: moderngl.Context, gl: GLExt, capacity: int, stride: int, depth: int = DEPTH, *, compact: bool = False
    ) -> None:
        if capacity < 1 or stride < 1 or depth < 2:
            raise ValueError(f"bad feedback ring: capacity {capacity!r}, stride {stride!r}, depth {depth!r}")
        self.ctx, self.gl = ctx, gl
        self.capacity, self.stride, self.depth = capacity, stride, depth
        # the stride of a dense frame (`begin_frame(dense=True)`): half the stride where the capacity
        # holds its entries for the draws' size (`fitted`), else the stride itself
        self.dense_stride = stride
        self.sized_for = (1 << 30, 1 << 30)  # the draw size the ring is made for (`reserved`): no bound here
        self.viewport_size: tuple[int, int] | None = None  # the latest viewport (`fitted`)
        self._drawn_stride = stride  # the stride this frame's draws record at
        mapped = gl.has_buffer_storage
        compact = compact and FeedbackCompactor.available(ctx, gl)
        self.compactor = FeedbackCompactor(ctx, capacity) if compact else None
        self._compacting = False  # the compactor's work buffer is sized and reserved (`track_ids`)
        self.choice = CompactionChoice(self.compactor is not None)  # compact a buffer only while it pays
        self.n_ids = 0  # tile ids in use, as `track_ids` was last told
        readback = max(self.nbytes_each, self.compactor.list_bytes if self.compactor else 0)
        self._entries = [
            _Entry(
                ctx.buffer(reserve=self.nbytes_each), gl.create_mapped_buffer(readback, read=True) if mapped else None
            )
            for _ in range(depth)
        ]
        self._current: _Entry | None = None
        self._spare_entry: _Entry | None = None
        self.age = -1  # frames between the newest feedback read and the frame it was read in
        self.completed = -1  # the newest frame whose buffer's fence signalled: the GPU finished its draws
        self.dropped = 0  # entries lost because the buffer was full
        self.skipped_frames = 0  # frames without a free buffer (GPU far behind): no feedback recorded

    @classmethod
    def reserved(
        cls, ctx: moderngl.Context, gl: GLExt, budget: BudgetManager, size: tuple[int, int], config: StreamerConfig
    ) -> FeedbackRing:
        """A ring for draws of `size` pixels, its bytes reserved in `budget` as "feedback" (BudgetError:
        nothing made)."""
        divisor = config.feedback_divisor
        capacity, dense = cls.capacity_for(size, divisor), cls.capacity_for(size, dense_stride(divisor))
        if config.feedback_burst_frames and budget.budget * BURST_BUDGET_SHARE >= cls.bytes_for(dense):
            capacity = dense  # dense frames at this size fit
        ring = cls(ctx, gl, capacity, divisor, compact=config.feedback_compaction)
        ring.dense_stride = ring.densest_stride(size)
        ring.sized_for = (int(size[0]), int(size[1]))
        try:
            budget.reserve("feedback", ring.nbytes)
        except BaseException:
            ring.release()
            raise
        return ring

    def resized(self, size: tuple[int, int], budget: BudgetManager, config: StreamerConfig) -> FeedbackRing:
        """A ring for draws of `size` pixels in place of this one (released); BudgetError keeps this one."""
        budget.release("feedback")
        n_ids = self.n_ids
        try:
            new = FeedbackRing.reserved(self.ctx, self.gl, budget, size, config)
        except BudgetError:
            budget.reserve("feedback", self.nbytes)
            raise
        self.release(budget)
        new.track_ids(n_ids, budget)
        return new

    def track_ids(self, n_ids: int, budget: BudgetManager) -> None:
        """Tile ids in use are below `n_ids` (called when textures open): the compaction's work buffer
        follows, its bytes reserved as "feedback-compaction"; where the budget cannot hold them the CPU
        reduces the raw entries instead (nothing fails)."""
        self.n_ids = n_ids
        c = self.compactor
        if c is None or n_ids <= 0:
            return
        need = c.bytes_for(n_ids)
        if need > COMPACT_BUDGET_SHARE * budget.budget:
            log.info("feedback: the compaction's %d bytes would take over 1/32 of the budget; the CPU reduces", need)
            self._stop_compacting(budget)
            return
        if need > budget.reserved("feedback-compaction"):
            try:
                budget.reserve("feedback-compaction", need)
            except BudgetError:
                log.info("feedback: no room for the compaction's %d bytes; the CPU reduces the entries", need)
                self._stop_compacting(budget)
                return
        c.track(n_ids)
        self._compacting = True

    def _stop_compacting(self, budget: BudgetManager) -> None:
        if self.compactor is not None:
            self.compactor.release()
            self.compactor = None
        self._compacting = False
        budget.release("feedback-compaction")

    def growth_bytes(self, n_ids: int, budget: BudgetManager) -> int:
        """Bytes `track_ids(n_ids)` would add to the budget's reservations."""
        c = self.compactor
        if c is None or c.bytes_for(n_ids) > COMPACT_BUDGET_SHARE * budget.budget:
            return 0
        return max(0, c.bytes_for(n_ids) - budget.reserved("feedback-compaction"))

    def fit_budget(self, budget: BudgetManager, nbytes: int) -> None:
        """The budget becomes `nbytes`: the compaction stops (its bytes go back) if it would take more
        than its share of it."""
        if self._compacting and budget.reserved("feedback-compaction") > COMPACT_BUDGET_SHARE * nbytes:
            self._stop_compacting(budget)

    @property
    def compacting(self) -> bool:
        """The feedback is reduced to unique pages on the GPU before it is read back (it can, and it
        costs the render thread less than reducing the entries on the CPU: `CompactionChoice`)."""
        return self._compacting and self.choice.compact

    def record_cost(self, batches: Sequence[np.ndarray | CompactFeedback], seconds: float) -> None:
        """The render thread's `seconds` for one frame's feedback: closing the buffer, collecting
        `batches` (this frame's `collect`) and reducing them; counted for the way they were made
        (nothing when none were read, or when they were made both ways)."""
        if not self._compacting or not batches:
            return
        compacted = {isinstance(b, CompactFeedback) for b in batches}
        if len(compacted) == 1:
            self.choice.record(compacted.pop(), seconds)

    def fitted(
        self, viewport: tuple[int, int, int, int] | None, budget: BudgetManager, config: StreamerConfig
    ) -> FeedbackRing:
        """This ring, or a bigger one when draws of `viewport` would overflow it (kept if the budget
        cannot hold a bigger one: the entries that do not fit are counted as dropped)."""
        if not viewport or FeedbackRing.capacity_for(viewport[2:], config.feedback_divisor) <= self.capacity:
            self.dense_stride = self.densest_stride(viewport[2:]) if viewport else self.stride
            self.viewport_size = viewport[2:] if viewport else None
            return self
        try:
            return self.resized((viewport[2], viewport[3]), budget, config)
        except BudgetError:
            return self

    @staticmethod
    def capacity_for(size: tuple[int, int], stride: int) -> int:
        """Entries for draws of `size` pixels: up to 4 samples (textures) per stride x stride cell."""
        return 4 * (-(-size[0] // stride)) * (-(-size[1] // stride))

    def densest_stride(self, size: tuple[int, int]) -> int:
        """The stride of a dense frame drawn at `size` pixels: half the stride if the buffers hold
        its entries, else the stride."""
        dense = dense_stride(self.stride)
        return dense if FeedbackRing.capacity_for(size, dense) <= self.capacity else self.stride

    def frame_capacity(self, stride: int) -> int:
        """Entries a frame drawn at `stride` may append: what that stride needs at the larger of the
        ring's size and the viewport (`fitted`), at most the capacity. A ring sized for dense frames
        lets its normal frames use a quarter of it, so the compaction and the copy of those frames
        cover only that (on the render thread as on the GPU, they cost by the entries covered)."""
        w, h = self.sized_for
        if self.viewport_size is not None:
            w, h = max(w, self.viewport_size[0]), max(h, self.viewport_size[1])
        return min(self.capacity, FeedbackRing.capacity_for((w, h), stride))

    @staticmethod
    def bytes_for(capacity: int) -> int:
        """GPU bytes of a ring of `DEPTH` buffers of `capacity` entries."""
        return (HEADER_UINTS + capacity) * 4 * DEPTH

    @property
    def nbytes_each(self) -> int:
        return (HEADER_UINTS + self.capacity) * 4

    @property
    def nbytes(self) -> int:
        """GPU bytes: the SSBOs (the read mappings live in client memory)."""
        return self.nbytes_each * self.depth

    def end_frame(self) -> None:
        """Close the buffer the latest draws appended to: copy it for reading and fence the copy.
        Called as early as possible (the start of the next update), so the copy is queued right
        behind those draws and a GPU that keeps up answers within the same update."""
        if self._current is not None:
            # Shader writes reach glGetBufferSubData / glMapBuffer only through this barrier; the
            # fence behind it tells when both the draw and the barrier are done.
            cur = self._current
            cur.compacted = self.compacting and cur.readback is not None
            if cur.compacted:
                assert self.compactor is not None and cur.readback is not None
                work = self.compactor.run(cur.buffer, cur.capacity)
                cur.list_capacity = self.compactor.list_capacity
                self.gl.copy_buffer(work.glo, cur.readback.glo, self.compactor.list_bytes)
            else:
                self.ctx.memory_barrier(GL_BUFFER_UPDATE_BARRIER_BIT)
                if cur.readback is not None:
                    self.gl.copy_buffer(cur.buffer.glo, cur.readback.glo, (HEADER_UINTS + cur.capacity) * 4)
            cur.fence = self.gl.fence()
            self._current = None

    def begin_frame(self, frame: int, *, dense: bool = False) -> int:
        """Bind a fresh buffer for this frame's draws (closing the previous one if still open); they
        record one fragment in every `dense_stride` (`dense`) or `stride` square. Returns that stride."""
        self.end_frame()
        free = next((e for e in self._entries if e.frame < 0), None)
        stride = self.dense_stride if dense else self.stride
        capacity = self.frame_capacity(stride)
        if free is None:
            self.skipped_frames += 1
            free, capacity = self._spare(), 0
        free.capacity = capacity
        phase = (frame * 7) % (stride * stride)  # visits every fragment of a cell (7 is prime to 2^k)
        free.buffer.write(np.array([0, capacity, stride, phase], np.uint32))
        self._drawn_stride = stride
        if capacity:
            free.frame = frame
            self._current = free
        free.buffer.bind_to_storage_buffer(FEEDBACK_BINDING)
        return stride

    def _spare(self) -> _Entry:
        # Every buffer still waits on the GPU: this frame records nothing (capacity 0) into a tiny
        # dedicated buffer rather than overwrite one the GPU may still be writing.
        if self._spare_entry is None:
            self._spare_entry = _Entry(self.ctx.buffer(reserve=HEADER_UINTS * 4 + 4))
        return self._spare_entry

    def inject(self, ids: np.ndarray) -> bool:
        """Append entries to this frame's buffer as if the coming draw had written them (benchmarks and
        tests that drive the streamer without drawing). False when this frame records nothing."""
        if self._current is None:
            return False
        cap = self._current.capacity
        ids = np.asarray(ids, np.uint32)[:cap]
        head = np.array([ids.size, cap, self._drawn_stride, 0], np.uint32)
        self._current.buffer.write(head.tobytes() + ids.tobytes())
        return True

    def read_current(self) -> np.ndarray:
        """This frame's entries so far, read back at once (waits for the GPU: tests only)."""
        if self._current is None:
            return np.zeros(0, np.uint32)
        n = int(np.frombuffer(self._current.buffer.read(size=4), np.uint32)[0])
        n = min(n, self._current.capacity)
        if n == 0:
            return np.zeros(0, np.uint32)
        return np.frombuffer(self._current.buffer.read(size=4 * n, offset=HEADER_UINTS * 4), np.uint32).copy()

    def bind(self) -> None:
        """Bind this frame's buffer again (after user code rebound the binding point)."""
        if self._current is not None:
            self._current.buffer.bind_to_storage_buffer(FEEDBACK_BINDING)

    def collect(self, frame: int) -> list[np.ndarray | CompactFeedback]:
        """Entries of every closed buffer whose fence signalled, oldest first (never blocks): raw, or
        compacted on the GPU (`CompactFeedback`)."""
        ready = [e for e in self._entries if e.fence is not None and e.fence.signalled()]
        out: list[np.ndarray | CompactFeedback] = []
        for e in sorted(ready, key=lambda e: e.frame):
            if e.compacted:
                assert self.compactor is not None
                unique, invalid, count = (int(v) for v in e.read(12))
                n = min(count, e.capacity)
                unique = min(unique, n)  # the shader lists at most one id per entry read
                ids = e.read(4 * unique, HEADER_UINTS * 4)
                counts = e.read(4 * unique, (HEADER_UINTS + e.list_capacity) * 4)
                out.append(CompactFeedback(ids, counts, n, invalid))
            else:
                count = int(e.read(4)[0])
                n = min(count, e.capacity)
                out.append(e.read((HEADER_UINTS + n) * 4)[HEADER_UINTS:])
            self.dropped += count - n
            self.age = frame - e.frame
            self.completed = max(self.completed, e.frame)
            e.fence.release()
            e.fence, e.frame = None, -1
        return out

    def release(self, budget: BudgetManager | None = None) -> None:
        """Free the buffers (and give back the compaction's reservation in `budget` when given)."""
        if self.compactor is not None:
            self.compactor.release()
            self.compactor = None
        if budget is not None:
            budget.release("feedback-compaction")
        self._compacting = False
        for e in self._entries:
            if e.fence is not None:
                e.fence.release()
            e.buffer.release()
            if e.readback is not None:
                e.readback.release()
        self._entries = []
        if self._spare_entry is not None:
            self._spare_entry.buffer.release()
            self._spare_entry = None
        self._current = None
