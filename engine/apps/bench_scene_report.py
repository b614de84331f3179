"""`texstream bench scene`'s printed tables: per path, convergence after cuts, naive vs texstream."""

from __future__ import annotations

from ..units import MIB


def _mib(n: float) -> str:
    return f"{n / MIB:.1f}"


def _f(v: float | None, fmt: str = ".0f") -> str:
    return "-" if v is None else format(v, fmt)


def print_scene(r: dict) -> None:
    """The results as tables: per path, convergence after cuts, naive vs texstream."""
    quick = " (quick)" if r["quick"] else ""
    fw, fh = r["frame_size"]
    up = r["upload_ceiling"]
    a, n = r["packs"]["albedo"], r["packs"]["normals"]
    print(
        f"texstream bench scene{quick} on {r['gl_renderer']} ({r['gl_version']}), {r['cpu_count']} CPUs; "
        f"{fw}x{fh}, fixed dt 1/60 s"
    )
    print(
        f"  terrain {a['size'][0]}^2 {a['format']} t{a['tile']} ({a['tiles']} tiles) + normals {n['size'][0]}^2 "
        f"{n['format']} t{n['tile']} ({n['tiles']} tiles); ready in {r['packs_seconds']:.1f} s"
    )
    print(
        f"  upload ceiling: {up['tiles_per_s']:,.0f} tiles/s = {up['mb_per_s']:,.0f} MB/s ({up['tiles']} "
        f"{up['format']} {up['slot']}^2 tiles, batches of {up['batch']}, fenced + finished)"
    )
    head = (
        f"  {'path':<15}{'frames':>7}{'budget':>8}{'peak':>7}{'uploads':>8}{'tiles/s':>8}{'MB/s':>7}"
        f"{'peak':>7}{'x ceil':>7}{'update p50/95':>15}{'cpu p50/95':>12}{'latency 50/95/99':>17}"
        f"{'refetch':>8}{'bias':>5}{'fps':>6}"
    )
    print(head)
    print(
        f"  {'':<15}{'':>7}{'MiB':>8}{'MiB':>7}{'':>8}{'60 fps':>8}{'60fps':>7}{'MB/s':>7}{'peak':>7}"
        f"{'ms':>15}{'ms':>12}{'frames':>17}{'<=30f':>8}{'max':>5}{'wall':>6}"
    )
    for name, p in r["paths"].items():
        lat = f"{_f(p['latency_p50_frames'])}/{_f(p['latency_p95_frames'])}/{_f(p['latency_p99_frames'])}"
        print(
            f"  {name:<15}{p['frames']:>7}{_mib(p['budget_bytes']):>8}{_mib(p['vram_peak_bytes']):>7}"
            f"{p['uploads']:>8}{p['tiles_per_s']:>8.0f}{p['mb_per_s']:>7.2f}{p['mb_per_s_peak']:>7.2f}"
            f"{p['ceiling_fraction_peak']:>7.3f}"
            f"{p['update_ms_p50']:>8.1f}/{p['update_ms_p95']:<6.1f}{p['update_cpu_ms_p50']:>5.1f}/"
            f"{p['update_cpu_ms_p95']:<6.1f}{lat:>17}{p['refetches']:>8}{p['max_mip_bias']:>5.2f}"
            f"{p['fps_wall']:>6.0f}"
        )
    o = r["paths"]["oversubscribed"]
    print(
        f"  oversubscribed: working set {o['working_set_tiles']} tiles (peak of {o['working_set_samples']} poses, "
        f"all-resident reference) vs unpinned slots {o['cache_slots']}: most loaded pool "
        f"{o['oversubscription']:.2f}x"
    )
    print(
        "  update: wall ms; cpu: the render thread's CPU ms in update() (no driver or GIL waits); "
        "x ceil: peak 60 fps MB/s / ceiling MB/s"
    )
    rc = r["paths"]["region_cuts"]
    conv = ", ".join(
        f"{c['cut_time_s']:.0f}s: {_f(c['frames_to_converge'])} ({_f(c['psnr_first_db'], '.1f')} dB first)"
        for c in rc.get("cuts", [])
    )
    print(f"  region_cuts, frames to >= {r['converged_db']:.0f} dB vs all-resident after each cut: {conv}")
    print(
        f"  region_cuts, frames until the feedback drawn after a cut finds nothing missing: "
        f"{[c['settle_frames'] for c in rc.get('cuts', [])]} (mean {_f(rc.get('settle_frames_mean'), '.1f')}, "
        f"p95 {_f(rc.get('settle_frames_p95'), '.1f')}, max {_f(rc.get('settle_frames_max'))})"
    )
    print("  update() ms on streaming frames (p50/p95/p99/max), and mean ms per phase (streaming | idle):")
    for name, p in r["paths"].items():
        u = p["streaming_update_ms"]
        spread = "/".join(_f(u[k], ".2f") for k in ("p50", "p95", "p99", "max"))
        ph = p["phases_ms"]
        cells = " ".join(
            f"{k.removesuffix('_ms')} {ph['streaming'][k]:.2f}|{ph['idle'][k]:.2f}" for k in ph["streaming"]
        )
        print(f"    {name:<15}{p['streaming_frames']:>5} frames {spread:<24} {cells}")
    ages = ", ".join(
        f"{n} {p['feedback_age_p50']:.0f}/{p['feedback_age_p95']:.0f} "
        f"({p['compacted_frames']} of {p['frames']} compacted)"
        for n, p in r["paths"].items()
    )
    print(f"  feedback age p50/p95 frames (frames whose feedback was compacted on the GPU): {ages}")
    c = r["naive_comparison"]
    nv, ts = c["naive"], c["texstream"]
    print(f"  naive vs texstream on the same {c['size']}^2 image (flythrough, {nv['frames']} frames):")
    print(
        f"    naive (Pillow PNG + mipmapped RGBA8 texture): first frame {nv['first_frame_s']:.2f} s "
        f"(load {nv['load_s']:.2f}, upload {nv['upload_s']:.2f}, mipmaps {nv['mipmaps_s']:.2f}), "
        f"VRAM {_mib(nv['vram_bytes'])} MiB, frame {nv['frame_ms_mean']:.2f} ms with 4x anisotropy "
        f"({nv['frame_ms_mean_trilinear']:.2f} ms trilinear only)"
    )
    settle = "never" if ts["settle_s"] is None else f"{ts['settle_s']:.2f} s ({ts['settle_frames']} frames)"
    print(
        f"    texstream: first frame {ts['first_frame_s']:.2f} s, fully resident at {settle}, VRAM peak "
        f"{_mib(ts['vram_peak_bytes'])} of {_mib(ts['budget_bytes'])} MiB, "
        f"frame {ts['frame_ms_mean']:.2f} ms"
    )
    tried = [t for t in c["attempts"] if t["error"]]
    if tried:
        print(f"    larger sizes tried: {tried}")
    print(f"  {r['seconds']:.0f} s in all")
