"""The generated dashboards: checked in as generated, every panel with a unit, a datasource and thresholds,
every query on a metric the pipeline writes (schemas) or a recording rule we generate."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from infersight.dashboards import generate, rules
from infersight.dashboards import slo as S
from infersight.dashboards.common import (
    DATASOURCE_UID,
    FLINK_NAMES,
    KAFKA_NAMES,
    OTELCOL_JOB,
    OTELCOL_NAMES,
    VARIABLES,
)
from infersight.schemas import pipeline as P

GENERATED = generate.OUT
PROVISIONING = GENERATED.parent / "provisioning"


def _dashboards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(GENERATED.glob("*.json"))}


def _panels(d: dict) -> list[dict]:
    return [p for p in d["panels"] if p["type"] != "row"]


def test_regenerating_gives_exactly_the_checked_in_files():
    problems = generate.differences()
    assert not problems, "dashboards/generated/ is out of date (run python -m infersight.dashboards.generate): " \
                         + "; ".join(problems)


def test_the_check_names_a_hand_edited_file(tmp_path):
    out = tmp_path / "generated"
    generate.write(out)
    assert generate.differences(out) == []
    first = sorted(out.glob("*.json"))[0]
    first.write_text(first.read_text().replace('"type": "prometheus"', '"type": "loki"'))
    (out / "old.json").write_text("{}")
    assert generate.differences(out) == [f"{first.name}: differs", "old.json: not generated (stale)"]


def test_at_least_four_dashboards_of_four_panels_with_unique_uids():
    dashboards = _dashboards()
    assert len(dashboards) >= 4
    for uid, d in dashboards.items():
        assert d["uid"] == uid
        assert len(_panels(d)) >= 4, uid
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), uid


def test_every_panel_has_a_unit_a_datasource_thresholds_and_queries():
    for uid, d in _dashboards().items():
        for p in _panels(d):
            where = f"{uid}: {p['title']}"
            assert p["datasource"] == {"type": "prometheus", "uid": DATASOURCE_UID}, where
            assert p["fieldConfig"]["defaults"].get("unit"), where
            assert p["fieldConfig"]["defaults"]["thresholds"]["steps"], where
            assert p.get("description"), where
            assert p["targets"] and all(t["expr"] and t["datasource"]["uid"] == DATASOURCE_UID
                                        for t in p["targets"]), where


def test_deployment_dashboards_have_the_four_variables():
    for uid in ("infersight-oncall", "infersight-cost"):
        names = [v["name"] for v in _dashboards()[uid]["templating"]["list"]]
        assert names == list(VARIABLES), uid


def _known_names() -> set[str]:
    names = set(OTELCOL_NAMES) | set(FLINK_NAMES) | set(KAFKA_NAMES)  # the collectors', Flink's, Kafka's own
    from infersight.schemas import canary as C

    names |= {C.PROM_VERDICT, C.PROM_FINAL, C.PROM_SHIFT}  # the canary job's gauges
    for o in P.OUTPUTS:
        names.add(o.prometheus)
        if o.kind == "histogram":
            names |= {o.prometheus + s for s in ("_bucket", "_count", "_sum")}
    config = S.load()
    for f in rules.rule_files(config).values():
        names |= {r["record"] for g in f["groups"] for r in g["rules"] if "record" in r}
    return names


# PromQL words that look like metric names; anything else before "{" / "[" / ")" must be a real metric
_PROMQL = {"sum", "max", "min", "avg", "count", "rate", "increase", "by", "time", "timestamp", "last_over_time",
           "max_over_time", "label_values", "absent", "or", "and", "unless"}
_NAME = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?=\{|\[)")


def test_every_query_reads_a_metric_the_pipeline_writes():
    known = _known_names()
    seen = set()
    for uid, d in _dashboards().items():
        exprs = [t["expr"] for p in _panels(d) for t in p["targets"]]
        exprs += [v["query"]["query"] for v in d["templating"]["list"]]
        exprs += [a["expr"] for a in d["annotations"].get("list", [])]
        for expr in exprs:
            for name in _NAME.findall(expr):
                if name not in _PROMQL:
                    assert name in known, f"{uid}: {name} is written by nothing ({expr})"
                    seen.add(name)
    assert len(seen) >= 15  # the regex found the names (a sanity check of the test itself)


def test_provisioning_points_grafana_at_the_datasource_the_panels_use():
    ds = (PROVISIONING / "datasources" / "prometheus.yaml").read_text()
    assert f"uid: {DATASOURCE_UID}" in ds
    assert "type: file" in (PROVISIONING / "dashboards" / "infersight.yaml").read_text()


def test_ttft_slo_thresholds_must_be_histogram_bounds(tmp_path):
    cfg = tmp_path / "slo.yaml"
    cfg.write_text("default: {ttft_threshold_s: 0.2, ttft_objective: 0.99, availability_objective: 0.999, "
                   "period_days: 30}\n")
    with pytest.raises(ValueError, match="not a TTFT bucket bound"):
        S.load(cfg)
    assert S.load().default.ttft_threshold_s in S.M.TTFT_BUCKETS


def test_a_model_gets_its_own_objective_and_the_rest_the_default(tmp_path):
    cfg = tmp_path / "slo.yaml"
    cfg.write_text("default: {ttft_threshold_s: 0.25, ttft_objective: 0.99, availability_objective: 0.999, "
                   "period_days: 30}\nmodels:\n  big: {ttft_threshold_s: 0.5, ttft_objective: 0.95}\n")
    config = S.load(cfg)
    assert config.models["big"] == S.Objective(0.5, 0.95, 0.999, 30)
    exprs = [r["expr"] for r in rules.slo_recording_rules(config)]
    assert any('model="big", le="0.5"' in e for e in exprs)
    assert any('model!~"big", le="0.25"' in e for e in exprs)
    assert 'infersight:slo_ttft_bad:ratio_rate1h{model="big"} / 0.05' in exprs
    with pytest.raises(ValueError, match="unknown key"):
        cfg.write_text("default: {ttft_threshold_s: 0.25, ttft_objective: 0.99, availability_objective: 0.999, "
                       "period_days: 30, ttft: 1}\n")
        S.load(cfg)


def test_generated_readme_stays():
    assert (GENERATED / "README.md").exists() and Path(generate.__file__).parent.name == "dashboards"


def test_the_collector_panels_read_the_job_prometheus_scrapes():
    base = yaml.safe_load((GENERATED.parents[1] / "stack" / "config" / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in base["scrape_configs"]}
    assert OTELCOL_JOB in jobs
    labels = [t["labels"] for t in jobs[OTELCOL_JOB]["static_configs"]]
    assert all({"collector", "region"} <= set(lab) for lab in labels)


def _simulated_burn(perturbations=(), points: int = 48) -> dict[tuple[str, str], tuple[float, float]]:
    """(region, model) -> (TTFT burn, availability burn) of the simulated fleet over a day, sampled at 1 s ticks
    spread over the diurnal curve, with each model's objective from slo.yaml (bad TTFT: above the threshold,
    as the bucket le=threshold counts it)."""
    import dataclasses

    import numpy as np

    from infersight.simulator.fleet import FleetSpec
    from infersight.simulator.workload import Fleet

    config = S.load()
    spec = dataclasses.replace(FleetSpec(), perturbations=tuple(perturbations))
    fleet = Fleet(spec, seed=7)
    counts: dict[tuple[str, str], list[int]] = {}
    for i in range(points):
        tick = fleet.tick(int(i * spec.day_s / points), 0, 1.0)
        ttft = (tick.queue_ns + tick.prefill_ns) / 1e9
        for index in np.unique(tick.pod):
            pod, mine = fleet.pods[index], tick.pod == index
            o = config.models.get(pod.model.name, config.default)
            c = counts.setdefault((pod.region.name, pod.model.name), [0, 0, 0])
            c[0] += int(mine.sum())
            c[1] += int((ttft[mine] > o.ttft_threshold_s).sum())
            c[2] += int((tick.error[mine] >= 0).sum())
    out = {}
    for (region, model), (n, slow, failed) in counts.items():
        o = config.models.get(model, config.default)
        out[region, model] = (slow / n / (1 - o.ttft_objective), failed / n / (1 - o.availability_objective))
    return out


def test_the_slos_hold_for_a_healthy_simulated_fleet_and_page_on_a_regional_slowdown():
    from infersight.simulator.fleet import Perturbation

    healthy = _simulated_burn()
    assert len(healthy) == 9
    assert all(ttft < 1 and errors < 1 for ttft, errors in healthy.values()), healthy
    slow = _simulated_burn([Perturbation("slow", 0, 1e9, 1.5, region="eu-west-1")])
    fast_burn = rules.BURN_ALERTS[0][3]
    for (region, model), (ttft, _errors) in slow.items():
        if region == "eu-west-1":
            assert ttft > fast_burn, (model, ttft)
        else:
            assert ttft < 1, (region, model, ttft)


def test_the_flink_panels_read_what_the_stacks_flink_reporter_sends():
    """Each Flink name the dashboards and alerts read is one the reporter's filter lets through (scope, then name:
    flink_<scope with _>_<name>), and the sink collector has the pipeline that takes it to Prometheus."""
    import fnmatch

    from infersight.stack.flink_config import REPORTED_METRICS, metrics_reporter
    from infersight.stack.paths import collector_config

    sent = []
    for pattern in REPORTED_METRICS:
        scope, names = pattern.split(":")
        sent += [f"flink_{scope.replace('.', '_')}_{n}" for n in names.split(",")]
    for name in FLINK_NAMES:
        assert any(fnmatch.fnmatchcase(name, s) for s in sent), name
    conf = metrics_reporter("http://127.0.0.1:1")
    assert conf["metrics.reporter.otel.filter.includes"].split(";") == REPORTED_METRICS
    sink = yaml.safe_load(collector_config("sink.yaml").read_text())
    assert sink["service"]["pipelines"]["metrics/flink"]["receivers"] == ["otlp"]


def test_panels_fit_grafanas_24_columns_without_overlapping():
    """The SDK's own layout put a panel that did not fit past the 24th column; compose() wraps it."""
    for uid, d in _dashboards().items():
        cells: set[tuple[int, int]] = set()
        for p in d["panels"]:
            g = p["gridPos"]
            assert g["x"] + g["w"] <= 24, (uid, p["title"], g)
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not mine & cells, (uid, p["title"], g)
            cells |= mine


def test_the_preview_fills_grafanas_variables_and_names_series_by_the_legend():
    from infersight.dashboards import preview

    expr = 'sum by (region) (rate(x{region=~"$region", model=~"${model}"}[$__rate_interval]))'
    assert preview.substitute(expr, 15) == 'sum by (region) (rate(x{region=~".*", model=~".*"}[60s]))'
    assert preview.substitute("rate(x[$__rate_interval])", 30) == "rate(x[120s])"
    assert preview._label({"region": "eu-west-1", "job_name": "j"}, "{{region}} {{ job_name }}") == "eu-west-1 j"
    oncall = _dashboards()["infersight-oncall"]
    found = preview.targets(oncall)
    assert len(found) == sum(len(p.get("targets", [])) for p in oncall["panels"])
    assert all(t.expr and t.kind in ("timeseries", "stat", "table") for t in found)
