"""What the engine holds on the GPU: `memory_stats` (a dict) and `memory_summary` (a readable table).

In the spirit of ``torch.cuda.memory_summary()``: every allocation registered with the budget, per
cache pool (format, slot size, slot occupancy), per virtual texture (size, format, resident tiles per
level, page-table bytes), the staging ring and the feedback buffers, and the totals against the
budget. The rows add up to ``streamer.budget.usage`` exactly (any allocation name the table does not
know is listed as "other", never dropped).

Both take the streamer as their only argument, so they can serve as a method::

    Streamer.memory_summary = texstream.telemetry.memory_summary   # streamer.memory_summary()
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..runtime.budget import BudgetManager
from ..runtime.frame_stats import FeedbackInfo, IOStatus
from ..runtime.pools import CachePool, PoolKey
from ..runtime.texture import VirtualTexture
from ..units import MIB


class MemorySource(Protocol):
    """What the memory report reads: a streamer's public views (no import of the streamer itself)."""

    budget: BudgetManager

    @property
    def pools(self) -> dict[PoolKey, CachePool]: ...

    @property
    def textures(self) -> list[VirtualTexture]: ...

    def io_status(self) -> IOStatus: ...

    def feedback_info(self) -> FeedbackInfo: ...


__all__ = ["memory_stats", "memory_summary"]


def memory_stats(streamer: MemorySource) -> dict[str, Any]:
    """GPU memory the engine holds, as plain data (bytes); see `memory_summary` for the table."""
    budget = streamer.budget
    breakdown = budget.breakdown()
    claimed: set[str] = set()
    pools = []
    for pool in streamer.pools.values():
        fmt, srgb, _size = pool.key
        g = pool.geometry
        nbytes = breakdown.get(pool.name, pool.bytes_on_gpu)
        claimed.add(pool.name)
        pools.append(
            {
                "name": pool.name,
                "format": fmt.name.lower() + ("-srgb" if srgb else ""),
                "slot_size": g.slot_size,
                "slot_bytes": g.slot_bytes,
                "layers": pool.layers,
                "slots_per_layer": g.cells,
                "capacity": pool.capacity,
                "used": pool.ledger.used_count,
                "resident": pool.ledger.resident_count,
                "pinned": pool.ledger.pinned_count,
                "free": pool.ledger.free_count,
                "textures": list(pool.textures),
                "unit": pool.unit,
                "bytes": int(nbytes),
            }
        )
    textures = []
    # One storage buffer holds every page table: each texture's share is its entries; the rest of the
    # buffer (room for textures to come) is listed under "other".
    page_total = breakdown.get("page-tables", 0)
    page_shares = 0
    for vt in streamer.textures:
        h, table = vt.header, vt.table
        nbytes = table.bytes_on_gpu
        page_shares += nbytes
        levels = table.resident_tiles()[0]
        resident = np.bincount(levels.astype(np.int64), minlength=table.level_count)[: table.level_count]
        textures.append(
            {
                "id": vt.id,
                "path": str(vt.path),
                "width": h.width,
                "height": h.height,
                "format": h.texel_format.name.lower() + ("-srgb" if h.srgb else ""),
                "tile_size": h.tile_size,
                "levels": table.level_count,
                "pool": vt.pool.name,
                "resident_by_level": resident.astype(int).tolist(),
                "tiles_by_level": (table.tiles_x * table.tiles_y).astype(int).tolist(),
                "corrupt_tiles": vt.corrupt_tiles,
                "page_table_bytes": int(nbytes),
            }
        )
    claimed.add("page-tables")
    rs_now = streamer.io_status().ring
    other: dict[str, Any] = {}
    if page_total > page_shares:
        other["page-tables"] = {
            "bytes": page_total - page_shares,
            "detail": "page-table buffer room beyond the open textures",
        }
    if "staging-ring" in breakdown:
        claimed.add("staging-ring")
        rs = rs_now
        other["staging-ring"] = {
            "bytes": breakdown["staging-ring"],
            "detail": (
                f"{rs.slot_count} slots x {rs.slot_bytes} B, "
                f"{'persistent-mapped' if rs.persistent else 'orphaned'}, {rs.occupancy:.0%} busy"
            )
            if rs is not None
            else "",
        }
    if "feedback" in breakdown:
        claimed.add("feedback")
        fb = streamer.feedback_info()
        other["feedback"] = {
            "bytes": breakdown["feedback"],
            "detail": f"{fb.depth} buffers x {fb.nbytes_each} B (screen / {fb.stride})",
        }
    device = streamer.io_status().device_staging
    if "staging-device" in breakdown and device is not None:
        claimed.add("staging-device")
        other["staging-device"] = {
            "bytes": breakdown["staging-device"],
            "detail": f"{device.slot_count} slots, device-local: uploads read it after one copy a frame",
        }
    staged = streamer.io_status().texture_staging
    if "staging-device" in breakdown and staged is not None:
        claimed.add("staging-device")
        made = ", ".join(f"{n} layers of {slot}-texel tiles ({block}-byte blocks)" for block, slot, n in staged.arrays)
        other["staging-device"] = {
            "bytes": breakdown["staging-device"],
            "detail": f"staging textures, {staged.nbytes} B made: {made or 'none yet'}",
        }
    for name, nbytes in breakdown.items():
        if name not in claimed:
            other[name] = {"bytes": nbytes, "detail": ""}
    total = sum(p["bytes"] for p in pools) + sum(t["page_table_bytes"] for t in textures)
    total += sum(o["bytes"] for o in other.values())
    return {
        "pools": pools,
        "textures": textures,
        "other": other,
        "total_bytes": int(total),
        "usage_bytes": int(budget.usage),
        "budget_bytes": int(budget.budget),
        "headroom_bytes": int(budget.budget - budget.usage),
        "peak_bytes": int(budget.peak),
        "budget_source": budget.source,
        "mip_bias": float(budget.bias),
    }


def _mib(nbytes: float) -> str:
    """Bytes in the largest binary unit that keeps the figure >= 1, two decimals (bytes exact)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:10.2f} {unit}"
    return f"{int(nbytes):10d} B  "


def _levels(resident: list[int], tiles: list[int]) -> str:
    return " ".join(f"L{i}:{r}/{t}" for i, (r, t) in enumerate(zip(resident, tiles, strict=True)))


def memory_summary(streamer: MemorySource) -> str:
    """A readable table of the engine's GPU memory: pools, textures, ring, feedback, totals vs budget."""
    m = memory_stats(streamer)
    width = 100
    bar = "=" * width
    rule = "-" * width
    out = [bar, f"{'texstream GPU memory summary':^{width}}", bar]
    out.append(f"{'Cache pools':<40}{'slots cap/used/res/pin':>26}{'bytes':>34}")
    out.append(rule)
    for p in m["pools"]:
        occupancy = f"{p['capacity']}/{p['used']}/{p['resident']}/{p['pinned']}"
        out.append(f"{p['name']:<40}{occupancy:>26}{_mib(p['bytes']):>34}")
        out.append(
            f"    format {p['format']}, slot {p['slot_size']} texels = {p['slot_bytes']} B, "
            f"{p['layers']} layers x {p['slots_per_layer']} slots, textures {p['textures']}"
        )
    if not m["pools"]:
        out.append("    (none)")
    out.append(rule)
    out.append(f"{'Virtual textures':<66}{'page table':>34}")
    out.append(rule)
    for t in m["textures"]:
        head = f"[{t['id']}] {t['path']}"
        if len(head) > 64:
            head = "[" + str(t["id"]) + "] ..." + t["path"][-(64 - 6 - len(str(t["id"]))) :]
        out.append(f"{head:<66}{_mib(t['page_table_bytes']):>34}")
        out.append(
            f"    {t['width']}x{t['height']} {t['format']}, tile {t['tile_size']}, {t['levels']} levels, "
            f"{t['pool']}, corrupt {t['corrupt_tiles']}"
        )
        out.append(f"    resident {_levels(t['resident_by_level'], t['tiles_by_level'])}")
    if not m["textures"]:
        out.append("    (none)")
    out.append(rule)
    out.append("Other allocations")
    out.append(rule)
    for name, o in m["other"].items():
        out.append(f"{name:<20}{o['detail']:<46}{_mib(o['bytes']):>34}")
    if not m["other"]:
        out.append("    (none)")
    out.append(bar)
    b = m["budget_bytes"]
    pct = (lambda v: f"{100.0 * v / b:6.1f}%") if b else (lambda v: "      -")
    out.append(f"{'Total held':<46}{pct(m['total_bytes']):>20}{_mib(m['total_bytes']):>34}")
    if m["total_bytes"] != m["usage_bytes"]:
        out.append(f"{'  budget manager reports':<66}{_mib(m['usage_bytes']):>34}")
    out.append(f"{'Peak held':<46}{pct(m['peak_bytes']):>20}{_mib(m['peak_bytes']):>34}")
    out.append(f"{'Budget (' + m['budget_source'] + ')':<66}{_mib(b):>34}")
    out.append(f"{'Headroom':<46}{pct(m['headroom_bytes']):>20}{_mib(m['headroom_bytes']):>34}")
    out.append(f"{'Mip bias':<66}{m['mip_bias']:>30.2f} lvl")
    out.append(f"Total held = {m['total_bytes']} bytes of a {b}-byte budget")
    out.append(bar)
    return "\n".join(out)
