"""The live view's table: rows per region and model, and the detect job's open incidents and the canary job's
verdicts in its caption."""

from __future__ import annotations

from rich.console import Console

from infersight.simulator import view


def render(snap: view.Snapshot) -> str:
    console = Console(width=200, record=True)
    console.print(view.table(snap, "http://prom"))
    return console.export_text()


def test_open_incidents_show_under_the_table_and_none_means_no_line():
    snap = view.Snapshot(rows={("us-east-1", "m"): {"rps": 10.0}})
    assert "open incidents" not in render(snap)
    snap.incidents = {("region", "outage"): 1, ("global", "bad_rollout"): 2}
    text = render(snap)
    assert "open incidents: bad_rollout (global) x2, outage (region) x1" in text
    assert "us-east-1" in text


def test_canary_verdicts_show_per_rollout_with_the_regions_that_fail():
    snap = view.Snapshot(rows={("us-east-1", "m"): {"rps": 10.0}})
    assert "canary verdicts" not in render(snap)
    snap.verdicts = {("m", "v2", "all"): ("fail", False), ("m", "v2", "eu-west-1"): ("fail", True),
                     ("m", "v2", "us-east-1"): ("pass", False), ("n", "v7", "all"): ("pass", True)}
    text = render(snap)
    assert "canary verdicts: m v2: fail, fail in eu-west-1; n v7: pass (final)" in text
    snap.incidents = {("region", "outage"): 1}
    text = render(snap)
    assert text.index("open incidents") < text.index("canary verdicts")


def test_a_quality_column_per_region_and_model_and_dash_where_nothing_is_judged():
    snap = view.Snapshot(rows={("us-east-1", "m"): {"rps": 10.0, "quality": 0.8374},
                               ("us-east-1", "n"): {"rps": 5.0}})
    lines = render(snap).splitlines()
    assert "quality" in next(line for line in lines if "region" in line)
    row_m = next(line for line in lines if " m " in line)
    row_n = next(line for line in lines if " n " in line)
    assert "0.84" in row_m
    assert "0.84" not in row_n and "-" in row_n


def test_open_drift_alarms_show_in_the_caption_between_incidents_and_verdicts():
    snap = view.Snapshot(rows={("us-east-1", "m"): {"rps": 10.0}})
    assert "drift alarms" not in render(snap)
    snap.drifts = {("eu-west-1", "m", "score.relevance"), ("eu-west-1", "m", "guardrail.refusal"),
                   ("us-east-1", "n", "tokens_in")}
    text = render(snap)
    assert "drift alarms: eu-west-1/m guardrail.refusal, score.relevance; us-east-1/n tokens_in" in text
    snap.incidents = {("region", "outage"): 1}
    snap.verdicts = {("m", "v2", "all"): ("pass", False)}
    text = render(snap)
    assert text.index("open incidents") < text.index("drift alarms") < text.index("canary verdicts")


def test_the_quality_and_drift_queries_read_the_quality_jobs_gauges():
    assert "infersight_quality_composite" in view.QUERIES["quality"]
    assert 'model!="all"' in view.QUERIES["quality"]
    assert view.DRIFT_ALARMS.startswith("max by (region, model, signal)")
    assert "infersight_quality_drift_alarm" in view.DRIFT_ALARMS
