"""Helpers for the Flink job tests: produce request spans, read topics exactly, query Prometheus."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import requests
from confluent_kafka import Consumer, Producer, TopicPartition

from infersight.schemas.records import RequestRecord, parse_batch
from infersight.schemas.topics import OTLP_REQUESTS
from infersight.stack import jobs as flink
from tests.support.otlp_requests import encode_requests


def produce_requests(bootstrap: str, records: Iterable[RequestRecord], per_message: int = 50,
                     key: bytes = b"test") -> int:
    """Root spans as a gateway writes them (one key: in order on one partition)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    batch: list[RequestRecord] = []
    sent = 0
    for record in records:
        batch.append(record)
        if len(batch) == per_message:
            producer.produce(OTLP_REQUESTS.name, encode_requests(batch), key=key)
            sent += len(batch)
            batch = []
    if batch:
        producer.produce(OTLP_REQUESTS.name, encode_requests(batch), key=key)
        sent += len(batch)
    assert producer.flush(30) == 0
    return sent


def produce_pod_gauges(bootstrap: str, pods: Iterable[dict[str, Any]], time_ns: int, key: bytes = b"test") -> None:
    """One OTLP metrics export on ``infersight.otlp.metrics``, as a gateway writes it: per pod (``resource``:
    its resource attributes; ``gauges``: metric -> value, or a list of per-GPU values, one per ``hw.id``)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    from infersight.schemas.attributes import HW_ID
    from infersight.schemas.topics import OTLP_METRICS

    req = ExportMetricsServiceRequest()
    for pod in pods:
        rm = req.resource_metrics.add()
        for name, value in pod["resource"].items():
            rm.resource.attributes.append(KeyValue(key=name, value=AnyValue(int_value=value) if isinstance(
                value, int) else AnyValue(string_value=value)))
        sm = rm.scope_metrics.add()
        for name, values in pod["gauges"].items():
            metric = sm.metrics.add()
            metric.name = name
            for hw, value in (enumerate(values) if isinstance(values, list) else [(None, values)]):
                point = metric.gauge.data_points.add()
                point.as_double, point.time_unix_nano = float(value), time_ns
                if hw is not None:
                    point.attributes.append(KeyValue(key=HW_ID, value=AnyValue(string_value=str(hw))))
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(OTLP_METRICS.name, req.SerializeToString(), key=key)
    assert producer.flush(30) == 0


def prom_at(url: str, query: str, at_s: float) -> float | None:
    """``query``'s value at ``at_s`` (epoch seconds), or None."""
    resp = requests.get(f"{url}/api/v1/query", params={"query": query, "time": at_s}, timeout=10)
    resp.raise_for_status()
    result = resp.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def read_all(bootstrap: str, topic: str, committed: bool = True, idle_s: float = 3.0) -> list[Any]:
    """Every message of ``topic`` now (read_committed by default), until idle_s without news."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed" if committed else "read_uncommitted"})
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
    out: list[Any] = []
    quiet_since = time.monotonic()
    try:
        while time.monotonic() - quiet_since < idle_s:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            out.append(msg)
            quiet_since = time.monotonic()
    finally:
        consumer.close()
    return out


def request_records(bootstrap: str, topic: str, committed: bool = True) -> list[dict[str, Any]]:
    """The records on ``topic``: batches (``infersight.requests``) or one per message (``infersight.late``)."""
    out = []
    for m in read_all(bootstrap, topic, committed):
        try:
            batch = parse_batch(m.value())
        except ValueError:  # a poison message (the dead-letter tests write some): not a record
            continue
        out.extend(r for r in batch if isinstance(r, dict))
    return out


def prom(url: str, query: str, at_s: float | None = None) -> list[dict[str, Any]]:
    params = {"query": query} if at_s is None else {"query": query, "time": at_s}
    resp = requests.get(f"{url}/api/v1/query", params=params, timeout=10)
    resp.raise_for_status()
    return resp.json()["data"]["result"]


def prom_value(url: str, query: str) -> float | None:
    result = prom(url, query)
    return float(result[0]["value"][1]) if result else None


def wait_until(check: Callable[[], Any], timeout_s: float, what: str, every_s: float = 2.0,
               last_of: Callable[[], Any] | None = None) -> Any:
    """Poll ``check`` until truthy; on time-out the message shows its last result (or ``last_of()``'s)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every_s)
    if last_of is not None:
        last = last_of()
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})")


def since_now_ms() -> int:
    """A job's ``--start-ms`` for a test that sends its traffic from now on (a second's margin for clocks)."""
    return int(time.time() * 1000) - 1000


class Jobs:
    """The normalize and metrics jobs (and archive, given a root) under this test's own group ids."""

    def __init__(self, stack, archive_root=None) -> None:
        self.stack, self.layout, self.archive_root = stack, stack.layout, archive_root
        tag = uuid.uuid4().hex[:8]
        self.start_ms = since_now_ms()
        # multi-region: normalize reads the mirrored <region>.infersight.otlp.* (as stack/jobs.py deploys it)
        sources = getattr(self.layout, "normalize_sources", list)()
        self.args = {
            "infersight.flink_jobs.normalize.job": ["--group-id", f"test-normalize-{tag}", *self.since(),
                                                    *(["--source-topics", ",".join(sources)] if sources else [])],
            "infersight.flink_jobs.metrics.job": ["--group-id", f"test-metrics-{tag}", *self.since()],
        }
        if archive_root is not None:
            self.args["infersight.flink_jobs.archive.job"] = ["--group-id", f"test-archive-{tag}", "--root",
                                                          str(archive_root), "--bucket-s", "10", "--grace-s", "1",
                                                          *self.since()]
        self.ids: dict[str, str] = {}

    def since(self) -> list[str]:
        """The option that starts a job at this test's records, skipping what earlier modules left in the shared
        topics: replayed, their old windows would reach Prometheus again (refused, with the batch around them)."""
        return ["--start-ms", str(self.start_ms)]

    def start(self, restore: bool = False) -> None:
        for module, args in self.args.items():
            path = flink.latest_checkpoint(self.layout, self.ids[module]) if restore else None
            assert path or not restore, f"{module} has no completed checkpoint to restore from"
            self.ids[module] = flink.submit(self.layout, module, ["--brokers", self.layout.kafka_bootstrap, *args],
                                             restore_from=path)

    def running(self) -> bool:
        return all(flink.tasks_running(self.layout, j) for j in self.ids.values())

    def states(self) -> dict[str, str]:
        """Each job's state and its vertices' (a time-out message says which job did not run, and why)."""
        out = {}
        for module, job_id in self.ids.items():
            job = requests.get(f"{self.layout.flink_rest_url}/jobs/{job_id}", timeout=5).json()
            vertices = sorted({v["status"] for v in job.get("vertices", [])})
            out[module.rsplit(".", 2)[-2]] = f"{job['state']} {'/'.join(vertices)}"
        return out

    def stop_quietly(self) -> None:
        """Teardown: stop every job with a savepoint whatever state the cluster is in (a plain cancel would
        leave Kafka transactions open, blocking the next test's read_committed readers for minutes)."""
        for job_id in self.ids.values():
            try:
                flink.stop(self.layout, job_id, timeout_s=180)  # a loaded CI host can take minutes
            except OSError:
                pass

    def cancel(self) -> None:
        for job_id in self.ids.values():
            flink.cancel(self.layout, job_id)
        wait_until(lambda: all(flink.job_state(self.layout, j) == "CANCELED" for j in self.ids.values()), 60,
                   "the jobs to cancel")

    def checkpoints(self) -> dict[str, int]:
        return {m: flink.checkpoint_count(self.layout, j) for m, j in self.ids.items()}
