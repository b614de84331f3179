"""The streamer end to end, headless: streamed frames against all-resident frames and an independent
decoder, never black, budget held under pressure and across a run-time shrink, two formats sharing
one budget, corrupt tiles survived, eviction delay and fence-gated ring reuse, and `texstream render`.

Packs are baked once per module (small: 1024-4096 texels, 64-texel tiles). Frames are 256 px; on
llvmpipe a streamed view converges within a few frames.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import moderngl
import numpy as np
import pytest
from PIL import Image

from texstream.apps.render import PlaneRenderer, render
from texstream.bake.pipeline import bake, bake_procedural
from texstream.bake.source import ArraySource
from texstream.config import BakeConfig, BudgetConfig, StreamerConfig, UploadPath
from texstream.errors import EngineError
from texstream.pack.extract import extract_level
from texstream.pack.format import TexelFormat
from texstream.pack.reader import PackReader
from texstream.runtime.staging import RingSlotState
from texstream.runtime.streamer import Streamer
from texstream.runtime.uploader import LoadState
from texstream.scene.camera import View
from texstream.testing import psnr

pytestmark = pytest.mark.gl

SIZE = (256, 256)
CONVERGED_DB = 45.0
FLOOR_DB = 15.0  # any frame, even the first (pinned levels only), against the converged reference
FRAMES = 24


# ---- helpers ---------------------------------------------------------------------------------
def black(img: np.ndarray) -> np.ndarray:
    """Mask of pure black pixels (the clear colour; never a texel of the test images)."""
    return (img[..., :3] == 0).all(axis=-1)


def colour_image(size: int, seed: int = 3) -> np.ndarray:
    """RGBA8 content without black: smooth waves at several scales plus mild noise, in 40..230."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    r = 0.5 + 0.5 * np.sin(x / 41.0 + 2.0 * np.sin(y / 157.0))
    g = 0.5 + 0.5 * np.sin(y / 29.0 + x / 311.0)
    b = 0.5 + 0.5 * np.cos((x + 2.0 * y) / 97.0)
    rgb = np.stack([r, g, b], axis=-1) * 170.0 + 50.0 + rng.normal(0.0, 5.0, (size, size, 3))
    out = np.full((size, size, 4), 255, np.uint8)
    out[..., :3] = np.clip(rgb, 40, 230).astype(np.uint8)
    return out


def config(budget_mb: float = 64.0, **kw: object) -> StreamerConfig:
    kw.setdefault("io_threads", 2)
    kw.setdefault("ring_mb", 4)
    kw.setdefault("upload_staging_min_tiles", 1)  # the small scenes here stage every batch on that path
    return StreamerConfig(budget=BudgetConfig(budget_mb=budget_mb), **kw)  # type: ignore[arg-type]


def reference(ctx: moderngl.Context, pack: Path, view: View, size: tuple[int, int] = SIZE) -> np.ndarray:
    return render(ctx, pack, view=view, size=size, frames=2, all_resident=True, config=config()).frames[-1]


@dataclass
class Packs:
    colour: Path  # 2048^2 BC1 sRGB, no black texel
    normals: Path  # 1024^2 BC5 linear
    big: Path  # 4096^2 BC1 checker: far more than a few MiB
    root: Path


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Packs:
    root = tmp_path_factory.mktemp("packs")
    bc1 = BakeConfig(tile_size=64, jobs=2, progress=False)
    bake(ArraySource(colour_image(2048), "waves"), root / "colour.tpk", bc1)
    bc5 = BakeConfig(texel_format=TexelFormat.BC5, tile_size=64, jobs=2, progress=False)
    bake_procedural(root / "normals.tpk", 1024, "normals", 1, bc5)
    bake_procedural(root / "big.tpk", 4096, "checker", 1, bc1)
    return Packs(root / "colour.tpk", root / "normals.tpk", root / "big.tpk", root)


@pytest.fixture
def renderer(gl_context: moderngl.Context) -> Iterator[PlaneRenderer]:
    r = PlaneRenderer(gl_context, SIZE)
    yield r
    r.release()


def run(streamer: Streamer, renderer: PlaneRenderer, vt, view: View, frames: int):  # noqa: ANN001, ANN201
    """update + draw + read `frames` times; yields (frame image, stats)."""
    for _ in range(frames):
        streamer.update()
        renderer.draw(vt, view)
        yield renderer.read(), streamer.stats()


def last_frame(streamer: Streamer, renderer: PlaneRenderer, vt, view: View, frames: int) -> np.ndarray:  # noqa: ANN001
    """`frames` frames of `view`; the last one."""
    frame = None
    for frame, _st in run(streamer, renderer, vt, view, frames):  # noqa: B007
        pass
    assert frame is not None
    return frame


#: Every upload path, chosen explicitly (AUTO takes the host ring on llvmpipe, which reports no video memory).
PATHS = pytest.mark.parametrize(
    "upload_path", [UploadPath.HOST_RING, UploadPath.DEVICE_BUFFER, UploadPath.STAGING_TEXTURE], ids=lambda p: p.value
)


def check_path(s: Streamer, upload_path: UploadPath) -> None:
    """The streamer runs `upload_path`, and the budget counts its staging (the device buffer too)."""
    io = s.io_status()
    assert io.upload_path is upload_path
    staging = s.budget.breakdown()
    if upload_path is UploadPath.DEVICE_BUFFER:
        assert io.device_staging is not None and staging["staging-device"] == io.device_staging.nbytes > 0
    elif upload_path is UploadPath.STAGING_TEXTURE:  # the arrays live in the share the budget holds
        ts = io.texture_staging
        assert io.device_staging is None and ts is not None
        assert staging["staging-device"] == ts.share_bytes >= ts.nbytes
    else:
        assert io.device_staging is None and io.texture_staging is None and "staging-device" not in staging
    assert io.ring is not None and staging["staging-ring"] >= io.ring.slot_count * io.ring.slot_bytes


# ---- image quality ---------------------------------------------------------------------------
VIEWS = {
    "1to1": View(0.5, 0.5, 1.0),
    "minified": View(0.45, 0.55, 0.3),
    "magnified": View(0.52, 0.48, 3.0),
    "oblique": View(0.5, 0.6, 1.0, 60.0, 25.0),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_streamed_frames_converge_and_are_never_black(gl_context: moderngl.Context, packs: Packs, name: str) -> None:
    view = VIEWS[name]
    ref = reference(gl_context, packs.colour, view)
    plane = ~black(ref)  # the oblique view sees the horizon: the clear colour above it is excluded
    assert plane.mean() > 0.5
    result = render(gl_context, packs.colour, view=view, size=SIZE, frames=FRAMES, keep_frames=True, config=config())
    scores = [psnr(f, ref) for f in result.frames]
    for i, frame in enumerate(result.frames):
        assert not (black(frame) & plane).any(), f"{name}: black texels in frame {i}"
        assert scores[i] >= FLOOR_DB, f"{name}: frame {i} is {scores[i]:.1f} dB from the reference"
    assert scores[-1] >= CONVERGED_DB, f"{name}: converged to {scores[-1]:.1f} dB only ({scores})"
    last = result.telemetry[-1]
    assert last.missing_pages == 0 and last.corrupt_tiles == 0
    assert all(t.vram_bytes <= t.budget_bytes for t in result.telemetry)


def test_one_to_one_matches_independent_decoder(gl_context: moderngl.Context, packs: Packs) -> None:
    # A 1:1 top view centred on a texel corner maps each pixel onto one level-0 texel centre.
    w, h = SIZE
    x0, y0 = 1024 - w // 2 + 64, 1024 - h // 2 - 32
    view = View((x0 + w / 2) / 2048, (y0 + h / 2) / 2048, 1.0)
    frame = render(gl_context, packs.colour, view=view, size=SIZE, frames=FRAMES, config=config()).frames[-1]
    expected = extract_level(packs.colour, 0, (x0, y0, w, h))
    score = psnr(frame, expected)
    assert score >= CONVERGED_DB, f"streamed 1:1 frame is {score:.1f} dB from texture2ddecoder's decode"


# ---- budget ----------------------------------------------------------------------------------
def test_budget_far_below_demand(gl_context: moderngl.Context, packs: Packs) -> None:
    """A 4096^2 texture seen minified and oblique through a 3.3 MiB budget (2 MiB of it feedback,
    0.8 MiB ring): usage never exceeds the budget, the mip bias rises, and the view settles on a
    coarser level that fits (no missing page, no re-upload churn) instead of thrashing."""
    view = View(0.5, 0.5, 0.25, 60.0, 25.0)
    cfg = config(3.3, ring_mb=1)
    size = (384, 384)
    renderer = PlaneRenderer(gl_context, size)
    try:
        with Streamer(gl_context, cfg) as s:
            vt = s.open(packs.big)
            demand = vt.header.tile_count
            assert demand * vt.header.tile_raw_size > 4 * s.budget.budget
            history = []
            for _frame, st in run(s, renderer, vt, view, 48):
                assert st.vram_bytes <= st.budget_bytes, st.vram_breakdown
                history.append(st)
            assert max(h.mip_bias for h in history) > 0
            tail = history[-8:]
            assert all(h.missing_pages == 0 for h in tail), [h.missing_pages for h in tail]
            assert sum(h.uploads for h in tail) == 0, "still re-uploading after settling"
            assert s.stats().vram_peak_bytes <= s.budget.budget
            for pool in s.pools.values():
                pool.ledger.check()
    finally:
        renderer.release()


@pytest.mark.parametrize("upload_path", [UploadPath.AUTO, UploadPath.STAGING_TEXTURE], ids=lambda p: p.value)
def test_two_formats_share_one_budget(gl_context: moderngl.Context, packs: Packs, upload_path: UploadPath) -> None:
    """BC1 and BC5 in one streamer share one ring, whose stride is the BC5 tile's: on the
    staging-texture path both go through their arrays (8- and 16-byte blocks), BC1 read at that stride."""
    view_c, view_n = View(0.4, 0.6, 0.7), View(0.6, 0.4, 1.5)
    ref_c, ref_n = reference(gl_context, packs.colour, view_c), reference(gl_context, packs.normals, view_n)
    second = PlaneRenderer(gl_context, SIZE)
    first = PlaneRenderer(gl_context, SIZE)
    try:
        with Streamer(gl_context, config(12.0, upload_path=upload_path)) as s:
            colour, normals = s.open(packs.colour), s.open(packs.normals)
            assert colour.pool is not normals.pool and len(s.pools) == 2
            names = set(s.budget.breakdown())
            assert {colour.pool.name, normals.pool.name} <= names
            for _ in range(FRAMES):
                st = s.update()
                first.draw(colour, view_c)
                second.draw(normals, view_n)
                assert s.budget.usage <= s.budget.budget
                a, b = first.read(), second.read()
                assert not black(a).any() and not black(b).any()
            assert st.missing_pages == 0
            assert colour.table.resident_count > 21 and normals.table.resident_count > 5  # beyond pinned
            s.validate()  # the GPU's page tables hold both textures' entries as the CPU has them
            ts = s.io_status().texture_staging
            if upload_path is UploadPath.STAGING_TEXTURE:
                assert ts is not None and {a[0] for a in ts.arrays} == {8, 16} and ts.ring_tiles == 0
                assert s.io_status().ring.slot_bytes > colour.header.tile_raw_size  # type: ignore[union-attr]
    finally:
        first.release()
        second.release()
    assert psnr(a, ref_c) >= CONVERGED_DB
    assert psnr(b, ref_n) >= CONVERGED_DB


@PATHS
def test_budget_shrink_at_run_time(
    gl_context: moderngl.Context, packs: Packs, renderer: PlaneRenderer, upload_path: UploadPath
) -> None:
    path = [View(0.2 + 0.1 * i, 0.3 + 0.05 * i, 0.6) for i in range(7)]
    final = View(0.8, 0.6, 1.0)
    ref = reference(gl_context, packs.colour, final)
    with Streamer(gl_context, config(24.0, ring_mb=1, upload_path=upload_path)) as s:
        vt = s.open(packs.colour)
        check_path(s, upload_path)
        for view in path:  # fill the cache well beyond what the last view needs
            for _ in run(s, renderer, vt, view, 4):
                pass
        before = vt.pool.capacity
        resident_before = vt.table.resident_count
        s.set_budget(3.5)
        assert s.budget.usage <= s.budget.budget == int(3.5 * 2**20)
        assert vt.pool.capacity < before and vt.pool.capacity < resident_before
        vt.pool.ledger.check()
        vt.table.validate()
        scores = []
        for frame, st in run(s, renderer, vt, final, FRAMES):
            assert st.vram_bytes <= st.budget_bytes == int(3.5 * 2**20)
            assert not black(frame).any()
            scores.append(psnr(frame, ref))
        assert min(scores) >= FLOOR_DB
        assert scores[-1] >= CONVERGED_DB, scores
        # and back up: nothing lost, rendering continues
        s.set_budget(16.0)
        for frame, _st in run(s, renderer, vt, final, 2):
            assert psnr(frame, ref) >= CONVERGED_DB


@PATHS
def test_a_tiny_upload_time_budget_still_converges(
    gl_context: moderngl.Context, packs: Packs, renderer: PlaneRenderer, upload_path: UploadPath
) -> None:
    """A time budget far below one call's cost lets one upload call (one run of layers, plus its
    buffer copy on the device path) out per frame: the view still converges to the all-resident
    reference, never black, within the budget; without the time budget the same frames take more
    calls at once."""
    view = VIEWS["minified"]
    ref = reference(gl_context, packs.colour, view)
    calls: dict[bool, list[int]] = {}
    for timed in (True, False):
        cfg = config(upload_time_budget_ms=1e-6 if timed else None, prefetch=False, upload_path=upload_path)
        with Streamer(gl_context, cfg) as s:
            vt = s.open(packs.colour)
            calls[timed] = []
            scores = []
            for frame, st in run(s, renderer, vt, view, 3 * FRAMES):
                calls[timed].append(s.last.upload_calls)
                assert st.vram_bytes <= st.budget_bytes
                assert not black(frame).any()
                scores.append(psnr(frame, ref))
            assert scores[-1] >= CONVERGED_DB, f"timed={timed}: {scores}"
            assert s.last.missing_pages == 0
    one = 1 if upload_path is UploadPath.HOST_RING else 2  # a buffer copy, or a fill, with the call
    assert max(calls[True]) == one and sum(calls[True]) > one
    assert max(calls[False]) > one  # the budget is what held the calls back


def test_close_while_streaming_returns_every_staging_slot(gl_context: moderngl.Context, packs: Packs) -> None:
    """Closing a texture with loads queued, in flight and read-but-not-uploaded (a 2-tile upload cap
    keeps a backlog) gives their ring slots back; the other texture streams on, and a texture
    opened again (taking the freed id) converges."""
    view_c, view_n = View(0.5, 0.5, 0.5), View(0.5, 0.5, 0.8)
    ref_c, ref_n = reference(gl_context, packs.colour, view_c), reference(gl_context, packs.normals, view_n)
    first, second = PlaneRenderer(gl_context, SIZE), PlaneRenderer(gl_context, SIZE)
    try:
        # issue more than the uploader takes: reads pile up READY
        with Streamer(gl_context, config(32.0, upload_tiles_per_frame=2, request_tiles_per_frame=64)) as s:
            colour, normals = s.open(packs.colour), s.open(packs.normals)
            for _ in range(60):  # feedback arrives when the GPU's fences signal: a few frames on real drivers
                s.update()
                first.draw(colour, view_c)
                second.draw(normals, view_n)
                if s.load_states(normals)[LoadState.READY]:
                    break
            assert s.load_states(normals)[LoadState.READY], "no backlog to test"
            s.close(normals)
            assert psnr(last_frame(s, first, colour, view_c, 60), ref_c) >= CONVERGED_DB
            rs = s.io_status().ring
            assert rs is not None
            assert not s.busy and rs.held == 0, rs
            again = s.open(packs.normals)
            assert again.id == normals.id
            assert psnr(last_frame(s, second, again, view_n, FRAMES * 2), ref_n) >= CONVERGED_DB
    finally:
        first.release()
        second.release()


# ---- bad data --------------------------------------------------------------------------------
@PATHS
def test_corrupt_tile_keeps_fallback(
    gl_context: moderngl.Context, packs: Packs, renderer: PlaneRenderer, upload_path: UploadPath
) -> None:
    bad = packs.root / "corrupt.tpk"
    shutil.copyfile(packs.colour, bad)
    tx, ty = 16, 16  # level-0 tile under pixels 128..191 of the 1:1 view centred on the texture
    with PackReader(bad) as r:
        e = r.entry(0, tx, ty)
    with bad.open("r+b") as f:
        f.seek(e.offset + e.stored_size // 2)
        chunk = bytearray(f.read(8))
        f.seek(e.offset + e.stored_size // 2)
        f.write(bytes(v ^ 0x5A for v in chunk))
    view = View(0.5, 0.5, 1.0)
    ref = reference(gl_context, packs.colour, view)
    region = np.zeros(ref.shape[:2], bool)
    region[128 - 8 : 192 + 8, 128 - 8 : 192 + 8] = True  # the tile, plus a bilinear margin
    with Streamer(gl_context, config(retry_frames=4, upload_path=upload_path)) as s:
        vt = s.open(bad)
        check_path(s, upload_path)
        for frame, _st in run(s, renderer, vt, view, FRAMES):
            assert not black(frame).any()
            assert psnr(frame, ref) >= FLOOR_DB
        st = s.stats()
        assert st.corrupt_tiles == 1  # one bad tile, counted once...
        assert st.totals.failed >= 2 and vt.failed_loads == st.totals.failed  # ...tried again
        assert not vt.table.is_resident(np.array([0]), np.array([tx]), np.array([ty]))[0]
        assert vt.table.resident_levels(np.array([0]), np.array([tx]), np.array([ty]))[0] >= 1  # an ancestor
    assert psnr(frame, ref, ~region) >= CONVERGED_DB  # every other tile streamed
    assert psnr(frame, ref, region) < CONVERGED_DB  # the bad tile shows its (blurrier) ancestor
    assert psnr(frame, ref, region) >= FLOOR_DB


# ---- eviction delay and fence-gated ring reuse -------------------------------------------------
class FenceWatch:
    """Wraps every fence a streamer makes (through `Streamer.gl`). A fence made in update U follows
    the draws of frame U - 1, so once it reports signalled the GPU has finished them: `done` is the
    newest such frame. With `first_poll_unsignalled`, each fence answers "not yet" to its first poll,
    as when the GPU finishes the work during the update that first asks (llvmpipe signals at once)."""

    def __init__(self, streamer: Streamer, monkeypatch: pytest.MonkeyPatch, *, first_poll_unsignalled: bool) -> None:
        self.done = -1
        make = streamer.gl.fence
        monkeypatch.setattr(streamer.gl, "fence", lambda: WatchedFence(make(), self, streamer.frame - 1))
        self.delay = int(first_poll_unsignalled)


class WatchedFence:
    def __init__(self, inner, watch: FenceWatch, after_frame: int) -> None:  # noqa: ANN001
        self.inner, self.watch, self.after_frame, self.polls = inner, watch, after_frame, 0

    def signalled(self) -> bool:
        self.polls += 1
        if self.polls <= self.watch.delay or not self.inner.signalled():
            return False
        self.watch.done = max(self.watch.done, self.after_frame)
        return True

    def release(self) -> None:
        self.inner.release()


def test_feedback_the_gpu_finishes_during_the_update_is_read_in_it(
    gl_context: moderngl.Context, packs: Packs, renderer: PlaneRenderer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """update() polls the last draw's feedback again after the uploads: feedback the GPU finishes
    meanwhile is one frame old, not two, and the view converges as with fences that signal at once."""
    view = View(0.5, 0.5, 0.5)
    ref = reference(gl_context, packs.colour, view)
    with Streamer(gl_context, config()) as s:
        vt = s.open(packs.colour)
        FenceWatch(s, monkeypatch, first_poll_unsignalled=True)
        ages = []
        for frame, _st in run(s, renderer, vt, view, FRAMES):  # noqa: B007
            ages.append(s.last.feedback_age)
        assert ages[1:] == [1] * (len(ages) - 1), ages
        assert psnr(frame, ref) >= CONVERGED_DB
        assert s.last.missing_pages == 0


@PATHS
@pytest.mark.parametrize("fences", ["instant", "second-poll"])
def test_no_slot_overwritten_while_a_frame_in_flight_samples_it(
    gl_context: moderngl.Context, packs: Packs, upload_path: UploadPath, fences: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exhaustive feedback (every fragment, read right after each draw) names exactly the slots a
    draw sampled through its page table. Under budget pressure, with the camera jumping back to a
    view whose tiles went cold (the engine learns that draw N sampled them only at N + 2), no slot
    sampled by draw N receives another tile before update N + frames_in_flight unless a fence had
    shown the GPU done with draw N (the early overwrite gate), and every evicted tile's last known use
    is at least frames_in_flight updates old. With "second-poll" fences the last draw's feedback is
    read after the uploads (`FenceWatch`)."""
    size = (192, 192)
    fif = 3
    cfg = config(
        256.0, ring_mb=1, feedback_divisor=1, frames_in_flight=fif, upload_tiles_per_frame=8, upload_path=upload_path
    )
    renderer = PlaneRenderer(gl_context, size)
    early: list[tuple[int, int, int]] = []  # (update, slot, last draw that sampled it)
    ages: list[int] = []
    uploads = 0
    a, b = View(0.3, 0.3, 0.5, 40.0, 0.0), View(0.7, 0.7, 0.5, 40.0, 180.0)
    try:
        with Streamer(gl_context, cfg) as s:
            # the default feedback ring is sized for 1920x1080 (126 MiB at divisor 1): size it for 192^2
            s.set_feedback_size(size)
            s.set_budget(3.3)  # about 100 cache slots: the two views do not fit together
            vt = s.open(packs.big)
            gpu = FenceWatch(s, monkeypatch, first_poll_unsignalled=fences == "second-poll")
            check_path(s, upload_path)
            pool = vt.pool
            sampled = np.full(pool.capacity, -(1 << 30), np.int64)  # slot -> last draw sampling it
            for view in [b] * 12 + ([a] * 4 + [b] * 2) * 10:
                st = s.update()
                if st.uploaded is not None:
                    for slot in st.uploaded.loads.cache_slot.tolist():
                        uploads += 1
                        if s.frame - sampled[slot] < fif and sampled[slot] > gpu.done:
                            early.append((s.frame, slot, int(sampled[slot])))
                ages.extend(st.evicted_age.tolist())
                renderer.draw(vt, view)
                gl_context.finish()
                ids = np.unique(s.current_feedback()).astype(np.int64)  # every fragment's page
                slots = s.sample_slots(ids, with_parents=True)  # trilinear samples the next level
                sampled[slots[slots >= 0]] = s.frame
                assert s.budget.usage <= s.budget.budget
            pool.ledger.check()
    finally:
        renderer.release()
    assert len(ages) > 30 and uploads > 100, "the run must evict and reuse slots to test anything"
    assert min(ages) >= fif
    assert not early, f"slots overwritten while a frame in flight sampled them (update, slot, draw): {early[:5]}"


class HeldFence:
    """Wraps a real fence; reports unsignalled while the test holds it (a GPU far behind)."""

    held = True

    def __init__(self, inner) -> None:  # noqa: ANN001
        self.inner = inner

    def signalled(self) -> bool:
        return not HeldFence.held and self.inner.signalled()

    def release(self) -> None:
        self.inner.release()


@PATHS
def test_ring_slots_reused_only_after_their_fence(
    gl_context: moderngl.Context, packs: Packs, renderer: PlaneRenderer, upload_path: UploadPath
) -> None:
    """With every fence held (a GPU far behind), no ring slot is handed out again: on the device path
    the fence sits behind the buffer copies, and the ring still waits for it."""
    with Streamer(gl_context, config(ring_mb=1, upload_path=upload_path)) as s:
        vt = s.open(packs.colour)
        check_path(s, upload_path)
        ring = s.staging_ring
        assert ring is not None
        HeldFence.held = True
        ring.fence_factory = lambda: HeldFence(s.gl.fence())
        acquire = ring.acquire
        fenced: set[int] = set()
        reused: list[int] = []

        def checked_acquire(count: int) -> np.ndarray:
            slots = acquire(count)
            reused.extend(v for v in slots.tolist() if v in fenced)
            return slots

        ring.acquire = checked_acquire  # type: ignore[method-assign]
        view = View(0.5, 0.5, 0.6)
        for i in range(48):  # pan: keeps asking for new tiles while no upload fence signals
            for frame, _st in run(s, renderer, vt, View(0.2 + 0.013 * i, 0.3 + 0.008 * i, 0.5), 1):
                assert not black(frame).any()
            fenced |= set(np.flatnonzero(ring.state == RingSlotState.IN_FLIGHT).tolist())
        rs = ring.stats()
        assert not reused, f"slots {reused[:8]} handed out again before their fence signalled"
        assert rs.free == 0 and rs.in_flight == len(fenced) == rs.slot_count, rs  # ran dry; frames went on
        HeldFence.held = False
        ref = reference(gl_context, packs.colour, view)
        frame = last_frame(s, renderer, vt, view, FRAMES)
        assert ring.stats().in_flight < len(fenced)
        assert psnr(frame, ref) >= CONVERGED_DB


# ---- the CLI ---------------------------------------------------------------------------------
def cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "texstream", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def test_cli_render_writes_png_and_telemetry(packs: Packs, tmp_path: Path) -> None:
    out, tel = tmp_path / "frame.png", tmp_path / "frames.jsonl"
    p = cli(
        "render",
        packs.colour,
        "--out",
        out,
        "--size",
        "96x64",
        "--frames",
        "5",
        "--budget-mb",
        "32",
        "--view",
        "0.5,0.5,0.5,30,10",
        "--telemetry",
        tel,
    )
    assert p.returncode == 0, p.stderr
    with Image.open(out) as img:
        assert img.size == (96, 64)
    lines = [json.loads(line) for line in tel.read_text().splitlines()]
    assert len(lines) == 5
    for line in lines:
        assert 0 < line["vram_bytes"] <= line["budget_bytes"] == 32 << 20


@pytest.mark.parametrize(
    "args",
    [
        ["--size", "0x64"],
        ["--size", "big"],
        ["--frames", "0"],
        ["--view", "0.5,0.5"],
        ["--view", "0.5,0.5,-1"],
        ["--budget-mb", "-5"],
        ["--bogus"],
    ],
    ids=["size-zero", "size-text", "frames", "view-short", "view-zoom", "budget", "unknown"],
)
def test_cli_render_bad_arguments_exit_2(packs: Packs, tmp_path: Path, args: list[str]) -> None:
    p = cli("render", packs.colour, "--out", tmp_path / "x.png", *args)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "x.png").exists()


def test_cli_render_missing_pack_exits_1(tmp_path: Path) -> None:
    p = cli("render", tmp_path / "nope.tpk", "--out", tmp_path / "x.png", "--frames", "1")
    assert p.returncode == 1, (p.returncode, p.stderr)
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "nope.tpk" in err[0], p.stderr


# ---- the same pack opened twice, the budget shortcut, the public throttle ----------------------------
def test_a_pack_opened_twice_shares_its_residency(
    gl_context: moderngl.Context, packs: Packs, renderer: PlaneRenderer
) -> None:
    """Two opens of one pack (by another spelling of its path, too) are two handles on one texture:
    the same tiles and page table, no second cache share or load; closing one handle keeps the other
    streaming and converging, and the pack's tiles go only with its last handle."""
    view = View(0.5, 0.5, 0.6)
    ref = reference(gl_context, packs.colour, view)
    with Streamer(gl_context, config()) as s:
        first = s.open(packs.colour)
        pinned_usage, resident = s.budget.usage, s.stats().resident_tiles
        second = s.open(packs.colour.parent / "." / packs.colour.name)
        assert second is not first and second.id == first.id and second.tiles == first.tiles
        assert second.pool is first.pool and len(s.textures) == 1 and len(s.pools) == 1
        assert s.budget.usage == pinned_usage and s.stats().resident_tiles == resident  # nothing loaded twice
        assert psnr(last_frame(s, renderer, second, view, FRAMES), ref) >= CONVERGED_DB
        loaded = s.stats().resident_tiles
        np.testing.assert_array_equal(first.table.resident_tiles()[3], second.table.resident_tiles()[3])
        first.close()
        assert first.closed and not second.closed and len(s.textures) == 1
        assert s.stats().resident_tiles == loaded  # the residency stayed with the open handle
        with pytest.raises(EngineError, match="closed"):
            first.bind(renderer.program, "u_vt")
        assert (
            psnr(
                last_frame(s, renderer, second, View(0.4, 0.6, 0.7), FRAMES),
                reference(gl_context, packs.colour, View(0.4, 0.6, 0.7)),
            )
            >= CONVERGED_DB
        )
        s.validate()
        second.close()
        assert not s.textures and s.stats().resident_tiles == 0 and not s.pools
        other = s.open(packs.colour)  # opened afresh after the last handle closed
        assert other.corrupt_tiles == 0 and s.stats().resident_tiles == resident


def test_budget_mb_shortcut_and_its_conflicts(gl_context: moderngl.Context, packs: Packs) -> None:
    assert StreamerConfig(budget_mb=48).budget == BudgetConfig(budget_mb=48)
    assert StreamerConfig(budget_mb=48, budget=BudgetConfig(high_water=0.9)).budget.high_water == 0.9
    with pytest.raises(ValueError, match="conflicts with budget=BudgetConfig"):
        StreamerConfig(budget_mb=48, budget=BudgetConfig(budget_mb=64))
    with pytest.raises(ValueError, match="positive number of MiB, got -1"):
        StreamerConfig(budget_mb=-1)
    with pytest.raises(TypeError, match="budget_mb must be a number"):
        StreamerConfig(budget_mb="64")  # type: ignore[arg-type]
    with Streamer(gl_context, budget_mb=40) as s:
        assert s.budget.budget == 40 << 20 and s.budget.source == "config"
        throttle = s.throttle(2)
        assert throttle.depth == 2
        throttle.frame_done()
        throttle.release()
    with pytest.raises(ValueError, match="conflicts"):
        Streamer(gl_context, config(64.0), budget_mb=32)
