"""``infersight detect replay``: a CSV of window stats in, one JSON incident per line out; bad rows counted."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from infersight.schemas.detection import WINDOW_STATS_COLUMNS, row_problem
from infersight.simulator.scenarios import generate, make_scenario, random_fault

REPO = Path(__file__).resolve().parents[2]


def write_csv(path: Path, rows, extra=()):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(WINDOW_STATS_COLUMNS)
        for r in rows:
            w.writerow(r)
        for r in extra:
            w.writerow(r)


def test_replay_cli_end_to_end(tmp_path):
    sc = make_scenario(3, hours=1.5)
    sc.faults = [random_fault("regional_outage", sc.t0 + 3000.0, np.random.default_rng(3))]
    bad = [("x", "us-east-1", "m", "stable", "ttft_p99", "0.1"),  # bad time
           ("1767225610", "us-east-1", "m", "stable", "no_such_signal", "0.1"),
           ("1767225610", "us-east-1", "m", "stable", "ttft_p99", "nan"),
           ("1767225610", "us-east-1", "m", "stable", "ttft_p99", "inf"),
           ("1767225610", "", "m", "stable", "ttft_p99", "0.1")]
    write_csv(tmp_path / "series.csv", generate(sc), bad)
    out = subprocess.run([sys.executable, "-m", "infersight.cli", "detect", "replay", "--input",
                          str(tmp_path / "series.csv"), "--out", str(tmp_path / "incidents.jsonl")],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["bad_rows"] == {"bad_window_end": 1, "unknown_signal": 1, "nan_value": 1, "inf_value": 1,
                                   "missing_region": 1}
    lines = (tmp_path / "incidents.jsonl").read_text().splitlines()
    assert len(lines) == 1
    inc = json.loads(lines[0])
    for key in ("kind", "scope_kind", "regions", "models", "signals", "start", "end", "severity", "summary"):
        assert key in inc
    assert inc["scope_kind"] == "region" and inc["kind"] == "outage"


def test_replay_of_a_file_without_the_columns_counts_it(tmp_path):
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    out = subprocess.run([sys.executable, "-m", "infersight.cli", "detect", "replay", "--input",
                          str(tmp_path / "bad.csv"), "--out", str(tmp_path / "o.jsonl")],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0
    assert "missing_columns" in out.stdout and (tmp_path / "o.jsonl").read_text() == ""


def test_help_is_fast():
    out = subprocess.run([sys.executable, "-m", "infersight.cli", "detect", "replay", "--help"],
                         capture_output=True, text=True, cwd=REPO, timeout=20)
    assert out.returncode == 0 and "--input" in out.stdout


def test_row_problem_reasons():
    good = {"window_end": "10", "region": "r", "model": "m", "track": "stable", "signal": "error_ratio", "value": "0"}
    assert row_problem(good) is None
    assert row_problem({**good, "value": "abc"}) == "non_numeric_value"
    assert row_problem({**good, "window_end": "-5"}) == "bad_window_end"
    assert row_problem({**good, "track": None}) == "missing_track"
