"""The region status service (multi-region topology): per region ``ok | link_delayed | gateways_down |
no_traffic``, the link lag and the backlog, on the compacted topic ``infersight.region_status`` and as
Prometheus series (``schemas/region_status.py``; the judgement itself is ``stack/region_status.py``).

A small service rather than a Flink job: it judges by the wall clock and must probe each regional cluster
through its link, which a Flink job's event time and checkpoint-committed sinks would delay by a checkpoint,
and it has to keep judging when the Flink cluster is the thing that is down.

What it reads, on its own threads:

- per region, every ``--probe-interval-s``: the regional cluster through the region's link (the bootstrap MM2
  uses), ``ListOffsets`` for the mirrored topics (end offsets) and the beacon topic (newest timestamp);
- on the global cluster, ``read_committed``: the mirrored beacons ``<region>.infersight.otlp.beacons`` and
  MM2's offsets topics (the source offset it has copied each regional partition up to, committed in the same
  transaction as the records): ``mm2-offsets.<alias>.internal`` in dedicated mode (the native stack), the
  Connect cluster's ``--offsets-topic`` under Strimzi (the global chart: ``stack/mirror.py``'s
  ``OFFSET_STORAGE_TOPIC``).

    GET /healthz   200 while the process serves and all its threads run (503 and their names otherwise)
    GET /status    {"regions": [the latest record of every region]}
    GET /metrics   the Prometheus series (text format 0.0.4)

Run: ``python -m infersight.stack.region_status_service --global-brokers HOST:PORT
--region REGION=HOST:PORT [--region ...] [--region-ca REGION=CA.PEM ...] [--port 8084]``; ``service_args`` builds
that list for the native stack and the global Helm chart alike. ``--region-ca``: the region's link is TLS (the
region chart's ``mirror`` listener) and its broker is verified against that CA, as MM2 does.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from infersight.schemas import region_status as RS
from infersight.schemas.topics import GATEWAY_BEACONS, REGION_STATUS
from infersight.stack import mirror
from infersight.stack.region_status import Beacon, Probe, RegionJudge, Thresholds

MODULE = "infersight.stack.region_status_service"
DEFAULT_PORT = 8084
OFFSETS_TOPIC_PREFIX, OFFSETS_TOPIC_SUFFIX = "mm2-offsets.", ".internal"
RECENT_BEACONS = 60  # read this many mirrored beacons back at start: rates are known at once
QUIET = {"log_level": 0}  # a cut link makes librdkafka log every retry; the status says it once


def service_args(global_brokers: str, links: dict[str, str], host: str, port: int,
                 offsets_topic: str | None = None, cas: dict[str, str] | None = None) -> list[str]:
    """The service's arguments after ``python -m MODULE``, in one place: the native stack starts it with them and
    a test holds the global chart's Deployment to them. ``links``: region -> its cluster as MM2 reaches it;
    ``cas``: region -> the CA file its TLS link is verified against (none: plaintext)."""
    return ["--global-brokers", global_brokers, "--host", host, "--port", str(port),
            *(["--offsets-topic", offsets_topic] if offsets_topic else []),
            *(a for region, bootstrap in links.items() for a in ("--region", f"{region}={bootstrap}")),
            *(a for region, ca in (cas or {}).items() for a in ("--region-ca", f"{region}={ca}"))]


def link_client_config(bootstrap: str, ca: str | None) -> dict[str, Any]:
    """The librdkafka settings of a probe through a region's link: TLS verified against the region's CA when
    given (the region chart's listener), else plaintext (the native stack's loopback relays)."""
    tls = {"security.protocol": "SSL", "ssl.ca.location": ca} if ca else {}
    return {"bootstrap.servers": bootstrap, "socket.timeout.ms": 3000, "reconnect.backoff.max.ms": 1000, **tls,
            **QUIET}


def is_offsets_topic(name: str, connect_offsets_topics: frozenset[str] = frozenset()) -> bool:
    """MM2's source offsets on the global cluster: dedicated mode writes one topic per source alias; as a Connect
    cluster (Strimzi) every flow shares the cluster's offsets topic, which the keys' ``cluster`` tells apart."""
    return name in connect_offsets_topics or (name.startswith(OFFSETS_TOPIC_PREFIX)
                                               and name.endswith(OFFSETS_TOPIC_SUFFIX))


def decode_beacon(payload: bytes, timestamp_ms: int) -> list[Beacon]:
    """The beacons (one per gateway resource) of one OTLP ExportMetricsServiceRequest."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    request = ExportMetricsServiceRequest()
    request.ParseFromString(payload)
    out = []
    for rm in request.resource_metrics:
        attrs = {a.key: a.value.string_value for a in rm.resource.attributes}
        accepted = queue = 0.0
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == "otelcol_receiver_accepted_spans":
                    accepted += sum(_value(p) for p in m.sum.data_points if _attr(p, "receiver") == "otlp")
                elif m.name == "otelcol_exporter_queue_size":
                    queue += sum(_value(p) for p in m.gauge.data_points)
        out.append(Beacon(attrs.get("service.instance.id", ""), timestamp_ms, accepted, queue))
    return out


def _value(point: Any) -> float:
    return float(point.as_double if point.WhichOneof("value") == "as_double" else point.as_int)


def _attr(point: Any, key: str) -> str:
    return next((a.value.string_value for a in point.attributes if a.key == key), "")


def parse_offset_record(key: bytes | None, value: bytes | None) -> tuple[str, str, int, int | None] | None:
    """(cluster, topic, partition, next offset) of one record of MM2's offsets topic, or None for another
    connector's. MirrorSourceConnector keys ``["<connector>", {"cluster": c, "topic": t, "partition": p}]`` and
    values ``{"offset": n}`` (the last offset copied); a tombstone gives None as the offset."""
    try:
        _, part = json.loads(key or b"null")
        cluster, topic, partition = part["cluster"], part["topic"], int(part["partition"])
    except (TypeError, ValueError, KeyError):
        return None
    if value is None:
        return cluster, topic, partition, None
    try:
        return cluster, topic, partition, int(json.loads(value)["offset"]) + 1
    except (TypeError, ValueError, KeyError):
        return None


def prometheus_text(records: list[dict[str, Any]], changes: dict[str, int]) -> str:
    lines = [f"# HELP {RS.STATUS} 1 for the region's current status (schemas.region_status)",
             f"# TYPE {RS.STATUS} gauge"]
    for r in records:
        for s in RS.STATUSES:
            lines.append(f'{RS.STATUS}{{{RS.LABEL_REGION}="{r["region"]}",{RS.LABEL_STATUS}="{s}"}} '
                         f'{1 if r["status"] == s else 0}')
    series = ((RS.LINK_LAG_SECONDS, "gauge", "how far the mirrored beacons are behind the region's", "link_lag_s"),
              (RS.BACKLOG_RECORDS, "gauge", "records in the region not mirrored yet", "backlog_records"),
              (RS.LINK_UP, "gauge", "1 when the last probe through the region's link answered", "link_up"))
    for name, kind, help_, field in series:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        for r in records:
            if r[field] is not None:
                lines.append(f'{name}{{{RS.LABEL_REGION}="{r["region"]}"}} {float(r[field]):g}')
    lines += [f"# HELP {RS.STATUS_CHANGES} status transitions", f"# TYPE {RS.STATUS_CHANGES} counter"]
    for r in records:
        lines.append(f'{RS.STATUS_CHANGES}{{{RS.LABEL_REGION}="{r["region"]}"}} {changes.get(r["region"], 0)}')
    return "\n".join(lines) + "\n"


class RegionStatusService:
    """The judges of every region, fed by the probe and reader threads, judged and published by ``run``."""

    def __init__(self, global_brokers: str, links: dict[str, str], thresholds: Thresholds | None = None,
                 probe_interval_s: float = 1.0, probe_timeout_s: float = 2.5, judge_interval_s: float = 1.0,
                 refresh_s: float = 5.0, topic: str = REGION_STATUS.name,
                 log: Callable[[str], None] = print, offsets_topics: tuple[str, ...] = (),
                 cas: dict[str, str] | None = None) -> None:
        mirror.check_regions(list(links))
        unknown = sorted(set(cas or ()) - set(links))
        if unknown:
            raise ValueError(f"a CA for regions without a link: {', '.join(unknown)}")
        self.global_brokers, self.links, self.topic, self.log = global_brokers, links, topic, log
        self.cas = dict(cas or {})
        self.offsets_topics = frozenset(offsets_topics)
        self.probe_interval_s, self.probe_timeout_s = probe_interval_s, probe_timeout_s
        self.judge_interval_s, self.refresh_s = judge_interval_s, refresh_s
        now = time.monotonic()
        self.judges = {r: RegionJudge(r, now, thresholds) for r in links}
        self.lock = threading.Lock()
        self.latest: dict[str, dict[str, Any]] = {}
        self.publish_error: str | None = None  # the last refusal of the status topic, until a record goes out
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()

    # -- probes through the links -----------------------------------------------------------------------------
    def probe_loop(self, region: str) -> None:
        from confluent_kafka.admin import AdminClient

        def client() -> AdminClient:
            return AdminClient(link_client_config(self.links[region], self.cas.get(region)))

        admin = client()
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                probe = self.probe_once(admin, region)
            except Exception as exc:  # noqa: BLE001 - every failure of the link is an answer: "not now"
                with self.lock:
                    self.judges[region].probe_failed(time.monotonic(), f"{type(exc).__name__}: {exc}"[:160])
                # A fresh client after a failure: a regional broker stopped and started again left the old one
                # with the metadata of its shutdown (no partition leaders), and it kept failing with "No leaders
                # found" for minutes after the broker was back (measured: regional_kafka_down).
                admin = client()
            else:
                with self.lock:
                    self.judges[region].probe_ok(probe)
            self.stop.wait(max(0.0, self.probe_interval_s - (time.monotonic() - started)))

    def probe_once(self, admin: Any, region: str) -> Probe:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        timeout = self.probe_timeout_s
        latest = {TopicPartition(t.name, p): OffsetSpec.latest()
                  for t in mirror.mirrored_topics() for p in range(t.partitions)}
        ends = {(tp.topic, tp.partition): f.result(timeout=timeout + 1).offset
                for tp, f in admin.list_offsets(latest, request_timeout=timeout).items()}
        invalid = sorted(f"{t}[{p}]" for (t, p), n in ends.items() if n is None or n < 0)
        if invalid:  # an answer without offsets is no answer (librdkafka reports some failures this way)
            raise RuntimeError(f"no end offset for {', '.join(invalid[:3])}")
        newest = {TopicPartition(GATEWAY_BEACONS.name, p): OffsetSpec.max_timestamp()
                  for p in range(GATEWAY_BEACONS.partitions)}
        stamps = [f.result(timeout=timeout + 1).timestamp
                  for f in admin.list_offsets(newest, request_timeout=timeout).values()]
        stamps = [s for s in stamps if s is not None and s >= 0]
        beacon_end = sum(n for (topic, _), n in ends.items() if topic == GATEWAY_BEACONS.name)
        return Probe(time.monotonic(), beacon_end, max(stamps) if stamps else None, ends)

    # -- the global cluster: mirrored beacons and MM2's offsets -------------------------------------------------
    def read_loop(self) -> None:
        while not self.stop.is_set():
            try:
                self._read()
            except Exception as exc:  # noqa: BLE001 - keep reading; a global broker restart is survivable
                self.log(f"region-status: reading the global cluster failed ({type(exc).__name__}: {exc})")
                self.stop.wait(2.0)

    def _read(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.global_brokers, "group.id": f"region-status-{time.time_ns()}",
                             "enable.auto.commit": False, "isolation.level": "read_committed", **QUIET})
        beacon_topics = {mirror.global_topic(r, GATEWAY_BEACONS): r for r in self.links}
        assigned: set[str] = set()
        next_scan = 0.0
        try:
            while not self.stop.is_set():
                if time.monotonic() >= next_scan:  # MM2 creates its offsets topics when it starts: look again
                    next_scan = time.monotonic() + 10
                    topics = consumer.list_topics(timeout=10).topics
                    new = []
                    for name, meta in topics.items():
                        wanted = name in beacon_topics or is_offsets_topic(name, self.offsets_topics)
                        if not wanted or name in assigned or not meta.partitions:
                            continue
                        assigned.add(name)
                        for p in meta.partitions:
                            tp = TopicPartition(name, p, OFFSET_BEGINNING)
                            if name in beacon_topics:
                                low, high = consumer.get_watermark_offsets(tp, timeout=10)
                                tp.offset = max(low, high - RECENT_BEACONS)
                            new.append(tp)
                    if new:
                        consumer.incremental_assign(new)
                for msg in consumer.consume(500, timeout=0.5):
                    if msg.error() is not None:
                        continue
                    self._record(beacon_topics, msg)
        finally:
            consumer.close()

    def _record(self, beacon_topics: dict[str, str], msg: Any) -> None:
        now = time.monotonic()
        region = beacon_topics.get(msg.topic())
        if region is not None:
            try:
                beacons = decode_beacon(msg.value(), msg.timestamp()[1])
            except Exception:  # noqa: BLE001 - not a beacon: nothing to learn from it
                return
            with self.lock:
                for b in beacons:
                    self.judges[region].beacon(b, now)
            return
        parsed = parse_offset_record(msg.key(), msg.value())
        if parsed is None or parsed[0] not in self.judges or parsed[3] is None:
            return
        cluster, topic, partition, next_offset = parsed
        with self.lock:
            self.judges[cluster].mirrored_offset((topic, partition), next_offset)

    # -- judge and publish ------------------------------------------------------------------------------------
    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.global_brokers, "enable.idempotence": True,
                             "linger.ms": 5, **QUIET})
        published: dict[str, tuple[str, float]] = {}
        while not self.stop.is_set():
            try:
                self.judge_and_publish(producer, published)
            except Exception as exc:  # noqa: BLE001 - a judge that stops leaves every status stale: log, go on
                self.log(f"region-status: judging failed ({type(exc).__name__}: {exc})")
            producer.poll(0)
            self.stop.wait(self.judge_interval_s)
        producer.flush(5)

    def judge_and_publish(self, producer: Any, published: dict[str, tuple[str, float]]) -> None:
        """Judge every region; publish a record on a change and every ``refresh_s`` (``published``: the last
        status published per region and when). A record the global cluster refuses (away, or the topic not there
        yet) is published on the next turn."""
        from confluent_kafka import KafkaException

        now, now_ms = time.monotonic(), int(time.time() * 1000)
        with self.lock:
            records = {r: j.judge(now, now_ms) for r, j in self.judges.items()}
            self.latest = records
        for region, record in records.items():
            last = published.get(region)
            if last is not None and last[0] == record["status"] and now - last[1] < self.refresh_s:
                continue
            if last is not None and last[0] != record["status"]:
                self.log(f"region-status: {region} {last[0]} -> {record['status']}: {record['reason']}")
            try:
                producer.produce(self.topic, json.dumps(record, sort_keys=True).encode(), key=region.encode())
            except (BufferError, KafkaException) as exc:
                if self.publish_error is None:
                    self.log(f"region-status: publishing to {self.topic} failed, trying again ({exc})")
                self.publish_error = str(exc)
                return
            published[region] = (record["status"], now)
            self.publish_error = None

    def records(self) -> list[dict[str, Any]]:
        with self.lock:
            return [self.latest[r] for r in sorted(self.latest)]

    def metrics(self) -> str:
        with self.lock:
            changes = {r: j.changes for r, j in self.judges.items()}
        return prometheus_text(self.records(), changes)

    def dead_threads(self) -> list[str]:
        """The worker threads that ended while the service runs (each loop catches its failures: a bug)."""
        return [t.name for t in self.threads if not t.is_alive()] if not self.stop.is_set() else []

    def start(self, host: str, port: int) -> ThreadingHTTPServer:
        self.threads = [threading.Thread(target=self.probe_loop, args=(region,), daemon=True, name=f"probe-{region}")
                        for region in self.links]
        self.threads += [threading.Thread(target=self.read_loop, daemon=True, name="read"),
                         threading.Thread(target=self.run, daemon=True, name="judge")]
        for thread in self.threads:
            thread.start()
        server = ThreadingHTTPServer((host, port), handler_for(self))
        threading.Thread(target=server.serve_forever, daemon=True, name="http").start()
        return server


def handler_for(service: RegionStatusService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
            pass  # a scrape every few seconds

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            path = self.path.split("?")[0].rstrip("/")
            if path == "/healthz":  # unhealthy when a worker thread died: its part of the status would go stale
                dead = service.dead_threads()
                self._send(503 if dead else 200, json.dumps({"status": "dead threads" if dead else "ok",
                                                            "dead_threads": dead}).encode(), "application/json")
            elif path == "/status":
                self._send(200, json.dumps({"regions": service.records()}, sort_keys=True).encode(),
                           "application/json")
            elif path == "/metrics":
                self._send(200, service.metrics().encode(), "text/plain; version=0.0.4")
            else:
                self._send(404, json.dumps({"error": f"no such path {path!r}: see /status, /metrics, /healthz"})
                           .encode(), "application/json")

    return Handler


def _pair(form: str) -> Callable[[str], tuple[str, str]]:
    def parse(text: str) -> tuple[str, str]:
        region, sep, value = text.partition("=")
        if not sep or not region or not value:
            raise argparse.ArgumentTypeError(f"{text!r} is not {form}")
        return region, value
    return parse


def arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="region-status", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--global-brokers", required=True, help="the global cluster (mirrored beacons, MM2 offsets)")
    parser.add_argument("--region", action="append", type=_pair("REGION=HOST:PORT"), required=True,
                        help="REGION=HOST:PORT: a region and its cluster as MM2 reaches it (through its link)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--topic", default=REGION_STATUS.name)
    parser.add_argument("--offsets-topic", action="append", default=[],
                        help="MM2's Connect offsets topic when it runs as a Connect cluster (Strimzi's "
                             "KafkaMirrorMaker2); dedicated mode's mm2-offsets.<alias>.internal are always read")
    parser.add_argument("--region-ca", action="append", type=_pair("REGION=CA.PEM"), default=[],
                        help="REGION=CA.PEM: the region's link is TLS, its broker verified against this CA")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = arg_parser().parse_args(argv)
    service = RegionStatusService(args.global_brokers, dict(args.region), topic=args.topic,
                                  offsets_topics=tuple(args.offsets_topic), cas=dict(args.region_ca))
    server = service.start(args.host, args.port)
    print(f"region status service on http://{args.host}:{server.server_address[1]} for "
          f"{', '.join(service.links)}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        service.stop.set()
        server.shutdown()


if __name__ == "__main__":
    main()
