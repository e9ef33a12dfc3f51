"""What each dashboard shows, without Grafana: every panel's queries run against a live Prometheus and drawn
where Grafana would put them (the panels' grid positions), one PNG per dashboard; and which panels have no data.

    python -m infersight.dashboards.preview --prometheus http://127.0.0.1:9090 --out docs/img [--minutes 15]

Grafana's server cannot be installed on our machines (docker-compose runs it); this is the picture a reader of the
README gets instead, drawn by hand with matplotlib because no library renders Grafana's JSON model. Variables are
"All", as Grafana opens the dashboards. It draws time series (lines per series, the legend format's labels), stat
panels (the last value, coloured by the panel's thresholds) and tables (the first rows); it does not imitate
Grafana's styling beyond that.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infersight.dashboards.generate import OUT

ALL = ".*"  # what Grafana puts in a multi-value variable set to All (the variables' allValue)
GRID_COLUMNS = 24
MAX_SERIES = 10  # lines drawn per panel (the rest counted in the legend's title)


@dataclass(frozen=True)
class Target:
    dashboard: str
    panel: str
    kind: str  # timeseries | stat | table
    ref: str
    expr: str
    legend: str


def substitute(expr: str, step_s: int) -> str:
    """Grafana's variables as it fills them with every variable at All."""
    rate = f"{max(4 * step_s, 60)}s"  # $__rate_interval: at least 4 scrape steps
    out = expr.replace("$__rate_interval", rate).replace("$__range", "1h").replace("$__interval", f"{step_s}s")
    return re.sub(r"\$\{?([a-z_]+)\}?", ALL, out)


def targets(dashboard: dict[str, Any]) -> list[Target]:
    return [Target(dashboard["uid"], p.get("title", ""), p["type"], t.get("refId", "A"), t["expr"],
                   t.get("legendFormat", ""))
            for p in dashboard["panels"] if p["type"] != "row" for t in p.get("targets", [])]


def dashboards(folder: Path = OUT) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def query_range(prometheus: str, expr: str, start: float, end: float, step_s: int) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": substitute(expr, step_s), "start": start, "end": end, "step": step_s})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=30) as resp:
        return json.load(resp)["data"]["result"]


def empty_panels(prometheus: str, minutes: float = 10, folder: Path = OUT) -> list[str]:
    """``dashboard / panel`` for every panel none of whose queries returns a series over the last ``minutes``."""
    end = time.time()
    seen: dict[tuple[str, str], bool] = {}
    for d in dashboards(folder):
        for t in targets(d):
            key = (t.dashboard, t.panel)
            has = bool(query_range(prometheus, t.expr, end - 60 * minutes, end, 15))
            seen[key] = seen.get(key, False) or has
    return [f"{dash} / {panel}" for (dash, panel), has in seen.items() if not has]


def _label(metric: dict[str, str], legend: str) -> str:
    if legend:
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), legend).strip()
    return " ".join(v for k, v in sorted(metric.items()) if k != "__name__") or "value"


def _threshold_colour(panel: dict[str, Any], value: float) -> str:
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
    colour = "green"
    for step in steps:
        if step.get("value") is None or value >= step["value"]:
            colour = step.get("color", colour)
    return {"green": "#3c9a4a", "red": "#c4314b", "orange": "#e08a1e", "yellow": "#d6b600"}.get(colour, colour)


def _format(value: float, unit: str) -> str:
    if math.isnan(value):
        return "NaN"
    if unit == "percentunit":
        return f"{100 * value:.2f} %"
    if unit in ("s", "ms"):
        return f"{value:.3g} {unit}"
    return f"{value:,.4g}" + (f" {unit}" if unit not in ("short", "none", "bool", "") else "")


def render(prometheus: str, out: Path, minutes: float = 15, folder: Path = OUT) -> tuple[list[Path], list[str]]:
    """One PNG per dashboard in ``out``; returns their paths and the panels without data (as ``empty_panels``,
    from the same queries)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    end = time.time()
    start, step = end - 60 * minutes, max(15, int(60 * minutes / 120))
    written, empty = [], []
    for d in dashboards(folder):
        panels = d["panels"]
        rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
        unit_h = 0.42  # inches per grid row
        height = rows * unit_h + 0.8
        fig = plt.figure(figsize=(16, height))
        fig.text(0.005, 1 - 0.3 / height, f"{d['title']}  (last {minutes:g} min, variables at All)", fontsize=13,
                 fontweight="bold", va="center")
        top = 1 - 0.7 / height
        for p in panels:
            g = p["gridPos"]
            x, w = g["x"] / GRID_COLUMNS, g["w"] / GRID_COLUMNS
            y, h = top * (1 - (g["y"] + g["h"]) / rows), top * g["h"] / rows
            if p["type"] == "row":
                fig.text(x + 0.005, y + h / 2, p.get("title", ""), fontsize=11, fontweight="bold", va="center")
                continue
            ax = fig.add_axes((x + 0.035 * w + 0.004, y + 0.18 * h, w * 0.93 - 0.008, h * 0.62))
            ax.set_title(p.get("title", ""), fontsize=9, loc="left")
            unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
            results = [(t, r) for t in p.get("targets", [])
                       for r in query_range(prometheus, t["expr"], start, end, step)]
            if not results:
                empty.append(f"{d['uid']} / {p.get('title', '')}")
                ax.text(0.5, 0.5, "No data", ha="center", va="center", color="grey", transform=ax.transAxes)
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            if p["type"] == "timeseries":
                for t, r in results[:MAX_SERIES]:
                    ts = [(float(v[0]), float(v[1])) for v in r["values"]]
                    ax.plot([datetime.fromtimestamp(a, tz=UTC) for a, _ in ts], [b for _, b in ts], linewidth=1,
                            label=_label(r["metric"], t.get("legendFormat", ""))[:40])
                ax.set_xlim(datetime.fromtimestamp(start, tz=UTC), datetime.fromtimestamp(end, tz=UTC))
                ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
                ax.tick_params(labelsize=7)
                ax.set_ylabel(unit, fontsize=7)
                more = f" (+{len(results) - MAX_SERIES} more)" if len(results) > MAX_SERIES else ""
                ax.legend(fontsize=6, loc="upper left", ncol=2, framealpha=0.6, title=more or None,
                          title_fontsize=6)
            else:
                ax.set_xticks([])
                ax.set_yticks([])
                lines = []
                for t, r in results[:6]:
                    value = float(r["values"][-1][1])
                    lines.append((_label(r["metric"], t.get("legendFormat", "")), value))
                if p["type"] == "stat" and len(lines) == 1:
                    name, value = lines[0]
                    ax.set_facecolor(_threshold_colour(p, value))
                    ax.text(0.5, 0.45, _format(value, unit), ha="center", va="center", fontsize=16,
                            color="white", fontweight="bold", transform=ax.transAxes)
                else:
                    for i, (name, value) in enumerate(lines):
                        ax.text(0.02, 0.9 - i * 0.15, f"{name[:70]}: {_format(value, unit)}", fontsize=7,
                                va="top", transform=ax.transAxes, color=_threshold_colour(p, value))
        path = out / f"{d['uid']}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written, empty


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090", help="the Prometheus the pipeline feeds")
    parser.add_argument("--out", type=Path, help="write one PNG per dashboard here (else: only list empty panels)")
    parser.add_argument("--minutes", type=float, default=15, help="time range drawn (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        if args.out:
            written, empty = render(args.prometheus, args.out, args.minutes)
            for path in written:
                print(path)
        else:
            empty = empty_panels(args.prometheus, args.minutes)
    except OSError as exc:
        print(f"error: cannot query Prometheus at {args.prometheus}: {exc}\n  fix: start the stack "
              "(`bin/infersight up`) or pass --prometheus", file=sys.stderr)
        return 1
    for panel in empty:
        print(f"no data: {panel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
