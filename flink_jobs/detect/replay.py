"""Offline replay: window-stats rows (CSV) through the same Engine the job runs, incidents out (JSON lines).

Rows are taken in window order, then by series and signal (as the detect job feeds each window, whatever order
the records arrived in);
a row that cannot be used is counted with its reason and skipped, never a crash.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from infersight.flink_jobs.detect.core import Engine, EngineParams
from infersight.schemas.detection import WINDOW_STATS_COLUMNS, row_problem

INCIDENT_OUTPUT = ("kind", "scope_kind", "regions", "absorbing_regions", "models", "signals", "start", "end",
                   "severity", "likely_cause", "chance_p", "anomalies", "summary", "id")


def clean_rows(rows: Iterable[dict[str, Any]], bad: dict[str, int]) -> list[tuple[float, str, str, str, str, float]]:
    good = []
    for row in rows:
        reason = row_problem(row) if isinstance(row, dict) else "not_a_row"
        if reason is not None:
            bad[reason] = bad.get(reason, 0) + 1
            continue
        good.append((float(row["window_end"]), str(row["region"]), str(row["model"]), str(row["track"]),
                     str(row["signal"]), float(row["value"])))
    good.sort()  # window, then series and signal: how the job feeds a window, whatever the arrival order
    return good


def run(rows: Iterable[tuple[float, str, str, str, str, float]], engine: Engine | None = None
        ) -> Iterator[dict[str, Any]]:
    """Every event (anomaly points and incident open/update/resolve) the engine gives for these rows."""
    engine = engine or Engine(EngineParams())
    for t, region, model, track, signal, value in rows:
        yield from engine.observe(t, region, model, track, signal, value)
    yield from engine.flush()


def incidents(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The final state of each incident (its resolve event), in the order they opened."""
    order: list[str] = []
    final: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.get("type") != "incident":
            continue
        if e["id"] not in final:
            order.append(e["id"])
        final[e["id"]] = e
    return [{k: final[i][k] for k in INCIDENT_OUTPUT} for i in order]


def read_csv(path: Path, bad: dict[str, int]) -> list[tuple[float, str, str, str, str, float]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in WINDOW_STATS_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            bad["missing_columns:" + ",".join(missing)] = 1
            return []
        return clean_rows(reader, bad)


def replay_file(input_path: Path, out_path: Path, events_path: Path | None = None) -> dict[str, Any]:
    bad: dict[str, int] = {}
    rows = read_csv(input_path, bad)
    engine = Engine(EngineParams())
    events = list(run(rows, engine))
    found = incidents(events)
    with open(out_path, "w") as f:
        for inc in found:
            f.write(json.dumps(inc, sort_keys=True) + "\n")
    if events_path is not None:
        with open(events_path, "w") as f:
            for e in events:
                f.write(json.dumps(e, sort_keys=True) + "\n")
    skipped = dict(engine.counts)
    for d in engine.detectors.values():
        for name in ("n_out_of_order", "n_clock_jumps"):
            if getattr(d, name):
                skipped[name[2:]] = skipped.get(name[2:], 0) + getattr(d, name)
    return {"rows": len(rows), "bad_rows": bad, "counted": skipped, "incidents": len(found),
            "anomalies": sum(1 for e in events if e.get("type") == "anomaly")}
