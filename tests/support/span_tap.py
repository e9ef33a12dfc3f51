"""span_tap: OTLP span batches from Kafka -> one JSON record per span on another topic.

The smallest real pipeline through Flink and the Kafka connector; handy to see what the
gateways deliver (``infersight.otlp.spans``) in a readable form. A test job, not part of the product: the
first-slice test submits it with this file shipped alongside (``stack.jobs.submit(..., py_files=...)``), so
it runs as ``span_tap``.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator

from google.protobuf.message import DecodeError

from infersight.flink_jobs.normalize.otlp_spans import iter_spans
from infersight.schemas.topics import OTLP_SPANS

log = logging.getLogger(__name__)


def span_records(payload: bytes) -> Iterator[str]:
    """Pure core: one compact JSON string per span; undecodable payloads yield nothing."""
    try:
        for span in iter_spans(payload):
            yield json.dumps(span, separators=(",", ":"), sort_keys=True)
    except DecodeError as exc:  # the normalize job routes these to the DLQ; the tap only skips
        log.warning("span_tap: skipped a payload that is not OTLP traces: %s", exc)


def build(env, brokers: str, source_topic: str, sink_topic: str, group_id: str) -> None:
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.common.serialization import ByteArraySchema, SimpleStringSchema
    from pyflink.datastream.connectors.base import DeliveryGuarantee
    from pyflink.datastream.connectors.kafka import (
        KafkaOffsetsInitializer,
        KafkaRecordSerializationSchema,
        KafkaSink,
        KafkaSource,
    )

    source = (
        KafkaSource.builder()
        .set_bootstrap_servers(brokers)
        .set_topics(source_topic)
        .set_group_id(group_id)
        .set_starting_offsets(KafkaOffsetsInitializer.earliest())
        .set_value_only_deserializer(ByteArraySchema())
        .build()
    )
    sink = (
        KafkaSink.builder()
        .set_bootstrap_servers(brokers)
        .set_record_serializer(
            KafkaRecordSerializationSchema.builder()
            .set_topic(sink_topic)
            .set_value_serialization_schema(SimpleStringSchema())
            .build()
        )
        .set_delivery_guarantee(DeliveryGuarantee.AT_LEAST_ONCE)
        .build()
    )
    (
        env.from_source(source, WatermarkStrategy.no_watermarks(), "otlp-spans")
        .flat_map(span_records, output_type=Types.STRING())
        .name("decode-spans")
        .sink_to(sink)
        .name("span-records")
    )


def main(argv: list[str] | None = None) -> None:
    from infersight.flink_jobs.common.environment import add_jars_option, execution_environment

    parser = argparse.ArgumentParser(prog="span_tap", description=__doc__)
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--source-topic", default=OTLP_SPANS.name)
    parser.add_argument("--sink-topic", required=True)
    parser.add_argument("--group-id", default="infersight-span-tap")
    add_jars_option(parser)
    args = parser.parse_args(argv)
    env = execution_environment(args.jars)
    build(env, args.brokers, args.source_topic, args.sink_topic, args.group_id)
    env.execute("infersight-span-tap")


if __name__ == "__main__":
    main()
