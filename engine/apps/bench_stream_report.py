"""`texstream bench stream`'s printed table: each measure of the result dict, its value, what it means."""

from __future__ import annotations


def print_stream(r: dict) -> None:
    """The results as a table: measure, value, what it means."""
    up, upy, e2e, epy, sb = (
        r[k] for k in ("upload_ceiling", "upload_ceiling_python", "end_to_end", "end_to_end_python", "streamer_bound")
    )
    pt, cp, sct, scp = r["upload_per_tile"], r["copy_bandwidth"], r["scene_update_timed"], r["scene_update_paced"]
    spy = r["scene_update_python_io"]
    sc, sc2, cuts, ratio = r["scene_update"], r["scene_update_again"], r["camera_cuts"], r["ratios"]
    paced = r["camera_cuts_60hz"]
    quick = " (quick)" if r["quick"] else ""
    print(f"texstream bench stream{quick} on {r['gl_renderer']} ({r['gl_version']}), {r['cpu_count']} CPUs")
    fw, fh = e2e["frame_size"]
    sw, sh = sc["frame_size"]
    host, dev = r["upload_ceiling_host_ring"], r.get("upload_ceiling_device")
    stt = r.get("upload_ceiling_staging_texture")
    stx = r.get("upload_candidate_upload_fill", {})
    rows = [
        (
            "(a) upload ceiling",
            f"{up['tiles_per_s']:,.0f} tiles/s",
            f"{up['gb_per_s']:.2f} GB/s, {up['path']} path, runs of layers ({up['tiles'] / max(1, up['calls']):.0f} "
            f"tiles a call, copies counted), {up['loop']} loop, batches of {up['batch']}, fenced + finished, best of "
            f"two; the streamer's AUTO picks {r['upload_path_auto']}",
        ),
        (
            "    host ring",
            f"{host['tiles_per_s']:,.0f} tiles/s",
            f"{host['gb_per_s']:.2f} GB/s, runs straight from the persistent-mapped ring; CPU issuing "
            f"{host['issue_cpu_us_per_tile']:.2f} us a tile ({host['cpu_us_per_tile']:.2f} with polls, "
            f"{host['gpu_waits']} polls found the GPU behind); Python loop {upy['tiles_per_s']:,.0f} tiles/s",
        ),
        (
            "    device buffer",
            f"{dev['tiles_per_s']:,.0f} tiles/s" if dev else "n/a",
            (
                f"{dev['gb_per_s']:.2f} GB/s, one buffer copy a batch into video memory, runs from there; "
                f"{ratio['device_vs_host_ring']:.2f} x the host ring; CPU issuing "
                f"{dev['issue_cpu_us_per_tile']:.2f} us a tile ({dev['cpu_us_per_tile']:.2f} with polls, "
                f"{dev['gpu_waits']} polls found the GPU behind)"
            )
            if dev
            else "no buffer storage on this context",
        ),
        (
            "    staging texture",
            f"{stt['tiles_per_s']:,.0f} tiles/s" if stt else "n/a",
            (
                f"{stt['gb_per_s']:.2f} GB/s, one compute dispatch a ring span stores the blocks into an RG32UI "
                f"array, one glCopyImageSubData a run; {ratio['staging_texture_vs_host_ring']:.2f} x the host ring; "
                f"CPU issuing {stt['issue_cpu_us_per_tile']:.2f} us a tile ({stt['gpu_waits']} polls found the GPU "
                "behind)"
            )
            if stt
            else "needs buffer storage and GL 4.3 compute shaders, which this context lacks",
        ),
        (
            "    staging, upload fill",
            f"{stx['tiles_per_s']:,.0f} tiles/s" if "tiles_per_s" in stx else "failed",
            (
                f"{stx['gb_per_s']:.2f} GB/s, a candidate (not an engine path): the same array filled by one "
                f"glTexSubImage3D a ring span; {stx['tiles_per_s'] / host['tiles_per_s']:.2f} x the host ring"
            )
            if "tiles_per_s" in stx
            else stx.get("error", "not measured"),
        ),
        (
            "    per tile (old path)",
            f"{pt['tiles_per_s']:,.0f} tiles/s",
            f"{pt['gb_per_s']:.2f} GB/s, one call a tile; runs are {ratio['runs_vs_per_tile']:.2f} x this; CPU "
            f"{pt['cpu_us_per_tile']:.2f} us a tile",
        ),
        (
            "    host -> device copy",
            f"{cp['bc1_tiles_per_s']:,.0f} tiles/s",
            f"{cp['gb_per_s']:.2f} GB/s glCopyBufferSubData of the whole ring (the bus: the physical limit); "
            f"(a) is {ratio['ceiling_vs_copy']:.3f} x this",
        ),
        (
            "(b) end to end, drawn",
            f"{e2e['tiles_per_s']:,.0f} tiles/s",
            f"{ratio['end_to_end_vs_ceiling']:.3f} x (a), {e2e['upload_path']} path; {e2e['tiles']} tiles in "
            f"{e2e['frames']} frames at {fw}x{fh} "
            f"({e2e['fps']:.0f} fps), compiled I/O {e2e['compiled']}, {e2e['io_threads']} I/O threads; "
            f"render-thread CPU {e2e['update_cpu_us_per_tile']:.1f} us per uploaded tile (upload step "
            f"{e2e['upload_cpu_us_per_tile']:.1f})",
        ),
        *(
            (
                f"    {other['upload_path']}",
                f"{other['tiles_per_s']:,.0f} tiles/s",
                f"{other['tiles_per_s'] / up['tiles_per_s']:.3f} x (a): the same pan on a path AUTO did not pick; "
                f"CPU {other['update_cpu_us_per_tile']:.1f} us per uploaded tile",
            )
            for other in r.get("end_to_end_other_paths", {}).values()
        ),
        (
            "    pure Python I/O",
            f"{epy['tiles_per_s']:,.0f} tiles/s",
            f"{ratio['end_to_end_python_vs_ceiling']:.3f} x (a): the same pan with the Python loops",
        ),
        (
            "    drawing alone",
            f"{r['drawn_resident']['fps']:.0f} fps",
            f"the same plane over resident windows ({r['drawn_resident']['uploads']} uploads; the draw's GPU time "
            f"{r['drawn_resident']['draw_gpu_ms_p50']:.2f} ms p50): at (b)'s tiles a "
            f"frame, {r['drawn_resident']['tiles_per_s_at_e2e_tiles_a_frame']:,.0f} tiles/s; (b) is "
            f"{ratio['end_to_end_vs_drawing']:.3f} x this bound",
        ),
        (
            "(b') streamer-bound",
            f"{sb['tiles_per_s']:,.0f} tiles/s",
            f"{ratio['streamer_bound_vs_ceiling']:.3f} x (a); {sb['window']}^2 windows of CPU-written feedback, "
            f"{sb['fps']:.0f} updates/s",
        ),
        (
            "(c) update(), 3 textures",
            f"{sc['update_ms_p50']:.2f} ms p50",
            f"p95 {sc['update_ms_p95']:.2f}, p99 {sc['update_ms_p99']:.2f}, max after 1 s "
            f"{sc['update_ms_max_after_1s']:.2f} ms; CPU p50 {sc['update_cpu_ms_p50']:.2f}; {sw}x{sh} flythrough, "
            f"{sc['frames']} frames, {sc['frames_with_uploads']:.0%} with uploads; {sc['gc']['collections']} GC "
            f"pauses, max {sc['gc']['max_ms']:.1f} ms",
        ),
        (
            "    frames that stream",
            f"{sc['streaming_update_ms']['p50']:.2f} ms p50",
            f"p95 {sc['streaming_update_ms']['p95']:.2f}, p99 {sc['streaming_update_ms']['p99']:.2f}, max "
            f"{sc['streaming_update_ms']['max']:.2f} ms over {sc['streaming_frames']} frames that upload or request",
        ),
        (
            "    phases, mean ms",
            "streaming | idle",
            " ".join(
                f"{k.removesuffix('_ms')} {sc['phases_ms']['streaming'][k]:.3f}|{sc['phases_ms']['idle'][k]:.3f}"
                for k in sc["phases_ms"]["streaming"]
            ),
        ),
        (
            "    Python I/O threads",
            f"{spy['update_ms_p50']:.2f} ms p50",
            f"p95 {spy['update_ms_p95']:.2f}, p99 {spy['update_ms_p99']:.2f}, max after 1 s "
            f"{spy['update_ms_max_after_1s']:.2f} ms; CPU p50 {spy['update_cpu_ms_p50']:.2f}; the compiled readers "
            f"off (a no-op read hook), run between (c) and again; their p95 are "
            f"{sc['update_ms_p95'] / spy['update_ms_p95']:.2f} and "
            f"{sc2['update_ms_p95'] / spy['update_ms_p95']:.2f} x this",
        ),
        (
            "    again",
            f"{sc2['update_ms_p50']:.2f} ms p50",
            f"p95 {sc2['update_ms_p95']:.2f}, p99 {sc2['update_ms_p99']:.2f}, max after 1 s "
            f"{sc2['update_ms_max_after_1s']:.2f} ms; CPU p50 {sc2['update_cpu_ms_p50']:.2f}; "
            f"GC max {sc2['gc']['max_ms']:.1f} ms",
        ),
        (
            f"    {sct['upload_time_budget_ms']:g} ms upload budget",
            f"{sct['update_ms_p50']:.2f} ms p50",
            f"p95 {sct['update_ms_p95']:.2f}, p99 {sct['update_ms_p99']:.2f}, max after 1 s "
            f"{sct['update_ms_max_after_1s']:.2f} ms; CPU p50 {sct['update_cpu_ms_p50']:.2f}; "
            f"upload_time_budget_ms={sct['upload_time_budget_ms']:g}",
        ),
        (
            f"    paced at {scp['paced_fps']:g} Hz",
            f"{scp['update_ms_p50']:.2f} ms p50",
            f"p95 {scp['update_ms_p95']:.2f}, p99 {scp['update_ms_p99']:.2f}, max after 1 s "
            f"{scp['update_ms_max_after_1s']:.2f} ms; CPU p50 {scp['update_cpu_ms_p50']:.2f}; each frame on the "
            "next tick, as a vsynced loop (the CPU idles between frames)",
        ),
        (
            "(d) latency",
            f"{e2e['latency_frames_p50']:.0f} / {e2e['latency_frames_p95']:.0f} frames",
            f"p50 / p95 from submission to upload, {e2e['latency_samples']} tiles of (b)",
        ),
        (
            "(e) camera cuts",
            f"{cuts['p95']:.0f} frames p95",
            f"mean {cuts['mean']:.1f}, p50 {cuts['p50']:.0f}, max {cuts['max']} frames until nothing wanted is "
            f"missing, {cuts['cuts']} cuts, "
            f"as fast as the GPU goes (2 frames queued); missing nothing for the rest of the hold: "
            f"{_settled(cuts)}",
        ),
        (
            "    paced at 60 Hz",
            f"{paced['p95']:.0f} frames p95",
            f"p50 {paced['p50']:.0f}, max {paced['max']}: the same cuts in a vsynced-like loop; "
            f"settled {_settled(paced)}",
        ),
    ]
    told = r.get("camera_cuts_60hz_announced")
    if told:
        rows.append(
            (
                "    paced, cuts announced",
                f"{told['p95']:.0f} frames p95",
                f"p50 {told['p50']:.0f}, max {told['max']}: Streamer.camera_cut() before each; "
                f"settled {_settled(told)}",
            )
        )
    width = max(len(a) for a, _, _ in rows)
    for a, b, c in rows:
        print(f"  {a:<{width}}  {b:>18}  {c}".rstrip())


def _settled(cuts: dict) -> str:
    st = cuts.get("settled")
    return f"mean {st['mean']:.1f}, p95 {st['p95']:.0f}, max {st['max']}" if st else "-"
