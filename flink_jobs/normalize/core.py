"""The normalize job's pure core: one Kafka record of either input topic -> output records (requests in
batches, pod gauges in batches, dead letters). No PyFlink here; the wiring is in ``job``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from google.protobuf.message import DecodeError

from infersight.flink_jobs.common.deadletter import dead_letter as common_dead_letter
from infersight.flink_jobs.normalize.client_calls import client_call_outputs
from infersight.flink_jobs.normalize.evaluations import evaluation_outputs
from infersight.flink_jobs.normalize.pod_gauges import gauges_from_payload
from infersight.flink_jobs.normalize.span_records import Rejected, TimeBounds, record_dicts_from_payload
from infersight.schemas.records import dump_batch
from infersight.schemas.topics import DLQ, OTLP_METRICS, PODS, REQUESTS
from infersight.schemas.units import MS

JOB = "infersight-normalize"
DEFAULT_BOUNDS = TimeBounds()
# Records per output message: a gateway batch holds up to 2,048 request spans, and 2,048 records (~1.1 MB of
# JSON) went over the producer's 1 MB max.request.size, failing the job in a loop (measured at 4,000/s).
MAX_BATCH_RECORDS = 1000
MAX_BATCH_GAUGES = 4000  # ~230 bytes of JSON each


def dead_letter(reason: str, problems: list[str], topic: str, partition: int, offset: int, raw: bytes,
                trace_id: str | None = None) -> str:
    """The DLQ record (JSON, ``schemas/deadletter.py``): why, where it came from, and the bytes to replay once
    fixed (capped: ``common.deadletter``)."""
    return common_dead_letter(JOB, reason, raw, problems=problems, topic=topic, partition=partition,
                              offset=offset, trace_id=trace_id)


def is_metrics_topic(topic: str) -> bool:
    """The regional OTLP metrics topic, or its mirror on the global cluster (``<region>.infersight.otlp.metrics``,
    MirrorMaker 2's DefaultReplicationPolicy)."""
    return topic == OTLP_METRICS.name or topic.endswith(f".{OTLP_METRICS.name}")


def normalize(topic: str, partition: int, offset: int, payload: bytes, now_ns: int,
              bounds: TimeBounds = DEFAULT_BOUNDS, on_batch: Callable[[int], Any] | None = None
              ) -> Iterator[tuple[str, str, int]]:
    """``(output topic, JSON value, event time ms)`` for one Kafka record of either input topic.

    The request records of one input record leave as one batch (a JSON array: ``schemas.records``
    ``parse_batch`` reads it; several when over ``MAX_BATCH_RECORDS``): per element, not per request,
    is what a PyFlink operator pays for, so the downstream jobs handle a batch per Kafka record. The
    event time (the batch's latest request end, a gauge's time; now for dead letters) becomes the
    output's Kafka timestamp, so downstream jobs get per-partition watermarks in the JVM without
    parsing the JSON."""
    now_ms = now_ns // MS
    try:
        if is_metrics_topic(topic):
            gauges = []
            for gauge in gauges_from_payload(payload, now_ns, bounds):
                if isinstance(gauge, str):
                    yield DLQ.name, dead_letter(gauge, [gauge], topic, partition, offset, payload), now_ms
                else:
                    gauges.append(gauge)
            for lo in range(0, len(gauges), MAX_BATCH_GAUGES):  # a batch, as for requests: ~1,500 points/s
                chunk = gauges[lo:lo + MAX_BATCH_GAUGES]        # at 10,000 requests/s
                yield PODS.name, dump_batch(chunk), max(g["time_ns"] for g in chunk) // MS
            return
        batch = []
        parents: dict[tuple[str, str], str] = {}  # the records whose span has a parent: client-call server halves
        for item in record_dicts_from_payload(payload, now_ns, bounds, parents):  # records as their to_dict()
            if isinstance(item, Rejected):
                yield DLQ.name, dead_letter("; ".join(item.problems), item.problems, topic, partition, offset,
                                            item.span_bytes, item.trace_id), now_ms
            else:
                batch.append(item)
        if batch and on_batch is not None:
            on_batch(len(batch))
        for lo in range(0, len(batch), MAX_BATCH_RECORDS):
            chunk = batch[lo:lo + MAX_BATCH_RECORDS]
            yield REQUESTS.name, dump_batch(chunk), max(r["end_ns"] for r in chunk) // MS
        yield from client_call_outputs(  # both ends of a request, for the client TTFT join (issue #22)
            payload, batch, parents, lambda reason, problems, span_bytes, trace_id: dead_letter(
                reason, problems, topic, partition, offset, span_bytes, trace_id), now_ns, bounds)
        yield from evaluation_outputs(  # judge and guardrail results (issue #17), on their own topic
            payload, lambda reason, problems, trace_id: dead_letter(reason, problems, topic, partition, offset,
                                                                    payload, trace_id), now_ns, bounds)
    except DecodeError as exc:
        what = "metrics" if is_metrics_topic(topic) else "trace"
        reason = f"payload: not an OTLP {what} request (protobuf decode failed: {exc})"
        yield DLQ.name, dead_letter(reason, [reason], topic, partition, offset, payload), now_ms
    except Exception as exc:  # noqa: BLE001 - bad input must never stop the job
        reason = f"payload: could not be normalised ({type(exc).__name__}: {exc})"
        yield DLQ.name, dead_letter(reason, [reason], topic, partition, offset, payload), now_ms
