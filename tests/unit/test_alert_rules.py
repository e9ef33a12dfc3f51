"""The generated Prometheus rules: valid for the real promtool, unit-tested by promtool (and those tests fail on
a wrong rule), every alert labelled, annotated and linked to its docs/runbook.md section."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from infersight.dashboards import generate, rules
from infersight.dashboards import slo as S

REPO = Path(__file__).resolve().parents[2]
RULES = generate.OUT / "rules"
RULE_TESTS = generate.OUT.parent / "rules_tests"
RUNBOOK = REPO / "docs" / "runbook.md"


def _promtool() -> Path:
    from infersight.stack.setup import prometheus_binary  # promtool ships next to it (Debian's package)

    found = prometheus_binary().with_name("promtool")
    if not found.exists():
        found = Path(shutil.which("promtool") or "/nonexistent")
    if not found.exists():
        pytest.skip("promtool not installed (`infersight setup` fetches Debian's prometheus package with it)")
    return found


def _promtool_run(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(_promtool()), *map(str, args)], capture_output=True, text=True, timeout=120)


def _alerts() -> list[dict]:
    out = []
    for path in sorted(RULES.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += [r for r in group["rules"] if "alert" in r]
    return out


def test_promtool_accepts_the_rule_files():
    done = _promtool_run("check", "rules", *sorted(RULES.glob("*.yml")))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_pass():
    done = _promtool_run("test", "rules", *sorted(RULE_TESTS.glob("*.test.yml")))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("file,right,wrong", [
    ("slo.rules.yml", "> 14.4", "> 144"),                 # a fast-burn threshold 10x too high
    ("slo.rules.yml", 'le="0.25"', 'le="0.5"'),          # the good-request bucket off the SLO threshold
    ("pipeline.rules.yml", "> 45", "> 450"),              # the freshness bound
    ("detection.rules.yml", "severity: critical", "severity: warning"),  # a wide incident that only tickets
])
def test_the_promtool_tests_catch_a_wrong_rule(tmp_path, file, right, wrong):
    shutil.copytree(RULES, tmp_path / "generated" / "rules")
    shutil.copytree(RULE_TESTS, tmp_path / "rules_tests")
    path = tmp_path / "generated" / "rules" / file
    text = path.read_text()
    assert right in text
    path.write_text(text.replace(right, wrong))
    assert _promtool_run("check", "rules", path).returncode == 0  # still a valid rule, just a wrong one
    done = _promtool_run("test", "rules", *sorted((tmp_path / "rules_tests").glob("*.test.yml")))
    assert done.returncode != 0, f"promtool tests still pass with {file}: {right!r} -> {wrong!r}"


def test_every_alert_has_severity_region_summary_and_a_runbook_section():
    anchors = {re.sub(r"[^a-z0-9-]", "", line[3:].strip().lower().replace(" ", "-"))
               for line in RUNBOOK.read_text().splitlines() if line.startswith("## ")}
    alerts = _alerts()
    assert len(alerts) >= 10
    for a in alerts:
        name = a["alert"]
        assert a["labels"]["severity"] in (rules.CRITICAL, rules.WARNING), name
        # a static region, or one the expression keeps (by region, the per-region SLO series, or the region
        # label Prometheus gives each collector's scrape target)
        assert ("region" in a["labels"] or re.search(r"by \([^)]*\bregion\b", a["expr"])
                or ":slo_" in a["expr"] or a["expr"] == 'up{job="otelcol"} == 0'), name
        assert a["annotations"]["summary"], name
        url = a["annotations"]["runbook_url"]
        assert url == f"docs/runbook.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/runbook.md has no '## {name}' section"


def test_every_alert_has_a_promtool_test_that_fires_it():
    fired = set()
    for path in RULE_TESTS.glob("*.test.yml"):
        for test in yaml.safe_load(path.read_text())["tests"]:
            fired |= {t["alertname"] for t in test.get("alert_rule_test", []) if t.get("exp_alerts")}
    missing = {a["alert"] for a in _alerts()} - fired
    assert not missing, f"no promtool test fires {sorted(missing)}"


def test_every_rule_file_is_tested():
    tested = set()
    for path in RULE_TESTS.glob("*.test.yml"):
        tested |= {Path(f).name for f in yaml.safe_load(path.read_text())["rule_files"]}
    assert tested == {p.name for p in RULES.glob("*.yml")}


def test_burn_rate_alerts_follow_the_workbook_table():
    assert [(b[1], b[2], b[3]) for b in rules.BURN_ALERTS] == [("1h", "5m", 14.4), ("6h", "30m", 6.0),
                                                               ("3d", "6h", 1.0)]
    config = S.load()
    names = {r.get("record") for f in rules.rule_files(config).values() for g in f["groups"] for r in g["rules"]}
    for _s, long_w, short_w, _r, _sev in rules.BURN_ALERTS:
        for slo in ("ttft", "errors"):
            assert {rules.burn(slo, long_w), rules.burn(slo, short_w)} <= names


def test_amtool_accepts_alertmanager_yml_and_routes_by_severity_and_region():
    from infersight.stack.setup import alertmanager_binary

    amtool = alertmanager_binary().with_name("amtool")
    if not amtool.exists():
        pytest.skip("amtool not installed (`infersight setup` fetches Debian's prometheus-alertmanager with it)")
    config = generate.OUT / "alertmanager.yml"
    done = subprocess.run([str(amtool), "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr

    def receiver(*labels: str) -> str:
        out = subprocess.run([str(amtool), "config", "routes", "test", f"--config.file={config}", *labels],
                             capture_output=True, text=True, timeout=60)
        return out.stdout.strip()

    assert receiver("severity=critical", "region=eu-west-1", "alertname=InfersightTTFTBudgetBurnFast") == "page"
    assert receiver("severity=warning", "region=eu-west-1", "alertname=InfersightAnomalyActive") == "ticket"


def test_the_native_stack_loads_the_rules_and_finds_its_alertmanager(tmp_path):
    from infersight.stack.components import StackLayout
    from infersight.stack.ports import PortPlan

    layout = StackLayout(tmp_path, PortPlan.from_base(20000))
    layout.write_prometheus_config()
    config = yaml.safe_load(layout.prometheus_config.read_text())
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:20007"]
    assert config["storage"]["tsdb"]["out_of_order_time_window"] == "30m"  # the base config's settings kept
    done = _promtool_run("check", "config", layout.prometheus_config)  # loads the rule files it names
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") >= 1 + len(list(RULES.glob("*.yml")))
    # a plan saved before Alertmanager (or the verdict service) joined gets its scheme's port when loaded ...
    saved = {k: v for k, v in PortPlan.from_base(20000).to_dict().items() if k != "alertmanager"}
    assert PortPlan.from_dict({**saved, "verdicts": 0}) == PortPlan.from_base(20000)
    default = {**PortPlan.default().to_dict(), "alertmanager": 0, "sink_otlp": 0, "verdicts": 0}
    assert PortPlan.from_dict(default) == PortPlan.default()
    # ... and one of no known scheme keeps 0: no alerting section, no alertmanager component
    odd = {**PortPlan.from_base(20000).to_dict(), "prometheus": 23333, "alertmanager": 0}
    old = PortPlan.from_dict(odd)
    assert old.alertmanager == 0
    layout = StackLayout(tmp_path, old)
    layout.write_prometheus_config()
    assert "alerting" not in yaml.safe_load(layout.prometheus_config.read_text())
    assert "alertmanager" not in [c.name for c in layout.components()]
