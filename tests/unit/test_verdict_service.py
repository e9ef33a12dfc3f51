"""The verdict service's HTTP API and webhook (stack/verdict_service.py) on a real loopback server: health,
readiness, every verdict, one rollout by model/version/region (model names with a slash), 404s that say
what is missing, and one webhook POST per rollout's fail, none for fails replayed at start."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infersight.schemas import canary as C
from infersight.stack.verdict_service import Verdicts, handler_for, post_webhook


def event(model, version, region, verdict, final=False):
    return {"rollout": C.rollout_id(model, version, region), "model": model, "canary_version": version,
            "region": region, "verdict": verdict, "final": final, "reasons": [], "metrics": []}


@pytest.fixture
def service():
    verdicts = Verdicts()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(verdicts))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield verdicts, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_health_readiness_and_verdicts(service):
    verdicts, base = service
    assert get(base + "/healthz") == (200, {"status": "ok"})
    assert get(base + "/readyz") == (503, {"ready": False})
    verdicts.ready = True
    assert get(base + "/readyz") == (200, {"ready": True})
    overall = event("org/llama", "v2", "all", "pass", final=True)
    regional = event("org/llama", "v2", "us-east-1", "fail", final=True)
    verdicts.apply(overall["rollout"], overall)
    verdicts.apply(regional["rollout"], regional)
    assert get(base + "/verdicts/org/llama/v2") == (200, overall)
    assert get(base + "/verdicts/org/llama/v2?region=us-east-1") == (200, regional)
    status, body = get(base + "/verdicts")
    assert status == 200 and len(body["verdicts"]) == 2
    status, body = get(base + "/verdicts/org/llama/v3")
    assert status == 404 and "org/llama/v3/all" in body["error"]
    assert get(base + "/nothing")[0] == 404


def test_webhook_fires_once_per_failed_rollout_and_not_for_replayed_fails():
    received = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    hook = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    try:
        verdicts = Verdicts(post_webhook(f"http://127.0.0.1:{hook.server_address[1]}/hook"))
        old = event("m", "v1", "all", "fail", final=True)
        verdicts.apply(old["rollout"], old, replay=True)  # announced by whoever saw it live
        failing = event("m", "v2", "all", "fail", final=True)
        verdicts.apply(failing["rollout"], event("m", "v2", "all", "inconclusive"))
        verdicts.apply(failing["rollout"], failing)
        verdicts.apply(failing["rollout"], failing)  # the same fail again (a replayed look): no second POST
        assert [r["rollout"] for r in received] == ["m/v2/all"]
        assert received[0]["type"] == "canary_fail" and received[0]["event"]["verdict"] == "fail"
    finally:
        hook.shutdown()
        hook.server_close()


def test_an_unreachable_webhook_is_logged_not_raised():
    logged = []
    send = post_webhook("http://127.0.0.1:9/nothing", timeout_s=0.5, log=logged.append)
    send(event("m", "v2", "all", "fail"))
    assert any("gave up" in line for line in logged)


def test_the_demo_inbox_receives_what_the_webhook_posts():
    from infersight.demo import WebhookInbox

    inbox = WebhookInbox()
    try:
        assert inbox.summary() == ""
        fail = event("m", "v2", "all", "fail")
        Verdicts(post_webhook(inbox.url, log=lambda _: None)).apply(fail["rollout"], fail)
        assert [m["rollout"] for m in inbox.received] == ["m/v2/all"]
        assert inbox.received[0]["type"] == "canary_fail" and inbox.received[0]["event"] == fail
        assert inbox.summary() == "webhook: canary fail received for m/v2/all"
    finally:
        inbox.close()


def test_the_topic_reader_survives_a_kafka_that_is_not_up_yet(monkeypatch):
    """The stack may start the service before Kafka answers: the reader retries instead of dying (a dead reader
    left the service up, healthy, and answering nothing)."""
    from infersight.stack import verdict_service

    stop, tries, logged = threading.Event(), [], []

    def flaky(*_args):
        tries.append(1)
        if len(tries) < 3:
            raise RuntimeError("Connect to ipv4#127.0.0.1:1 failed: Connection refused")
        stop.set()

    monkeypatch.setattr(verdict_service, "_follow_once", flaky)
    verdict_service.follow("127.0.0.1:1", "t", Verdicts(), stop, log=logged.append, retry_s=0.01)
    assert len(tries) == 3 and len(logged) == 2 and "Connection refused" in logged[0]
