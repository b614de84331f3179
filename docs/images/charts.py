"""Benchmark charts for the docs, drawn as SVG from the JSON that `texstream bench stream --json` writes.

    python docs/images/charts.py                 # redraw the charts from docs/images/bench-stream.json
    python docs/images/charts.py --record        # run `texstream bench stream --quick` first, then draw
    python docs/images/charts.py --label B.json  # store a run made by hand (texstream bench stream --json B.json)
    python docs/images/charts.py --json FILE     # draw from another run's JSON (e.g. a full, non-quick one)

`--record` and `--label` store the bench's own JSON with a "recorded" block added (date, commit, machine, the
command), so the committed charts always say where their numbers come from. The SVG is written
directly (no plotting library): three small charts do not need one.

Charts (into the folder of the JSON file):

- ``chart-stream-throughput.svg``: tiles per second of the streaming paths against the upload
  ceiling measured in the same run;
- ``chart-update-time.svg``: ``update()`` time, median and 95th percentile, per scenario;
- ``chart-camera-cuts.svg``: frames until a view is complete after a camera cut.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from html import escape
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_JSON = HERE / "bench-stream.json"
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
INK, MUTED, GRID = "#1f2328", "#57606a", "#d0d7de"
BLUE, ORANGE, GREEN, GREY = "#3b82f6", "#f59e0b", "#22c55e", "#9ca3af"
WIDTH = 760


class Chart:
    """One SVG chart: a title, a subtitle naming the run, horizontal bars in rows."""

    def __init__(self, title: str, subtitle: str, rows: int, *, legend: list[tuple[str, str]] | None = None) -> None:
        self.title, self.subtitle, self.legend = title, subtitle, legend or []
        self.left, self.right, self.top, self.row_h = 200, 150, 78 + (22 if legend else 0), 34
        self.height = self.top + rows * self.row_h + 56
        self.parts: list[str] = []

    def text(self, x: float, y: float, s: str, *, size: float = 13, anchor: str = "start", colour: str = INK,
             weight: str = "400") -> None:  # fmt: skip
        self.parts.append(
            f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{colour}" '
            f'font-weight="{weight}">{escape(s)}</text>'
        )

    def bars(self, labels: list[str], series: list[list[float | None]], colours: list[str], unit: str,
             notes: list[str] | None = None) -> None:  # fmt: skip
        """`series[k][i]`: the k-th bar of row i (bars of a row stacked thin, one under another)."""
        top = max((v for s in series for v in s if v is not None), default=1.0) or 1.0
        scale = (WIDTH - self.left - self.right) / top
        axis = self.height - 48
        for tick in nice_ticks(top):
            x = self.left + tick * scale
            self.parts.append(f'<line x1="{x:.1f}" y1="{self.top - 6}" x2="{x:.1f}" y2="{axis}" stroke="{GRID}"/>')
            self.text(x, axis + 16, fmt(tick) if tick >= 1000 else f"{tick:g}", size=11, anchor="middle", colour=MUTED)
        self.text(self.left + (WIDTH - self.left - self.right) / 2, axis + 34, unit, size=12, anchor="middle")
        bar_h = (self.row_h - 10) / len(series)
        for i, label in enumerate(labels):
            y = self.top + i * self.row_h
            self.text(self.left - 10, y + self.row_h / 2 + 4, label, anchor="end")
            for k, values in enumerate(series):
                v = values[i]
                if v is None:
                    continue
                by = y + 4 + k * bar_h
                self.parts.append(
                    f'<rect x="{self.left}" y="{by:.1f}" width="{max(v * scale, 1):.1f}" height="{bar_h - 2:.1f}" '
                    f'rx="3" fill="{colours[k]}"/>'
                )
                note = f"  ({notes[i]})" if notes and notes[i] and k == 0 else ""
                self.text(self.left + v * scale + 6, by + bar_h / 2 + 3, fmt(v) + note, size=11, colour=MUTED)

    def svg(self) -> str:
        head = [
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {self.height}" width="100%" '
            f'style="max-width:{WIDTH}px;height:auto" font-family="{FONT}" role="img" '
            f'aria-label="{escape(self.title)}">',
            f"<title>{escape(self.title)}</title>",
            f'<rect width="{WIDTH}" height="{self.height}" rx="10" fill="#ffffff"/>',
        ]
        title = [
            f'<text x="20" y="30" font-size="17" font-weight="600" fill="{INK}">{escape(self.title)}</text>',
            f'<text x="20" y="52" font-size="12" fill="{MUTED}">{escape(self.subtitle)}</text>',
        ]
        x = 20
        for name, colour in self.legend:
            title.append(f'<rect x="{x}" y="66" width="12" height="12" rx="2" fill="{colour}"/>')
            title.append(f'<text x="{x + 18}" y="76" font-size="12" fill="{INK}">{escape(name)}</text>')
            x += 30 + 7 * len(name)
        return "\n".join(head + title + self.parts) + "\n</svg>\n"


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.0f}"
    return f"{v:.2g}" if v < 1 else f"{v:.1f}"


def nice_ticks(top: float) -> list[float]:
    """0 and round steps up to `top` (1, 2 or 5 times a power of ten), about five of them."""
    raw = top / 5
    power = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 10 ** -len(str(int(1 / raw)))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(top / step) + 1)]


def subtitle(run: dict) -> str:
    rec = run.get("recorded", {})
    kind = "quick run" if run.get("quick") else "full run"
    where = rec.get("machine") or f"{run.get('cpu_count', '?')} CPUs, {run.get('gl_renderer', '?')}"
    when = f", {rec['date']}" if rec.get("date") else ""
    commit = f" at {rec['commit']}" if rec.get("commit") else ""
    load = f", load average {rec['load_average']:g}" if rec.get("load_average") is not None else ""
    return f"texstream bench stream ({kind}), {where}{load}{when}{commit}"


def throughput_chart(run: dict) -> str:
    ceiling = run["upload_ceiling"]["tiles_per_s"]
    rows = [
        ("upload ceiling", run["upload_ceiling"]),
        ("upload loop in Python", run["upload_ceiling_python"]),
        ("streamer bound", run["streamer_bound"]),
        ("end to end", run["end_to_end"]),
        ("end to end, Python loops", run["end_to_end_python"]),
    ]
    chart = Chart("Streaming throughput", subtitle(run), len(rows))
    values = [r["tiles_per_s"] for _, r in rows]
    chart.bars(
        [name for name, _ in rows],
        [values],
        [BLUE],
        "tiles/s",
        notes=[f"{v / ceiling:.2g}x the ceiling" if i else "" for i, v in enumerate(values)],
    )
    return chart.svg()


UPDATE_SCENARIOS = (
    ("scene_update", "scene flight"),
    ("scene_update_again", "scene flight, again"),
    ("camera_cuts", "camera cuts, unpaced"),
    ("camera_cuts_60hz", "camera cuts, 60 Hz"),
)


def update_chart(run: dict) -> str:
    present = [(key, name) for key, name in UPDATE_SCENARIOS if key in run]
    chart = Chart(
        "update() time per frame",
        subtitle(run),
        len(present),
        legend=[("median", BLUE), ("95th percentile", ORANGE), ("99th percentile", GREY)],
    )
    chart.bars(
        [name for _, name in present],
        [[run[k].get(f"update_ms_{p}") for k, _ in present] for p in ("p50", "p95", "p99")],
        [BLUE, ORANGE, GREY],
        "ms",
    )
    return chart.svg()


def cuts_chart(run: dict) -> str:
    present = [(key, name) for key, name in UPDATE_SCENARIOS if key.startswith("camera_cuts") and key in run]
    chart = Chart(
        "Frames until the view is complete after a camera cut",
        subtitle(run),
        len(present),
        legend=[("median", BLUE), ("95th percentile", ORANGE), ("worst", GREY)],
    )
    chart.bars(
        [name for _, name in present],
        [[float(run[k][p]) for k, _ in present] for p in ("p50", "p95", "max")],
        [BLUE, ORANGE, GREY],
        "frames",
        notes=[f"of {run[k]['cuts']} cuts" for k, _ in present],
    )
    return chart.svg()


def record(path: Path, bench_json: Path | None = None) -> None:
    """Store the quick stream bench's JSON (run now, or `bench_json` from a run by hand) at `path`,
    labelled with where and when it ran (a run by hand may come from another machine: its own CPU
    count and renderer are used, and no load average of this one)."""
    here = bench_json is None
    with tempfile.TemporaryDirectory() as tmp:
        if bench_json is None:
            bench_json = Path(tmp) / "bench.json"
            cmd = [sys.executable, "-m", "texstream", "bench", "stream", "--quick", "--json", str(bench_json)]
            subprocess.run(cmd, check=True)
        run = json.loads(bench_json.read_text(encoding="utf-8"))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    run["recorded"] = {
        "date": datetime.date.today().isoformat(),
        "commit": commit or None,
        "machine": f"{run.get('cpu_count', os.cpu_count())} cores ({platform.machine()}), "
        f"{run.get('gl_renderer', '?').split(' (')[0]}",
        "command": f"texstream bench stream {'--quick ' if run.get('quick') else ''}--json",
        # a shared box's numbers depend on what else ran: the 1-minute load average when stored
        "load_average": round(os.getloadavg()[0], 1) if here else None,
    }
    path.write_text(json.dumps(run, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="the bench's JSON (default: %(default)s)")
    parser.add_argument("--record", action="store_true", help="run the quick bench first and store its JSON there")
    parser.add_argument("--label", type=Path, metavar="BENCH_JSON", help="store this bench JSON there, labelled")
    args = parser.parse_args(argv)
    if args.record or args.label:
        record(args.json, args.label)
    run = json.loads(args.json.read_text(encoding="utf-8"))
    if run.get("bench") != "stream":
        raise SystemExit(f"{args.json} is not the JSON of `texstream bench stream --json`")
    for name, draw in (
        ("chart-stream-throughput.svg", throughput_chart),
        ("chart-update-time.svg", update_chart),
        ("chart-camera-cuts.svg", cuts_chart),
    ):
        out = args.json.parent / name
        out.write_text(draw(run), encoding="utf-8")
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
