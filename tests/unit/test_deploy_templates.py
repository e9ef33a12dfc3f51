"""deploy/: the Argo Rollouts AnalysisTemplates' and the Flagger MetricTemplate's conditions and queries against
real verdicts. Verdict events come from the canary core on request records, are served by the real verdict
service over loopback HTTP at the URL the template builds, selected by the template's jsonPath, and the
conditions are evaluated by github.com/expr-lang/expr (the language Argo Rollouts evaluates them with) through
deploy/exprcheck (Go, from the module proxy). Argo and Kubernetes cannot run here: the templates are not applied."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import yaml

from infersight.flink_jobs.canary.core import NS, Bake, BakeConfig
from infersight.schemas import canary as C
from infersight.stack.verdict_service import Verdicts, handler_for

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="needs Go (deploy/exprcheck)")


def templates(name: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d}


def expr(checks: list[tuple[str, object]]) -> list[object]:
    """Evaluate (condition, result) pairs with expr-lang/expr."""
    out = subprocess.run(["go", "run", "."], cwd=DEPLOY / "exprcheck", check=True, capture_output=True, text=True,
                         timeout=300, input=json.dumps([{"expr": e, "result": r} for e, r in checks]))
    return json.loads(out.stdout)


def events() -> dict[str, dict]:
    """Real verdict events: an interim look, a final pass, an early fail, a final inconclusive (too little data)."""
    rng = np.random.default_rng(1)
    config = BakeConfig(bake_s=120.0, interval_s=30.0)

    def run(slow: float, n: int, looks: int, version: str) -> dict:
        bake = Bake("org/llama", "", 0, config)
        out = {}
        for k in range(looks):
            recs = [{"track": track, "model_version": version if track == "canary" else "v1", "region": "us",
                     "end_ns": int((k * 30 + 1) * NS), "ttft_s": float(x), "e2e_s": float(x) * 4, "error_type": None}
                    for track, m, size in (("canary", slow, n), ("stable", 1.0, 4 * n))
                    for x in rng.lognormal(np.log(0.05 * m), 0.4, size)]
            bake.add_records(recs)
            out = bake.evaluate(int((k + 1) * 30 * NS))
            if out["final"]:
                break
        return {**out, "region": "all", "rollout": C.rollout_id("org/llama", out["canary_version"], "all")}

    got = {"interim": run(1.0, 300, 1, "v-interim"), "pass": run(1.0, 300, 4, "v-pass"),
           "fail": run(1.6, 300, 4, "v-fail"), "inconclusive": run(1.0, 3, 4, "v-thin")}
    assert [got[k]["verdict"] for k in got] == ["inconclusive", "pass", "fail", "inconclusive"]
    assert [got[k]["final"] for k in got] == [False, True, True, True]
    return got


@pytest.fixture(scope="module")
def served():
    verdicts = Verdicts()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(verdicts))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    got = events()
    for e in got.values():
        verdicts.apply(e["rollout"], e)
    yield got, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def web_result(metric: dict, base: str, event: dict) -> object:
    args = {"verdict-service": base, "model": event["model"], "canary-version": event["canary_version"],
            "region": "all"}
    url = metric["provider"]["web"]["url"]
    for k, v in args.items():
        url = url.replace("{{args." + k + "}}", v)
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.loads(r.read())
    assert metric["provider"]["web"]["jsonPath"] == "{$}"  # the whole response (Kubernetes JSONPath root)
    return body


def test_argo_web_templates_on_the_services_real_responses(served):
    got, base = served
    t = templates("argo/analysis-template-web.yaml")
    (watch,) = t["infersight-canary-watch"]["spec"]["metrics"]
    (gate,) = t["infersight-canary-gate"]["spec"]["metrics"]
    checks, expected = [], []
    outcome = {  # event -> (watch fails, gate succeeds, gate fails)
        "interim": (False, False, False), "pass": (False, True, False), "fail": (True, False, True),
        "inconclusive": (False, False, True)}
    for name, (watch_fails, gate_ok, gate_fails) in outcome.items():
        result = web_result(watch, base, got[name])
        assert result == got[name]
        checks += [(watch["failureCondition"], result), (gate["successCondition"], result),
                   (gate["failureCondition"], result)]
        expected += [watch_fails, gate_ok, gate_fails]
    assert expr(checks) == expected


def test_argo_prometheus_template_conditions_on_the_verdict_gauges(served):
    got, _ = served
    (tmpl,) = templates("argo/analysis-template-prometheus.yaml").values()
    watch, gate = tmpl["spec"]["metrics"]
    assert C.PROM_VERDICT in watch["provider"]["prometheus"]["query"]
    assert C.PROM_FINAL in gate["provider"]["prometheus"]["query"]
    checks, expected = [], []
    for e in got.values():
        code = C.VERDICT_CODE[e["verdict"]]
        # the Prometheus provider's result for a vector query: its sample values (empty before the first look)
        final_pass = [] if not e["final"] else [1.0 if e["verdict"] == "pass" else 0.0]
        checks += [(watch["failureCondition"], [float(code)]), (gate["successCondition"], final_pass),
                   (gate["failureCondition"], final_pass)]
        expected += [e["verdict"] == "fail", e["final"] and e["verdict"] == "pass",
                     e["final"] and e["verdict"] != "pass"]
    checks.append((watch["failureCondition"], []))  # no verdict yet: not a failure
    expected.append(False)
    assert expr(checks) == expected


def test_flagger_metric_template_and_rollout_reference_real_names():
    (mt,) = templates("flagger/metric-template.yaml").values()
    assert mt["kind"] == "MetricTemplate" and C.PROM_VERDICT in mt["spec"]["query"]
    assert f"== bool {C.VERDICT_CODE['fail']}" in mt["spec"]["query"]
    (rollout,) = templates("argo/rollout.yaml").values()
    canary = rollout["spec"]["strategy"]["canary"]
    names = set(templates("argo/analysis-template-web.yaml"))
    used = {t["templateName"] for t in canary["analysis"]["templates"]}
    used |= {t["templateName"] for s in canary["steps"] if "analysis" in s for t in s["analysis"]["templates"]}
    assert used <= names and any("pause" in s for s in canary["steps"])
