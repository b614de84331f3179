"""`texstream bench sets`: what a texture set costs the render thread, against one texture and against
the same textures opened on their own.

Three cases see the same view of the same material, panning so that every frame streams:

- ``one``: the material's largest texture alone;
- ``set``: the four textures as one `TextureSet` (only the lead's feedback comes back);
- ``independent``: the four textures opened on their own (four feedback entries per sampled fragment).

(a) Deciders (no GL; render-thread CPU time, ``thread_time``, around each verb of the residency core,
    driven by the feedback a draw would write and movers simulated on the CPU): feedback reduction (reduce,
    map the set's lead pages onto its members, mip bias), request selection (scheduler, slot
    reservation, eviction), page-table work (arrivals into the tables, the dirty ranges to upload).
(b) ``Streamer.update()`` in full on a headless context, with the same feedback written into the
    feedback buffer by the CPU (`inject_feedback`; nothing drawn): wall and render-thread CPU time.

p50/p95/p99 per frame; ratios of ``set`` and ``independent`` against ``one``. The target: a set's
feedback + page-table work within 1.1x one texture's.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import moderngl
import numpy as np

from ..config import BakeConfig, BudgetConfig, StreamerConfig
from ..pack.format import PackHeader, TexelFormat
from ..runtime.budget import BudgetManager
from ..runtime.compiled_loops import decider_loops
from ..runtime.records import Drained, LoadRecords, Uploaded
from ..runtime.residency import Residency
from ..runtime.slots import SlotGeometry, SlotLedger

__all__ = ["run_sets_bench"]

log = logging.getLogger(__name__)

STRIDE = 8  # StreamerConfig.feedback_divisor's default: one fragment in 8 x 8 writes feedback
ZOOM = 0.75  # screen pixels per lead texel: the lead wants its level 0, the half-size members theirs
MEMBERS = (  # name, size as a fraction of the lead's, texel format, procedural pattern
    ("albedo", 1, TexelFormat.BC1, "terrain"),
    ("normal", 1, TexelFormat.BC5, "normals"),
    ("roughness", 2, TexelFormat.BC1, "checker"),
    ("occlusion", 2, TexelFormat.BC1, "terrain"),
)
CASES = ("one", "set", "independent")


@dataclass(frozen=True)
class Scale:
    lead: int  # the lead's side in texels
    screen: tuple[int, int]
    frames: int


def scale(quick: bool) -> Scale:
    return Scale(4096, (960, 540), 90) if quick else Scale(8192, (1920, 1080), 240)


def cache_slots(sc: Scale) -> int:
    """Cache slots per texture: three screens of level-0 tiles with their parents, so that the pan keeps
    streaming (and evicting) instead of ending with the whole texture resident."""
    tiles = (-(-sc.screen[0] / ZOOM // 128) + 1) * (-(-sc.screen[1] / ZOOM // 128) + 1)
    return int(3 * tiles * 4 / 3)


def headers(lead: int) -> list[PackHeader]:
    return [PackHeader(width=lead // d, height=lead // d, texel_format=f, srgb=False) for _, d, f, _ in MEMBERS]


def pan(sc: Scale) -> list[tuple[float, float]]:
    """The screen's top-left corner in lead texels, frame by frame: left to right and back, a row
    lower each pass, a fifth of the screen per frame (new pages every frame, prefetch or not)."""
    w, h = sc.screen[0] / ZOOM, sc.screen[1] / ZOOM
    step = max(w / 5, 256.0)  # at least two level-0 tiles: nothing prefetched covers it all
    xs = np.arange(0, sc.lead - w, step)
    out, row = [], 0
    while len(out) < sc.frames:
        y = (row * max(h / 2, 256.0)) % max(1.0, sc.lead - h)
        out += [(float(x), float(y)) for x in (xs if row % 2 == 0 else xs[::-1])]
        row += 1
    return out[: sc.frames]


def view_pages(sc: Scale, corner: tuple[float, float], frame: int, h: PackHeader) -> tuple[int, np.ndarray, np.ndarray]:
    """(level, x, y) of the page under every feedback-writing fragment for texture `h` (lead texel
    coordinates scaled to its size), as vt.glsl's feedback names them."""
    w, hh = sc.screen
    phase = frame % (STRIDE * STRIDE)
    py, px = np.mgrid[phase // STRIDE : hh : STRIDE, phase % STRIDE : w : STRIDE]
    s = h.width / sc.lead
    tx, ty = (corner[0] + px.ravel() / ZOOM) * s, (corner[1] + py.ravel() / ZOOM) * s
    level = min(h.level_count - 1, max(0, int(np.floor(np.log2(s / ZOOM) + 1e-9))))  # texels a pixel spans
    t = h.tile_size << level
    grid = h.level_table[level]
    x = np.clip((tx // t).astype(np.int64), 0, int(grid["tiles_x"]) - 1)
    y = np.clip((ty // t).astype(np.int64), 0, int(grid["tiles_y"]) - 1)
    return level, x, y


class _Movers:
    """The uploader played on the CPU with arrays: a load ordered at frame N is read and uploaded at
    frame N + 1 (no failures), through the records the real uploader returns."""

    def __init__(self, core: Residency) -> None:
        self.core = core
        z = np.zeros(0, np.int64)
        self.tiles, self.pool, self.slot, self.frame = z, z, z, z
        core.set_loading(lambda ids: np.isin(ids, self.tiles))

    def records(self, m: np.ndarray) -> LoadRecords:
        t = self.tiles[m]
        return LoadRecords(t, self.core.space.tex[t].astype(np.int64), self.pool[m], self.slot[m])

    def uploaded(self, frame: int, slot_bytes: int) -> Uploaded:
        done = self.frame < frame
        out = Uploaded(self.records(done), frame - self.frame[done], int(done.sum()) * slot_bytes)
        self.tiles, self.pool, self.slot, self.frame = (
            a[~done] for a in (self.tiles, self.pool, self.slot, self.frame)
        )
        return out

    def cancel_stale(self, last_wanted: np.ndarray, since: int) -> LoadRecords:
        stale = last_wanted[self.tiles] < since
        out = self.records(stale)
        self.tiles, self.pool, self.slot, self.frame = (
            a[~stale] for a in (self.tiles, self.pool, self.slot, self.frame)
        )
        return out

    def submit(self, frame: int, tiles: np.ndarray, pool: np.ndarray, slots: np.ndarray) -> None:
        self.tiles = np.concatenate([self.tiles, tiles])
        self.pool = np.concatenate([self.pool, pool])
        self.slot = np.concatenate([self.slot, slots])
        self.frame = np.concatenate([self.frame, np.full(tiles.size, frame)])


def _percentiles(values: list[float]) -> dict[str, float]:
    v = np.asarray(values, float) if values else np.zeros(1)
    return {f"p{q}": float(np.percentile(v, q)) for q in (50, 95, 99)}


class _DeciderCase:
    """One case of (a): a residency core with its textures, pools and simulated movers."""

    def __init__(self, sc: Scale, case: str) -> None:
        self.sc = sc
        config = StreamerConfig(budget=BudgetConfig(budget_mb=4096))
        core = self.core = Residency(config, BudgetManager(config.budget), loops=decider_loops())
        hs = self.headers = headers(sc.lead)[: 1 if case == "one" else len(MEMBERS)]
        pools: dict[TexelFormat, int] = {}
        for tex, h in enumerate(hs):
            p = pools.setdefault(h.texel_format, len(pools))
            core.register(tex, h)
            if core.ledgers[p] is None:  # cache_slots() per texture of the pool, besides its pinned tiles
                n = sum(1 for x in hs if x.texel_format is h.texel_format)
                capacity = -(-(n * (cache_slots(sc) + 64)) // 64) * 64
                ledger = SlotLedger(f"pool/{h.texel_format.name}", capacity, config.frames_in_flight, 64)
                geometry = SlotGeometry(slot_size=h.slot_size, slot_bytes=h.tile_raw_size, cells_x=8, cells_y=8)
            else:
                ledger, geometry = core.ledgers[p], core.geometry[p]  # type: ignore[assignment]
            core.attach(tex, h, p, ledger, geometry)  # type: ignore[arg-type]
            ids = core.pinned_level_ids(tex)
            slots, _ = core.reserve_now(tex, ids, pin=True, what=h.texel_format.name)
            core.loaded_now(tex, ids, slots, pinned_levels=True)
        if case == "set":
            core.sets.add(0, list(range(len(hs))), dict(enumerate(hs)))
        self.writers = [0] if case == "set" else list(range(len(hs)))
        self.movers = _Movers(core)
        self.times: dict[str, list[float]] = {"feedback": [], "requests": [], "page_tables": []}
        self.uploads: list[int] = []
        self.entries: list[int] = []

    def frame(self, frame_no: int, corner: tuple[float, float]) -> None:
        core, movers, sc = self.core, self.movers, self.sc
        feedback = [  # uint32 entries, as the draws write them
            np.concatenate(
                [core.space.ids(t, *view_pages(sc, corner, frame_no, self.headers[t])) for t in self.writers]
            ).astype(np.uint32)
        ]
        self.entries.append(int(feedback[0].size))
        frame = core.begin_frame()
        up = movers.uploaded(frame, self.headers[0].tile_raw_size)  # the simulated uploader: not timed
        t0 = time.thread_time()
        core.observe(feedback)
        t1 = time.thread_time()
        core.apply(drained=Drained(LoadRecords.empty(), [], len(up.loads)))
        core.apply(uploaded=up)
        core.tables.take_dirty()  # the ranges update() uploads
        t2 = time.thread_time()
        orders = core.orders(1 << 20, movers.cancel_stale)
        t3 = time.thread_time()
        movers.submit(frame, orders.tiles, orders.pool, orders.cache_slot)
        self.times["feedback"].append((t1 - t0) * 1e3)
        self.times["page_tables"].append((t2 - t1) * 1e3)
        self.times["requests"].append((t3 - t2) * 1e3)
        self.uploads.append(len(up.loads))

    def summary(self) -> dict:
        warm = slice(5, None)  # the first frames load the whole first view
        times = {k: v[warm] for k, v in self.times.items()}
        out: dict = {"textures": len(self.headers), "feedback_entries_p50": float(np.median(self.entries))}
        for name, v in times.items():
            out[name] = _percentiles(v)
        both = [a + b for a, b in zip(times["feedback"], times["page_tables"], strict=True)]
        out["feedback_and_page_tables"] = _percentiles(both)
        out["uploads_per_frame_p50"] = float(np.median(self.uploads[warm]))
        out["frames_streaming"] = float(np.mean(np.asarray(self.uploads[warm]) > 0))
        return out


def deciders(sc: Scale) -> dict[str, dict]:
    """(a) for every case, frame by frame in turn (a load on the machine hits every case alike)."""
    cases = {case: _DeciderCase(sc, case) for case in CASES}
    for frame_no, corner in enumerate(pan(sc)):
        for c in cases.values():
            c.frame(frame_no, corner)
    return {case: c.summary() for case, c in cases.items()}


def _bake(folder: Path, lead: int) -> list[Path]:
    from ..bake.pipeline import bake_procedural

    out = []
    for i, (name, d, fmt, pattern) in enumerate(MEMBERS):
        path = folder / f"{name}-{lead // d}.tpk"
        bake_procedural(path, lead // d, pattern, i + 1, BakeConfig(texel_format=fmt, srgb=False, progress=False))
        out.append(path)
    return out


def streamer_updates(ctx: moderngl.Context, sc: Scale, packs: list[Path], case: str) -> dict:
    """(b): `update()` in full for one case, the feedback written by the CPU."""
    from ..runtime.streamer import Streamer

    cfg = StreamerConfig(budget=BudgetConfig(budget_mb=512), io_threads=2, ring_mb=16)
    wall, cpu, uploads = [], [], []
    with Streamer(ctx, cfg) as s:
        if case == "set":
            tset = s.open_set({m[0]: p for m, p in zip(MEMBERS, packs, strict=True)})
            textures, writers = list(tset.members.values()), [tset[tset.lead]]
        else:
            textures = [s.open(p) for p in packs[: 1 if case == "one" else len(packs)]]
            writers = textures
        # the cache of `deciders`: cache_slots() per texture, whatever else the budget holds
        fixed = sum(v for k, v in s.budget.breakdown().items() if not k.startswith("pool/"))
        pinned = sum(p.ledger.pinned_count * p.geometry.slot_bytes for p in s.pools.values())
        s.set_budget((fixed + pinned + sum(cache_slots(sc) * vt.header.tile_raw_size for vt in textures)) / 2**20)
        throttle = s.throttle(2)
        for frame_no, corner in enumerate(pan(sc)):
            st = s.update()
            wall.append(st.update_ms)
            cpu.append(st.update_cpu_ms)
            uploads.append(st.uploads)
            ids = [vt.table.ids(*view_pages(sc, corner, frame_no, vt.header)) for vt in writers]
            s.inject_feedback(np.concatenate(ids))
            throttle.frame_done()
        throttle.release()
        n = len(textures)
    warm = slice(5, None)
    return {
        "textures": n,
        "update_ms": _percentiles(wall[warm]),
        "update_cpu_ms": _percentiles(cpu[warm]),
        "uploads_per_frame_p50": float(np.median(uploads[warm])),
    }


def run_sets_bench(quick: bool = False, json_path: str | None = None) -> dict:
    """Run (a) and (b) for every case; print a table; write JSON to `json_path` if given."""
    sc = scale(quick)
    result: dict = {"bench": "sets", "quick": quick, "lead": sc.lead, "screen": list(sc.screen), "frames": sc.frames}
    result["cpu_count"] = os.cpu_count()
    result["deciders"] = deciders(sc)
    from ..gl.context import headless_context

    ctx = headless_context()
    try:
        result["gl_renderer"] = ctx.info.get("GL_RENDERER", "?")
        with tempfile.TemporaryDirectory(prefix="texstream-bench-") as tmp:
            t0 = time.perf_counter()
            packs = _bake(Path(tmp), sc.lead // 2)  # (b) at half the size: baking the full size takes minutes
            result["bake_seconds"] = time.perf_counter() - t0
            half = Scale(sc.lead // 2, (sc.screen[0] // 2, sc.screen[1] // 2), sc.frames)  # the same pan, halved
            result["update"] = {case: streamer_updates(ctx, half, packs, case) for case in CASES}
    finally:
        ctx.release()
    d, u = result["deciders"], result["update"]
    result["ratios"] = {
        f"{case}_vs_one": {
            "feedback_and_page_tables_p50": d[case]["feedback_and_page_tables"]["p50"]
            / d["one"]["feedback_and_page_tables"]["p50"],
            "requests_p50": d[case]["requests"]["p50"] / d["one"]["requests"]["p50"],
            "update_cpu_p50": u[case]["update_cpu_ms"]["p50"] / u["one"]["update_cpu_ms"]["p50"],
        }
        for case in ("set", "independent")
    }
    print_sets(result)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result


def print_sets(r: dict) -> None:
    quick = " (quick)" if r["quick"] else ""
    w, h = r["screen"]
    print(
        f"texstream bench sets{quick}: a {r['lead']}² lead, {w}x{h} screen, {r['frames']} frames, {r['cpu_count']} CPUs"
    )
    print("  (a) deciders, ms per frame p50 / p95 / p99")
    head = f"    {'case':<12} {'feedback':>22} {'page tables':>22} {'fb + pages':>22} {'requests':>22} entries uploads"
    print(head)
    for case in CASES:
        c = r["deciders"][case]
        cols = [
            " / ".join(f"{c[k][p]:.3f}" for p in ("p50", "p95", "p99"))
            for k in ("feedback", "page_tables", "feedback_and_page_tables", "requests")
        ]
        print(
            f"    {case:<12} {cols[0]:>22} {cols[1]:>22} {cols[2]:>22} {cols[3]:>22} "
            f"{c['feedback_entries_p50']:>7.0f} {c['uploads_per_frame_p50']:>7.0f}"
        )
    print(
        f"  (b) update() at a {r['lead'] // 2}² lead and a {w // 2}x{h // 2} screen (packs baked in "
        f"{r['bake_seconds']:.1f} s), ms p50 / p95 / p99"
    )
    for case in CASES:
        c = r["update"][case]
        wall = " / ".join(f"{c['update_ms'][p]:.2f}" for p in ("p50", "p95", "p99"))
        cpu = " / ".join(f"{c['update_cpu_ms'][p]:.2f}" for p in ("p50", "p95", "p99"))
        print(f"    {case:<12} wall {wall:>22}  CPU {cpu:>22}  uploads/frame {c['uploads_per_frame_p50']:.0f}")
    for k, v in r["ratios"].items():
        print(
            f"  {k}: feedback + page tables {v['feedback_and_page_tables_p50']:.2f}x, requests "
            f"{v['requests_p50']:.2f}x, update() CPU {v['update_cpu_p50']:.2f}x (target for the set: <= 1.1x)"
        )
