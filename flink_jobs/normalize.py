"""normalize: request-level OTLP spans -> ``infersight.requests``; pod OTLP metrics -> ``infersight.pods``;
anything undecodable or off-contract -> ``infersight.dlq`` with the reason, source topic/partition/offset
and the raw bytes. The job never stops on bad input.

Exactly-once: checkpoints commit the Kafka source offsets and the sinks' transactions together.
The Kafka source is declared in SQL because only the SQL connector exposes topic/partition/offset
(as metadata columns) to Python; everything after it is the DataStream API.
"""

from __future__ import annotations

import argparse
import base64
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from google.protobuf.message import DecodeError

from infersight.flink_jobs.kafka_io import kafka_sink
from infersight.flink_jobs.pod_gauges import gauges_from_payload
from infersight.flink_jobs.span_records import Rejected, TimeBounds, record_dicts_from_payload
from infersight.schemas.records import dump_batch
from infersight.schemas.topics import DLQ, OTLP_METRICS, OTLP_REQUESTS, PODS, REQUESTS

JOB = "infersight-normalize"
DEFAULT_BOUNDS = TimeBounds()
MS = 1_000_000
# Records per output message: a gateway batch holds up to 2,048 request spans, and 2,048 records (~1.1 MB of
# JSON) went over the producer's 1 MB max.request.size, failing the job in a loop (measured at 4,000/s).
MAX_BATCH_RECORDS = 1000
MAX_BATCH_GAUGES = 4000  # ~230 bytes of JSON each
_JSON = {"separators": (",", ":")}


def dead_letter(reason: str, problems: list[str], topic: str, partition: int, offset: int, raw: bytes,
                trace_id: str | None = None) -> str:
    """The DLQ record (JSON): why, where it came from, and the bytes to replay once fixed."""
    return json.dumps({
        "reason": reason, "problems": problems, "job": JOB, "trace_id": trace_id,
        "source": {"topic": topic, "partition": partition, "offset": offset},
        "raw_base64": base64.b64encode(raw).decode("ascii"), "seen_ns": time.time_ns(),
    }, **_JSON)


def normalize(topic: str, partition: int, offset: int, payload: bytes, now_ns: int,
              bounds: TimeBounds = DEFAULT_BOUNDS, on_batch: Callable[[int], Any] | None = None
              ) -> Iterator[tuple[str, str, int]]:
    """Pure core: ``(output topic, JSON value, event time ms)`` for one Kafka record of either input topic.

    The request records of one input record leave as one batch (a JSON array: ``schemas.records``
    ``parse_batch`` reads it; several when over ``MAX_BATCH_RECORDS``): per element, not per request,
    is what a PyFlink operator pays for, so the downstream jobs handle a batch per Kafka record. The
    event time (the batch's latest request end, a gauge's time; now for dead letters) becomes the
    output's Kafka timestamp, so downstream jobs get per-partition watermarks in the JVM without
    parsing the JSON."""
    now_ms = now_ns // MS
    try:
        if topic == OTLP_METRICS.name:
            gauges = []
            for gauge in gauges_from_payload(payload):
                if isinstance(gauge, str):
                    yield DLQ.name, dead_letter(gauge, [gauge], topic, partition, offset, payload), now_ms
                else:
                    gauges.append(gauge)
            for lo in range(0, len(gauges), MAX_BATCH_GAUGES):  # a batch, as for requests: ~1,500 points/s
                chunk = gauges[lo:lo + MAX_BATCH_GAUGES]        # at 10,000 requests/s
                yield PODS.name, dump_batch(chunk), max(g["time_ns"] for g in chunk) // MS
            return
        batch = []
        for item in record_dicts_from_payload(payload, now_ns, bounds):  # records as their to_dict()
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
    except DecodeError as exc:
        what = "metrics" if topic == OTLP_METRICS.name else "trace"
        reason = f"payload: not an OTLP {what} request (protobuf decode failed: {exc})"
        yield DLQ.name, dead_letter(reason, [reason], topic, partition, offset, payload), now_ms
    except Exception as exc:  # noqa: BLE001 - bad input must never stop the job
        reason = f"payload: could not be normalised ({type(exc).__name__}: {exc})"
        yield DLQ.name, dead_letter(reason, [reason], topic, partition, offset, payload), now_ms


def build(env, brokers: str, group_id: str, bounds: TimeBounds, source_topics: list[str]) -> None:
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.common.watermark_strategy import TimestampAssigner
    from pyflink.datastream import OutputTag, ProcessFunction
    from pyflink.table import StreamTableEnvironment

    t_env = StreamTableEnvironment.create(env)
    t_env.execute_sql(f"""
        CREATE TABLE otlp_in (
            `topic` STRING METADATA VIRTUAL,
            `partition` INT METADATA VIRTUAL,
            `offset` BIGINT METADATA VIRTUAL,
            `payload` BYTES
        ) WITH (
            'connector' = 'kafka',
            'topic' = '{";".join(source_topics)}',
            'properties.bootstrap.servers' = '{brokers}',
            'properties.group.id' = '{group_id}',
            'properties.isolation.level' = 'read_committed',
            'scan.startup.mode' = 'group-offsets',
            'properties.auto.offset.reset' = 'earliest',
            'format' = 'raw'
        )""")
    rows = t_env.to_data_stream(t_env.from_path("otlp_in"))
    dlq_tag = OutputTag("dlq", Types.STRING())
    pods_tag = OutputTag("pods", Types.STRING())

    class Normalize(ProcessFunction):
        def open(self, runtime_context: Any) -> None:
            self.records = runtime_context.get_metrics_group().counter("records")  # requests out (in batches)

        def process_element(self, row: Any, ctx: Any):
            yield from normalize(row[0], row[1], row[2], bytes(row[3]), time.time_ns(), bounds, self.records.inc)

    class EventTime(TimestampAssigner):
        def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
            return value[2]

    class Route(ProcessFunction):
        def process_element(self, value: Any, ctx: Any):
            if value[0] == REQUESTS.name:
                yield value[1]
            elif value[0] == PODS.name:
                yield pods_tag, value[1]
            else:
                yield dlq_tag, value[1]

    records = (rows.process(Normalize(), output_type=Types.TUPLE([Types.STRING(), Types.STRING(), Types.LONG()]))
               .name("normalize")
               # element timestamps = event time; the Kafka sinks write them as the records' timestamps
               .assign_timestamps_and_watermarks(WatermarkStrategy.no_watermarks().with_timestamp_assigner(EventTime()))
               .process(Route(), output_type=Types.STRING()).name("route"))
    records.sink_to(kafka_sink(brokers, REQUESTS.name, group_id)).name(REQUESTS.name)
    records.get_side_output(pods_tag).sink_to(kafka_sink(brokers, PODS.name, group_id)).name(PODS.name)
    records.get_side_output(dlq_tag).sink_to(kafka_sink(brokers, DLQ.name, group_id)).name(DLQ.name)


def main(argv: list[str] | None = None) -> None:
    from infersight.flink_jobs.common.environment import add_jars_option, execution_environment

    parser = argparse.ArgumentParser(prog="normalize", description=__doc__)
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--group-id", default=JOB)
    parser.add_argument("--source-topics", default=f"{OTLP_REQUESTS.name},{OTLP_METRICS.name}")
    parser.add_argument("--max-future-s", type=float, default=DEFAULT_BOUNDS.max_future_s)
    parser.add_argument("--max-age-s", type=float, default=DEFAULT_BOUNDS.max_age_s)
    parser.add_argument("--checkpoint-s", type=float, default=1.0,
                        help="checkpoint interval: read_committed readers see this job's output only at "
                             "checkpoints, so it is on the freshness path (the cluster default is 5 s)")
    add_jars_option(parser)
    args = parser.parse_args(argv)
    env = execution_environment(args.jars)
    env.enable_checkpointing(int(args.checkpoint_s * 1000))
    build(env, args.brokers, args.group_id, TimeBounds(args.max_future_s, args.max_age_s),
          args.source_topics.split(","))
    env.execute(JOB)


if __name__ == "__main__":
    main()
