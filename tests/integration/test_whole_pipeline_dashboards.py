"""The dashboards and alerts against the real pipeline (issue #19): the simulator's fleet (5 % of its requests
judged) through the gateways, normalize, metrics, detect, canary and quality, the sink and Prometheus. A regional
slowdown fires the TTFT fast-burn alert, which reaches the webhook through Alertmanager within the alert's
documented delay and pages no other region; and every panel of every generated dashboard returns data (the
incident panels once the detect job has seen the slowdown, the quality panels from the judged share).

About five minutes: the detect job here scores a series after 12 windows (2 minutes) of history (30 by default,
``--warmup-windows``). Named to run
after the other integration modules, the longest and heaviest last (each module's jobs skip what earlier ones
left in the topics: ``Jobs.since``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from infersight.dashboards import preview
from infersight.demo import endpoints_of
from infersight.simulator.fleet import Perturbation
from infersight.simulator.run import Simulator
from infersight.stack.components import SLO_FILE_ENV
from tests.integration.pipeline_util import Jobs, wait_until
from tests.support.pipeline_load import fleet

pytestmark = pytest.mark.integration

# The fleet's models carry this module's tag: series of their own, never the demo's or another test's (a metrics
# job writing a series another job wrote before sends Prometheus older native-histogram samples, which it refuses
# with the rest of their batch)
TAG = uuid.uuid4().hex[:6]
SLOWED_REGION = "eu-west-1"
SLOWED_MODEL = f"llama-3.1-8b-instruct-{TAG}"
WARMUP_WINDOWS = 12  # the detect job's warm-up here (30 by default: 5 minutes of a CI run)
WARMUP_S = WARMUP_WINDOWS * 10 + 30  # its windows of 10 s, and a little
SLOW_FOR_S = 300
MAGNITUDE = 10  # prefill ~25 ms on an idle pod, x10 and queueing: many first tokens past the 0.5 s threshold
THRESHOLD_S = 0.5  # healthy, none of the model's requests takes this long (0.25 s: ~0.3 %, a burn of 3 at 99.9 %)
OBJECTIVE = 0.999  # so that the fast burn (1 h window) can fire within the test: see PAGE_WITHIN_S
# The fast burn fires when the 1 h window's bad share passes 14.4 x (1 - objective) = 1.44 %: with ~2.5 minutes of
# history in that window and a third of the slowed requests bad, after ~10 s of slow traffic; then the pipeline's
# freshness bound (45 s), two rule evaluations (15 s each), Alertmanager's group wait (10 s) and our polling.
PAGE_WITHIN_S = 10 + 45 + 2 * 15 + 10 + 60
JUDGE_RATE = 0.05  # 15 judged requests/s at 300 requests/s: every region, model and track judged in each window
QUALITY_WINDOW_S = 10


class _Webhook(BaseHTTPRequestHandler):
    received: list[tuple[float, str, dict]] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Webhook.received.append((time.monotonic(), self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def _restart(stack, names: tuple[str, ...]) -> None:
    for name in names:
        stack.stop(name)
    stack.up(only=list(names))


@pytest.fixture
def alerting_for_the_test(stack, tmp_path):
    """The stack's Prometheus with rules from this test's SLO file and its Alertmanager posting to this test's
    webhook; both restored afterwards."""
    slo = tmp_path / "slo.yaml"
    slo.write_text(yaml.safe_dump({
        "default": {"ttft_threshold_s": 2.5, "ttft_objective": 0.99, "availability_objective": 0.95,
                    "period_days": 30},
        "models": {SLOWED_MODEL: {"ttft_threshold_s": THRESHOLD_S, "ttft_objective": OBJECTIVE}}}))
    server = HTTPServer(("127.0.0.1", 0), _Webhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    saved = {k: os.environ.get(k) for k in (SLO_FILE_ENV, "INFERSIGHT_ALERT_WEBHOOK")}
    os.environ[SLO_FILE_ENV] = str(slo)
    os.environ["INFERSIGHT_ALERT_WEBHOOK"] = f"http://127.0.0.1:{server.server_port}"
    try:
        _restart(stack, ("prometheus", "alertmanager"))
        yield _Webhook.received
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _restart(stack, ("prometheus", "alertmanager"))
        server.shutdown()


def _pages(received: list, alertname: str) -> list[tuple[float, dict]]:
    return [(t, a) for t, path, body in received if path == "/page" for a in body["alerts"]
            if a["labels"]["alertname"] == alertname and a["status"] == "firing"]


def test_a_regional_slowdown_pages_and_every_panel_has_data(stack, alerting_for_the_test):
    received = alerting_for_the_test
    lay = stack.layout
    tag = TAG
    stats_topic = f"test-dash-window-stats-{tag}"
    admin = AdminClient({"bootstrap.servers": lay.kafka_bootstrap})  # kept: a collected client cancels futures
    admin.create_topics([NewTopic(stats_topic, 3, 1)])[stats_topic].result(30)
    jobs = Jobs(stack)
    jobs.args["infersight.flink_jobs.metrics.job"] += ["--window-stats-topic", stats_topic]
    jobs.args["infersight.flink_jobs.detect.job"] = ["--group-id", f"test-dash-detect-{tag}", "--input-topic",
                                                      stats_topic, "--warmup-windows", str(WARMUP_WINDOWS),
                                                      *jobs.since()]
    # the fleet's canary pods (10 % of each model's traffic) give the rollouts dashboard its verdicts
    jobs.args["infersight.flink_jobs.canary.job"] = ["--group-id", f"test-dash-canary-{tag}", *jobs.since()]
    # the judged share of the fleet gives the quality dashboard its scores; 10 s windows and the stable track as the
    # canary's baseline give drift distances within minutes (the default baseline is the previous day)
    jobs.args["infersight.flink_jobs.quality.job"] = ["--group-id", f"test-dash-quality-{tag}", "--window-s",
                                                       str(QUALITY_WINDOW_S), "--baseline", "stable_track",
                                                       *jobs.since()]
    jobs.start()
    # five jobs' Python workers start at once on CI's two cores: minutes, not seconds
    wait_until(jobs.running, 360, "the jobs to run", last_of=jobs.states)
    spec = dataclasses.replace(fleet(TAG, 300.0), judge_rate=JUDGE_RATE, perturbations=(
        Perturbation("slow", at_s=WARMUP_S, duration_s=SLOW_FOR_S, magnitude=MAGNITUDE, region=SLOWED_REGION),))
    sim = Simulator(spec, endpoints_of(stack), seed=5).start()
    started = time.monotonic()
    try:
        page = wait_until(lambda: _pages(received, "InfersightTTFTBudgetBurnFast"), WARMUP_S + PAGE_WITHIN_S,
                          "the TTFT fast-burn page at the webhook",
                          last_of=lambda: [(p, [a["labels"]["alertname"] for a in b["alerts"]])
                                           for _, p, b in received])
        at, alert = page[0]
        assert alert["labels"]["region"] == SLOWED_REGION and alert["labels"]["model"] == SLOWED_MODEL, alert
        assert at - started >= WARMUP_S, "paged before the slowdown: the healthy fleet burns its budget"
        assert at - started <= WARMUP_S + PAGE_WITHIN_S
        print(f"page {at - started - WARMUP_S:.0f} s after the slowdown began")

        empty = lambda: preview.empty_panels(lay.prometheus_url, minutes=10)  # noqa: E731
        wait_until(lambda: not empty(), 240, "data in every panel", last_of=empty)
    finally:
        sim.stop(flush_s=10)
        jobs.stop_quietly()
    # this fleet's pages only: the session's Prometheus holds earlier modules' series too, judged here by the test's
    # default objective (test_flink_jobs' exactly-once test sends slow ap-southeast-1 requests: a slow burn for its
    # model while its requests are inside the 30 min window)
    burns = {a["labels"]["region"] for name in ("InfersightTTFTBudgetBurnFast", "InfersightTTFTBudgetBurnSlow")
             for _, a in _pages(received, name) if a["labels"]["model"].endswith(f"-{TAG}")}
    assert burns == {SLOWED_REGION}, f"TTFT burn pages outside the slowed region: {burns}"
