"""The verdict service: the canary verdicts of ``infersight.rollout.verdicts`` over HTTP, for Argo Rollouts' Web
metric provider, Flagger's webhooks and people; a webhook that POSTs a user's URL on each ``fail``; and, with
the ``mlflow`` extra, each final verdict as a run in an MLflow tracking store (``stack/verdict_mlflow.py``).

State is the compacted topic: on start the service reads it from the beginning (one key per rollout, the
latest verdict wins) and is ready once it has caught up; then it follows it. Stdlib HTTP (one small JSON API:
no framework needed), loopback by default.

    GET /healthz                                   200 while the process serves
    GET /readyz                                    200 once the topic is read up to its end at start, else 503
    GET /verdicts                                  {"verdicts": [every rollout's latest verdict event]}
    GET /verdicts/<model>/<canary_version>[?region=<region>]
                                                   the latest verdict event (region: ``all`` by default),
                                                   404 with {"error": ...} when there is none

Run: ``python -m infersight.stack.verdict_service --brokers HOST:PORT [--port 8089] [--webhook-url URL]
[--mlflow-tracking-uri URI]``."""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from infersight.schemas import canary as C
from infersight.schemas.topics import ROLLOUT_VERDICTS
from infersight.stack.verdict_mlflow import EXPERIMENT, background_logger

DEFAULT_PORT = 8089
WEBHOOK_TRIES = 3


class Verdicts:
    """The latest verdict per rollout, and which fails were announced (a fail is announced once per rollout)."""

    def __init__(self, on_fail: Callable[[dict[str, Any]], None] | None = None,
                 on_final: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.lock = threading.Lock()
        self.latest: dict[str, dict[str, Any]] = {}
        self.announced: set[str] = set()
        self.on_fail, self.on_final = on_fail, on_final
        self.ready = False

    def apply(self, key: str, event: dict[str, Any], replay: bool = False) -> None:
        """One event of the topic. During the start-up replay no webhook fires (those fails were announced
        by the instance that saw them live); final verdicts go to ``on_final`` always (its MLflow logging is
        idempotent: a replay logs only what an earlier instance missed)."""
        with self.lock:
            self.latest[key] = event
            fresh_fail = event.get("verdict") == "fail" and key not in self.announced
            if event.get("verdict") == "fail":
                self.announced.add(key)
        if fresh_fail and not replay and self.on_fail is not None:
            self.on_fail(event)
        if event.get("final") and self.on_final is not None:
            self.on_final(event)

    def get(self, model: str, version: str, region: str) -> dict[str, Any] | None:
        with self.lock:
            return self.latest.get(C.rollout_id(model, version, region))

    def all(self) -> list[dict[str, Any]]:
        with self.lock:
            return [self.latest[k] for k in sorted(self.latest)]


def post_webhook(url: str, timeout_s: float = 5.0, log: Callable[[str], None] = print) -> Callable[[dict], None]:
    """A POST of the fail event (JSON) to ``url``, retried; a failure is logged, never raised."""
    def send(event: dict[str, Any]) -> None:
        body = json.dumps({"type": "canary_fail", "rollout": event.get("rollout"), "event": event}).encode()
        for attempt in range(1, WEBHOOK_TRIES + 1):
            try:
                request = urllib.request.Request(url, body, {"Content-Type": "application/json"}, method="POST")
                with urllib.request.urlopen(request, timeout=timeout_s) as response:
                    if response.status < 300:
                        return
            except OSError as exc:
                log(f"webhook {url}: try {attempt} of {WEBHOOK_TRIES} failed: {exc}")
            time.sleep(0.5 * attempt)
        log(f"webhook {url}: gave up on {event.get('rollout')}")
    return send


def handler_for(verdicts: Verdicts) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
            pass  # one line per Argo poll would drown the stack's logs

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, sort_keys=True).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.strip("/").split("/") if p]
            if parts == ["healthz"]:
                self._send(200, {"status": "ok"})
            elif parts == ["readyz"]:
                self._send(200 if verdicts.ready else 503, {"ready": verdicts.ready})
            elif parts == ["verdicts"]:
                self._send(200, {"verdicts": verdicts.all()})
            elif len(parts) >= 3 and parts[0] == "verdicts":
                # model names may hold "/" (``org/model``): the version is the last part, the model the rest
                model, version = "/".join(parts[1:-1]), parts[-1]
                region = parse_qs(url.query).get("region", [C.ALL_REGIONS_LABEL])[0]
                event = verdicts.get(model, version, region)
                if event is None:
                    self._send(404, {"error": f"no verdict for rollout {C.rollout_id(model, version, region)}"})
                else:
                    self._send(200, event)
            else:
                self._send(404, {"error": f"no such path {url.path!r}: see /verdicts, /healthz, /readyz"})

    return Handler


def follow(brokers: str, topic: str, verdicts: Verdicts, stop: threading.Event,
           consumer_config: dict[str, str] | None = None, log: Callable[[str], None] = print,
           retry_s: float = 2.0) -> None:
    """Read ``topic`` from its beginning into ``verdicts``, ready at the end offsets seen at start, until ``stop``.
    A Kafka that is not up yet (the service may start first) or goes away: logged, and read again from the
    beginning (the compacted topic replays every rollout's latest verdict; fails already announced stay so)."""
    while not stop.is_set():
        try:
            _follow_once(brokers, topic, verdicts, stop, consumer_config)
        except Exception as exc:  # noqa: BLE001 - a dead reader would leave the service answering stale verdicts
            log(f"verdicts: reading {topic} failed ({type(exc).__name__}: {exc}); again in {retry_s:.0f} s")
            stop.wait(retry_s)


def _follow_once(brokers: str, topic: str, verdicts: Verdicts, stop: threading.Event,
                 consumer_config: dict[str, str] | None) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": brokers, "group.id": f"verdict-service-{time.time_ns()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         **(consumer_config or {})})
    try:
        while True:  # the stack creates its topics once Kafka is up: wait for this one
            meta = consumer.list_topics(topic, timeout=30).topics.get(topic)
            if (meta is not None and meta.partitions) or stop.wait(1.0):
                break
        if meta is None or not meta.partitions:
            return
        partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=30)[1] for p in partitions}
        consumer.assign(partitions)
        position = {p: 0 for p in ends}
        while not stop.is_set():
            if not verdicts.ready and all(position[p] >= end for p, end in ends.items()):
                verdicts.ready = True
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is not None and msg.error().fatal():
                raise KafkaException(msg.error())
            if msg is None or msg.error() or msg.key() is None:
                continue
            position[msg.partition()] = msg.offset() + 1
            try:
                event = json.loads(msg.value())
            except (TypeError, ValueError):
                continue  # the job writes JSON; anything else is not a verdict
            verdicts.apply(msg.key().decode(), event, replay=not verdicts.ready)
    finally:
        consumer.close()


def serve(brokers: str, host: str, port: int, webhook_url: str | None = None, topic: str = ROLLOUT_VERDICTS.name,
          consumer_config: dict[str, str] | None = None, mlflow_tracking_uri: str | None = None,
          mlflow_experiment: str | None = None) -> tuple[ThreadingHTTPServer, threading.Event, Verdicts]:
    """Start following the topic and serving (both on daemon threads); stop with ``stop.set()`` and
    ``server.shutdown()``."""
    on_final = background_logger(mlflow_tracking_uri, mlflow_experiment or EXPERIMENT) if mlflow_tracking_uri else None
    verdicts = Verdicts(post_webhook(webhook_url) if webhook_url else None, on_final)
    stop = threading.Event()
    threading.Thread(target=follow, args=(brokers, topic, verdicts, stop, consumer_config), daemon=True).start()
    server = ThreadingHTTPServer((host, port), handler_for(verdicts))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, stop, verdicts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="verdict-service", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--topic", default=ROLLOUT_VERDICTS.name)
    parser.add_argument("--webhook-url", help="POST each rollout's first fail verdict here (JSON)")
    parser.add_argument("--mlflow-tracking-uri", help="log each final verdict as a run in this MLflow tracking store "
                                                      "(e.g. sqlite:///verdicts.db; needs the mlflow extra)")
    parser.add_argument("--mlflow-experiment", default=EXPERIMENT, help="the runs' MLflow experiment")
    args = parser.parse_args(argv)
    server, stop, _ = serve(args.brokers, args.host, args.port, args.webhook_url, args.topic,
                            mlflow_tracking_uri=args.mlflow_tracking_uri, mlflow_experiment=args.mlflow_experiment)
    print(f"verdict service on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.shutdown()


if __name__ == "__main__":
    main()
