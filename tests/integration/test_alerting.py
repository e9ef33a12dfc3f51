"""Alerting, natively, without the rest of the stack: Prometheus (the stack's own config) loads every generated
rule group, finds the stack's Alertmanager and scrapes a gateway collector's own telemetry under the names the
dashboards read; Alertmanager (Debian's 0.25, the generated routing) posts critical alerts to the webhook's
/page, one notification per region with that region's alerts grouped."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import yaml

from infersight.dashboards import generate
from infersight.dashboards.common import OTELCOL_NAMES
from infersight.stack import setup
from infersight.stack.components import StackLayout
from infersight.stack.ports import PortPlan

pytestmark = pytest.mark.integration


class _Webhook(BaseHTTPRequestHandler):
    received: list[tuple[str, dict]] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Webhook.received.append((self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _wait(what: str, check, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            got = check()
        except OSError:
            got = None
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.fixture
def alerting(tmp_path, monkeypatch):
    setup.ensure_prometheus()
    setup.ensure_alertmanager()
    setup.ensure_otelcol()
    server = HTTPServer(("127.0.0.1", 0), _Webhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("INFERSIGHT_ALERT_WEBHOOK", f"http://127.0.0.1:{server.server_port}")
    layout = StackLayout(tmp_path, PortPlan.free())
    layout.logs.mkdir(parents=True)
    procs = []
    # one gateway (its Kafka is absent: it starts, queues and serves its telemetry all the same)
    gateway = layout.gateway(0, layout.regions[0])
    (tmp_path / "data" / f"gateway-{layout.regions[0]}" / "queue").mkdir(parents=True)
    try:
        for c in (layout.alertmanager(), layout.prometheus(), gateway):
            if c.prepare:
                c.prepare()
            procs.append(subprocess.Popen(c.argv, stdout=c.log.open("w"), stderr=subprocess.STDOUT,
                                          env={**os.environ, **c.env}))
        for c in (layout.alertmanager(), layout.prometheus(), gateway):
            _wait(f"{c.name} to be ready (log: {c.log})", c.healthy, 60)
        _Webhook.received = []
        yield layout
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(20)
        server.shutdown()


def test_prometheus_loads_every_rule_group_and_finds_alertmanager(alerting):
    want = {g["name"] for path in sorted((generate.OUT / "rules").glob("*.yml"))
            for g in yaml.safe_load(path.read_text())["groups"]}
    groups = _wait("the rule groups", lambda: {g["name"] for g in
                                               _get(f"{alerting.prometheus_url}/api/v1/rules")["data"]["groups"]}, 30)
    assert groups == want
    active = _wait("Prometheus to find Alertmanager",
                   lambda: _get(f"{alerting.prometheus_url}/api/v1/alertmanagers")["data"]["activeAlertmanagers"], 30)
    assert active == [{"url": f"{alerting.alertmanager_url}/api/v2/alerts"}]


def test_a_regions_critical_alerts_reach_the_page_webhook_as_one_notification(alerting):
    def alert(name: str, region: str, severity: str = "critical") -> dict:
        return {"labels": {"alertname": name, "region": region, "severity": severity, "model": "m"},
                "annotations": {"summary": name, "runbook_url": f"docs/runbook.md#{name.lower()}"}}

    alerts = [alert("InfersightTTFTBudgetBurnFast", "eu-west-1"), alert("InfersightRegionNoData", "eu-west-1"),
              alert("InfersightTTFTBudgetBurnFast", "us-east-1")]
    request = urllib.request.Request(f"{alerting.alertmanager_url}/api/v2/alerts", json.dumps(alerts).encode(),
                                     {"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=5).close()
    pages = _wait("two /page notifications (group_wait 10 s)",
                  lambda: [b for path, b in _Webhook.received if path == "/page"][:2]
                  if len([p for p, _ in _Webhook.received if p == "/page"]) >= 2 else None, 45)
    by_region = {b["groupLabels"]["region"]: sorted(a["labels"]["alertname"] for a in b["alerts"]) for b in pages}
    assert by_region == {"eu-west-1": ["InfersightRegionNoData", "InfersightTTFTBudgetBurnFast"],
                         "us-east-1": ["InfersightTTFTBudgetBurnFast"]}
    assert all(b["receiver"] == "page" and b["status"] == "firing" for b in pages)


def test_every_dashboard_query_is_valid_promql_for_the_stacks_prometheus(alerting):
    """Grafana's variables filled in as it would with "All"; a query Prometheus cannot parse answers 400."""
    subst = {"$__rate_interval": "1m", "$__range": "1h", "$region": ".*", "$model": ".*", "$version": ".*",
             "$track": ".*"}
    bad = []
    for path in sorted(generate.OUT.glob("*.json")):
        d = json.loads(path.read_text())
        exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
        exprs += [a["expr"] for a in d["annotations"].get("list", [])]
        for expr in exprs:
            for k, v in subst.items():
                expr = expr.replace(k, v)
            url = f"{alerting.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            try:
                _get(url)
            except urllib.error.HTTPError as exc:
                bad.append(f"{path.name}: {expr}: {exc.read().decode()[:200]}")
    assert not bad, "\n".join(bad)


def test_prometheus_scrapes_the_collectors_telemetry_under_the_dashboards_names(alerting):
    region = alerting.regions[0]

    def scraped() -> set[str]:
        query = urllib.parse.urlencode({"query": f'{{job="otelcol", region="{region}", collector="gateway"}}'})
        result = _get(f"{alerting.prometheus_url}/api/v1/query?{query}")["data"]["result"]
        names = {r["metric"]["__name__"] for r in result}
        return names if {"up", "otelcol_exporter_queue_size"} <= names else set()

    names = _wait("a scrape of the gateway's telemetry (every 15 s)", scraped, 60)
    # the receiver's counters appear with the first request; the rest are there from the start
    assert set(OTELCOL_NAMES) - {"otelcol_receiver_accepted_spans", "otelcol_receiver_refused_spans"} <= names
    up = _get(f"{alerting.prometheus_url}/api/v1/query?" + urllib.parse.urlencode(
        {"query": f'up{{job="otelcol", region="{region}"}}'}))["data"]["result"]
    assert [r["value"][1] for r in up] == ["1"]
