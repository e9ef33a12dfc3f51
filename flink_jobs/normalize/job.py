"""normalize: request-level OTLP spans -> ``infersight.requests``; pod OTLP metrics -> ``infersight.pods``;
the two ends of a called request (client spans with ``infersight.client.ttft``, request spans with a parent)
-> ``infersight.client_calls``;
anything undecodable or off-contract -> ``infersight.dlq`` with the reason, source topic/partition/offset
and the raw bytes. The job never stops on bad input.

Exactly-once: checkpoints commit the Kafka source offsets and the sinks' transactions together.
The Kafka source is declared in SQL because only the SQL connector exposes topic/partition/offset
(as metadata columns) to Python; everything after it is the DataStream API.

    python -m infersight.flink_jobs.normalize.job --brokers HOST:PORT --jars URL;URL
"""

from __future__ import annotations

import argparse

from infersight.flink_jobs.normalize.core import DEFAULT_BOUNDS, JOB
from infersight.flink_jobs.normalize.span_records import TimeBounds
from infersight.schemas.topics import CLIENT_CALLS, DLQ, EVALUATIONS, OTLP_METRICS, OTLP_REQUESTS, PODS, REQUESTS


def build(env, brokers: str, group_id: str, bounds: TimeBounds, source_topics: list[str],
          start_ms: int | None = None) -> None:
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.table import StreamTableEnvironment

    from infersight.flink_jobs.common.kafka_io import kafka_sink, sql_client_options
    from infersight.flink_jobs.normalize import functions as F

    startup = ("'scan.startup.mode' = 'group-offsets', 'properties.auto.offset.reset' = 'earliest'" if start_ms is None
               else f"'scan.startup.mode' = 'timestamp', 'scan.startup.timestamp-millis' = '{start_ms}'")
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
            {startup},
            'format' = 'raw'{sql_client_options()}
        )""")
    rows = t_env.to_data_stream(t_env.from_path("otlp_in"))
    outputs = Types.TUPLE([Types.STRING(), Types.STRING(), Types.LONG()])  # (topic, JSON value, event time ms)
    records = (rows.process(F.Normalize(bounds), output_type=outputs)
               .name("normalize")
               # element timestamps = event time; the Kafka sinks write them as the records' timestamps
               .assign_timestamps_and_watermarks(WatermarkStrategy.no_watermarks().with_timestamp_assigner(F.EventTime())))
    for topic in (REQUESTS, PODS, DLQ, EVALUATIONS, CLIENT_CALLS):
        (records.flat_map(F.Select(topic.name), output_type=Types.STRING()).name(f"select-{topic.name}")
         .sink_to(kafka_sink(brokers, topic.name, group_id)).name(topic.name))


def main(argv: list[str] | None = None) -> None:
    from infersight.flink_jobs.common.environment import add_jars_option, execution_environment
    from infersight.flink_jobs.common.kafka_io import add_start_option

    parser = argparse.ArgumentParser(prog="normalize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--group-id", default=JOB)
    parser.add_argument("--source-topics", default=f"{OTLP_REQUESTS.name},{OTLP_METRICS.name}")
    parser.add_argument("--max-future-s", type=float, default=DEFAULT_BOUNDS.max_future_s)
    parser.add_argument("--max-age-s", type=float, default=DEFAULT_BOUNDS.max_age_s)
    parser.add_argument("--checkpoint-s", type=float, default=1.0,
                        help="checkpoint interval: read_committed readers see this job's output only at "
                             "checkpoints, so it is on the freshness path (the cluster default is 5 s)")
    add_start_option(parser)
    add_jars_option(parser)
    args = parser.parse_args(argv)
    env = execution_environment(args.jars)
    env.enable_checkpointing(int(args.checkpoint_s * 1000))
    build(env, args.brokers, args.group_id, TimeBounds(args.max_future_s, args.max_age_s),
          args.source_topics.split(","), start_ms=args.start_ms)
    env.execute(JOB)


if __name__ == "__main__":
    main()
