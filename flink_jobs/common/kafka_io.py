"""Kafka sources and sinks shared by the jobs: sources read committed records from the group's offsets,
sinks are transactional (exactly-once with checkpoints) by default."""

from __future__ import annotations


def kafka_source(brokers: str, topic: str, group_id: str, value_schema=None):
    """A KafkaSource of ``topic``'s values (strings unless ``value_schema``), from the group's committed offsets
    (the earliest without them), reading only committed records (what an upstream job's checkpoints
    committed)."""
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream.connectors.kafka import KafkaOffsetResetStrategy, KafkaOffsetsInitializer, KafkaSource

    return (KafkaSource.builder().set_bootstrap_servers(brokers).set_topics(topic)
            .set_group_id(group_id)
            .set_starting_offsets(KafkaOffsetsInitializer.committed_offsets(KafkaOffsetResetStrategy.EARLIEST))
            .set_property("isolation.level", "read_committed")  # only committed upstream output
            .set_value_only_deserializer(value_schema or SimpleStringSchema()).build())


def event_time(out_of_orderness_s: float, idle_s: float):
    """Watermarks from the Kafka records' timestamps (the records' event times: normalize writes them), per
    partition inside the source, in the JVM; a partition silent for ``idle_s`` is idle. A fresh strategy per
    call: a used one holds a Java handle."""
    from pyflink.common import Duration, WatermarkStrategy

    return (WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(int(out_of_orderness_s * 1000)))
            .with_idleness(Duration.of_millis(int(idle_s * 1000))))


def kafka_sink(brokers: str, topic: str, deployment: str, value_schema=None, exactly_once: bool = True):
    """A KafkaSink to ``topic``. ``deployment`` (the job's consumer group id) prefixes the transactional
    ids: two running jobs with the same prefix fence each other's producers, so each deployment of a
    job needs its own, and a restored job must keep it to abort its own lingering transactions."""
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream.connectors.base import DeliveryGuarantee
    from pyflink.datastream.connectors.kafka import KafkaRecordSerializationSchema, KafkaSink

    builder = (
        KafkaSink.builder()
        .set_bootstrap_servers(brokers)
        .set_record_serializer(KafkaRecordSerializationSchema.builder().set_topic(topic)
                               .set_value_serialization_schema(value_schema or SimpleStringSchema()).build())
        # Longer than a restart takes, shorter than the broker's transaction.max.timeout.ms (15 min).
        .set_property("transaction.timeout.ms", "600000")
        .set_property("compression.type", "zstd")
        # Uncompressed; the default 1 MB fails the job in a loop on one big record (a dead letter carries
        # its whole payload). The broker's message.max.bytes (8 MiB) bounds the compressed batch.
        .set_property("max.request.size", "8388608")
    )
    if exactly_once:
        return (builder.set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
                .set_transactional_id_prefix(f"{deployment}-{topic}").build())
    return builder.set_delivery_guarantee(DeliveryGuarantee.AT_LEAST_ONCE).build()
