"""The live terminal view: per region and model, what an on-call SRE looks at first, straight from
Prometheus (so it shows what the pipeline computed, not what the simulator meant to send)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console
from rich.live import Live
from rich.table import Table

from infersight.schemas import canary as C
from infersight.schemas import metrics as M
from infersight.schemas import pipeline as P
from infersight.simulator.prom import query

WINDOW_S = 10  # the metrics job's default --window-s

# From the newest window of each series (a sample per 10 s window, stamped at its end): numbers show
# with the first window, not after a minute of rate(); tracks are combined by summing counts and taking
# the worse track's p99 (sketch quantiles of different series cannot be merged in PromQL).
_WINDOW = f"{int(WINDOW_S)}"
_REQS, _ERR_RATIO = P.prom(P.WINDOW_REQUESTS), P.prom(P.WINDOW_ERROR_RATIO)
_BY = f"{P.LABEL_REGION}, {P.LABEL_MODEL}"


def _p99(field: str) -> str:
    """The worst track's p99 of a distribution's window sketch, per region and model."""
    name = P.prom(P.DISTRIBUTIONS[field][0] + P.WINDOW_QUANTILE_SUFFIX)
    return f'max by ({_BY}) ({name}{{{P.LABEL_QUANTILE}="0.99"}})'


QUERIES = {
    "rps": f"sum by ({_BY}) ({_REQS}) / {_WINDOW}",
    "errors": f"sum by ({_BY}) ({_ERR_RATIO} * {_REQS}) / {_WINDOW}",
    "ttft_p99": _p99("ttft_s"),
    "itl_p99": _p99("itl_p99_s"),
    # the quality job's composite score (0..1, 1 best) of the worse track, from its newest window (once a minute by
    # default); rows of a model nobody judges show "-"
    "quality": f"min by ({_BY}) (last_over_time({P.prom(P.QUALITY_COMPOSITE)}"
               f'{{{P.LABEL_MODEL}!="{P.ALL_DEPLOYMENTS}"}}[5m]))',
}
# The region roll-up of the pod gauges and cost (model=model_version=track="all"): the per-deployment series
# and the roll-up share the name, so a query without the selector would count each pod twice.
_REGION_ROLLUP = f'{P.LABEL_MODEL}="{P.ALL_DEPLOYMENTS}"'


def _pods(gauge: str, stat: str) -> str:
    return f'{P.prom(P.POD_GAUGES[gauge].name)}{{{P.LABEL_STAT}="{stat}",{_REGION_ROLLUP}}}'


REGION_QUERIES = {
    "queue": f"sum by ({P.LABEL_REGION}) ({_pods(M.QUEUE_DEPTH, 'sum')})",
    "kv": f"max by ({P.LABEL_REGION}) ({_pods(M.KV_CACHE_USAGE, 'mean')})",
    "usd_per_1m": f"max by ({P.LABEL_REGION}) ({P.prom(P.USD_PER_1M_OUTPUT_TOKENS)}{{{_REGION_ROLLUP}}})",
    "freshness_s": f"time() - max by ({P.LABEL_REGION}) (timestamp({_REQS}))",
}


# incidents the detect job has open now, by scope and kind (its gauge comes once per window)
INCIDENTS = (f"sum by ({P.LABEL_SCOPE_KIND}, {P.LABEL_KIND}) "
             f"(last_over_time({P.prom(P.OPEN_INCIDENTS)}[1m])) > 0")
# the quality job's drift alarms open now, per region, model and signal (any version or track)
DRIFT_ALARMS = (f"max by ({_BY}, {P.LABEL_SIGNAL}) "
                f"(last_over_time({P.prom(P.DRIFT_ALARM)}[2m])) > 0")
# the canary job's current verdict per rollout (its gauge comes once per look) and whether it is final
_ROLLOUT_BY = f"{P.LABEL_MODEL}, {C.LABEL_CANARY_VERSION}, {P.LABEL_REGION}"
VERDICTS = f"max by ({_ROLLOUT_BY}) (last_over_time({C.PROM_VERDICT}[2m]))"
FINALS = f"max by ({_ROLLOUT_BY}) (last_over_time({C.PROM_FINAL}[2m]))"


@dataclass
class Snapshot:
    rows: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    regions: dict[str, dict[str, float]] = field(default_factory=dict)
    incidents: dict[tuple[str, str], int] = field(default_factory=dict)  # (scope kind, kind) -> open now
    drifts: set[tuple[str, str, str]] = field(default_factory=set)  # (region, model, signal) alarming now
    # (model, canary version, region) -> (verdict, final)
    verdicts: dict[tuple[str, str, str], tuple[str, bool]] = field(default_factory=dict)
    error: str = ""

    @property
    def total_rps(self) -> float:
        return sum(r.get("rps", 0.0) for (region, _), r in self.rows.items() if region != P.GLOBAL_REGION)


def snapshot(prom_url: str) -> Snapshot:
    snap = Snapshot()
    try:
        for name, promql in QUERIES.items():
            for series in query(prom_url, promql):
                key = (series["metric"].get("region", "?"), series["metric"].get("model", "?"))
                snap.rows.setdefault(key, {})[name] = float(series["value"][1])
        for name, promql in REGION_QUERIES.items():
            for series in query(prom_url, promql):
                snap.regions.setdefault(series["metric"].get("region", "?"), {})[name] = float(series["value"][1])
        for series in query(prom_url, INCIDENTS):
            labels = series["metric"]
            snap.incidents[(labels.get(P.LABEL_SCOPE_KIND, "?"), labels.get(P.LABEL_KIND, "?"))] = \
                int(float(series["value"][1]))
        for series in query(prom_url, DRIFT_ALARMS):
            labels = series["metric"]
            snap.drifts.add((labels.get(P.LABEL_REGION, "?"), labels.get(P.LABEL_MODEL, "?"),
                             labels.get(P.LABEL_SIGNAL, "?")))
        finals = {_rollout(s["metric"]): float(s["value"][1]) >= 1 for s in query(prom_url, FINALS)}
        for series in query(prom_url, VERDICTS):
            code = int(float(series["value"][1]))
            verdict = C.VERDICTS[code] if 0 <= code < len(C.VERDICTS) else "?"
            snap.verdicts[_rollout(series["metric"])] = (verdict, finals.get(_rollout(series["metric"]), False))
    except Exception as exc:  # noqa: BLE001 - the view keeps going while Prometheus restarts
        snap.error = f"{type(exc).__name__}: {exc}"
    return snap


def _rollout(labels: dict[str, str]) -> tuple[str, str, str]:
    return (labels.get(P.LABEL_MODEL, "?"), labels.get(C.LABEL_CANARY_VERSION, "?"),
            labels.get(P.LABEL_REGION, C.ALL_REGIONS_LABEL))


def verdict_line(verdicts: dict[tuple[str, str, str], tuple[str, bool]]) -> str:
    """One entry per rollout: its overall verdict, and the regions whose own verdict is ``fail``."""
    entries = []
    for model, version in sorted({(m, v) for m, v, _ in verdicts}):
        overall, final = verdicts.get((model, version, C.ALL_REGIONS_LABEL), ("-", False))
        failing = sorted(r for (m, v, r), (verdict, _) in verdicts.items()
                         if (m, v) == (model, version) and r != C.ALL_REGIONS_LABEL and verdict == "fail")
        text = f"{model} {version}: {overall}{' (final)' if final else ''}"
        if failing:
            text += f", fail in {', '.join(failing)}"
        entries.append(f"[bold red]{text}[/bold red]" if overall == "fail" or failing else text)
    return "canary verdicts: " + "; ".join(entries) if entries else ""


def drift_line(drifts: set[tuple[str, str, str]]) -> str:
    """The open drift alarms, per region and model, their signals."""
    by_series: dict[tuple[str, str], list[str]] = {}
    for region, model, signal in sorted(drifts):
        by_series.setdefault((region, model), []).append(signal)
    entries = [f"{region}/{model} {', '.join(signals)}" for (region, model), signals in by_series.items()]
    return f"[bold yellow]drift alarms: {'; '.join(entries)}[/bold yellow]" if entries else ""


def _fmt(value: float | None, unit: str = "", scale: float = 1.0, digits: int = 0) -> str:
    if value is None or math.isnan(value) or math.isinf(value):
        return "-"
    return f"{value * scale:,.{digits}f}{unit}"


def table(snap: Snapshot, prom_url: str, status: str = "") -> Table:
    t = Table(title=f"infersight live — Prometheus {prom_url}", caption=status or None, caption_justify="left")
    for name, justify in (("region", "left"), ("model", "left"), ("req/s", "right"), ("TTFT p99", "right"),
                          ("ITL p99", "right"), ("errors", "right"), ("quality", "right"), ("queue", "right"),
                          ("KV cache", "right"), ("$/1M tok", "right"), ("fresh", "right")):
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    order = sorted(snap.rows, key=lambda k: (k[0] == P.GLOBAL_REGION, k[0], k[1]))
    last_region = None
    for region, model in order:
        r = snap.rows[(region, model)]
        g = snap.regions.get(region, {}) if region != last_region else {}
        rps = r.get("rps")
        err = r.get("errors", 0.0) / rps if rps else None
        t.add_row(region if region != last_region else "", model, _fmt(rps, digits=0),
                  _fmt(r.get("ttft_p99"), " ms", 1000), _fmt(r.get("itl_p99"), " ms", 1000, 1),
                  _fmt(err, " %", 100, 2), _fmt(r.get("quality"), digits=2), _fmt(g.get("queue")),
                  _fmt(g.get("kv"), " %", 100),
                  _fmt(g.get("usd_per_1m"), "", 1, 2), _fmt(g.get("freshness_s"), " s"),
                  end_section=False)
        last_region = region
    lines = [drift_line(snap.drifts), verdict_line(snap.verdicts)]
    if snap.incidents:
        opened = ", ".join(f"{kind} ({scope}) x{n}" for (scope, kind), n in sorted(snap.incidents.items()))
        lines.insert(0, f"[bold red]open incidents: {opened}[/bold red]")
    if any(lines):
        t.caption = "\n".join([line for line in lines if line] + ([status] if status else []))
    if snap.error:
        t.caption = f"[red]{snap.error}[/red]" + (f"\n{status}" if status else "")
    return t


def live(prom_url: str, status: Callable[[], str] = lambda: "", refresh_s: float = 2.0,
         until: Callable[[], bool] = lambda: False, console: Console | None = None) -> None:
    """Refresh the table until ``until()`` or Ctrl-C; without a terminal, print it every 15 s instead."""
    console = console or Console()
    if not console.is_terminal:
        while not until():
            console.print(table(snapshot(prom_url), prom_url, status()))
            for _ in range(int(15 / 0.5)):
                if until():
                    return
                time.sleep(0.5)
        return
    with Live(table(snapshot(prom_url), prom_url, status()), console=console, refresh_per_second=1,
              screen=False) as view:
        while not until():
            time.sleep(refresh_s)
            view.update(table(snapshot(prom_url), prom_url, status()))
